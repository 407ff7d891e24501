package redlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redlimit/redlimit/internal/inflight"
	"github.com/redlimit/redlimit/internal/wire"
)

// In-flight limits: at most Limit holders at once, across every instance,
// where a rate limit counts what was granted per interval. The whole
// decision is scripts/inflight.lua, run as every other script is (Client.run);
// internal/inflight keeps the waiting lines and each hold's lease.

// InFlight is a handle on one named in-flight limit in Redis: at most Limit
// holds at once, whoever takes them. Acquire and TryAcquire take a Hold,
// which its holder releases when its work is done. A holder that crashes
// never releases: every hold therefore expires TTL after it was taken or
// last refreshed, and its slot comes back by itself then. A Hold refreshes
// itself every TTL/3 while held, so work may last longer than TTL; TTL is
// how long a crashed holder's slot stays taken. A holder cut off from Redis
// gives its hold up on its own clock before Redis can hand the slot on (see
// Hold).
//
// The config lives in Redis, as a rate's does (SetLimit, TrySetLimit), with
// the handle's default (WithDefault) in force while none is stored. A lower
// Limit evicts no one: the holds above it finish, and new ones wait until
// fewer than the new Limit remain.
//
// Like a Limiter, it holds no state of its own and is safe for concurrent
// use; the Redis keys are the config hash (Name) and the holds, a sorted
// set of hold ids scored by their expiry, named Name + ":holders" (with
// Redisson's braces, in one Cluster slot) and expiring with the latest
// hold. Being full is not an error: TryAcquire returns no Hold and no error.
type InFlight struct {
	client *Client
	name   string
	keys   []any // the config hash, the holds: as scripts/inflight.lua names them
	// config is ARGV[CONFIG]: noArg (the stored config only) or the
	// default's, "default limit ttl".
	config any
	dflt   InFlightConfig
	err    error
	// refreshEvery is how often holds refresh themselves: 0 for TTL/3,
	// negative for never (tests on a controlled clock).
	refreshEvery time.Duration
	// afterFunc runs f once d has passed: nil for time.AfterFunc. Tests on a
	// controlled clock set one that fires as they move that clock.
	afterFunc func(d time.Duration, f func()) (stop func() bool)
}

// InFlightConfig is an in-flight limit's config.
type InFlightConfig struct {
	Limit int64 // holds at once, 1 to 100,000
	// TTL is how long a hold lasts unless refreshed: how long a crashed
	// holder keeps its slot. At least 10ms, a whole number of milliseconds;
	// a Hold refreshes itself every TTL/3, and gives itself up TTL/10 + 2ms
	// before its TTL runs out unless a refresh succeeds (see Hold).
	TTL time.Duration
}

func (cfg InFlightConfig) String() string {
	return fmt.Sprintf("%d in flight, %v each unless refreshed", cfg.Limit, cfg.TTL)
}

// inFlightPoll is the longest a waiting Acquire sleeps between attempts:
// a holder that releases early tells no one, so waiters look again.
const inFlightPoll = 20 * time.Millisecond

// InFlight returns a handle on the in-flight limit called name (with the
// Client's prefix). Its keys are built here, once.
func (c *Client) InFlight(name string) *InFlight {
	full, err := wire.CheckedName(c.prefix, name)
	l := &InFlight{client: c, name: full, config: noArg}
	if err != nil {
		l.err = err
		return l
	}
	l.keys = []any{full, wire.KeyOf(full, wire.SuffixHolders)}
	return l
}

// Name returns the limit's full name (with the Client's prefix): the key of its config hash.
func (l *InFlight) Name() string { return l.name }

// Validate reports why cfg cannot be an in-flight config, wrapping
// ErrInvalidConfig. SetLimit, TrySetLimit and WithDefault check the same.
func (l *InFlight) Validate(cfg InFlightConfig) error { return inflight.Validate(cfg.Limit, cfg.TTL) }

// WithDefault returns a handle that uses cfg while no config is stored in
// Redis. It makes no round trip and stores nothing; SetLimit does. An
// invalid cfg gives a handle whose every call fails with the reason.
func (l *InFlight) WithDefault(cfg InFlightConfig) *InFlight {
	d := *l
	if err := l.Validate(cfg); err != nil {
		d.err = errors.Join(d.err, err)
		return &d
	}
	d.dflt, d.config = cfg, inflight.ConfigArg(wire.SourceDefault, cfg.Limit, cfg.TTL)
	return &d
}

// SetLimit stores cfg, replacing any stored config. Holds are kept: with a
// lower Limit, those above it finish (no one is evicted) and acquires wait
// until fewer than the new Limit remain; a new TTL applies from each hold's
// next refresh.
func (l *InFlight) SetLimit(ctx context.Context, cfg InFlightConfig) error {
	_, err := l.store(ctx, inflight.OpSet, cfg)
	return err
}

// TrySetLimit stores cfg unless a config is stored already, and reports
// whether it did: every instance can call it at start-up, and an operator's
// SetLimit is kept.
func (l *InFlight) TrySetLimit(ctx context.Context, cfg InFlightConfig) (bool, error) {
	return l.store(ctx, inflight.OpTrySet, cfg)
}

func (l *InFlight) store(ctx context.Context, op any, cfg InFlightConfig) (bool, error) {
	if err := l.Validate(cfg); err != nil {
		return false, err
	}
	reply, err := l.eval(ctx, op, noArg, inflight.ConfigArg(wire.SourceNew, cfg.Limit, cfg.TTL))
	if err != nil {
		return false, err
	}
	return inflight.ZeroOrOne(reply)
}

// Config returns the stored config, or the handle's default when none is
// stored.
func (l *InFlight) Config(ctx context.Context) (InFlightConfig, error) {
	reply, err := l.eval(ctx, inflight.OpGet, noArg, noArg)
	if err != nil {
		return InFlightConfig{}, err
	}
	limit, ttl, found, err := inflight.ParseConfig(reply)
	switch {
	case err != nil:
		return InFlightConfig{}, err
	case found:
		return InFlightConfig{Limit: limit, TTL: ttl}, nil
	case l.dflt.Limit == 0:
		return InFlightConfig{}, fmt.Errorf("%w: %s", ErrNotInitialized, l.name)
	}
	return l.dflt, nil
}

// Delete removes the config and every hold, and reports whether there were
// any. Holders still working are not told: their next refresh or release
// finds their hold gone, and says it was dropped (Hold.Err).
func (l *InFlight) Delete(ctx context.Context) (bool, error) {
	reply, err := l.eval(ctx, inflight.OpDelete, noArg, noArg)
	if err != nil {
		return false, err
	}
	return inflight.ZeroOrOne(reply)
}

// Reset drops every hold and keeps the config, and reports whether there
// were holds: for an operator clearing slots whose holders are gone, or
// stuck. Their holders are not told at once: each finds its hold lost
// (ErrHoldLost, saying it was dropped) on its next refresh or release.
func (l *InFlight) Reset(ctx context.Context) (bool, error) {
	reply, err := l.eval(ctx, inflight.OpReset, noArg, noArg)
	if err != nil {
		return false, err
	}
	return inflight.ZeroOrOne(reply)
}

// Holder is one live hold, as Holders lists it.
type Holder struct {
	// ID is the hold's: the holding Client's ID (WithClientID), ':', then
	// random hex, so that an operator can tell which instance holds it.
	ID  string
	TTL time.Duration // until it expires, unless refreshed
}

// Holders lists the live holds, the one expiring first first. It writes
// nothing.
func (l *InFlight) Holders(ctx context.Context) ([]Holder, error) {
	reply, err := l.eval(ctx, inflight.OpHolders, noArg, noArg)
	if err != nil {
		return nil, err
	}
	hs, err := inflight.ParseHolders(reply)
	if err != nil {
		return nil, err
	}
	holders := make([]Holder, len(hs))
	for i, h := range hs {
		holders[i] = Holder(h)
	}
	return holders, nil
}

// TryAcquire takes a hold if fewer than Limit are held, without waiting. When
// Limit are held it returns no Hold and no error.
//
// With WithFailOpen, a Redis that cannot decide (ErrUnavailable) gives a
// Hold that holds no slot: its Release and Refresh do nothing.
func (l *InFlight) TryAcquire(ctx context.Context) (*Hold, error) {
	id := l.newHoldID()
	h, _, err := l.try(ctx, id)
	if err != nil {
		l.abandon(id, err)
	}
	return h, err
}

// Acquire takes a hold, waiting until one is free or ctx ends. The waiters
// of one Client line up by name, first come first served: only the first
// asks Redis, when the earliest hold expires, at once when a hold of this
// Client is released, and every 20ms meanwhile (a holder elsewhere that
// releases early tells no one); once it holds, the next asks at once. So a
// full limit costs Redis one call per 20ms per process, however many wait.
// Every attempt of one Acquire asks for the same hold, so a reply lost on
// the way (a timeout, a re-sent script) never costs a second slot; an
// Acquire that fails after a call that may have been granted releases that
// hold on its way out, in the background. When ctx ends first the error
// wraps ctx's.
func (l *InFlight) Acquire(ctx context.Context) (*Hold, error) {
	turn := l.client.lines.Join(l.name)
	defer turn.Leave()
	gaveUp := func() error {
		return fmt.Errorf("redlimit: no slot of %s came free in time: %w", l.name, context.Cause(ctx))
	}
	select {
	case <-turn.Ready():
	case <-ctx.Done():
		return nil, gaveUp()
	}
	id := l.newHoldID()
	for {
		h, wait, err := l.try(ctx, id)
		if err != nil {
			turn.Scatter() // Redis failing says nothing of the others
			l.abandon(id, err)
			return nil, err
		}
		if h != nil {
			if h.held.Phantom() { // granted open: so will the others be
				turn.Scatter()
			}
			return h, nil
		}
		// The jitter keeps processes that wait on one limit from asking
		// in step.
		pause := min(wait, inFlightPoll) + rand.N(inFlightPoll/4)
		if err := turn.Sleep(ctx, l.client.sleep, pause); err != nil {
			return nil, gaveUp()
		}
	}
}

// try makes one attempt to take the hold id: the Hold when granted, else
// the time until the earliest hold expires. It tells the observer.
func (l *InFlight) try(ctx context.Context, id string) (*Hold, time.Duration, error) {
	c := l.client
	start := time.Now()
	sent := c.clock()
	var r Result
	var a inflight.Acquire
	reply, err := l.eval(ctx, inflight.OpAcquire, id, l.config)
	if err == nil {
		a, err = inflight.ParseAcquire(reply)
		r = Result{Allowed: a.Granted, Limit: a.Limit, RetryAfter: a.Wait}
	}
	failOpen := c.grantsOpen(ctx, err, false)
	if failOpen {
		r = Result{Allowed: true, Reason: ReasonFailOpen}
	}
	if c.observe != nil {
		c.observe(Decision{Limiter: l.name, Algorithm: wire.InFlightAlgorithm, Permits: 1, Result: r, Err: err, Latency: time.Since(start)})
	}
	switch {
	case failOpen:
		return &Hold{inflight.Phantom(id)}, 0, nil
	case err != nil:
		return nil, 0, err
	case !r.Allowed:
		return nil, r.RetryAfter, nil
	}
	return &Hold{inflight.Granted(l.keeper(), id, sent, a.TTL)}, 0, nil
}

// abandon releases, in the background, the hold id that a call that failed
// with err may have taken all the same: Redis may have run the script and
// its reply been lost (a timeout, a cancelled context). An error that says
// the script never ran, or did not grant, needs nothing.
func (l *InFlight) abandon(id string, err error) {
	if !inflight.MayHaveRun(err) || l.err != nil {
		return
	}
	go l.keeper().ReleaseAlone(id)
}

// newHoldID names a hold after its Client, for operators (Holders).
func (l *InFlight) newHoldID() string {
	return l.client.clientID + ":" + randomHex(8)
}

// eval runs the in-flight script once.
func (l *InFlight) eval(ctx context.Context, op, id, config any) (any, error) {
	if l.err != nil {
		return nil, l.err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redlimit: %w", err)
	}
	now := noArg
	if l.client.now != nil {
		now = l.client.now().UnixMicro()
	}
	return l.client.run(ctx, scripts.InFlight, l.keys, inflight.Args(op, now, id, config))
}

// Hold is one slot of an InFlight limit, taken by Acquire or TryAcquire.
// Its holder calls Release when its work is done, with a context that is
// still live: Release must reach Redis, or the slot stays taken until the
// hold's TTL passes. It is safe for concurrent use.
//
// While held, a Hold refreshes itself every TTL/3 (with the TTL in force
// at each refresh), on a timer of its own; a refresh that fails is tried
// again a third of a TTL later. And it keeps a lease, as the holder of a
// lock does: counting on the Client's clock (the monotonic clock, or
// WithClock's) from when its last renewal that succeeded (the grant or a
// refresh) was sent, since Redis set the hold's expiry at some moment after
// that, it gives the hold up at
//
//	renewal + TTL − (TTL/10 + 2ms)
//
// unless a refresh has succeeded by then: whether refreshes fail, hang or
// were never made. With a TTL of 30s that is 26.998s after the last renewal
// was sent, 3.002s before Redis may hand the slot to another: Redis keeps
// the hold until at least renewal + TTL − 1ms by its own clock (it counts
// whole milliseconds), and a refresh never brings that forward. The margin,
// TTL/10 + 2ms, covers clocks whose rates differ by up to a tenth, and a
// lease timer that fires late on a busy machine. With WithClock, Redis
// counts on the instances' clocks instead of its own: they must agree to
// within the margin. A hold is lost too when a refresh or a release finds it
// no longer in Redis: dropped by Reset or Delete, or lost with Redis's data
// (a restart, a failover).
//
// Once lost, Lost is closed, Err says why (ErrHoldLost), and Release returns
// that error, so that a holder can tell that its work ran for a while
// without its slot; a hold once lost is never held again. Err and Lost read
// the clock themselves, so what they say is exact at the moment they are
// called, even when the lease's timer runs late. A refresh whose reply comes
// after the lease ran out leaves the hold lost: the slot it kept in Redis (or
// may have kept) is released at renewal + TTL, when it would have come back
// had that refresh never reached Redis.
//
// What no lease can cover: a holder paused (a long GC, a stopped VM) between
// reading Err and acting on it, Redis's clock stepping forward, and Redis
// losing its data. Work that must never overlap another's needs a check of
// its own where the work lands (a fencing token).
type Hold struct{ held *inflight.Hold }

// keeper is what the handle's holds ask of it (internal/inflight).
func (l *InFlight) keeper() *inflight.Keeper {
	c := l.client
	return &inflight.Keeper{
		Clock: c.clock, After: l.afterFunc, RefreshEvery: l.refreshEvery,
		Refresh: func(ctx context.Context, id string) (any, error) {
			return l.eval(ctx, inflight.OpRefresh, id, l.config)
		},
		Release:  func(ctx context.Context, id string) (any, error) { return l.eval(ctx, inflight.OpRelease, id, noArg) },
		Released: func() { c.lines.Released(l.name) },
	}
}

// ID returns the hold's id, as Holders lists it.
func (h *Hold) ID() string { return h.held.ID() }

// Lost is closed when the hold is lost (see Hold). It is never closed for a
// hold released in time.
func (h *Hold) Lost() <-chan struct{} { return h.held.Lost() }

// Err returns nil while the hold is held or once it was released in time,
// and an error wrapping ErrHoldLost once it was lost.
func (h *Hold) Err() error { return h.held.Err() }

// Refresh extends the hold to TTL from now. The Hold does it by itself every
// TTL/3; call it to extend it sooner. A hold lost (its lease ran out, or
// Redis found it gone) stays lost: Refresh returns an error wrapping
// ErrHoldLost, and Lost is closed. Any other error (Redis unavailable)
// leaves the hold as it was, its lease running on.
func (h *Hold) Refresh(ctx context.Context) error { return h.held.Refresh(ctx) }

// Release gives the slot back. It returns an error wrapping ErrHoldLost when
// the hold was lost before it (see Hold): its slot was given back all the
// same, or is now. Any other error (Redis unavailable) leaves the slot taken
// until the TTL passes, as refreshes stop; calling Release again tries
// again. Once Redis has answered, Release does nothing more.
func (h *Hold) Release(ctx context.Context) error { return h.held.Release(ctx) }
