package redlimit

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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
	shadow      bool // WithShadow
	sleep       func(ctx context.Context, d time.Duration) error
	loads       sync.Map // *script → *scriptLoad, see Client.reload
	breaker     *breaker // nil unless WithBreaker
	families    families // see Client.limiter
	batches     batches  // see batch.go
	// lines: the Acquires waiting on each in-flight limit (inflight.go).
	linesMu sync.Mutex
	lines   map[string]*waitingLine
	// leases: the leased handles made from the Client and not closed, as
	// keys, for Close (lease.go).
	leases sync.Map

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
	Latency   time.Duration // of the round trip
	Cached    bool          // denied by the local cache (WithLocalCache), without a round trip
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

// New returns a Client deciding through rdb.
func New(rdb redis.Scripter, opts ...Option) *Client {
	c := &Client{rdb: rdb, clientID: randomHex(8), sleep: sleep}
	for _, opt := range opts {
		opt(c)
	}
	c.clientIDArg, c.retryWindowArg = c.clientID, ""
	c.families.current = make(map[familyKey]*family)
	c.batches.route(rdb)
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

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n, 3*n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return string(hex.AppendEncode(b[n:], b))
}
