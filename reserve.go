package redlimit

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit/internal/requestid"
	"github.com/redlimit/redlimit/internal/settle"
	"github.com/redlimit/redlimit/internal/wire"
)

// Reservation is a grant whose cost is settled after the work: given back
// exactly (Release), or settled with the work's actual cost (Settle), which
// charges or gives back the difference. Limiter.Reserve's. Its Result is
// the decision, as Allow's would be. Copies of a reservation are the same
// reservation: what one settles, the others have settled.
type Reservation struct {
	Result
	Taken   int64 // the permits granted and counted: the request's, or 0
	limiter *Limiter
	s       *settlement // nil for a reservation that took nothing
}

// SettleResult is what settling a reservation did.
//
// A settle counts once however often it is sent: go-redis sends a script
// again when it did not read its reply, and a settle that failed with
// Redis unavailable (or its caller gone) is sent again before the next one.
// A charge whose first run counted is then reported in full when nothing
// could have capped it (no MaxDebt, an algorithm that holds a debt), and
// not at all otherwise, as how much counted is not known; a refund sent
// again reports nothing.
type SettleResult struct {
	// Charged: the permits counted beyond what the reservation held.
	Charged int64
	// Refunded: the permits given back.
	Refunded int64
	// Uncharged: the permits of the actual cost above what the reservation
	// held that were not counted: past MaxDebt, past a fixed window's rate
	// (a window holds no debt), or all of them once the reservation could
	// no longer be settled (SettleWithin).
	Uncharged int64
	// Held: what the reservation counts now, by its own reckoning: Taken,
	// plus what its settles charged, less what they gave back.
	Held int64
}

// A ReserveOption says how a reservation may be settled.
type ReserveOption func(*settlement)

// SettleWithin gives the reservation d to be settled. Once d has passed
// since Reserve, on the limiter's clock (Redis's, or WithClock's) and to
// the ms, the reservation is a charge of what it holds: its estimate, and
// whatever SettlePartial charged. Settle and Release then change nothing,
// in Redis and in the result (they give back nothing and charge nothing).
// Without it a reservation may be settled while its grant counts (the
// limit's longest interval, or the time a funnel's burst takes to drain),
// or the Client's retry window if that is longer: give work that may
// outlast that a SettleWithin as long as it may take, or its overrun goes
// uncharged. d is from 1 ms to about 142 years (ErrInvalidConfig).
func SettleWithin(d time.Duration) ReserveOption {
	return func(s *settlement) { s.within, s.timed = d, true }
}

// MaxDebt caps what a settle above the reservation charges: no more than
// leaves every rate of the limit owing at most permits past its limit (as
// Charge's debt: what a token bucket's or sliding window's count has past
// its rate, what a funnel has past full, in permits). What it cannot
// charge is reported as Uncharged. 0 charges only what the limit has room
// for. A fixed window holds no debt: there MaxDebt above 0 is
// ErrUnsupported, and a settle always charges at most what its window has
// room for. Without MaxDebt, the whole actual cost is charged.
func MaxDebt(permits int64) ReserveOption {
	return func(s *settlement) { s.maxDebt, s.capped = permits, true }
}

// Reserve takes permits as Allow does, and names the grant, so that it can
// be settled once the work's cost is known: Settle with the actual cost
// (SettlePartial as it grows), or Release what the work did not use.
//
// What a settle gives back is exact: never more than the grant still
// counts (nothing of a fixed window's once its window has ended, of a
// sliding window's once its sub-window has left, of a funnel's what has
// drained; a token bucket's from its own record while that is in the
// window), only once however often it is called, and nothing after a
// Reset, a Delete or SetRate with new rates (the state the grant was
// counted in is gone), nor once SettleWithin's time has passed.
//
// What a settle charges above the reservation is counted where the grant
// counts, while it still does, as if the grant had been that much larger:
// in a token bucket's own record, a sliding window's own sub-window, a
// fixed window's own window (so it leaves when the grant leaves), a
// funnel's own place (what follows it moves back). Once that has ended it
// is counted as a grant made at the settle would be: in the current
// record, sub-window or window, or, for a funnel, drained from now. A cost
// is never forgiven for coming late: a job that outlives its window pays
// its overrun in the next one. Past the limit it is a debt, as Charge's
// is, that later requests wait out (MaxDebt caps it); a fixed window holds
// none, and charges only what its window has room for.
//
// The grant's id stays in the limiter's request log (name:requests) while
// it may be settled. A reservation is never served by a lease or a cached
// denial: it is decided in Redis. Bad options are errors, with nothing
// taken.
func (l *Limiter) Reserve(ctx context.Context, permits int64, opts ...ReserveOption) (Reservation, error) {
	if permits < 0 || permits > maxPermits {
		return Reservation{}, fmt.Errorf("%w: %d", ErrInvalidPermits, permits)
	}
	s := &settlement{maxDebt: -1}
	for _, o := range opts {
		o(s)
	}
	var timeoutMS int64
	switch {
	case s.capped && s.maxDebt < 0 || s.maxDebt > maxPermits:
		return Reservation{}, fmt.Errorf("%w: MaxDebt %d", ErrInvalidPermits, s.maxDebt)
	case s.capped && s.maxDebt > 0 && l.alg != nil && !l.alg.Charges:
		return Reservation{}, fmt.Errorf("%w: MaxDebt: a %s holds no debt", ErrUnsupported, l.alg.Name)
	case s.timed:
		timeoutMS = int64((s.within + time.Millisecond - 1) / time.Millisecond)
		if s.within <= 0 || timeoutMS > wire.MaxDebt/1000 {
			return Reservation{}, fmt.Errorf("%w: SettleWithin %v: from 1ms to %v", ErrInvalidConfig, s.within, time.Duration(wire.MaxDebt)*time.Microsecond)
		}
	}
	start := time.Now()
	id := requestid.New()
	r, d, err := l.ask(ctx, request{op: opReserve, permits: permits, least: permits, id: id,
		logWindow: l.client.retryWindow.Milliseconds(), settling: settling{timeoutMS: timeoutMS}})
	if err == nil {
		err = aboveLimit(r, permits)
	}
	r, err, open := l.client.settle(ctx, l, permits, r, err)
	l.client.tell(l, permits, r, err, start)
	if open {
		err = nil
	}
	res := Reservation{Result: r, Taken: d.Taken, limiter: l}
	if d.Taken > 0 {
		s.at, s.taken = d.GrantAt, d.Taken
		s.ledger = settle.New(id, d.Taken, !s.capped && l.alg.Charges)
		res.s = s
	}
	return res, err
}

// Settle closes the reservation with the work's actual cost: what it holds
// above actual is given back, and actual above what it holds is charged
// (see Reserve for where, and for what is never given back). It is settled
// once: a later Settle, SettlePartial or Release, or one of a copy, changes
// nothing. actual below what SettlePartial reported is ErrInvalidPermits,
// with nothing changed; so is one above 2^53 - 1, or, for a token bucket,
// above what its record holds (2^32 - 1).
func (r Reservation) Settle(ctx context.Context, actual int64) (SettleResult, error) {
	return r.settle(ctx, actual, 0, true)
}

// SettlePartial reports the running cost of work still going on (an LLM's
// tokens as they stream): what the reservation holds follows it up, never
// down, charging what passes the estimate as it comes, so that the limit
// sees it at once; Settle closes the reservation. A report below an
// earlier one is an older one, overtaken: it changes nothing. Reports whose
// cost is within what the reservation holds ask nothing of Redis.
func (r Reservation) SettlePartial(ctx context.Context, soFar int64) (SettleResult, error) {
	return r.settle(ctx, soFar, 0, false)
}

// Release gives back up to permits of the reservation's grant, closing it
// as Settle does, and returns how many the limiter took back: see Reserve
// for what it never gives back. It gives back nothing of a reservation
// whose cost SettlePartial reported above its estimate. A reservation gives
// back once: a second Release, or one of a copy, takes back nothing.
func (r Reservation) Release(ctx context.Context, permits int64) (int64, error) {
	if permits < 0 {
		return 0, fmt.Errorf("%w: %d", ErrInvalidPermits, permits)
	}
	if permits == 0 {
		return 0, nil
	}
	res, err := r.settle(ctx, 0, permits, true)
	return res.Refunded, err
}

// settlement is a reservation's options and grant, and its ledger
// (internal/settle), shared by its copies.
type settlement struct {
	within  time.Duration // SettleWithin's
	timed   bool          // SettleWithin was given
	maxDebt int64         // MaxDebt's, or -1
	capped  bool          // MaxDebt was given

	at, taken int64 // the grant: its time on Redis's clock (µs), its permits
	ledger    *settle.Ledger
}

// settle reports the cost actual, finally or not; release, when above
// 0, is a Release of that many instead: the final cost the grant less
// them, but never below a cost already reported.
func (r Reservation) settle(ctx context.Context, actual, release int64, final bool) (SettleResult, error) {
	l, s := r.limiter, r.s
	switch {
	case actual < 0 || actual > maxPermits:
		return SettleResult{}, fmt.Errorf("%w: %d: from 0 to 2^53 - 1", ErrInvalidPermits, actual)
	case l != nil && l.alg.Records && actual > maxLogRate:
		return SettleResult{}, fmt.Errorf("%w: %d: a token bucket's record holds at most %d permits", ErrInvalidPermits, actual, int64(maxLogRate))
	case l == nil || s == nil:
		return SettleResult{}, nil // a reservation that took nothing settles nothing
	}
	res, err := s.ledger.Settle(ctx, grant{l, s}, actual, release, final)
	return SettleResult(res), err
}

// grant is how a reservation's ledger reaches its grant in Redis.
type grant struct {
	l *Limiter
	s *settlement
}

func (g grant) Settle(ctx context.Context, from, next *requestid.ID, amount int64) (int64, error) {
	r, _, err := g.l.ask(ctx, request{op: opSettle, permits: amount, id: from, grantAt: g.s.at, grantSize: g.s.taken,
		settling: settling{next: next, maxDebt: g.s.maxDebt}})
	return r.Remaining, err
}

func (g grant) Release(ctx context.Context, entry *requestid.ID, permits int64) (int64, error) {
	r, _, err := g.l.ask(ctx, request{op: opRelease, permits: permits, id: entry, grantAt: g.s.at, grantSize: g.s.taken})
	if err != nil {
		return 0, err
	}
	g.l.forget()
	return r.Remaining, nil
}

// settling is what a reservation and a settle add to a request: their
// arguments after wire.ArgGrantSize.
type settling struct {
	timeoutMS int64         // reserve: SettleWithin's, in ms; 0 for none
	next      *requestid.ID // settle: the id its entry moves to
	maxDebt   int64         // settle: MaxDebt's, or -1
}

// args writes s's arguments in their places.
func (s settling) args(args []any) {
	timeout, next, debt := noArg, noArg, noArg
	if s.timeoutMS > 0 {
		timeout = s.timeoutMS
	}
	if s.next != nil {
		next, debt = s.next, s.maxDebt
		if s.maxDebt < 0 {
			debt = noArg
		}
	}
	args[wire.ArgTimeout-1], args[wire.ArgNext-1], args[wire.ArgMaxDebt-1] = timeout, next, debt
}
