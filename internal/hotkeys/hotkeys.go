// Package hotkeys finds the keys decided often on one Client, by the rate
// of their decisions there, and keeps one lease on each while it is hot:
// the package redlimit's WithHotLeases, whose leases are leased handles.
// The table of keys is bounded, however many keys pass through: it keeps
// the recently decided ones, in two generations (internal/generations),
// and a key dropped from it cools.
package hotkeys

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/generations"
)

// Period is what a rate is measured over: the decisions of the current
// period, and the previous period's weighted by the part of it still
// within the last Period (as a sliding window estimates its count).
const Period = time.Second

// PerGeneration bounds the table: it holds at most twice this many
// entries (84 bytes each, measured, their keys shared with the handles').
const PerGeneration = 1024

// Config is when a Table leases a key, and what it does with a lease.
type Config[L comparable] struct {
	// Above is the decision rate, per second, above which a key is leased;
	// it cools once its rate falls below half of Above.
	Above float64
	// Now is a controlled clock (WithClock's), or nil for the real one. On
	// a controlled clock no timer sweeps (decisions do), and a lease that
	// cools is given back before the decision goes on, in order, so that a
	// run is the same every time.
	Now func() time.Time
	// Close gives a lease back.
	Close func(ctx context.Context, lease L) error
	// Closed counts what a lease given back did, once Close has returned.
	// It runs under the table's lock, as Read's reader does, so that a
	// reader sees each lease once: out, being given back, or counted.
	Closed func(lease L)
}

// Table is the keys recently decided on a Client, and the leases of those
// that are hot. Locks are taken in the order Table.mu, the table of keys,
// an entry's, and whatever a lease locks of its own.
type Table[L comparable] struct {
	cfg     Config[L]
	entries *generations.Map[string, *entry[L]]

	// mu guards the leases: a decision on a key in the current generation
	// does not take it, so that decisions do not queue behind one another.
	mu              sync.RWMutex
	leased          map[*entry[L]]struct{} // the entries with a lease now
	closing         map[L]struct{}         // leases being given back: not yet Closed
	started, cooled int64
	timer           *time.Timer // on the real clock, the next sweep, while leases are out
	// closed: by Close, after which no lease is taken again; swept: the
	// latest period a decision swept the leases in (sweep).
	closed atomic.Bool
	swept  atomic.Int64
}

// entry is one key, its recent decisions, and its lease.
type entry[L comparable] struct {
	key       string
	mu        sync.Mutex
	period    int64 // the period cur counts, in Periods since 1970
	cur, prev int64
	hot       bool // lease is out; it changes under Table.mu and mu both
	lease     L
}

// New returns an empty table.
func New[L comparable](cfg Config[L]) *Table[L] {
	return &Table[L]{cfg: cfg, entries: generations.New[string, *entry[L]](PerGeneration, PerGeneration),
		leased: map[*entry[L]]struct{}{}, closing: map[L]struct{}{}}
}

func (t *Table[L]) now() time.Time {
	if t.cfg.Now != nil {
		return t.cfg.Now()
	}
	return time.Now()
}

// rate counts n decisions at now and returns the rate, in decisions a
// second, over the last Period. The entry's lock is held.
func (e *entry[L]) rate(now time.Time, n int64) float64 {
	ns := now.UnixNano()
	p := ns / int64(Period)
	switch {
	case p == e.period+1:
		e.prev, e.cur = e.cur, 0
	case p > e.period+1:
		e.prev, e.cur = 0, 0
	}
	e.period = max(e.period, p) // a clock gone back counts in the latest period
	e.cur += n
	left := float64((e.period+1)*int64(Period)-ns) / float64(Period)
	return (float64(e.cur) + float64(e.prev)*min(max(left, 0), 1)) / Period.Seconds()
}

// Lease counts a decision on key and returns the lease it decides through
// while it is hot, and whether it is: from the decision that takes its rate
// above Above, a lease open makes, until its rate falls below half of it.
func (t *Table[L]) Lease(ctx context.Context, key string, open func() L) (L, bool) {
	now := t.now()
	if p, last := now.UnixNano()/int64(Period), t.swept.Load(); p > last && t.swept.CompareAndSwap(last, p) {
		t.sweep(ctx, now)
	}
	e := t.entry(ctx, key)
	e.mu.Lock()
	rate, hot, lease := e.rate(now, 1), e.hot, e.lease
	e.mu.Unlock()
	if !hot && (rate <= t.cfg.Above || t.closed.Load()) || hot && rate >= t.cfg.Above/2 {
		return lease, hot
	}
	// A change, rare: under the table's lock, against a sweep's or a
	// concurrent decision's.
	var cooled []L
	t.mu.Lock()
	e.mu.Lock()
	rate = e.rate(now, 0)
	switch {
	case !e.hot && rate > t.cfg.Above && !t.closed.Load():
		e.lease, e.hot = open(), true
		t.leased[e] = struct{}{}
		t.started++
		t.arm(now)
	case e.hot && rate < t.cfg.Above/2:
		cooled = append(cooled, t.cool(e))
	}
	lease, hot = e.lease, e.hot
	e.mu.Unlock()
	t.mu.Unlock()
	t.giveBack(ctx, cooled)
	return lease, hot
}

// entry returns the table's entry for key, made and moved into the current
// generation as needed; a generation dropped takes its leases with it.
func (t *Table[L]) entry(ctx context.Context, key string) *entry[L] {
	if e, _, current := t.entries.Get(key); current {
		return e
	}
	var dropped []L
	t.mu.Lock()
	e, found, _ := t.entries.Get(key)
	if !found {
		e = &entry[L]{key: key}
	}
	e, gone := t.entries.Keep(key, e)
	if gone != nil {
		for old := range t.leased {
			if gone[old.key] == old {
				old.mu.Lock()
				dropped = append(dropped, t.cool(old))
				old.mu.Unlock()
			}
		}
	}
	t.mu.Unlock()
	t.giveBack(ctx, dropped)
	return e
}

// sweep cools the leased keys whose rate fell, whether or not they are
// asked again: a decision in a new period runs it, and on the real clock a
// timer too.
func (t *Table[L]) sweep(ctx context.Context, now time.Time) {
	var cooled []L
	t.mu.Lock()
	for e := range t.leased {
		e.mu.Lock()
		if e.rate(now, 0) < t.cfg.Above/2 {
			cooled = append(cooled, t.cool(e))
		}
		e.mu.Unlock()
	}
	t.mu.Unlock()
	t.giveBack(ctx, cooled)
}

// arm sets the timer that sweeps at the next period, on the real clock
// (on a controlled one, decisions sweep). Its sweeps go on while leases are
// out, and so stop within two periods of the last decision. t.mu is held.
func (t *Table[L]) arm(now time.Time) {
	if t.cfg.Now != nil || t.timer != nil || len(t.leased) == 0 {
		return
	}
	next := now.Truncate(Period).Add(Period)
	t.timer = time.AfterFunc(next.Sub(now), func() {
		t.sweep(context.Background(), time.Now())
		t.mu.Lock()
		t.timer = nil
		t.arm(time.Now())
		t.mu.Unlock()
	})
}

// cool takes e's lease off it, for giveBack. t.mu and e.mu are held.
func (t *Table[L]) cool(e *entry[L]) L {
	lease := e.lease
	var none L
	e.lease, e.hot = none, false
	delete(t.leased, e)
	t.closing[lease] = struct{}{}
	t.cooled++
	return lease
}

// giveBack closes the leases cooled: on a controlled clock before the
// decision goes on, in order; else meanwhile.
func (t *Table[L]) giveBack(ctx context.Context, cooled []L) {
	for _, lease := range cooled {
		if t.cfg.Now != nil {
			_ = t.close(ctx, lease)
		} else {
			go t.close(context.Background(), lease)
		}
	}
}

// close gives lease back, and counts what it did.
func (t *Table[L]) close(ctx context.Context, lease L) error {
	err := t.cfg.Close(ctx, lease)
	t.mu.Lock()
	delete(t.closing, lease)
	t.cfg.Closed(lease)
	t.mu.Unlock()
	return err
}

// Close ends the leasing: every lease goes back, and none is taken again.
func (t *Table[L]) Close(ctx context.Context) error {
	var cooled []L
	t.mu.Lock()
	t.closed.Store(true)
	for e := range t.leased {
		e.mu.Lock()
		cooled = append(cooled, t.cool(e))
		e.mu.Unlock()
	}
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
	t.mu.Unlock()
	var errs []error
	for _, lease := range cooled {
		errs = append(errs, t.close(ctx, lease))
	}
	return errors.Join(errs...)
}

// Leased is one lease out: its key, and its key's rate when read.
type Leased[L comparable] struct {
	Key   string
	Lease L
	Rate  float64
}

// Stats is what a table holds and did: the leases out, those being given
// back, and how many were taken (a key turning hot) and given back (a key
// cooling, dropped from the table, or Close).
type Stats[L comparable] struct {
	Leased          []Leased[L]
	Closing         []L
	Started, Cooled int64
}

// Read calls read with what the table holds at now, under the table's
// lock (see Config.Closed).
func (t *Table[L]) Read(now time.Time, read func(Stats[L])) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s := Stats[L]{Started: t.started, Cooled: t.cooled}
	for e := range t.leased {
		e.mu.Lock()
		s.Leased = append(s.Leased, Leased[L]{Key: e.key, Lease: e.lease, Rate: e.rate(now, 0)})
		e.mu.Unlock()
	}
	for lease := range t.closing {
		s.Closing = append(s.Closing, lease)
	}
	read(s)
}

// Leases calls f with each lease out and its key, under the table's lock.
func (t *Table[L]) Leases(f func(key string, lease L)) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for e := range t.leased {
		f(e.key, e.lease) // e.lease changes under t.mu's write lock
	}
}

// Len is the number of keys the table holds.
func (t *Table[L]) Len() int { return t.entries.Len() }
