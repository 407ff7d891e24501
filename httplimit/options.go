package httplimit

import (
	"net/http"
	"time"

	"github.com/redlimit/redlimit/internal/breakerrun"
)

// Option configures New, NewAll and InFlight, as redlimit.Option configures
// a Client. The options and their defaults (under NewAll, WithKey and
// WithPermits are those of the policies without their own):
//
//	WithKey            ClientIP(""): RemoteAddr's IPv4 address, or its IPv6 /64; no proxy trusted
//	WithPermits        1 permit per request (New, NewAll)
//	WithPolicy         "default" (New, InFlight)
//	WithLegacyHeaders  off: no X-RateLimit-Limit, -Remaining, -Reset (New, NewAll)
//	WithFailOpen       off: when Redis is unavailable, answer 503 Service Unavailable
//	WithShadowHeaders  off: a decision in shadow mode sends no rate-limit fields (New, NewAll)
//	WithErrorHook      none
//	WithDeniedHandler  429 Too Many Requests with a text/plain body
//	WithErrorHandler   400, 500 or 503 with a text/plain body
//	WithClock          time.Now, read only for X-RateLimit-Reset (New, NewAll)
//	WithMaxWait        0: a full in-flight limit answers at once (InFlight only)
type Option func(*options)

type options struct {
	key     KeyFunc
	permits func(*http.Request) int64
	policy  string
	legacy  bool
	open    bool
	shadow  bool
	hook    func(*http.Request, error)
	denied  http.Handler
	failed  func(http.ResponseWriter, *http.Request, int, error)
	now     func() time.Time
	wait    time.Duration

	name string // the policy name as an sf-string
	// breakerRun: a run of ErrBreakerOpen is told once. See WithErrorHook.
	breakerRun breakerrun.Run
}

// newOptions applies opts over the defaults.
func newOptions(opts []Option) *options {
	o := &options{
		key:     ClientIP(""),
		permits: func(*http.Request) int64 { return 1 },
		policy:  "default",
		denied:  http.HandlerFunc(tooManyRequests),
		failed:  errorStatus,
		now:     time.Now,
	}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// WithKey names the client a request counts against (KeyFunc): ClientIP,
// ClientPrefix, Header, or a function of your own.
func WithKey(key KeyFunc) Option { return func(o *options) { o.key = key } }

// WithPermits sets how many permits a request takes; default 1. Zero lets it
// through and only reports the limiter's state. More than the limit can
// ever grant is answered 413 Content Too Large (see the package doc). A
// negative number is a bug, not an outage: the error hook is told
// (redlimit.ErrInvalidPermits) and the request is answered 500 Internal
// Server Error, even with WithFailOpen.
func WithPermits(permits func(r *http.Request) int64) Option {
	return func(o *options) { o.permits = permits }
}

// WithPolicy names the policy in RateLimit-Policy and RateLimit, and
// Decision.Policy; default "default". It must be printable ASCII: New panics
// otherwise. Stacked middlewares need names of their own, or a client cannot
// tell their items apart.
func WithPolicy(name string) Option { return func(o *options) { o.policy = name } }

// WithLegacyHeaders adds the pre-standard fields many clients still read:
// X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, the last as
// a Unix time in seconds, as GitHub's API sends it. They hold one limit only:
// of a limiter of several rates, the one RateLimit reports; under stacked
// middlewares that set them, the one that binds (a denial; else the fewest
// permits left; on a tie, the later reset).
func WithLegacyHeaders() Option { return func(o *options) { o.legacy = true } }

// WithFailOpen lets requests through, without rate-limit fields of their
// own, when Redis cannot decide (redlimit.ErrUnavailable: unreachable, timed
// out, failing over, WithBreaker open). Without it they are answered 503
// Service Unavailable. Either way the error hook learns the error, and the
// handlers find it in Decision.Err; a request let through has the Result a
// Client made WithFailOpen gives (Allowed, Reason redlimit.ReasonFailOpen,
// Limit 0). Any other error is a bug or a setup to fix, not an outage to
// ride out, and is answered 500 Internal Server Error even with
// WithFailOpen: redlimit.ErrMisconfigured (Redis refused the call: an ACL, a
// password), ErrNotInitialized, a negative permit count (ErrInvalidPermits),
// corrupt state.
//
// A Client made redlimit.WithFailOpen grants such requests itself: Allow
// then reports no error, so the error hook is not told (the Client's
// observer is), and the response has no rate-limit fields, there being no
// decision to report.
func WithFailOpen() Option { return func(o *options) { o.open = true } }

// WithShadowHeaders sends the rate-limit fields of a decision made in shadow
// mode (redlimit.Limiter.WithShadow, SetShadow) as enforcing would have,
// except Retry-After: the request goes through. By default such a decision
// sends none, so that a limit on trial is invisible to clients; the
// handlers see it either way (FromContext: Result.Shadow, Result.Reason).
func WithShadowHeaders() Option { return func(o *options) { o.shadow = true } }

// WithErrorHook tells hook of every error: the KeyFunc's, Redis's, the
// script's; not of a request whose client has gone away, which gets no
// answer, nor of one above the limit (redlimit.ErrPermitsExceedRate, 413),
// which is the client's to fix and would let any client fill a log. It runs
// on the request's goroutine, so it must be quick: a log line, a counter.
//
// The one exception: while a Client's breaker is open
// (redlimit.WithBreaker), every request is answered with
// redlimit.ErrBreakerOpen in microseconds, and a hook that logs would write
// a line for each (140,337 in 3 s, once). So the hook is told of the first
// ErrBreakerOpen of a run only: the next is told once something else has
// happened in between (a decision, or another error, such as the breaker's
// failed probe once per cool-down). The failures that open the breaker and
// those of its probes are told as they come. To count every request answered
// so, use the Client's observer (redlimit.WithObserver), which sees them all.
func WithErrorHook(hook func(r *http.Request, err error)) Option {
	return func(o *options) { o.hook = hook }
}

// WithDeniedHandler writes the response to a denied request, one that a
// wait lets through; default 429 Too Many Requests with a text/plain body.
// The rate-limit fields and Retry-After are set before it is called, and
// FromContext(r.Context()) holds the decision (its Result). A request above
// the limit, which no wait lets through, goes to the error handler instead
// (413).
func WithDeniedHandler(h http.Handler) Option { return func(o *options) { o.denied = h } }

// WithErrorHandler writes the response to a request the middleware could not
// decide, after the error hook, or one that can never be granted. status is
// what the middleware would answer: 400 Bad Request (the KeyFunc failed),
// 413 Content Too Large (more permits than the limit can ever grant, err
// redlimit.ErrPermitsExceedRate; RateLimit-Policy is set, and the error hook
// is not told), 503 Service Unavailable (Redis is unavailable, without
// WithFailOpen) or 500 Internal Server Error (any other error); err is why
// (FromContext(r.Context()).Err too). When a Client's breaker is open
// (redlimit.ErrBreakerOpen), Retry-After is set before it is called: 1
// second, the breaker's default cool-down. The cool-down in force is not
// known here, and a client back too early is answered at once by the
// breaker without touching Redis.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, status int, err error)) Option {
	return func(o *options) { o.failed = h }
}

// WithClock is the time X-RateLimit-Reset counts from; default time.Now.
// Tests pass the clock their redlimit.Client has (redlimit.WithClock).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithMaxWait is how long InFlight waits for a slot before it answers 429
// Too Many Requests; default 0, no wait: a full limit answers at once. A
// wait looks again every 20ms (redlimit.InFlight.Acquire).
func WithMaxWait(d time.Duration) Option { return func(o *options) { o.wait = d } }
