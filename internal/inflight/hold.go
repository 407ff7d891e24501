package inflight

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redlimit/redlimit/internal/wire"
)

// LeaseMargin is how long before its TTL runs out, counted from when its
// last renewal was sent, a holder gives its hold up: a tenth of the TTL for
// the holder's clock and Redis's running at different rates (quartz is
// within 0.01%, NTP slews by at most 0.05%: a tenth is far more than
// either) and for the lease's timer firing late on a busy machine; and 2ms
// because Redis keeps expiries in whole milliseconds, the start rounded
// down (up to 1ms early), and for a millisecond of the clocks' own reading.
func LeaseMargin(ttl time.Duration) time.Duration { return ttl/10 + 2*time.Millisecond }

// Keeper is what a hold asks of its limit's handle: its clock and timers,
// and the in-flight script's refresh and release of a hold by its id.
type Keeper struct {
	Clock func() time.Time
	// After runs f once d has passed, and returns what stops it: nil for
	// time.AfterFunc. Tests on a controlled clock fire it as they move it.
	After func(d time.Duration, f func()) (stop func() bool)
	// RefreshEvery is how often a hold refreshes itself: 0 for TTL/3,
	// negative for never (tests on a controlled clock refresh by hand).
	RefreshEvery time.Duration
	// Refresh and Release run the script's op on the hold id, and return
	// its reply.
	Refresh, Release func(ctx context.Context, id string) (any, error)
	// Released is told of every release Redis answered: it wakes the line.
	Released func()
}

// after runs f once d has passed, and returns what stops it.
func (k *Keeper) after(d time.Duration, f func()) func() bool {
	if k.After != nil {
		return k.After(d, f)
	}
	return time.AfterFunc(d, f).Stop
}

// ReleaseAlone releases the hold id for no one waiting (a holder that gave
// it up, a call whose reply was lost): a second bounds it.
func (k *Keeper) ReleaseAlone(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = k.Release(ctx, id)
}

// MayHaveRun reports whether a call that failed with err may have run in
// Redis all the same, its reply lost: a timeout, a cancelled context.
func MayHaveRun(err error) bool {
	return errors.Is(err, wire.ErrUnavailable) && !errors.Is(err, wire.ErrBreakerOpen) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// Hold is one hold's life in the holder's memory: the lease it keeps (the
// package redlimit's Hold says what it promises), its timers, and how it
// ended.
type Hold struct {
	id      string
	k       *Keeper
	phantom bool // granted by fail-open without Redis: it holds no slot
	lost    chan struct{}

	mu sync.Mutex
	// last is the renewal sent last (the refreshes come every last.ttl/3),
	// lease the one whose lease ends last: the hold is given up at
	// lease.end(). As Redis never brings a hold's expiry forward, each
	// renewal that succeeded keeps it there at least its ttl past its send.
	last, lease renewal
	refreshing  int   // refreshes on their way
	lastErr     error // of the last refresh, if it failed: why the lease ran out
	released    bool  // Release was called: the work is over, no more refreshes
	freed       bool  // Redis answered the release
	err         error // why the hold was lost; nil while it is not
	// stopRefresh and stopLease stop the timers of the next automatic
	// refresh and of the lease's end; nil while none is set.
	stopRefresh, stopLease func() bool
}

// renewal is a grant or a refresh that succeeded: when it was sent, on the
// Client's clock, and the TTL Redis gave the hold.
type renewal struct {
	sent time.Time
	ttl  time.Duration
}

// end is when the holder gives the hold up, unless renewed again before.
func (r renewal) end() time.Time { return r.sent.Add(r.ttl - LeaseMargin(r.ttl)) }

// Granted is the hold id that Redis granted with ttl to a call sent at
// sent: its refreshes and its lease start now.
func Granted(k *Keeper, id string, sent time.Time, ttl time.Duration) *Hold {
	r := renewal{sent: sent, ttl: ttl}
	h := &Hold{id: id, k: k, last: r, lease: r, lost: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.scheduleLocked()
	h.stopLease = k.after(r.end().Sub(k.Clock()), h.leaseTimer)
	return h
}

// Phantom is a hold granted open, without Redis: it holds no slot, and its
// Refresh and Release do nothing.
func Phantom(id string) *Hold {
	return &Hold{id: id, phantom: true, lost: make(chan struct{})}
}

// ID is the hold's id.
func (h *Hold) ID() string { return h.id }

// Phantom reports whether the hold was granted open, holding no slot.
func (h *Hold) Phantom() bool { return h.phantom }

// Lost is closed when the hold is lost.
func (h *Hold) Lost() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checkLeaseLocked()
	return h.lost
}

// Err is why the hold was lost, or nil.
func (h *Hold) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checkLeaseLocked()
	return h.err
}

// Refresh extends the hold to its TTL from now. A hold lost stays lost; any
// other error leaves the hold as it was, its lease running on.
func (h *Hold) Refresh(ctx context.Context) error {
	if h.phantom {
		return nil
	}
	h.mu.Lock()
	h.checkLeaseLocked()
	released, err := h.released, h.err
	if err == nil && !released {
		h.refreshing++
	}
	h.mu.Unlock()
	if err != nil {
		return err
	}
	if released {
		return fmt.Errorf("%w: %s was released", wire.ErrHoldLost, h.id)
	}
	sent := h.k.Clock()
	reply, err := h.k.Refresh(ctx, h.id)
	var state int64
	var ttl time.Duration
	if err == nil {
		state, ttl, err = ParseRefresh(reply)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshing--
	h.checkLeaseLocked()
	switch {
	case h.err != nil:
		// Given up while this refresh was on its way: its holder was told,
		// and a late reply does not take that back. A slot it kept in
		// Redis, or may have, must not stay taken for a TTL for no one.
		if err == nil && state == wire.HoldHeld || err != nil && MayHaveRun(err) {
			h.giveBackLocked()
		}
		return h.err
	case h.released:
		if err == nil && state != wire.HoldHeld {
			err = fmt.Errorf("%w: %s was released", wire.ErrHoldLost, h.id)
		}
		return err
	case err != nil:
		h.lastErr = err
		return err
	case state != wire.HoldHeld:
		h.loseLocked(h.goneLocked(state, "refresh"))
		return h.err
	}
	h.lastErr = nil
	r := renewal{sent: sent, ttl: ttl}
	if !sent.Before(h.last.sent) {
		h.last = r
	}
	if r.end().After(h.lease.end()) {
		h.lease = r
	}
	return nil
}

// Release gives the slot back, once Redis answers; it returns an error
// wrapping ErrHoldLost when the hold was lost before it.
func (h *Hold) Release(ctx context.Context) error {
	h.mu.Lock()
	if h.freed {
		h.mu.Unlock()
		return nil
	}
	// Work that ends after the lease ran out ran for a while without it.
	h.checkLeaseLocked()
	h.released = true
	h.stopTimersLocked()
	h.mu.Unlock()
	if h.phantom {
		return nil
	}
	reply, err := h.k.Release(ctx, h.id)
	if err != nil {
		return err
	}
	state, err := ParseRelease(reply)
	if err != nil {
		return err
	}
	h.k.Released()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.freed = true
	if state != wire.HoldHeld {
		h.loseLocked(h.goneLocked(state, "release"))
	}
	return h.err
}

// goneLocked says why a hold that Redis no longer held (state, as op found
// it) was lost while its lease ran: Redis's clock, or its data, or an
// operator, and never the holder's refreshes.
func (h *Hold) goneLocked(state int64, op string) error {
	if state == wire.HoldExpired {
		return fmt.Errorf("%w: %s had expired in Redis before its %s, though its lease had not run out: Redis's clock ran ahead of this holder's",
			wire.ErrHoldLost, h.id, op)
	}
	return fmt.Errorf("%w: %s was no longer held at its %s, though its lease had not run out: dropped by Reset or Delete, or lost with Redis's data (a restart, a failover), or expired by a Redis clock ahead of this holder's",
		wire.ErrHoldLost, h.id, op)
}

// checkLeaseLocked loses the hold if its lease has run out by the Client's
// clock. Every call on the Hold looks, so that what it says does not wait
// for the lease's timer.
func (h *Hold) checkLeaseLocked() {
	if h.phantom || h.released || h.err != nil || h.k.Clock().Before(h.lease.end()) {
		return
	}
	m := LeaseMargin(h.lease.ttl)
	why := fmt.Errorf("%w: %s: no refresh succeeded within %v of its last renewal's send (its TTL of %v less a margin of %v): its lease ran out",
		wire.ErrHoldLost, h.id, h.lease.ttl-m, h.lease.ttl, m)
	switch {
	case h.lastErr != nil:
		why = fmt.Errorf("%w; the last refresh failed: %w", why, h.lastErr)
	case h.refreshing > 0:
		why = fmt.Errorf("%w; a refresh is still waiting for Redis", why)
	}
	h.loseLocked(why)
}

// leaseTimer is the lease's timer: it loses the hold at the lease's end,
// or, renewed since it was set (or on a WithClock clock behind the timers),
// looks again when the lease should end.
func (h *Hold) leaseTimer() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checkLeaseLocked()
	if h.released || h.err != nil {
		return
	}
	// At least a millisecond: a clock that stands still (a test's) must not
	// have the timer spin.
	h.stopLease = h.k.after(max(h.lease.end().Sub(h.k.Clock()), time.Millisecond), h.leaseTimer)
}

// giveBackLocked releases the hold in Redis for a holder that gave it up
// while a refresh that may have renewed it was on its way: at the end of
// its last renewal's TTL, when the slot would have come back had the
// refresh never reached Redis, so that the holder keeps the margin it was
// promised to stop in. Nothing is sent if the holder's own release came.
func (h *Hold) giveBackLocked() {
	giveBack := func() {
		h.mu.Lock()
		freed := h.freed
		h.mu.Unlock()
		if !freed {
			h.k.ReleaseAlone(h.id)
		}
	}
	if d := h.lease.sent.Add(h.lease.ttl).Sub(h.k.Clock()); d > 0 {
		h.k.after(d, giveBack)
		return
	}
	go giveBack()
}

// loseLocked marks the hold lost for why, once.
func (h *Hold) loseLocked(why error) {
	if h.err != nil {
		return
	}
	h.err = why
	close(h.lost)
	h.stopTimersLocked()
}

func (h *Hold) stopTimersLocked() {
	for _, stop := range []func() bool{h.stopRefresh, h.stopLease} {
		if stop != nil {
			stop()
		}
	}
}

// scheduleLocked sets the timer of the next automatic refresh.
func (h *Hold) scheduleLocked() {
	every := h.k.RefreshEvery
	if every < 0 {
		return
	}
	if every == 0 {
		every = max(h.last.ttl/3, time.Millisecond)
	}
	h.stopRefresh = h.k.after(every, h.autoRefresh)
}

// autoRefresh is the timer's refresh. One that fails is tried again at the
// next tick; the lease, on a timer of its own, decides when to give up.
func (h *Hold) autoRefresh() {
	h.mu.Lock()
	stop, ttl := h.released || h.err != nil, h.last.ttl
	h.mu.Unlock()
	if stop {
		return
	}
	// No longer than a tick, where the context bounds the call (go-redis's
	// ContextTimeoutEnabled): a Redis that hangs must not hold up the next.
	ctx, cancel := context.WithTimeout(context.Background(), max(ttl/3, time.Millisecond))
	_ = h.Refresh(ctx)
	cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.released && h.err == nil {
		h.scheduleLocked()
	}
}
