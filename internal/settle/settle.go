// Package settle keeps a reservation's ledger: what it holds, the highest
// cost reported, and the request log entry its grant is under (the package
// redlimit's Reservation.Settle, SettlePartial and Release, which say what
// a settle does in Redis). Settles of one reservation go one at a time, and
// each counts once however its replies are lost: a settle whose reply may
// have been lost is sent again, first, before the next, and Redis knows it
// by its log entry.
package settle

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redlimit/redlimit/internal/requestid"
	"github.com/redlimit/redlimit/internal/wire"
)

// Redis is what a ledger asks of Redis, on the reservation's grant.
type Redis interface {
	// Settle counts amount more for the grant, whose log entry moves from
	// from to next, and returns what it counted: wire.SettledBefore when
	// an earlier run of the same step counted it.
	Settle(ctx context.Context, from, next *requestid.ID, amount int64) (int64, error)
	// Release gives back permits of the grant, under its log entry, and
	// returns how many Redis took back.
	Release(ctx context.Context, entry *requestid.ID, permits int64) (int64, error)
}

// Result is what a settle did: the package redlimit's SettleResult.
type Result struct {
	Charged, Refunded, Uncharged, Held int64
}

// Ledger is a reservation's state, shared by its copies.
type Ledger struct {
	// uncapped: nothing can cap a charge (no MaxDebt, an algorithm that
	// holds a debt), so a step an earlier run counted counted in full.
	uncapped bool

	mu    sync.Mutex    // held through a settle's round trip: one at a time
	entry *requestid.ID // its entry in the request log: the grant's id, until a settle moves it
	// ledger is what the entry stands for: the grant, or the highest cost
	// reported above it. held is the grant and what settles charged, less
	// what they gave back; running, the highest cost reported.
	ledger, held, running int64
	closed                bool
	// pending is a settle whose reply was lost: it may have been counted,
	// so it is sent again, first, before the next (it counts once).
	pending *step
}

// step is one settle request: amount more, counted as the entry moves from
// from to next, leaving the ledger at ledger.
type step struct {
	from, next *requestid.ID
	amount     int64
	ledger     int64
}

// New is the ledger of a grant of taken permits, logged under id.
func New(id *requestid.ID, taken int64, uncapped bool) *Ledger {
	return &Ledger{uncapped: uncapped, entry: id, ledger: taken, held: taken}
}

// Settle reports the cost actual, finally or not; release, when above 0,
// is a Release of that many instead: the final cost the grant less them,
// but never below a cost already reported. A final cost below one
// reported is ErrInvalidPermits; a report below one is an older one,
// overtaken, and changes nothing.
func (s *Ledger) Settle(ctx context.Context, redis Redis, actual, release int64, final bool) (Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := Result{Held: s.held}
	if release > 0 {
		actual = max(s.running, s.ledger-min(release, s.ledger))
	}
	switch {
	case s.closed:
		if actual > s.ledger {
			res.Uncharged = actual - s.ledger
		}
		return res, nil
	case actual < s.running && final:
		return res, fmt.Errorf("%w: %d: below the cost of %d reported already", wire.ErrInvalidPermits, actual, s.running)
	case actual < s.running:
		return res, nil
	}
	if s.pending != nil {
		if err := s.send(ctx, redis, &res, *s.pending); err != nil {
			return res, err
		}
	}
	reported := s.running
	s.running = actual
	switch {
	case actual > s.ledger:
		next := step{from: s.entry, next: requestid.New(), amount: actual - s.ledger, ledger: actual}
		if err := s.send(ctx, redis, &res, next); err != nil {
			if s.pending == nil {
				s.running = reported // refused: the report is not taken
			}
			return res, err
		}
	case final && actual < s.ledger:
		// Only a reservation never charged beyond its grant gets here (a
		// ledger above the grant's is a cost reported, and actual is no
		// less): its entry is the grant's id, and this is its release.
		back, err := redis.Release(ctx, s.entry, s.ledger-actual)
		if err != nil {
			return res, err
		}
		res.Refunded = back
		s.held -= back
	}
	s.closed = final
	res.Held = s.held
	return res, nil
}

// send runs st, adding what it did to res. A step whose reply may have
// been lost (Redis unavailable, the caller gone) is pending: sent again
// before the next, it counts once (its entry has moved on if it counted).
// One Redis refused (a debt past what the state holds) counted nothing.
func (s *Ledger) send(ctx context.Context, redis Redis, res *Result, st step) error {
	charged, err := redis.Settle(ctx, st.from, st.next, st.amount)
	if err != nil {
		s.pending = nil
		if errors.Is(err, wire.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			s.pending = &st
		}
		return err
	}
	s.pending = nil
	s.entry, s.ledger = st.next, st.ledger
	if charged == wire.SettledBefore {
		// Counted by an earlier run whose reply was lost: all of it, unless
		// something may have capped it, when how much is not known.
		if !s.uncapped {
			return nil
		}
		charged = st.amount
	}
	res.Charged += charged
	res.Uncharged += st.amount - charged
	s.held += charged
	return nil
}
