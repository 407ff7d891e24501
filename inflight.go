package redlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redlimit/redlimit/internal/wire"
)

// In-flight limits: at most Limit holders at once, across every instance,
// where a rate limit counts what was granted per interval. The whole
// decision is scripts/inflight.lua, run as every other script is (Client.run).

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

const (
	// maxInFlightLimit bounds Limit: an acquire removes every hold that has
	// expired in one call, and a crash of every holder leaves Limit of them.
	// Removing 100,000 takes Redis some tens of milliseconds.
	maxInFlightLimit = wire.MaxInFlightLimit
	// inFlightPoll is the longest a waiting Acquire sleeps between attempts:
	// a holder that releases early tells no one, so waiters look again.
	inFlightPoll = 20 * time.Millisecond
	// minInFlightTTL bounds TTL from below: a hold's lease ends
	// leaseMargin(TTL) before its TTL does, and below 10ms the margin would
	// leave no time for a refresh (every TTL/3) to renew it in.
	minInFlightTTL = wire.MinTTLMS * time.Millisecond
)

// leaseMargin is how long before its TTL runs out, counted from when its
// last renewal was sent, a holder gives its hold up (Hold): a tenth of the
// TTL for the holder's clock and Redis's running at different rates (quartz
// is within 0.01%, NTP slews by at most 0.05%: a tenth is far more than
// either) and for the lease's timer firing late on a busy machine; and 2ms
// because Redis keeps expiries in whole milliseconds, the start rounded down
// (up to 1ms early), and for a millisecond of the clocks' own reading.
func leaseMargin(ttl time.Duration) time.Duration { return ttl/10 + 2*time.Millisecond }

// What the script says of a hold on a refresh or a release (internal/wire).
const holdGone, holdHeld, holdExpired = wire.HoldGone, wire.HoldHeld, wire.HoldExpired

// The in-flight script's arguments are wire.InFlightOp …: see internal/wire.
const (
	inflightArgOp, inflightArgNow, inflightArgHold, inflightArgConfig = wire.InFlightOp, wire.InFlightNow, wire.InFlightHold, wire.InFlightConfig

	// inflightAlgorithm is the name the config hash stores (its algorithm
	// field) and observers see.
	inflightAlgorithm = wire.InFlightAlgorithm
)

// The in-flight script's ops, boxed once.
var (
	opAcquire, opRefresh, opHolders, opHoldRelease any = string(wire.OpAcquire), string(wire.OpRefresh), string(wire.OpHolders), string(wire.OpHoldRelease)
	opGet, opSet, opTrySet, opDelete, opReset          = any(string(wire.OpGet)), any(string(wire.OpSet)), any(string(wire.OpTrySet)), any(string(wire.OpDelete)), any(string(wire.OpReset))
	sourceDefault, sourceNew                           = string(wire.SourceDefault), string(wire.SourceNew)
	inflightScript                                     = scripts.InFlight
)

// InFlight returns a handle on the in-flight limit called name (with the
// Client's prefix). Its keys are built here, once.
func (c *Client) InFlight(name string) *InFlight {
	full := wire.FullName(c.prefix, name)
	l := &InFlight{client: c, name: full, config: noArg}
	if err := validName(c.prefix, name, full); err != nil {
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
func (l *InFlight) Validate(cfg InFlightConfig) error {
	switch {
	case cfg.Limit < 1 || cfg.Limit > maxInFlightLimit:
		return invalid("limit %d is outside 1..%d", cfg.Limit, maxInFlightLimit)
	case cfg.TTL < time.Millisecond:
		return invalid("ttl %v is below 1ms", cfg.TTL)
	case cfg.TTL%time.Millisecond != 0:
		return invalid("ttl %v is not a whole number of milliseconds", cfg.TTL)
	case cfg.TTL < minInFlightTTL:
		return invalid("ttl %v is below %v: a hold's lease would leave no time to refresh it in", cfg.TTL, minInFlightTTL)
	case cfg.TTL > maxInterval:
		return invalid("ttl %v is above %v", cfg.TTL, maxInterval)
	}
	return nil
}

// WithDefault returns a handle that uses cfg while no config is stored in
// Redis. It makes no round trip and stores nothing; SetLimit does. An
// invalid cfg gives a handle whose every call fails with the reason.
func (l *InFlight) WithDefault(cfg InFlightConfig) *InFlight {
	d := *l
	if err := l.Validate(cfg); err != nil {
		d.err = errors.Join(d.err, err)
		return &d
	}
	d.dflt, d.config = cfg, cfg.arg(sourceDefault)
	return &d
}

// arg encodes cfg for the script: source, limit, ttl in ms.
func (cfg InFlightConfig) arg(source string) string {
	return source + " " + strconv.FormatInt(cfg.Limit, 10) + " " + strconv.FormatInt(cfg.TTL.Milliseconds(), 10)
}

// SetLimit stores cfg, replacing any stored config. Holds are kept: with a
// lower Limit, those above it finish (no one is evicted) and acquires wait
// until fewer than the new Limit remain; a new TTL applies from each hold's
// next refresh.
func (l *InFlight) SetLimit(ctx context.Context, cfg InFlightConfig) error {
	_, err := l.store(ctx, opSet, cfg)
	return err
}

// TrySetLimit stores cfg unless a config is stored already, and reports
// whether it did: every instance can call it at start-up, and an operator's
// SetLimit is kept.
func (l *InFlight) TrySetLimit(ctx context.Context, cfg InFlightConfig) (bool, error) {
	return l.store(ctx, opTrySet, cfg)
}

func (l *InFlight) store(ctx context.Context, op any, cfg InFlightConfig) (bool, error) {
	if err := l.Validate(cfg); err != nil {
		return false, err
	}
	reply, err := l.eval(ctx, op, noArg, cfg.arg(sourceNew))
	if err != nil {
		return false, err
	}
	return zeroOrOne(reply)
}

// Config returns the stored config, or the handle's default when none is
// stored.
func (l *InFlight) Config(ctx context.Context) (InFlightConfig, error) {
	reply, err := l.eval(ctx, opGet, noArg, noArg)
	if err != nil {
		return InFlightConfig{}, err
	}
	v, ok := reply.([]any)
	if ok && len(v) == 0 {
		if l.dflt.Limit == 0 {
			return InFlightConfig{}, fmt.Errorf("%w: %s", ErrNotInitialized, l.name)
		}
		return l.dflt, nil
	}
	var n [2]int64
	if !ok || len(v) != len(n) || !integers(v, n[:]) {
		return InFlightConfig{}, unexpected(reply)
	}
	cfg := InFlightConfig{Limit: n[0], TTL: time.Duration(n[1]) * time.Millisecond}
	if l.Validate(cfg) != nil {
		return InFlightConfig{}, unexpected(reply)
	}
	return cfg, nil
}

// Delete removes the config and every hold, and reports whether there were
// any. Holders still working are not told: their next refresh or release
// finds their hold gone, and says it was dropped (Hold.Err).
func (l *InFlight) Delete(ctx context.Context) (bool, error) {
	reply, err := l.eval(ctx, opDelete, noArg, noArg)
	if err != nil {
		return false, err
	}
	return zeroOrOne(reply)
}

// Reset drops every hold and keeps the config, and reports whether there
// were holds: for an operator clearing slots whose holders are gone, or
// stuck. Their holders are not told at once: each finds its hold lost
// (ErrHoldLost, saying it was dropped) on its next refresh or release.
func (l *InFlight) Reset(ctx context.Context) (bool, error) {
	reply, err := l.eval(ctx, opReset, noArg, noArg)
	if err != nil {
		return false, err
	}
	return zeroOrOne(reply)
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
	reply, err := l.eval(ctx, opHolders, noArg, noArg)
	if err != nil {
		return nil, err
	}
	v, ok := reply.([]any)
	if !ok || len(v)%2 != 0 {
		return nil, unexpected(reply)
	}
	holders := make([]Holder, 0, len(v)/2)
	for i := 0; i < len(v); i += 2 {
		id, ok1 := v[i].(string)
		ms, ok2 := v[i+1].(int64)
		if !ok1 || !ok2 || ms < 0 || ms > maxInterval.Milliseconds() {
			return nil, unexpected(reply)
		}
		holders = append(holders, Holder{ID: id, TTL: time.Duration(ms) * time.Millisecond})
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
	line := l.client.waitingLine(l.name)
	turn := line.join()
	defer l.client.leaveLine(l.name, line, turn)
	gaveUp := func() error {
		return fmt.Errorf("redlimit: no slot of %s came free in time: %w", l.name, context.Cause(ctx))
	}
	select {
	case <-turn.ready:
	case <-ctx.Done():
		return nil, gaveUp()
	}
	id := l.newHoldID()
	for {
		h, wait, err := l.try(ctx, id)
		if err != nil {
			// Redis failing (or this caller giving up) says nothing of the
			// others: each asks for itself now, as in a line of one, rather
			// than wait its turn behind calls that may each time out.
			line.scatter()
			l.abandon(id, err)
			return nil, err
		}
		if h != nil {
			if h.phantom { // granted open: so will the others be
				line.scatter()
			}
			return h, nil
		}
		// The jitter keeps processes that wait on one limit from asking
		// in step.
		pause := min(wait, inFlightPoll) + rand.N(inFlightPoll/4)
		if err := line.sleep(ctx, l.client, pause); err != nil {
			return nil, gaveUp()
		}
	}
}

// waitingLine is the Acquires of one Client waiting on one in-flight limit,
// in the order they came: the first asks Redis, the others wait their
// turn (InFlight.Acquire).
type waitingLine struct {
	mu      sync.Mutex
	waiters []*waiter
	users   int // Acquires holding the line, to drop it when none does
	// freed wakes the first waiter early: a hold of this Client was released.
	freed chan struct{}
}

type waiter struct {
	ready   chan struct{} // closed when it is its turn: first in line, or the line scattered
	started bool          // ready is closed
}

// start gives w its turn, once; q.mu is held.
func (w *waiter) start() {
	if !w.started {
		w.started = true
		close(w.ready)
	}
}

// scatter gives every waiter its turn at once (see Acquire).
func (q *waitingLine) scatter() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, w := range q.waiters {
		w.start()
	}
}

// waitingLine returns the line for name, made when the first comes.
func (c *Client) waitingLine(name string) *waitingLine {
	c.linesMu.Lock()
	defer c.linesMu.Unlock()
	line := c.lines[name]
	if line == nil {
		if c.lines == nil {
			c.lines = map[string]*waitingLine{}
		}
		line = &waitingLine{freed: make(chan struct{}, 1)}
		c.lines[name] = line
	}
	line.users++
	return line
}

// join puts a waiter at the end of the line; its ready is closed at once
// when it is first.
func (q *waitingLine) join() *waiter {
	w := &waiter{ready: make(chan struct{})}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiters = append(q.waiters, w)
	if len(q.waiters) == 1 {
		w.start()
	}
	return w
}

// leaveLine takes w out of the line (first or not) and, if it was first,
// gives the next its turn; the line goes once no Acquire holds it.
func (c *Client) leaveLine(name string, q *waitingLine, w *waiter) {
	q.mu.Lock()
	if i := slices.Index(q.waiters, w); i >= 0 {
		q.waiters = slices.Delete(q.waiters, i, i+1)
		if i == 0 && len(q.waiters) > 0 {
			q.waiters[0].start()
		}
	}
	q.mu.Unlock()
	c.linesMu.Lock()
	defer c.linesMu.Unlock()
	if q.users--; q.users == 0 {
		delete(c.lines, name)
	}
}

// sleep waits d (on the Client's clock), or until a hold of this Client is
// released (freed), or ctx ends: then it returns ctx's error.
func (q *waitingLine) sleep(ctx context.Context, c *Client, d time.Duration) error {
	woken, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-q.freed:
			stop()
		case <-done:
		}
	}()
	_ = c.sleep(woken, d)
	return ctx.Err()
}

// released tells the first waiter on name, if any, that a slot came free.
func (c *Client) released(name string) {
	c.linesMu.Lock()
	line := c.lines[name]
	c.linesMu.Unlock()
	if line != nil {
		select {
		case line.freed <- struct{}{}:
		default: // told already
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
	var ttl time.Duration
	reply, err := l.eval(ctx, opAcquire, id, l.config)
	if err == nil {
		r, ttl, err = parseAcquire(reply)
	}
	failOpen := c.grantsOpen(ctx, err, false)
	if failOpen {
		r = Result{Allowed: true, Reason: ReasonFailOpen}
	}
	if c.observe != nil {
		c.observe(Decision{Limiter: l.name, Algorithm: inflightAlgorithm, Permits: 1, Result: r, Err: err, Latency: time.Since(start)})
	}
	switch {
	case failOpen:
		h := &Hold{l: l, id: id, phantom: true, lost: make(chan struct{})}
		return h, 0, nil
	case err != nil:
		return nil, 0, err
	case !r.Allowed:
		return nil, r.RetryAfter, nil
	}
	return l.newHold(id, renewal{sent: sent, ttl: ttl}), 0, nil
}

// parseAcquire reads an acquire's reply: {1, ttl ms, limit} or {0, wait
// ms, limit}. It returns the decision and, granted, the hold's TTL.
func parseAcquire(reply any) (Result, time.Duration, error) {
	v, ok := reply.([]any)
	var n [3]int64
	if !ok || len(v) != len(n) || !integers(v, n[:]) || n[0] != 0 && n[0] != 1 ||
		n[1] < 0 || n[1] > maxInterval.Milliseconds() || n[2] < 1 || n[2] > maxInFlightLimit {
		return Result{}, 0, unexpected(reply)
	}
	d := time.Duration(n[1]) * time.Millisecond
	if n[0] == 1 {
		if d == 0 {
			return Result{}, 0, unexpected(reply)
		}
		return Result{Allowed: true, Limit: n[2]}, d, nil
	}
	return Result{Limit: n[2], RetryAfter: d}, 0, nil
}

// abandon releases, in the background, the hold id that a call that failed
// with err may have taken all the same: Redis may have run the script and
// its reply been lost (a timeout, a cancelled context). An error that says
// the script never ran, or did not grant, needs nothing.
func (l *InFlight) abandon(id string, err error) {
	if !mayHaveRun(err) || l.err != nil {
		return
	}
	go l.releaseID(id)
}

// mayHaveRun reports whether a call that failed with err may have run in
// Redis all the same, its reply lost: a timeout, a cancelled context.
func mayHaveRun(err error) bool {
	return errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrBreakerOpen) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// releaseID releases the hold id for no one waiting: a second bounds it.
func (l *InFlight) releaseID(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = l.eval(ctx, opHoldRelease, id, noArg)
}

// after runs f once d has passed (afterFunc), and returns what stops it.
func (l *InFlight) after(d time.Duration, f func()) func() bool {
	if l.afterFunc != nil {
		return l.afterFunc(d, f)
	}
	return time.AfterFunc(d, f).Stop
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
	args := make([]any, inflightArgConfig)
	args[inflightArgOp-1], args[inflightArgNow-1], args[inflightArgHold-1], args[inflightArgConfig-1] = op, now, id, config
	return l.client.run(ctx, inflightScript, l.keys, args)
}

// zeroOrOne reads a reply of 0 or 1.
func zeroOrOne(reply any) (bool, error) {
	n, ok := reply.(int64)
	if !ok || n != 0 && n != 1 {
		return false, unexpected(reply)
	}
	return n == 1, nil
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
type Hold struct {
	l       *InFlight
	id      string
	phantom bool // granted by WithFailOpen without Redis: it holds no slot
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
func (r renewal) end() time.Time { return r.sent.Add(r.ttl - leaseMargin(r.ttl)) }

func (l *InFlight) newHold(id string, r renewal) *Hold {
	h := &Hold{l: l, id: id, last: r, lease: r, lost: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.scheduleLocked()
	h.stopLease = l.after(r.end().Sub(l.client.clock()), h.leaseTimer)
	return h
}

// ID returns the hold's id, as Holders lists it.
func (h *Hold) ID() string { return h.id }

// Lost is closed when the hold is lost (see Hold). It is never closed for a
// hold released in time.
func (h *Hold) Lost() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checkLeaseLocked()
	return h.lost
}

// Err returns nil while the hold is held or once it was released in time,
// and an error wrapping ErrHoldLost once it was lost.
func (h *Hold) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checkLeaseLocked()
	return h.err
}

// Refresh extends the hold to TTL from now. The Hold does it by itself every
// TTL/3; call it to extend it sooner. A hold lost (its lease ran out, or
// Redis found it gone) stays lost: Refresh returns an error wrapping
// ErrHoldLost, and Lost is closed. Any other error (Redis unavailable)
// leaves the hold as it was, its lease running on.
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
		return fmt.Errorf("%w: %s was released", ErrHoldLost, h.id)
	}
	sent := h.l.client.clock()
	reply, err := h.l.eval(ctx, opRefresh, h.id, h.l.config)
	var state int64
	var ttl time.Duration
	if err == nil {
		state, ttl, err = parseRefresh(reply)
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
		if err == nil && state == holdHeld || err != nil && mayHaveRun(err) {
			h.giveBackLocked()
		}
		return h.err
	case h.released:
		if err == nil && state != holdHeld {
			err = fmt.Errorf("%w: %s was released", ErrHoldLost, h.id)
		}
		return err
	case err != nil:
		h.lastErr = err
		return err
	case state != holdHeld:
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

// parseRefresh reads a refresh's reply: {HELD, ttl ms}, or {GONE or
// EXPIRED, 0}.
func parseRefresh(reply any) (int64, time.Duration, error) {
	v, ok := reply.([]any)
	var n [2]int64
	if ok && len(v) == len(n) && integers(v, n[:]) {
		switch {
		case n[0] == holdHeld && n[1] >= minInFlightTTL.Milliseconds() && n[1] <= maxInterval.Milliseconds():
			return holdHeld, time.Duration(n[1]) * time.Millisecond, nil
		case (n[0] == holdGone || n[0] == holdExpired) && n[1] == 0:
			return n[0], 0, nil
		}
	}
	return 0, 0, unexpected(reply)
}

// Release gives the slot back. It returns an error wrapping ErrHoldLost when
// the hold was lost before it (see Hold): its slot was given back all the
// same, or is now. Any other error (Redis unavailable) leaves the slot taken
// until the TTL passes, as refreshes stop; calling Release again tries
// again. Once Redis has answered, Release does nothing more.
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
	reply, err := h.l.eval(ctx, opHoldRelease, h.id, noArg)
	if err != nil {
		return err
	}
	state, ok := reply.(int64)
	if !ok || state != holdGone && state != holdHeld && state != holdExpired {
		return unexpected(reply)
	}
	h.l.client.released(h.l.name)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.freed = true
	if state != holdHeld {
		h.loseLocked(h.goneLocked(state, "release"))
	}
	return h.err
}

// goneLocked says why a hold that Redis no longer held (state, as op found
// it) was lost while its lease ran: Redis's clock, or its data, or an
// operator, and never the holder's refreshes.
func (h *Hold) goneLocked(state int64, op string) error {
	if state == holdExpired {
		return fmt.Errorf("%w: %s had expired in Redis before its %s, though its lease had not run out: Redis's clock ran ahead of this holder's",
			ErrHoldLost, h.id, op)
	}
	return fmt.Errorf("%w: %s was no longer held at its %s, though its lease had not run out: dropped by Reset or Delete, or lost with Redis's data (a restart, a failover), or expired by a Redis clock ahead of this holder's",
		ErrHoldLost, h.id, op)
}

// checkLeaseLocked loses the hold if its lease has run out by the Client's
// clock. Every call on the Hold looks, so that what it says does not wait
// for the lease's timer.
func (h *Hold) checkLeaseLocked() {
	if h.phantom || h.released || h.err != nil || h.l.client.clock().Before(h.lease.end()) {
		return
	}
	m := leaseMargin(h.lease.ttl)
	why := fmt.Errorf("%w: %s: no refresh succeeded within %v of its last renewal's send (its TTL of %v less a margin of %v): its lease ran out",
		ErrHoldLost, h.id, h.lease.ttl-m, h.lease.ttl, m)
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
	h.stopLease = h.l.after(max(h.lease.end().Sub(h.l.client.clock()), time.Millisecond), h.leaseTimer)
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
			h.l.releaseID(h.id)
		}
	}
	if d := h.lease.sent.Add(h.lease.ttl).Sub(h.l.client.clock()); d > 0 {
		h.l.after(d, giveBack)
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
	every := h.l.refreshEvery
	if every < 0 {
		return
	}
	if every == 0 {
		every = max(h.last.ttl/3, time.Millisecond)
	}
	h.stopRefresh = h.l.after(every, h.autoRefresh)
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
