package redlimit

import (
	"context"
	"embed"
	"encoding/hex"
	"io/fs"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/denials"
	"github.com/redlimit/redlimit/internal/evalsha"
	"github.com/redlimit/redlimit/internal/generations"
	"github.com/redlimit/redlimit/internal/inflight"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// scripts are the package's Lua scripts, assembled once (internal/evalsha).
var scripts = func() evalsha.Scripts {
	files, err := fs.Sub(scriptFiles, "scripts")
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	return evalsha.Assemble(files)
}()

// Client makes limiters that share one Redis connection and options. It is
// safe for concurrent use.
type Client struct {
	transport   *evalsha.Transport
	prefix      string
	now         func() time.Time // nil: the scripts read Redis TIME
	clientID    string
	retryWindow time.Duration
	observe     func(Decision)
	denials     *denials.Cache[Result] // nil unless WithLocalCache (local_cache.go)
	failOpen    bool
	shadow      bool // WithShadow
	sleep       func(ctx context.Context, d time.Duration) error
	breaker     *evalsha.Breaker // nil unless WithBreaker
	degraded    *degraded        // nil unless WithDegraded (degraded.go)
	noBatch     bool             // WithoutBatching
	// families: what the Client keeps of its limiters, by algorithm and
	// name, the recently used ones (Client.limiter).
	families *generations.Map[familyKey, *family]
	// lines: the Acquires waiting on each in-flight limit (inflight.go).
	lines inflight.Lines
	// leases: the leased handles made from the Client and not closed, as
	// keys, for Close (lease.go).
	leases sync.Map
	// hot: the limiters recently decided and the leases of the hot ones,
	// nil unless WithHotLeases (hot.go).
	hot *hotLeases

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
	Algorithm string // tokenbucket, funnel, fixed_window, sliding_window, or inflight (an in-flight limit's acquire)
	Permits   int64
	Result    Result
	Err       error
	// Latency is the decision's, round trip included when it made one:
	// Result.Reason tells a lease's or the local cache's decision (no round
	// trip) from Redis's.
	Latency time.Duration
}

// WithObserver calls observe after every decision, on the caller's goroutine:
// it must be quick and safe for concurrent use. For metrics and tracing.
func WithObserver(observe func(Decision)) Option { return func(c *Client) { c.observe = observe } }

// WithFailOpen grants every request Redis cannot decide (ErrUnavailable),
// instead of the default, failing closed: denying it and returning the error.
// Allow then reports Allowed with no error; the error still reaches the
// observer (WithObserver), which is where to count and log outages. A
// caller that cancelled its context (an HTTP client gone) is never granted:
// it gets an error wrapping context.Canceled, as it would have before the
// call, and a deadline that passes while Redis hangs is an outage.
func WithFailOpen() Option { return func(c *Client) { c.failOpen = true } }

// WithShadow makes every decision of the Client's limiters in shadow mode:
// see Limiter.WithShadow.
func WithShadow() Option { return func(c *Client) { c.shadow = true } }

// WithoutBatching sends every decision in a call of its own, as soon as its
// caller makes it, instead of batching the decisions that arrive while one
// is in flight (internal/evalsha's group commit).
func WithoutBatching() Option { return func(c *Client) { c.noBatch = true } }

// WithBreaker makes the Client fail fast while Redis is down. After failures
// decisions in a row end in ErrUnavailable (a batch's call that fails
// counts each of its decisions), every call ends at once, without
// asking Redis, in ErrUnavailable (wrapping ErrBreakerOpen and the last
// failure) for coolDown. Then one call goes to Redis as a probe while the
// others still fail fast: if Redis answers, calls flow again; if not, another
// coolDown starts. Defaults: failures 5 (when < 1), coolDown 1s (when <= 0).
//
// Without it each call during an outage waits for go-redis to give up (its
// dial and read timeouts, times its retries: seconds with the defaults);
// with it, WithFailOpen grants and failing closed denies in microseconds.
// Any answer from Redis (a grant, a denial, ErrCorruptState,
// ErrMisconfigured...) starts the count again. A call whose context was
// cancelled counts neither way: the caller gave up, not Redis. A context
// deadline passing before Redis answers counts as a failure: a hung Redis
// looks like that.
func WithBreaker(failures int, coolDown time.Duration) Option {
	if failures < 1 {
		failures = 5
	}
	if coolDown <= 0 {
		coolDown = time.Second
	}
	return func(c *Client) { c.breaker = evalsha.NewBreaker(failures, coolDown) }
}

// New returns a Client deciding through rdb.
func New(rdb redis.Scripter, opts ...Option) *Client {
	c := &Client{clientID: randomHex(8), sleep: sleep}
	for _, opt := range opts {
		opt(c)
	}
	c.transport = evalsha.NewTransport(rdb, scripts, evalsha.Options{Breaker: c.breaker, NoBatch: c.noBatch})
	c.degraded.start(c) // WithDegraded's heartbeat (degraded.go); nothing without it
	c.hot.start(c)      // WithHotLeases's table (hot.go); nothing without it
	c.clientIDArg, c.retryWindowArg = c.clientID, ""
	c.families = generations.New[familyKey, *family](familiesPerGeneration, 2*familiesPerGeneration)
	if c.retryWindow > 0 {
		c.retryWindowArg = c.retryWindow.Milliseconds()
	}
	return c
}

// run runs a script that makes no decision (the admin and in-flight
// scripts).
func (c *Client) run(ctx context.Context, s *evalsha.Script, keys, args []any) (any, error) {
	return c.transport.Run(ctx, s, keys, args)
}

// ClientID returns the identity this Client's PerClient limits are kept under.
func (c *Client) ClientID() string { return c.clientID }

func (c *Client) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n, 3*n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return string(hex.AppendEncode(b[n:], b))
}
