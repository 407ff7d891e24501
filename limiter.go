// Package redlimit shares rate limits between the instances of a service
// through Redis. Every decision is one Lua script run with EVALSHA, so each
// takes one round trip and is atomic on the server.
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
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotInitialized: no rate is stored for the limiter and its handle has no default.
	ErrNotInitialized = errors.New("redlimit: rate not set")
	// ErrInvalidConfig: a Config outside what the limiters can compute exactly.
	ErrInvalidConfig = errors.New("redlimit: invalid config")
	// ErrInvalidPermits: a negative number of permits.
	ErrInvalidPermits = errors.New("redlimit: invalid permits")
	// ErrPermitsExceedRate: a request for more permits than the limiter can ever grant at once.
	ErrPermitsExceedRate = errors.New("redlimit: permits exceed the limit")
	// ErrInvalidName: an empty limiter name, or one whose braces do not form a Redis Cluster hash tag.
	ErrInvalidName = errors.New("redlimit: invalid limiter name")
	// ErrCorruptState: a limiter's key in Redis holds something the scripts did not write.
	ErrCorruptState = errors.New("redlimit: corrupt state")
	// ErrAlgorithmMismatch: the name's stored config belongs to another algorithm.
	ErrAlgorithmMismatch = errors.New("redlimit: limiter holds another algorithm")
	// ErrUnexpectedReply: Redis answered with a reply the scripts never send.
	ErrUnexpectedReply = errors.New("redlimit: unexpected reply")
	// ErrUnavailable: Redis could not decide (unreachable, timed out, loading,
	// failing over, out of memory, the caller's context ended before it
	// answered...). The error wraps the cause too, and the context's error.
	ErrUnavailable = errors.New("redlimit: redis unavailable")
	// ErrMisconfigured: Redis refused the call for a reason only its operator
	// can fix (NOPERM, NOAUTH, WRONGPASS, unknown command...). Not an outage:
	// never failed open. The error wraps the refusal.
	ErrMisconfigured = errors.New("redlimit: redis misconfigured")
	// ErrBreakerOpen: WithBreaker answered without asking Redis. It wraps ErrUnavailable.
	ErrBreakerOpen = fmt.Errorf("%w: breaker open", ErrUnavailable)
)

// Client makes limiters that share one Redis connection and options. It is
// safe for concurrent use.
type Client struct {
	rdb         redis.Scripter
	prefix      string
	now         func() time.Time // nil: the scripts read Redis TIME
	clientID    string
	retryWindow time.Duration
	observe     func(Decision)
	denials     *denials // nil unless WithLocalCache
	failOpen    bool
	sleep       func(ctx context.Context, d time.Duration) error
	loads       sync.Map // *script → *scriptLoad, see Client.reload
	breaker     *breaker // nil unless WithBreaker

	// clientID and retryWindow as script arguments, boxed once.
	clientIDArg, retryWindowArg any
}

// Option configures a Client.
type Option func(*Client)

// WithPrefix prepends prefix to every limiter name; default "".
func WithPrefix(prefix string) Option { return func(c *Client) { c.prefix = prefix } }

// WithClock decides on this clock instead of Redis TIME: for Redis services
// that reject TIME in scripts, and for tests. Every instance sharing a limiter
// should then have a synchronised clock: a request stamped behind the
// limiter's latest decision is decided as of that decision by the windows,
// while the token bucket and funnel may over-admit by what the limit allows
// in a span as long as the lag.
func WithClock(now func() time.Time) Option { return func(c *Client) { c.now = now } }

// WithClientID is the identity PerClient limits are kept under; default a
// random ID per Client. An empty id keeps the default.
func WithClientID(id string) Option {
	return func(c *Client) {
		if id != "" {
			c.clientID = id
		}
	}
}

// WithRetryWindow makes re-sent scripts count once. go-redis re-sends a
// script whose reply it did not read (after a read timeout, up to MaxRetries
// times), and the server may have run the first copy. By default such a grant
// counts twice, which errs on the safe side: the limiter denies sooner, it
// never admits more. With this option each limiter keeps a log of the
// request IDs of its grants and releases for d (a zset, name:requests, one
// small entry per request), so that a re-run is recognised and counted once;
// d should exceed ReadTimeout × (MaxRetries+1), 15s for go-redis's defaults.
// The token bucket recognises a re-sent grant by its record without it.
func WithRetryWindow(d time.Duration) Option {
	return func(c *Client) {
		if d >= time.Millisecond {
			c.retryWindow = d
		}
	}
}

// Decision is what an observer learns of one Allow (and so of every
// TryAcquire, Acquire attempt and AvailablePermits) or Throttle.
type Decision struct {
	Limiter   string // full name, with the prefix
	Algorithm string // tokenbucket, funnel, fixed_window or sliding_window
	Permits   int64
	Result    Result
	Err       error
	Latency   time.Duration // of the round trip
	Cached    bool          // denied by the local cache (WithLocalCache), without a round trip
}

// WithObserver calls observe after every decision, on the caller's goroutine:
// it must be quick and safe for concurrent use. For metrics and tracing.
func WithObserver(observe func(Decision)) Option { return func(c *Client) { c.observe = observe } }

// WithFailOpen grants every request Redis cannot decide (ErrUnavailable),
// instead of the default, failing closed: denying it and returning the error.
// Allow then reports Allowed with no error; the error still reaches the
// observer (WithObserver), which is where to count and log outages.
func WithFailOpen() Option { return func(c *Client) { c.failOpen = true } }

// New returns a Client deciding through rdb.
func New(rdb redis.Scripter, opts ...Option) *Client {
	c := &Client{rdb: rdb, clientID: randomHex(8), sleep: sleep}
	for _, opt := range opts {
		opt(c)
	}
	c.clientIDArg, c.retryWindowArg = c.clientID, ""
	if c.retryWindow > 0 {
		c.retryWindowArg = c.retryWindow.Milliseconds()
	}
	return c
}

// ClientID returns the identity this Client's PerClient limits are kept under.
func (c *Client) ClientID() string { return c.clientID }

func (c *Client) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

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
	// The Config fields beyond the common ones that it uses.
	burst, buckets bool
}

// newAlgorithm gives a its script: scripts/common.lua, file and
// scripts/admin.lua, for the algorithm stored as a.name.
func newAlgorithm(a algorithm, file string) algorithm {
	a.script = newScript(a.name, file, len(a.state))
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
	if cfg.Burst != 0 && !l.alg.burst {
		return fmt.Errorf("%w: burst %d: only a funnel has a burst", ErrInvalidConfig, cfg.Burst)
	}
	if cfg.Buckets != 0 && !l.alg.buckets {
		return fmt.Errorf("%w: buckets %d: only a sliding window has buckets", ErrInvalidConfig, cfg.Buckets)
	}
	return nil
}

// Limiter is a handle on one named limit in Redis. It holds no state of its
// own: any number of handles, in any number of processes, share the limit.
// It is safe for concurrent use.
type Limiter struct {
	client    *Client
	alg       algorithm
	name      string
	keys      []string // see scripts/common.lua: config, client registry, request log, state keys
	clientID  any      // whose PerClient state keys[…] name, as a script argument
	denialKey string   // in the local cache of denials
	defaults  []any    // the default config's script arguments; nil without one
	dflt      Config
	err       error
}

func (c *Client) limiter(name string, alg algorithm) *Limiter {
	full := fullName(c.prefix, name)
	l := &Limiter{client: c, alg: alg, name: full, clientID: c.clientIDArg, denialKey: denialKey(alg.name+":"+full, sourceNone, nil)}
	if err := validName(name, full); err != nil {
		l.err = err
		return l
	}
	l.keys = append(l.keys, full, keyOf(full, "clients"), keyOf(full, "requests"))
	if !alg.inConfig {
		l.keys = append(l.keys, l.stateKeys("")...)
	}
	l.keys = append(l.keys, l.stateKeys(c.clientID)...)
	return l
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

func validName(name, full string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidName)
	}
	if open := strings.IndexByte(full, '{'); open >= 0 {
		if close := strings.IndexByte(full[open:], '}'); close <= 1 {
			return fmt.Errorf("%w: %q: a '{' must open a non-empty hash tag", ErrInvalidName, full)
		}
	}
	return nil
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
	d.clientID = id
	d.keys = append(slices.Clone(l.keys[:len(l.keys)-len(l.alg.state)]), l.stateKeys(id)...)
	limiter, decision := splitDenialKey(l.denialKey)
	d.denialKey = limiter + " as " + id + "\x00" + decision
	return &d
}

// Name returns the limiter's full name (with the Client's prefix): the key of its config hash.
func (l *Limiter) Name() string { return l.name }

// WithDefault returns a handle that uses cfg while no config is stored in
// Redis. It makes no extra round trip and stores nothing; SetRate does.
func (l *Limiter) WithDefault(cfg Config) *Limiter {
	d := *l
	if err := l.Validate(cfg); err != nil {
		d.err = errors.Join(d.err, err)
		return &d
	}
	d.dflt, d.defaults = cfg, cfg.args()
	d.denialKey = d.withDefaultDenialKey(d.defaults)
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
}

// TryAcquire makes one attempt to take permits, without waiting.
// A request for more permits than the limit is ErrPermitsExceedRate.
func (l *Limiter) TryAcquire(ctx context.Context, permits int64) (bool, error) {
	r, err := l.allow(ctx, permits)
	return r.Allowed, err
}

// Allow makes one attempt to take permits and reports the limiter's state.
// Zero permits is a peek: it reports the state and writes nothing. A request
// for more permits than Limit is denied with RetryAfter -1.
func (l *Limiter) Allow(ctx context.Context, permits int64) (Result, error) {
	if permits < 0 {
		return Result{}, fmt.Errorf("%w: %d", ErrInvalidPermits, permits)
	}
	return l.decide(ctx, request{op: opAllow, n: permits})
}

// decide runs an allow request, through the local cache when there is one,
// and tells the observer.
func (l *Limiter) decide(ctx context.Context, req request) (Result, error) {
	c := l.client
	start := time.Now()
	var r Result
	var err error
	cached := false
	var cacheKey string
	if c.denials != nil && req.n > 0 && l.err == nil {
		cacheKey = l.denialKeyFor(req)
		r, cached = c.denials.lookup(cacheKey, req.n, c.clock())
	}
	if !cached {
		var reply any
		if reply, err = l.eval(ctx, req); err == nil {
			r, err = parseResult(reply)
		}
		if err == nil && c.denials != nil && req.n > 0 {
			c.denials.store(cacheKey, req.n, r, c.clock())
		}
	}
	failOpen := err != nil && c.failOpen && errors.Is(err, ErrUnavailable)
	if failOpen {
		r = Result{Allowed: true}
	}
	if c.observe != nil {
		c.observe(Decision{Limiter: l.name, Algorithm: l.alg.name, Permits: req.n, Result: r, Err: err, Latency: time.Since(start), Cached: cached})
	}
	if failOpen {
		return r, nil
	}
	return r, err
}

// forgetDenial drops this Client's cached denial after a local change that
// may free permits sooner than the denial said.
func (l *Limiter) forgetDenial() {
	if l.client.denials != nil && l.err == nil {
		l.client.denials.forget(l.denialKey)
	}
}

// allow is Allow for the methods that treat a request above the limit as an error.
func (l *Limiter) allow(ctx context.Context, permits int64) (Result, error) {
	r, err := l.Allow(ctx, permits)
	if err == nil && !r.Allowed && r.RetryAfter < 0 {
		err = fmt.Errorf("%w: %d permits, limit %d", ErrPermitsExceedRate, permits, r.Limit)
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
		r, err := l.allow(ctx, permits)
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
		r, err := l.allow(ctx, permits)
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
	_, err := l.eval(ctx, request{op: opRelease, n: permits})
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
		if l.defaults == nil {
			return Config{}, fmt.Errorf("%w: %s", ErrNotInitialized, l.name)
		}
		return l.dflt, nil
	}
	var n [6]int64
	if !ok || len(f) != len(n) || !integers(f, n[:]) {
		return Config{}, unexpected(reply)
	}
	return Config{
		Rate: n[0], Interval: time.Duration(n[1]) * time.Millisecond, Type: RateType(n[2]),
		Burst: n[3], Buckets: int(n[4]), KeepAlive: time.Duration(n[5]) * time.Millisecond,
	}, nil
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
	return l.everyClient(ctx, request{op: op, source: sourceNew, config: cfg.args()})
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
	return l.everyClient(ctx, request{op: opExpire, n: int64(ms)})
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

// request is one script call.
type request struct {
	op      any      // one of the ops below
	n       int64    // permits, or milliseconds for expire
	source  any      // of config: nil (the stored one, else the handle's default), sourceNew or sourceFixed
	config  []any    // with sourceNew or sourceFixed: Config.args
	clients []string // other clients whose keys the op must reach
}

// The scripts' ops and config sources, boxed once: converting a string to
// an interface on every call would allocate.
var (
	opAllow, opRelease, opGet, opSet, opTrySet    any = "allow", "release", "get", "set", "tryset"
	opReset, opDelete, opExpire, opPersist, opTTL any = "reset", "delete", "expire", "persist", "ttl"
	opClients                                     any = "clients"

	sourceNone, sourceDefault, sourceNew, sourceFixed any = "", "default", "new", "fixed"

	noArg    any = ""
	noConfig     = []any{noArg, noArg, noArg, noArg, noArg, noArg}
)

// eval runs the limiter's script once: the one road from every method to
// Redis. Its keys and arguments are in the order scripts/common.lua names.
func (l *Limiter) eval(ctx context.Context, req request) (any, error) {
	if l.err != nil {
		return nil, l.err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redlimit: %w", err)
	}
	c := l.client
	now := noArg
	if c.now != nil {
		now = c.now().UnixMicro()
	}
	// A request ID names the token bucket's record, and the request log's
	// entry; only grants and releases need one.
	id := noArg
	counts := req.op == opAllow && req.n > 0
	if req.op == opRelease || counts && (l.alg.records || c.retryWindow > 0) {
		id = randomHex(8)
	}
	source, config := req.source, req.config
	if source == nil {
		source, config = sourceNone, noConfig
		if l.defaults != nil {
			source, config = sourceDefault, l.defaults
		}
	}
	keys := l.keys
	args := make([]any, 0, 13+len(req.clients))
	args = append(args, req.op, now, req.n, l.clientID, id, c.retryWindowArg, source)
	args = append(args, config...)
	if len(req.clients) > 0 {
		keys = slices.Clone(keys)
		for _, other := range req.clients {
			keys = append(keys, l.stateKeys(other)...)
			args = append(args, other)
		}
	}
	return c.run(ctx, l.alg.script, keys, args...)
}

// everyClient runs an op that must reach every client's keys. The script
// checks the list against its registry of clients and names any missing, so
// the op is sent again with them (clients appear between calls only rarely).
func (l *Limiter) everyClient(ctx context.Context, req request) (bool, error) {
	for range 10 {
		reply, err := l.eval(ctx, req)
		if err != nil {
			return false, err
		}
		if missing, ok := missingClients(reply); ok {
			req.clients = append(req.clients, missing...)
			continue
		}
		n, ok := reply.(int64)
		if !ok {
			return false, unexpected(reply)
		}
		return n == 1, nil
	}
	return false, fmt.Errorf("redlimit: %v %s: clients kept appearing", req.op, l.name)
}

func missingClients(reply any) ([]string, bool) {
	v, ok := reply.([]any)
	if !ok || len(v) != 2 || v[0] != "missing" {
		return nil, false
	}
	ids, ok := v[1].([]any)
	if !ok {
		return nil, false
	}
	missing := make([]string, 0, len(ids))
	for _, id := range ids {
		s, ok := id.(string)
		if !ok {
			return nil, false
		}
		missing = append(missing, s)
	}
	return missing, true
}

func parseResult(reply any) (Result, error) {
	v, ok := reply.([]any)
	var n [6]int64
	if !ok || len(v) != len(n) || !integers(v, n[:]) {
		return Result{}, unexpected(reply)
	}
	return Result{
		Allowed:    n[0] == 1,
		Limit:      n[1],
		Remaining:  n[2],
		RetryAfter: micros(n[3]),
		ResetAfter: micros(n[4]),
		Window:     time.Duration(n[5]) * time.Millisecond,
	}, nil
}

// integers copies v into n, reporting whether every element was an integer.
func integers(v []any, n []int64) bool {
	for i := range n {
		x, ok := v[i].(int64)
		if !ok {
			return false
		}
		n[i] = x
	}
	return true
}

func micros(us int64) time.Duration {
	if us < 0 {
		return Never
	}
	return time.Duration(us) * time.Microsecond
}

func unexpected(reply any) error {
	return fmt.Errorf("%w: %T %v", ErrUnexpectedReply, reply, reply)
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

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n, 3*n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return string(hex.AppendEncode(b[n:], b))
}
