package redlimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/requestid"
)

// Lease is how a leased handle takes its blocks (Limiter.WithLease).
//
// One limiter lives on one Redis thread, and every decision waits a round
// trip: a hot limit shared by every instance tops out at what that thread
// decides. A leased handle instead takes a block of permits in one script
// call, counted in Redis like any grant, and serves its decisions from the
// block in memory until the block runs out or Time passes; then it gives
// back what it did not use, and takes another, sized to its recent demand.
//
// The bound: a permit is counted in Redis before it is used, and used at
// most Time after Redis counted it, so the grants an instance makes are
// those Redis made, each moved later by less than Time:
//   - fixed window: a block is never used past its window's end, so no
//     window ever grants more than Rate: the bound is the limiter's own;
//   - sliding window: no span of Interval × (buckets − 1) / buckets − Time
//     grants more than Rate; token bucket: no span of Interval − Time;
//   - funnel: no span of length t grants more than Burst + Rate × (t + Time)
//     / Interval, the GCRA's bound over a span Time longer.
//
// What a block holds unused is denied to every other instance until it is
// given back: at most the number of instances × the block cap, for at most
// Time (the token bucket's until its records age out).
type Lease struct {
	// Time is the longest a block is used: the bound's slack, and how long
	// a rate change (SetRate) takes to reach the handle. Required.
	Time time.Duration
	// Max caps a block's permits; 0 leaves only Share's cap.
	Max int64
	// Share caps a block at this fraction of the limit (the smallest Limit
	// of its rates), so that a few instances cannot hold it all; 0 is 0.1.
	// A request for more than the cap is decided in Redis, unleased.
	Share float64
}

// LeaseStats counts what a leased handle did with its blocks.
type LeaseStats struct {
	Calls    int64 // script calls made for blocks: takes and refunds
	Taken    int64 // permits taken into blocks
	Used     int64 // permits granted from blocks
	Returned int64 // permits given back that Redis took back
}

// WithLease returns a handle that decides from blocks of permits it leases
// from the limiter (see Lease for the bound it keeps). Every other method
// behaves as the handle's own; a peek (zero permits) and a request larger
// than a block's cap go to Redis. Keep the handle, as the block is its
// own: the Client keeps it too, until it is closed. Close it when done, or
// the Client (Client.Close) on shutdown, so its unused permits go back at
// once.
func (l *Limiter) WithLease(cfg Lease) *Limiter {
	d := *l
	if err := cfg.validate(); err != nil {
		d.err = errors.Join(d.err, err)
	}
	if cfg.Share == 0 {
		cfg.Share = 0.1
	}
	d.lease = &lease{cfg: cfg}
	if d.err == nil {
		l.client.leases.Store(&d, struct{}{})
	}
	return &d
}

// validate says why cfg cannot be a lease's, wrapping ErrInvalidConfig.
func (cfg Lease) validate() error {
	switch {
	case cfg.Time <= 0:
		return fmt.Errorf("%w: lease time %v: must be positive", ErrInvalidConfig, cfg.Time)
	case cfg.Max < 0:
		return fmt.Errorf("%w: lease max %d: must be 0 or more", ErrInvalidConfig, cfg.Max)
	case !(cfg.Share >= 0 && cfg.Share <= 1): // and not NaN
		return fmt.Errorf("%w: lease share %v: must be within 0 to 1", ErrInvalidConfig, cfg.Share)
	}
	return nil
}

// Close gives back what every leased handle made from the Client holds
// unused, and makes them decide in Redis from then on (Limiter.Close): for
// a service's shutdown, so that its blocks serve the other instances at
// once rather than when their lease time is up. It ends hot leases too
// (WithHotLeases): their blocks go back, and no limiter is leased again;
// and degraded mode's heartbeat (WithDegraded). It does not close the
// go-redis client, which the caller owns.
func (c *Client) Close(ctx context.Context) error {
	c.degraded.close()
	errs := []error{c.hot.close(ctx)}
	c.leases.Range(func(h, _ any) bool {
		errs = append(errs, h.(*Limiter).Close(ctx))
		return true
	})
	return errors.Join(errs...)
}

// LeaseStats reports what the handle's leases did; zero for a handle
// without one.
func (l *Limiter) LeaseStats() LeaseStats {
	s := l.lease
	if s == nil {
		return LeaseStats{}
	}
	return LeaseStats{Calls: s.calls.Load(), Taken: s.taken.Load(), Used: s.used.Load(), Returned: s.returned.Load()}
}

// Close gives back what the handle's lease holds unused, and makes it
// decide in Redis from then on. It does nothing on a handle without one.
func (l *Limiter) Close(ctx context.Context) error {
	s := l.lease
	if s == nil {
		return nil
	}
	defer l.client.leases.Delete(l)
	s.mu.Lock()
	s.closed = true
	for s.taking != nil {
		// A take in flight: its block goes back here, once it returns.
		t := s.taking
		s.closers++
		s.mu.Unlock()
		var err error
		select {
		case <-t.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.mu.Lock()
		s.closers--
		if err != nil {
			if s.taking == nil && s.closers == 0 {
				go l.refund(context.Background(), s.drop()) // it returned as Close gave up
			}
			s.mu.Unlock()
			return fmt.Errorf("redlimit: %w", err)
		}
	}
	b := s.drop()
	s.mu.Unlock()
	return l.refund(ctx, b)
}

// lease is a leased handle's block and what it knows of the limiter.
type lease struct {
	cfg    Lease
	mu     sync.Mutex
	closed bool
	block  block
	// last is Redis's answer to the latest take, sent at lastAt; after a
	// denied take, requests of deniedAsking permits or more are denied
	// here until deniedUntil: the retry, or Time if sooner.
	last         Result
	lastAt       time.Time
	deniedUntil  time.Time
	deniedAsking int64
	// taking is the take in flight, nil when none is; closers, how many
	// Close calls wait for it, to give its block back themselves.
	taking  *taking
	closers int

	calls, taken, used, returned atomic.Int64
}

// block is one take's permits.
type block struct {
	held  int64         // left to grant
	size  int64         // taken
	used  int64         // granted from it
	at    int64         // the grant, µs on Redis's clock: what a refund names
	id    *requestid.ID // the take's, which its refund names
	from  time.Time     // sent, on the Client's clock
	until time.Time     // not used from then: from + Time, or its window's end
	timer *time.Timer
}

// drop takes the block out, for a refund. The lock is held.
func (s *lease) drop() block {
	b := s.block
	if b.timer != nil {
		b.timer.Stop()
	}
	s.block = block{size: b.size, used: b.used, from: b.from, until: b.until}
	return b
}

// allow decides permits from the block, or takes a new one; served is
// false when the request must go to Redis as an unleased one would.
func (s *lease) allow(ctx context.Context, l *Limiter, permits int64) (r Result, err error, served bool) {
	c := l.client
	for {
		s.mu.Lock()
		if s.closed || permits > s.most(permits) {
			s.mu.Unlock()
			return Result{}, nil, false
		}
		now := c.clock()
		b := &s.block
		if b.held >= permits && now.Before(b.until) {
			b.held -= permits
			b.used += permits
			r = s.last
			r.Allowed, r.RetryAfter, r.Remaining, r.Reason = true, 0, b.held+s.last.Remaining, ReasonLease
			r.ResetAfter = max(0, r.ResetAfter-now.Sub(s.lastAt))
			r.Quotas = slices.Clone(r.Quotas) // the caller's own, as a round trip's are
			s.mu.Unlock()
			s.used.Add(permits)
			return r, nil, true
		}
		if now.Before(s.deniedUntil) && permits >= s.deniedAsking && b.held < permits {
			r = s.last
			r.RetryAfter, r.Reason = s.last.RetryAfter-now.Sub(s.lastAt), ReasonLease
			r.ResetAfter = max(0, r.ResetAfter-now.Sub(s.lastAt))
			r.Quotas = slices.Clone(r.Quotas)
			s.mu.Unlock()
			return r, nil, true
		}
		if s.taking != nil {
			wait := s.taking.done
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return Result{}, fmt.Errorf("redlimit: %w", ctx.Err()), true
			}
		}
		want := s.want(now, permits)
		old := s.drop()
		t := &taking{done: make(chan struct{})}
		s.taking = t
		s.mu.Unlock()
		if old.held > 0 && c.now != nil {
			// On WithClock's clock, in order: a run on a controlled clock
			// is then the same every time.
			_ = l.refund(ctx, old)
		} else if old.held > 0 {
			go l.refund(context.Background(), old)
		}
		return s.await(ctx, l, t, permits, want)
	}
}

// taking is a take in flight, and what it answers its caller.
type taking struct {
	done chan struct{} // closed when the take has returned
	left bool          // its caller left first: the block keeps the caller's permits
	r    Result
	err  error
}

// await runs take t for its caller, who may leave before it returns: Redis
// may have counted it by then, so it runs on, up to the caller's deadline
// or 5 s from now if later, and its block (the caller's permits too) is
// kept, to be used or given back.
func (s *lease) await(ctx context.Context, l *Limiter, t *taking, permits, want int64) (Result, error, bool) {
	tctx, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
	if d, ok := ctx.Deadline(); ok {
		tctx, cancel = context.WithDeadline(tctx, later(d, time.Now().Add(leaseCallTimeout)))
	}
	go func() {
		s.take(tctx, l, t, permits, want)
		cancel()
	}()
	select {
	case <-t.done:
		return t.r, t.err, true
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-t.done: // returned meanwhile: its answer stands
		return t.r, t.err, true
	default:
		t.left = true
		return Result{}, fmt.Errorf("redlimit: %w", ctx.Err()), true
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// leaseCallTimeout bounds a take whose caller left and a refund whose
// caller set no deadline.
const leaseCallTimeout = 5 * time.Second

// most is the largest block: Max, and Share of the limit as Redis last
// said it (before any take, the request's own permits).
func (s *lease) most(permits int64) int64 { return s.mostOf(s.last, permits) }

// mostOf is most, by the limits of r.
func (s *lease) mostOf(r Result, permits int64) int64 {
	limit := r.Limit
	for _, q := range r.Quotas {
		limit = min(limit, q.Limit)
	}
	if limit <= 0 {
		return permits
	}
	most := max(1, int64(float64(limit)*s.cfg.Share))
	if s.cfg.Max > 0 {
		most = min(most, s.cfg.Max)
	}
	return most
}

// want sizes the next block: what the last one served, scaled to a whole
// lease time, twice over (and at least twice its size when it ran out
// early) for room to grow, since what is not used goes back. Never fewer
// than permits or more than most. The lock is held.
func (s *lease) want(now time.Time, permits int64) int64 {
	b := s.block
	n := permits
	if b.size > 0 {
		lived := max(now.Sub(b.from), time.Millisecond)
		pace := float64(b.used) * float64(s.cfg.Time) / float64(lived)
		switch {
		case now.Before(b.until):
			n = max(n, int64(2*pace), 2*b.size) // it ran out early
		default:
			n = max(n, int64(2*pace))
		}
	}
	return min(n, max(permits, s.most(permits)))
}

// take asks Redis for want permits, or as few as permits, and grants the
// caller's permits from them, unless the caller left: t's answer. A take is
// a reservation (Limiter.Reserve) of want, or as few as fit if permits or
// more: its id stays in the request log for as long as a refund may come
// (its Time, and a minute for go-redis's re-sending), and the refund names
// it.
func (s *lease) take(ctx context.Context, l *Limiter, t *taking, permits, want int64) {
	c := l.client
	from := c.clock()
	id := requestid.New()
	r, d, err := l.ask(ctx, request{op: opReserve, permits: want, least: permits, id: id,
		logWindow: max(c.retryWindow, s.cfg.Time+time.Minute).Milliseconds()})
	s.calls.Add(1)
	at, taken, ends := d.GrantAt, d.Taken, d.EndsUS
	if err == nil && (taken != 0 && taken < permits || taken > want) {
		err = unexpected(d)
	}
	// over: a block above the cap of the limits it was taken under (a rate
	// lowered since the last take, which sized it), given back at once.
	var over block
	defer func() {
		if over.held > 0 {
			_ = l.refund(ctx, over)
		}
		close(t.done)
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.taking = nil
	if err != nil {
		t.err = err
		return
	}
	s.last, s.lastAt = r, from
	r.Quotas = slices.Clone(r.Quotas) // the caller's own: s.last keeps its
	s.deniedUntil = time.Time{}
	if taken == 0 {
		if r.RetryAfter > 0 {
			// Denied locally until the retry, but for no longer than a
			// block lives: a rate raised elsewhere reaches the handle
			// within Time (its own SetRate, Reset and Release forget the
			// denial at once: forgetDenial).
			s.deniedUntil, s.deniedAsking = from.Add(min(r.RetryAfter, s.cfg.Time)), permits
		}
		r.Reason = ReasonLimit
		t.r = r
		return
	}
	used := permits
	if t.left {
		used = 0 // the caller's permits stay in the block
	}
	s.taken.Add(taken)
	s.used.Add(used)
	// A block is never used past the first of the windows its permits
	// count in to end (a fixed window's: its permits are its window's).
	until := from.Add(s.cfg.Time)
	if end := from.Add(micros(ends)); ends > 0 && end.Before(until) {
		until = end
	}
	s.block = block{held: taken - used, size: taken, used: used, at: at, id: id, from: from, until: until}
	if taken > max(permits, s.mostOf(r, permits)) {
		over = s.drop()
	} else if s.closed {
		// Closed while the take was in flight: what it took beyond the
		// request goes back, by the Close waiting for it, or at once.
		if s.closers == 0 {
			go l.refund(context.Background(), s.drop())
		}
	} else if s.block.held > 0 && l.client.now == nil {
		// Given back when its time is up, if no request does it sooner (on
		// WithClock's clock, a request or Close does).
		s.block.timer = time.AfterFunc(until.Sub(from), func() { s.expire(l, at, id) })
	}
	r.Remaining += s.block.held
	t.r = r
}

// expire gives back the block its take (at, id) made, if it is still the one held.
func (s *lease) expire(l *Limiter, at int64, id *requestid.ID) {
	s.mu.Lock()
	if s.block.at != at || s.block.id != id || s.block.held == 0 {
		s.mu.Unlock()
		return
	}
	b := s.drop()
	s.mu.Unlock()
	l.refund(context.Background(), b)
}

// refund gives back what b holds unused: the release of its take's
// reservation. Redis takes back only what is still counted of b's grant, so
// a refund however late never frees more than b's own permits would have.
// It does so once, while its take's id is in the request log: not after a
// Reset, a Delete or new rates, when the state the grant was counted in is
// gone or counts otherwise.
func (l *Limiter) refund(ctx context.Context, b block) error {
	if b.held <= 0 {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, leaseCallTimeout)
		defer cancel()
	}
	r, _, err := l.ask(ctx, request{op: opRelease, permits: b.held, id: b.id, grantAt: b.at, grantSize: b.size})
	l.lease.calls.Add(1)
	if err != nil {
		return err
	}
	l.lease.returned.Add(r.Remaining)
	l.forget()
	return nil
}

// forgetDenial ends the handle's local denial (see deniedUntil), after a
// local change that may free permits sooner than it says.
func (s *lease) forgetDenial() {
	s.mu.Lock()
	s.deniedUntil = time.Time{}
	s.mu.Unlock()
}
