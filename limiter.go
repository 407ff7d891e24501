// Package redlimit shares rate limits between the instances of a service
// through Redis. Every decision is made by a Lua script run with EVALSHA, so
// each takes one round trip and is atomic on the server; the decisions that
// arrive while a call is in flight go out together, in one (batch.go).
//
// A Client wraps a go-redis client (any redis.Scripter: Client, ClusterClient,
// Ring, FailoverClient, AutoPipeliner). Its TokenBucket, Funnel, FixedWindow
// and SlidingWindow methods return Limiters, which all answer the same API,
// modelled on Redisson's RRateLimiter. A limiter's rate lives in Redis, so one
// instance can change it (SetRate) and every instance follows on its next call.
//
// Being denied is not an error: Allow reports it in its Result and TryAcquire
// returns false. Errors are sentinels, to be tested with errors.Is.
package redlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// algorithm is what a Limiter needs to know of one.
type algorithm struct {
	name   string   // as the config hash stores it, and observers see it
	script *script  // scripts/common.lua + its file + scripts/admin.lua
	state  []string // suffixes of the keys holding one client's state
	// inConfig: the Overall state is fields of the config hash, so a
	// decision reads config and state at once; only PerClient state has
	// keys of its own.
	inConfig bool
	records  bool // its grants carry the request ID (the token bucket's log)
	// charges: a grant past the limit (Charge) is a debt its state holds
	// exactly, until it has drained as any grant does.
	charges bool
	// The Config fields beyond the common ones that it uses.
	burst, buckets, calendar bool
}

// registry is the position of the client registry in a limiter's keys
// (KEYS[REGISTRY], 1-based): after the config hash and, unless the Overall
// state is the hash's fields, the Overall state's keys. The request log
// follows it, then this client's state keys (see scripts/common.lua).
func (a algorithm) registry() int {
	if a.inConfig {
		return 2
	}
	return 2 + len(a.state)
}

// newAlgorithm gives a its script: scripts/common.lua, file and
// scripts/admin.lua, for the algorithm stored as a.name.
func newAlgorithm(a algorithm, file string) algorithm {
	a.script = newScript(a, file)
	return a
}

// Validate reports why cfg cannot be this limiter's config, wrapping
// ErrInvalidConfig: out of range, or a field its algorithm does not use
// (Burst is the funnel's, Buckets the sliding window's). SetRate, TrySetRate
// and WithDefault check the same; call it at start-up to catch a bad default
// there rather than on every call.
func (l *Limiter) Validate(cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if l.alg.records {
		if err := cfg.validateLog(); err != nil {
			return err
		}
	}
	for _, r := range cfg.rates() {
		if r.Burst != 0 && !l.alg.burst {
			return fmt.Errorf("%w: burst %d: only a funnel has a burst", ErrInvalidConfig, r.Burst)
		}
		if r.Buckets != 0 && !l.alg.buckets {
			return fmt.Errorf("%w: buckets %d: only a sliding window has buckets", ErrInvalidConfig, r.Buckets)
		}
		if r.Calendar.Period != 0 && !l.alg.calendar {
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
	alg      algorithm
	name     string
	keys     []string // see scripts/common.lua: config, Overall state, client registry, request log, this client's state
	keyArgs  []any    // keys, boxed once: script arguments
	clientID any      // whose PerClient state keys[…] name, as a script argument
	// perClient: the limiter is known to be PerClient (or to have been), so
	// decisions send every key; until then they send the few an Overall
	// limiter uses. It is its family's: every handle on the limiter shares it.
	perClient *atomic.Bool
	denialKey string // in the local cache of denials
	// The config the scripts are given: sourceNone (the stored one only),
	// sourceDefault (WithDefault: dflt while none is stored), sourceFixed
	// (Throttle's, whatever is stored) or sourceNew (SetRate's); config is
	// ARGV[argConfig], source and config in one string (Config.arg).
	source string
	config any
	dflt   Config
	// stored: with a default, whether the last decision found the limiter's
	// hash (a stored config, or state kept as its fields) rather than a flat
	// state or nothing (scripts/common.lua); the next one then sends
	// deferConfig, its default as sourceDefer, and the script reads the hash
	// first. It is its family's, as perClient is; nil without a default.
	stored      *atomic.Bool
	deferConfig any
	err         error
	family      *family
	shadow      bool // WithShadow: every decision in shadow mode
	// calendars: the handle's config's calendar rates, or nil.
	calendars *calendarSet
	lease     *lease // WithLease's block, or nil
}

// family is what a Client keeps of one limiter, an algorithm under a name:
// the handle the algorithm's constructor returns, its keys built and boxed
// once, and what decisions learn of the limiter in Redis, shared by every
// handle on it however it was made. A service that makes a handle per
// request (c.Funnel(key).WithDefault(cfg)) so builds no keys and formats no
// config on the way, and its handles do not relearn what the last one knew:
// a PerClient limiter's fresh handle would otherwise spend an EVALSHA on
// being told so.
type family struct {
	base              Limiter
	perClient, stored atomic.Bool // see Limiter's fields
	// calendars: the calendar rates a script last named for the limiter
	// (calendarReply), or nil.
	calendars atomic.Pointer[calendarSet]
	// withDefault is the latest handle base.WithDefault made, given again
	// for an equal config: one per family keeps them bounded, and a service
	// gives one name one default.
	withDefault atomic.Pointer[Limiter]
}

// familyKey names a family within its Client, whose prefix is the same for all.
type familyKey struct{ alg, name string }

// maxFamilies bounds the families a Client keeps. A service may make a
// limiter per user, millions of names, so they are kept in two generations:
// a family found in the previous generation moves to the current one, and
// once the current one holds familiesPerGeneration and both together twice
// that, the current one becomes the previous one and the previous one is
// dropped. Limiters in use so stay however many names pass through; a set
// of up to twice familiesPerGeneration names in use (10,922: the bench's
// 10,000, walked in a cycle) is kept whole; and at most maxFamilies are
// kept at any moment: 1.4 KB each with a default handle and a short name
// (measured), 22 MB at most. Exact recency (an LRU list) would take a lock
// on every handle made; a dropped family costs only its rebuilding, 30 to
// 50 allocations, and its relearning: one EVALSHA for a PerClient limiter,
// one failed read in the script for a stored config.
const (
	maxFamilies           = 3 * familiesPerGeneration
	familiesPerGeneration = 5461
)

// families is what a Client keeps of its limiters, in two generations (see
// maxFamilies). A lookup takes a read lock: a plain map with a
// struct key allocates nothing, where a sync.Map boxes the key.
type families struct {
	mu                sync.RWMutex
	current, previous map[familyKey]*family
}

// limiter returns the handle on the limiter alg keeps under name: its
// family's, made the first time.
func (c *Client) limiter(name string, alg algorithm) *Limiter {
	key := familyKey{alg.name, name}
	fs := &c.families
	fs.mu.RLock()
	f, current := fs.current[key]
	if !current {
		f = fs.previous[key]
	}
	fs.mu.RUnlock()
	if current {
		return &f.base
	}
	if f == nil {
		if f = c.newFamily(name, alg); f.base.err != nil {
			return &f.base // made again on every call: mistakes need no speed
		}
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if kept, ok := fs.current[key]; ok {
		return &kept.base // another caller's, made meanwhile
	}
	delete(fs.previous, key) // moving to the current generation
	if len(fs.current) >= familiesPerGeneration && len(fs.current)+len(fs.previous) >= 2*familiesPerGeneration {
		fs.previous, fs.current = fs.current, make(map[familyKey]*family)
	}
	fs.current[key] = f
	return &f.base
}

// newFamily makes the family of the limiter alg keeps under name, with its
// keys.
func (c *Client) newFamily(name string, alg algorithm) *family {
	full := fullName(c.prefix, name)
	f := &family{}
	l := &f.base
	*l = Limiter{client: c, alg: alg, name: full, clientID: c.clientIDArg, source: sourceNone, config: noArg,
		denialKey: denialKey(alg.name+":"+full, ""), perClient: &f.perClient, family: f}
	if err := validName(c.prefix, name, full); err != nil {
		l.err = err
		return f
	}
	l.keys = append(l.keys, full)
	if !alg.inConfig {
		l.keys = append(l.keys, l.stateKeys("")...)
	}
	l.keys = append(l.keys, keyOf(full, "clients"), keyOf(full, "requests"))
	l.keys = append(l.keys, l.stateKeys(c.clientID)...)
	l.keyArgs = boxed(l.keys)
	return f
}

// fullName puts the hash tag inside the prefix, so that every key of a
// limiter starts with the prefix (for ACL key patterns and SCAN MATCH) and
// all share one Cluster slot: prefix{name}, then prefix{name}:suffix. A name
// that holds a tag already keeps it, and without a prefix the name stays as
// it is, as Redisson names it.
func fullName(prefix, name string) string {
	if prefix == "" || strings.Contains(prefix+name, "{") {
		return prefix + name
	}
	return prefix + "{" + name + "}"
}

// keyOf follows Redisson: {name}:suffix, or name:suffix when name already has
// a hash tag, so that all of a limiter's keys share one Cluster slot.
func keyOf(name, suffix string) string {
	if strings.Contains(name, "{") {
		return name + ":" + suffix
	}
	return "{" + name + "}:" + suffix
}

func (l *Limiter) stateKeys(clientID string) []string {
	keys := make([]string, len(l.alg.state))
	for i, s := range l.alg.state {
		if clientID != "" {
			s += ":" + clientID
		}
		keys[i] = keyOf(l.name, s)
	}
	return keys
}

func boxed(keys []string) []any {
	b := make([]any, len(keys))
	for i, k := range keys {
		b[i] = k
	}
	return b
}

// validName checks that the full name (fullName of prefix and name) gives
// keys that share one Cluster slot: its first '{', if any, opens a non-empty
// hash tag. The error speaks of the braces the caller wrote, not of those
// fullName added.
func validName(prefix, name, full string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidName)
	}
	open := strings.IndexByte(full, '{')
	if open < 0 || strings.IndexByte(full[open:], '}') > 1 {
		return nil
	}
	if !strings.Contains(prefix+name, "{") {
		// fullName made the tag, prefix{name}, and name closed it at once.
		return fmt.Errorf("%w: %q: under a prefix a name cannot start with '}': its keys are named %q…, whose \"{}\" is no hash tag",
			ErrInvalidName, name, full)
	}
	return fmt.Errorf("%w: %q: a '{' must open a non-empty hash tag", ErrInvalidName, full)
}

// Clients lists the clients that have PerClient state in the limiter (those
// that were granted permits within the last interval or so), for
// inspection with AsClient. It writes nothing.
func (l *Limiter) Clients(ctx context.Context) ([]string, error) {
	reply, err := l.eval(ctx, request{op: opClients})
	if err != nil {
		return nil, err
	}
	v, ok := reply.([]any)
	if !ok {
		return nil, unexpected(reply)
	}
	ids := make([]string, len(v))
	for i, id := range v {
		if ids[i], ok = id.(string); !ok {
			return nil, unexpected(reply)
		}
	}
	return ids, nil
}

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
	d.keys = append(slices.Clone(l.keys[:len(l.keys)-len(l.alg.state)]), l.stateKeys(id)...)
	d.keyArgs = boxed(d.keys)
	limiter, decision := splitDenialKey(l.denialKey)
	d.denialKey = limiter + " as " + id + "\x00" + decision
	return &d
}

// Name returns the limiter's full name (with the Client's prefix): the key of its config hash.
func (l *Limiter) Name() string { return l.name }

// Algorithm returns the name its config hash stores for its algorithm, as
// observers see it: tokenbucket, funnel, fixed_window or sliding_window.
func (l *Limiter) Algorithm() string { return l.alg.name }

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
	d := l.withConfig(sourceDefault, cfg)
	// A copy of More: the caller's may change after, and the handle is kept.
	d.dflt = cfg
	d.dflt.More = slices.Clone(cfg.More)
	d.stored, d.deferConfig = &f.stored, sourceDefer+d.config.(string)[len(sourceDefault):]
	if own {
		f.withDefault.Store(d)
	}
	return d
}

// withConfig returns a handle whose calls give the scripts cfg, as source says.
func (l *Limiter) withConfig(source string, cfg Config) *Limiter {
	d := *l
	if cfg.Type == PerClient {
		d.perClient.Store(true)
	}
	arg := cfg.arg(source)
	d.source, d.config = source, arg
	d.lease = nil // a block was taken under the handle's config: lease again after WithDefault
	d.calendars = nil
	if spec := cfg.calendars(); spec != "" {
		d.calendars, _ = newCalendarSet(spec)
	}
	limiter, _ := splitDenialKey(l.denialKey)
	d.denialKey = denialKey(limiter, arg)
	return &d
}

// Never is the RetryAfter of a request no wait can satisfy: more permits
// than Limit.
const Never time.Duration = -1

// What RemainTimeToLive returns, as go-redis's TTL does, for a limiter whose
// config never expires (NoExpiry) and for one with no key at all (NoKey).
const (
	NoExpiry time.Duration = -1
	NoKey    time.Duration = -2
)

// Result is the outcome of one Allow. With WithFailOpen, a request Redis
// could not decide gets Result{Allowed: true} and nothing else: Limit 0 tells
// it apart.
type Result struct {
	Allowed    bool
	Limit      int64         // the most permits one request can ever get (Rate; a funnel's Burst)
	Remaining  int64         // permits that could be granted right now
	RetryAfter time.Duration // denied: exact wait before this request can succeed; Never if it never can; 0 if allowed
	ResetAfter time.Duration // until the limiter is back to full
	// Window is the span Limit applies to: the config's Interval, or for a
	// funnel the time its Burst takes to drain (Burst × Interval / Rate).
	// With SetRate it follows the config in force.
	Window time.Duration
	// With several rates (Config.And), Bound is the one that bound the
	// answer, whose Limit and Window these are: 0 for the config's own, i for
	// More[i-1]. Denied, it is the rate with the longest wait (or one that can
	// never grant that many); allowed, the one with the fewest permits left.
	// Quotas lists every rate's Limit and Window, in config order; with one
	// rate it is nil.
	Bound  int
	Quotas []Quota
	// Reason says what decided: the limit (ReasonLimit, the zero value),
	// a denial cached by WithLocalCache, WithFailOpen granting what Redis
	// could not decide (the observer's Decision.Err says why), shadow
	// mode granting what the limit denied, or the handle's lease.
	Reason Reason
	// Shadow: the decision was made in shadow mode (WithShadow,
	// Limiter.WithShadow, or the stored config's, Limiter.SetShadow). It
	// was made and counted as ever, and Allowed is true whatever the limit
	// said: Reason is ReasonShadow when the limit denied, and RetryAfter
	// and Remaining are what enforcing would have answered.
	Shadow bool
}

// Reason is what decided a Result.
type Reason uint8

const (
	ReasonLimit    Reason = iota // the limit, in Redis: Bound says which rate
	ReasonCache                  // a denial cached by WithLocalCache, without a round trip
	ReasonFailOpen               // granted by WithFailOpen, or in shadow mode, while Redis could not decide
	ReasonShadow                 // granted in shadow mode; the limit denied it
	ReasonLease                  // decided from this handle's lease (WithLease), without a round trip
)

func (r Reason) String() string {
	switch r {
	case ReasonLimit:
		return "limit"
	case ReasonCache:
		return "cache"
	case ReasonFailOpen:
		return "fail-open"
	case ReasonShadow:
		return "shadow"
	case ReasonLease:
		return "lease"
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Quota is one rate's Limit and Window, as Result reports them.
type Quota struct {
	Limit  int64
	Window time.Duration
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
// drain, with RetryAfter saying when and Remaining 0 meanwhile. Release
// gives back as after any grant. The funnel, the token bucket and the
// sliding window offer it; a fixed window would forgive the debt at its
// window's end, so there it is ErrUnsupported.
func (l *Limiter) Charge(ctx context.Context, permits int64) (Result, error) {
	switch {
	case l.err != nil:
		return Result{}, l.err
	case !l.alg.charges:
		return Result{}, fmt.Errorf("%w: Charge: a %s cannot hold a debt exactly", ErrUnsupported, l.alg.name)
	case permits < 0:
		return Result{}, fmt.Errorf("%w: %d", ErrInvalidPermits, permits)
	case l.alg.records && permits > maxLogRate:
		return Result{}, fmt.Errorf("%w: %d: a token bucket's record holds at most %d permits", ErrInvalidPermits, permits, int64(maxLogRate))
	}
	start := time.Now()
	reply, err := l.eval(ctx, request{op: opCharge, permits: permits})
	var r Result
	if err == nil {
		r, err = parseResult(reply, l.dflt)
	}
	if c := l.client; c.observe != nil {
		c.observe(Decision{Limiter: l.name, Algorithm: l.alg.name, Permits: permits, Result: r, Err: err, Latency: time.Since(start)})
	}
	return r, err
}

// Release gives back up to permits granted earlier and not used, never more
// than are still counted in the current window.
func (l *Limiter) Release(ctx context.Context, permits int64) error {
	if permits < 0 {
		return fmt.Errorf("%w: %d", ErrInvalidPermits, permits)
	}
	if permits == 0 {
		return nil
	}
	defer l.forgetDenial()
	_, err := l.eval(ctx, request{op: opRelease, permits: permits})
	return err
}

// Config returns the stored config, or the handle's default when none is stored.
func (l *Limiter) Config(ctx context.Context) (Config, error) {
	reply, err := l.eval(ctx, request{op: opGet})
	if err != nil {
		return Config{}, err
	}
	f, ok := reply.([]any)
	if ok && len(f) == 0 {
		if l.source != sourceDefault {
			return Config{}, fmt.Errorf("%w: %s", ErrNotInitialized, l.name)
		}
		return l.dflt, nil
	}
	var n [6]int64
	if !ok || len(f) != len(n)+2 || !integers(f, n[:]) {
		return Config{}, unexpected(reply)
	}
	s, _ := f[6].(string)
	more, ok := parseMore(s)
	if !ok {
		return Config{}, unexpected(reply)
	}
	cfg := Config{
		Rate: n[0], Interval: time.Duration(n[1]) * time.Millisecond, Type: RateType(n[2]),
		Burst: n[3], Buckets: int(n[4]), KeepAlive: time.Duration(n[5]) * time.Millisecond, More: more,
	}
	if s, _ := f[7].(string); s != "" {
		cals, ok := parseCalendars(s)
		if !ok {
			return Config{}, fmt.Errorf("%w: %s: field calendar = %q", ErrCorruptState, l.name, s)
		}
		for _, rc := range cals {
			if rc.place == 1 {
				cfg.Calendar = rc.cal
			} else if rc.place-2 < len(cfg.More) {
				cfg.More[rc.place-2].Calendar = rc.cal
			}
		}
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
	defer l.forgetDenial()
	flag := int64(0)
	if on {
		flag = 1
	}
	_, err := l.eval(ctx, request{op: opShadow, permits: flag})
	return err
}

// TrySetRate stores cfg unless a config is stored already, and reports whether it did.
func (l *Limiter) TrySetRate(ctx context.Context, cfg Config) (bool, error) {
	return l.setRate(ctx, opTrySet, cfg)
}

// SetRate stores cfg, replacing any stored config. Usage so far is kept, and
// counts against the new rate; changing Type clears it.
func (l *Limiter) SetRate(ctx context.Context, cfg Config) error {
	_, err := l.setRate(ctx, opSet, cfg)
	return err
}

func (l *Limiter) setRate(ctx context.Context, op any, cfg Config) (bool, error) {
	if err := l.Validate(cfg); err != nil {
		return false, err
	}
	defer l.forgetDenial()
	return l.withConfig(sourceNew, cfg).everyClient(ctx, request{op: op})
}

// Reset forgets every client's usage and keeps the config.
func (l *Limiter) Reset(ctx context.Context) error {
	defer l.forgetDenial()
	_, err := l.everyClient(ctx, request{op: opReset})
	return err
}

// Delete removes every key of the limiter, every client's and the request
// log (WithRetryWindow), and reports whether there were any.
func (l *Limiter) Delete(ctx context.Context) (bool, error) {
	defer l.forgetDenial()
	return l.everyClient(ctx, request{op: opDelete})
}

// Expire makes every key of the limiter expire within ttl (keys due to expire
// sooner keep their expiry), and later grants keep within it too. It reports
// whether the limiter had any key. A ttl of zero or less deletes the limiter.
func (l *Limiter) Expire(ctx context.Context, ttl time.Duration) (bool, error) {
	ms := max(0, (ttl+time.Millisecond-1)/time.Millisecond)
	defer l.forgetDenial()
	return l.everyClient(ctx, request{op: opExpire, ms: int64(ms)})
}

// ExpireAt is Expire until at, measured on the Client's clock.
func (l *Limiter) ExpireAt(ctx context.Context, at time.Time) (bool, error) {
	return l.Expire(ctx, at.Sub(l.client.clock()))
}

// ClearExpire removes the config's expiry (state keys keep theirs: they expire
// once the limiter is full again) and reports whether it had one.
func (l *Limiter) ClearExpire(ctx context.Context) (bool, error) {
	reply, err := l.eval(ctx, request{op: opPersist})
	return reply == int64(1), err
}

// RemainTimeToLive returns the config's time to live, as go-redis's TTL does:
// NoExpiry when it does not expire, NoKey when the limiter has no key.
// Without a stored config it is the longest-lived state key's.
func (l *Limiter) RemainTimeToLive(ctx context.Context) (time.Duration, error) {
	reply, err := l.eval(ctx, request{op: opTTL})
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
