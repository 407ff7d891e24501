package redlimit

import (
	"context"
	"fmt"
	"time"
)

// Reservation is a grant that can be given back exactly: Limiter.Reserve's.
// Its Result is the decision, as Allow's would be.
type Reservation struct {
	Result
	Taken   int64 // the permits granted and counted: the request's, or 0
	limiter *Limiter
	id      *requestID
	at      int64 // the grant's time, µs on Redis's clock (a funnel's: when it starts to drain)
}

// Reserve takes permits as Allow does, and names the grant, so that Release
// can give back what the work did not use, exactly: never more than the
// grant still counts (nothing of a fixed window's once its window has
// ended, of a sliding window's once its sub-window has left, of a funnel's
// what has drained; a token bucket's from its own record while that is in
// the window), only once however often it is called, and nothing after a
// Reset, a Delete or SetRate with new rates (the state the grant was counted
// in is gone). The grant's id stays in the limiter's request log
// (name:requests) while it may be released. A reservation is never served
// by a lease or a cached denial: it is decided in Redis.
func (l *Limiter) Reserve(ctx context.Context, permits int64) (Reservation, error) {
	if permits < 0 || permits > maxPermits {
		return Reservation{}, fmt.Errorf("%w: %d", ErrInvalidPermits, permits)
	}
	start := time.Now()
	id := newRequestID()
	r, d, err := l.ask(ctx, request{op: opReserve, permits: permits, least: permits, id: id, logWindow: l.client.retryWindow.Milliseconds()})
	if err == nil {
		err = aboveLimit(r, permits)
	}
	r, err, open := l.client.settle(ctx, l, permits, r, err)
	l.client.tell(l, permits, r, err, start)
	if open {
		err = nil
	}
	return Reservation{Result: r, Taken: d.Taken, limiter: l, id: id, at: d.GrantAt}, err
}

// Release gives back up to permits of the reservation's grant, and returns
// how many the limiter took back: see Reserve for what it never gives back.
// A reservation gives back once: a second Release, or one of a copy, takes
// back nothing.
func (r Reservation) Release(ctx context.Context, permits int64) (int64, error) {
	l := r.limiter
	switch {
	case permits < 0:
		return 0, fmt.Errorf("%w: %d", ErrInvalidPermits, permits)
	case l == nil || r.Taken == 0 || permits == 0:
		return 0, nil
	}
	defer l.forget()
	back, _, err := l.ask(ctx, request{op: opRelease, permits: min(permits, r.Taken), id: r.id, grantAt: r.at, grantSize: r.Taken})
	return back.Remaining, err
}
