// Package redlimit shares rate limits between the instances of a service
// through Redis. Every decision is made by a Lua script run with EVALSHA, so
// each takes one round trip and is atomic on the server; the decisions that
// arrive while a call is in flight go out together, in one.
//
// A Client wraps a go-redis client (any redis.Scripter: Client, ClusterClient,
// Ring, FailoverClient, AutoPipeliner). Its TokenBucket, Funnel, FixedWindow
// and SlidingWindow methods return Limiters, which all answer the same API,
// modelled on Redisson's RRateLimiter. A limiter's rate lives in Redis, so one
// instance can change it (SetRate) and every instance follows on its next call.
//
// Being denied is not an error: Allow reports it in its Result and TryAcquire
// returns false. Errors are sentinels, to be tested with errors.Is.
//
// Handles are cheap to make per request (c.Funnel(key).WithDefault(cfg)): a
// Client keeps the ones it made, by name, and the keys and arguments built
// for them, in a cache bounded to a few thousand names in use (about 22 MB
// at most), so a service with millions of keys makes no unbounded memory.
//
// The code reads in one direction: a Limiter's method (this file) runs its
// decision through the layers of pipeline.go (the handle's lease, the
// Client's cache of denials, Redis; then shadow mode, fail-open and the
// observer), which asks internal/evalsha to run the script with the
// arguments and reply internal/wire declares.
package redlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/calendar"
	"github.com/redlimit/redlimit/internal/degradedlocal"
	"github.com/redlimit/redlimit/internal/leasing"
	"github.com/redlimit/redlimit/internal/wire"
)

// Validate reports why cfg cannot be this limiter's config, wrapping
// ErrInvalidConfig: out of range, or a field its algorithm does not use
// (Burst is the funnel's, Buckets the sliding window's). SetRate, TrySetRate
// and WithDefault check the same; call it at start-up to catch a bad default
// there rather than on every call.
func (l *Limiter) Validate(cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if l.alg.Records {
		if err := cfg.validateLog(); err != nil {
			return err
		}
	}
	for _, r := range cfg.rates() {
		if r.Burst != 0 && l.alg.Own != wire.FieldBurst {
			return fmt.Errorf("%w: burst %d: only a funnel has a burst", ErrInvalidConfig, r.Burst)
		}
		if r.Buckets != 0 && l.alg.Own != wire.FieldBuckets {
			return fmt.Errorf("%w: buckets %d: only a sliding window has buckets", ErrInvalidConfig, r.Buckets)
		}
		if r.Calendar.Period != 0 && !l.alg.Calendar {
			return fmt.Errorf("%w: per %v: only a fixed window follows the calendar", ErrInvalidConfig, r.Calendar)
		}
	}
	return nil
}

// Limiter is a handle on one named limit in Redis. It holds no state of its
// own: any number of handles, in any number of processes, share the limit.
// It is safe for concurrent use. A Client keeps the handles it makes, by
// name, so a handle made per request (c.Funnel(key).WithDefault(cfg)) costs
// what one kept does.
type Limiter struct {
	client   *Client
	alg      *wire.Algorithm
	algArg   any // alg.Name, boxed once: a request's argument
	name     string
	keys     []string // wire.Algorithm.Keys: the whole list, this client's state last
	keyArgs  []any    // keys, boxed once: script arguments
	clientID any      // whose PerClient state keys[…] name, as a script argument
	family   *family
	// The config the scripts are given: none (source ""), the handle's
	// default (WithDefault: while none is stored), Throttle's (fixed,
	// whatever is stored) or SetRate's (new): config is its wire.ConfigArg,
	// and stored the same with wire.SourceStored (see family.hashed).
	source         wire.Source
	config, stored any
	dflt           Config
	dfltRates      []wire.Rate // dflt's, as replies give them
	err            error
	denial         string                 // its requests' key in the Client's cache of denials (setDenial)
	shadow         bool                   // WithShadow: every decision in shadow mode
	calendars      *calendar.Set          // the handle's config's calendar rates, or nil
	lease          *leasing.Lease[Result] // WithLease's blocks (lease.go), or nil
}

// family is what a Client keeps of one limiter, an algorithm under a name:
// the handle the algorithm's constructor returns, its keys built and boxed
// once, and what decisions learn of the limiter in Redis, shared by every
// handle on it however it was made. A service that makes a handle per
// request (c.Funnel(key).WithDefault(cfg)) so builds no keys and formats no
// config on the way, and its handles do not relearn what the last one knew.
type family struct {
	base Limiter
	// perClient: the limiter is known to be PerClient (or to have been), so
	// decisions send every key; until then they send the few an Overall
	// limiter uses.
	perClient atomic.Bool
	// hashed: the last decision met a hash at the limiter's key (a stored
	// config, or state kept as its fields), so the next one reads it as a
	// hash first (wire.SourceStored).
	hashed atomic.Bool
	// calendars: the calendar rates a script last named for the limiter
	// (wire.ReplyCalendar), or nil.
	calendars atomic.Pointer[calendar.Set]
	// full: the limiter needs the decision script (a stored config of
	// several rates, say): its decisions do not try the lean one.
	full atomic.Bool
	// withDefault is the latest handle base.WithDefault made, given again
	// for an equal config: one per family keeps them bounded, and a service
	// gives one name one default.
	withDefault atomic.Pointer[Limiter]
	// degraded: the config last seen in force, and the local state
	// (degraded.go, WithDegraded; internal/degradedlocal).
	degraded degradedlocal.Family[Config]
}

// familyKey names a family within its Client, whose prefix is the same for all.
type familyKey struct{ alg, name string }

// maxFamilies bounds the families a Client keeps. A service may make a
// limiter per user, millions of names, so they are kept in two generations
// (internal/generations): once the current one holds familiesPerGeneration
// and both together twice that, the current one becomes the previous one
// and the previous one is dropped. Limiters in use so stay however many
// names pass through; a set of up to twice familiesPerGeneration names in
// use (10,922: the bench's 10,000, walked in a cycle) is kept whole; and at
// most maxFamilies are kept at any moment: 1.4 KB each with a default
// handle and a short name (measured), 22 MB at most. A dropped family costs
// only its rebuilding, 30 to 50 allocations, and its relearning: one
// EVALSHA for a PerClient limiter, one failed read in the script for a
// stored config.
const (
	maxFamilies           = 3 * familiesPerGeneration
	familiesPerGeneration = 5461
)

// limiter returns the handle on the limiter alg keeps under name: its
// family's, made the first time.
func (c *Client) limiter(name string, alg *wire.Algorithm) *Limiter {
	key := familyKey{alg.Name, name}
	f, found, current := c.families.Get(key)
	if current {
		return &f.base
	}
	if !found {
		if f = c.newFamily(name, alg); f.base.err != nil {
			return &f.base // made again on every call: mistakes need no speed
		}
	}
	f, _ = c.families.Keep(key, f) // another caller's, if made meanwhile
	return &f.base
}

// newFamily makes the family of the limiter alg keeps under name, with its
// keys.
func (c *Client) newFamily(name string, alg *wire.Algorithm) *family {
	full, err := wire.CheckedName(c.prefix, name)
	f := &family{}
	f.base = Limiter{client: c, alg: alg, algArg: alg.Name, name: full, clientID: c.clientIDArg, config: "", family: f}
	if err != nil {
		f.base.err = err
		return f
	}
	f.base.keys = alg.Keys(full, c.clientID)
	f.base.keyArgs = boxed(f.base.keys)
	f.base.setDenial()
	return f
}

func boxed(keys []string) []any {
	b := make([]any, len(keys))
	for i, k := range keys {
		b[i] = k
	}
	return b
}

// Name returns the limiter's full name (with the Client's prefix): the key of its config hash.
func (l *Limiter) Name() string { return l.name }

// Algorithm returns the name its config hash stores for its algorithm, as
// observers see it: tokenbucket, funnel, fixed_window or sliding_window.
func (l *Limiter) Algorithm() string { return l.alg.Name }

// AsClient returns a handle on the same limiter as the client id sees it:
// with a PerClient config, its AvailablePermits (or Allow(ctx, 0)) reports
// that client's usage. For operators' tools; a service's own handles use
// WithClientID.
func (l *Limiter) AsClient(id string) *Limiter {
	d := *l
	if d.err != nil {
		return &d
	}
	d.clientID, d.lease = id, nil // a lease's block is its own client's
	d.keys = l.alg.Keys(l.name, id)
	d.keyArgs = boxed(d.keys)
	d.setDenial()
	return &d
}

// WithDefault returns a handle that uses cfg while no config is stored in
// Redis. It makes no extra round trip and stores nothing; SetRate does.
func (l *Limiter) WithDefault(cfg Config) *Limiter {
	f := l.family
	// The handles made from a family's own are kept, one: a service making
	// a handle per request gives the same config each time.
	own := l == &f.base
	if d := f.withDefault.Load(); own && d != nil && d.dflt.equal(cfg) {
		return d // validated when it was made
	}
	if err := l.Validate(cfg); err != nil {
		d := *l
		d.err = errors.Join(d.err, err)
		return &d
	}
	d := l.withConfig(wire.SourceDefault, cfg)
	// A copy of More: the caller's may change after, and the handle is kept.
	d.dflt = cfg
	d.dflt.More = slices.Clone(cfg.More)
	d.dfltRates = rateList(cfg.rates())
	d.stored = wire.WithSource(d.config.(string), wire.SourceStored)
	if own {
		f.withDefault.Store(d)
	}
	return d
}

// withConfig returns a handle whose calls give the scripts cfg, as source says.
func (l *Limiter) withConfig(source wire.Source, cfg Config) *Limiter {
	d := *l
	if cfg.Type == PerClient {
		d.family.perClient.Store(true)
	}
	d.source, d.config, d.stored = source, cfg.arg(source), nil
	d.lease = nil // a block was taken under the handle's config: lease again after WithDefault
	d.calendars = nil
	if cals := cfg.calendars(); len(cals) > 0 {
		d.calendars, _ = calendar.NewSet(wire.EncodeCalendars(cals))
	}
	d.setDenial()
	return &d
}

// configArg is the config a request sends: the handle's, with the source
// its family's last decision points to.
func (l *Limiter) configArg() any {
	if l.stored != nil && l.family.hashed.Load() {
		return l.stored
	}
	return l.config
}

// TryAcquire makes one attempt to take permits, without waiting.
// A request for more permits than the limit is ErrPermitsExceedRate.
func (l *Limiter) TryAcquire(ctx context.Context, permits int64) (bool, error) {
	r, err := l.Allow(ctx, permits)
	return r.Allowed, err
}

// aboveLimit is ErrPermitsExceedRate for a request that no wait can satisfy:
// every method that takes permits answers it so, Allow too, so that no
// caller reads "denied, retry after -1ns" as "try again now".
func aboveLimit(r Result, permits int64) error {
	if !r.Allowed && r.RetryAfter == Never {
		return fmt.Errorf("%w: %d permits, limit %d", ErrPermitsExceedRate, permits, r.Limit)
	}
	return nil
}

// Allow makes one attempt to take permits and reports the limiter's state.
// Zero permits is a peek: it reports the state and writes nothing. A request
// for more permits than Limit can never be granted: it is denied with
// RetryAfter Never and the error ErrPermitsExceedRate, as TryAcquire and
// Acquire answer it (in shadow mode it is granted, as every request is).
func (l *Limiter) Allow(ctx context.Context, permits int64) (Result, error) {
	if permits < 0 {
		return Result{}, fmt.Errorf("%w: %d", ErrInvalidPermits, permits)
	}
	r, err := l.decide(ctx, permits)
	if err == nil {
		err = aboveLimit(r, permits)
	}
	return r, err
}

// Acquire takes permits, waiting as long as it takes or until ctx ends. It
// returns at once, with an error wrapping context.DeadlineExceeded, when the
// wait would pass ctx's deadline. It never sleeps past the deadline: the
// jitter that spreads retries only takes half of the time the deadline
// leaves beyond RetryAfter, so the last attempt comes before it.
func (l *Limiter) Acquire(ctx context.Context, permits int64) error {
	for {
		r, err := l.Allow(ctx, permits)
		if err != nil || r.Allowed {
			return err
		}
		wait := r.RetryAfter + jitter(r.RetryAfter)
		if deadline, ok := ctx.Deadline(); ok {
			left := time.Until(deadline)
			if left < r.RetryAfter {
				return fmt.Errorf("redlimit: %d permits need a %v wait, past the context deadline: %w",
					permits, r.RetryAfter, context.DeadlineExceeded)
			}
			wait = min(wait, r.RetryAfter+(left-r.RetryAfter)/2)
		}
		if err := l.client.sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// TryAcquireWithin takes permits if it can within timeout. It gives up at once
// when the limiter says the wait would be longer; otherwise it waits and tries
// again, the last time at the end of timeout.
func (l *Limiter) TryAcquireWithin(ctx context.Context, permits int64, timeout time.Duration) (bool, error) {
	deadline := l.client.clock().Add(timeout)
	for {
		r, err := l.Allow(ctx, permits)
		if err != nil || r.Allowed {
			return r.Allowed, err
		}
		left := deadline.Sub(l.client.clock())
		if r.RetryAfter > left {
			return false, nil
		}
		if err := l.client.sleep(ctx, min(r.RetryAfter+jitter(r.RetryAfter), left)); err != nil {
			return false, err
		}
	}
}

// AvailablePermits returns how many permits could be granted right now. It writes nothing.
func (l *Limiter) AvailablePermits(ctx context.Context) (int64, error) {
	r, err := l.Allow(ctx, 0)
	return r.Remaining, err
}

// Charge takes permits after the fact, even past the limit: for work whose
// cost is known only once it is done (an LLM call's tokens). It is counted
// as a grant of permits is, and what it takes past the limit is a debt:
// the limiter denies until that has drained, exactly as any grant's permits
// drain, with RetryAfter saying when and Remaining 0 meanwhile. The funnel,
// the token bucket and the sliding window offer it; a fixed window would
// forgive the debt at its window's end, so there it is ErrUnsupported. A
// debt the limiter's state cannot hold exactly (a funnel's more than about
// 142 years of draining) is ErrInvalidPermits, and nothing is written.
func (l *Limiter) Charge(ctx context.Context, permits int64) (Result, error) {
	switch {
	case l.err != nil:
		return Result{}, l.err
	case !l.alg.Charges:
		return Result{}, fmt.Errorf("%w: Charge: a %s cannot hold a debt exactly", ErrUnsupported, l.alg.Name)
	case permits < 0 || permits > maxPermits:
		return Result{}, fmt.Errorf("%w: %d: at most 2^53 - 1", ErrInvalidPermits, permits)
	case l.alg.Records && permits > maxLogRate:
		return Result{}, fmt.Errorf("%w: %d: a token bucket's record holds at most %d permits", ErrInvalidPermits, permits, int64(maxLogRate))
	}
	start := time.Now()
	r, _, err := l.ask(ctx, request{op: opCharge, permits: permits})
	l.client.tell(l, permits, r, err, start)
	return r, err
}

// maxPermits bounds the permits of a charge or a reservation: the scripts'
// numbers are doubles, exact below 2^53.
const maxPermits = 1<<53 - 1

// Config returns the stored config, or the handle's default when none is stored.
func (l *Limiter) Config(ctx context.Context) (Config, error) {
	reply, err := l.admin(ctx, wire.OpGet, noArg, nil)
	if err != nil {
		return Config{}, err
	}
	st, found, err := wire.ParseGetReply(reply)
	switch {
	case err != nil:
		return Config{}, fmt.Errorf("%s: %w", l.name, err)
	case !found && l.source != wire.SourceDefault:
		return Config{}, fmt.Errorf("%w: %s", ErrNotInitialized, l.name)
	case !found:
		return l.dflt, nil
	}
	cfg, err := configOf(st)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", l.name, err)
	}
	return cfg, nil
}

// WithShadow returns a handle whose decisions are made in shadow mode: each
// is made and counted in Redis exactly as when enforcing, with the same
// round trips, and its caller is always granted; Result says what
// enforcing would have answered (Shadow, Reason). For trying a new limit
// on live traffic before it may deny anything. Requests Redis cannot decide
// (ErrUnavailable) are granted too, as with WithFailOpen.
func (l *Limiter) WithShadow() *Limiter {
	d := *l
	d.shadow = true
	return &d
}

// SetShadow turns shadow mode on or off for every instance's handles on the
// limiter, from its next decision (see WithShadow): it is kept with the
// stored config, which must exist (ErrNotInitialized), and survives SetRate
// and Reset; Delete, or the config's expiry, ends it.
func (l *Limiter) SetShadow(ctx context.Context, on bool) error {
	defer l.forget()
	flag := int64(0)
	if on {
		flag = 1
	}
	_, err := l.admin(ctx, wire.OpShadow, flag, nil)
	return err
}

// TrySetRate stores cfg unless a config is stored already, and reports whether it did.
func (l *Limiter) TrySetRate(ctx context.Context, cfg Config) (bool, error) {
	return l.setRate(ctx, wire.OpTrySet, cfg)
}

// SetRate stores cfg, replacing any stored config. Usage so far is kept, and
// counts against the new rate; changing Type clears it.
func (l *Limiter) SetRate(ctx context.Context, cfg Config) error {
	_, err := l.setRate(ctx, wire.OpSet, cfg)
	return err
}

func (l *Limiter) setRate(ctx context.Context, op wire.Op, cfg Config) (bool, error) {
	if err := l.Validate(cfg); err != nil {
		return false, err
	}
	defer l.forget()
	return l.withConfig(wire.SourceNew, cfg).everyClient(ctx, op, noArg)
}

// Reset forgets every client's usage and keeps the config.
func (l *Limiter) Reset(ctx context.Context) error {
	defer l.forget()
	_, err := l.everyClient(ctx, wire.OpReset, noArg)
	return err
}

// Delete removes every key of the limiter, every client's and the request
// log, and reports whether there were any.
func (l *Limiter) Delete(ctx context.Context) (bool, error) {
	defer l.forget()
	return l.everyClient(ctx, wire.OpDelete, noArg)
}

// Expire makes every key of the limiter expire within ttl (keys due to expire
// sooner keep their expiry), and later grants keep within it too. It reports
// whether the limiter had any key. A ttl of zero or less deletes the limiter.
func (l *Limiter) Expire(ctx context.Context, ttl time.Duration) (bool, error) {
	ms := max(0, (ttl+time.Millisecond-1)/time.Millisecond)
	defer l.forget()
	return l.everyClient(ctx, wire.OpExpire, int64(ms))
}

// ExpireAt is Expire until at, measured on the Client's clock.
func (l *Limiter) ExpireAt(ctx context.Context, at time.Time) (bool, error) {
	return l.Expire(ctx, at.Sub(l.client.clock()))
}

// ClearExpire removes the config's expiry (state keys keep theirs: they expire
// once the limiter is full again) and reports whether it had one.
func (l *Limiter) ClearExpire(ctx context.Context) (bool, error) {
	reply, err := l.admin(ctx, wire.OpPersist, noArg, nil)
	return reply == int64(1), err
}

// RemainTimeToLive returns the config's time to live, as go-redis's TTL does:
// NoExpiry when it does not expire, NoKey when the limiter has no key.
// Without a stored config it is the longest-lived state key's.
func (l *Limiter) RemainTimeToLive(ctx context.Context) (time.Duration, error) {
	reply, err := l.admin(ctx, wire.OpTTL, noArg, nil)
	if err != nil {
		return 0, err
	}
	ms, ok := reply.(int64)
	switch {
	case !ok:
		return 0, unexpected(reply)
	case ms < 0:
		return time.Duration(ms), nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Clients lists the clients that have PerClient state in the limiter (those
// that were granted permits within the last interval or so), for
// inspection with AsClient. It writes nothing.
func (l *Limiter) Clients(ctx context.Context) ([]string, error) {
	reply, err := l.admin(ctx, wire.OpClients, noArg, nil)
	if err != nil {
		return nil, err
	}
	ids, ok := wire.Strings(reply)
	if !ok {
		return nil, unexpected(reply)
	}
	return ids, nil
}

// jitter spreads the retries of callers denied together over a tenth of
// their wait (at most 10ms), so they do not all come back at once.
func jitter(d time.Duration) time.Duration {
	return rand.N(min(d/10, 10*time.Millisecond) + 1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("redlimit: %w", ctx.Err())
	}
}
