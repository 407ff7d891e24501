// Package httplimit is net/http middleware that rate-limits requests with
// redlimit, so that every instance of a service shares one limit per client.
//
// Each request costs one script call (Limiter.Allow, never a separate peek),
// whose Result fills the response fields of the IETF draft
// draft-ietf-httpapi-ratelimit-headers-11 (May 2026), both structured fields:
//
//	RateLimit-Policy: "default";q=100;w=60
//	RateLimit: "default";r=42;t=17
//
// and, when the request is denied, 429 Too Many Requests with Retry-After.
// q is the Result's Limit (the config's Rate; a funnel's Burst), so it follows
// a SetRate at once; r is Remaining; t is in whole seconds, rounded up.
package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/redlimit/redlimit"
)

// ErrNoKey: the request does not carry what its key is made of.
var ErrNoKey = errors.New("httplimit: no key")

// Option configures New. The options and their defaults:
//
//	KeyFunc        ClientIP(""): the IP address of RemoteAddr, no proxy trusted
//	PermitsFunc    1 permit per request
//	PolicyName     "default"
//	Window         0: RateLimit-Policy has no w parameter
//	LegacyHeaders  false: no X-RateLimit-Limit, -Remaining, -Reset
//	FailOpen       false: when Redis is unavailable, answer 503 Service Unavailable
//	ErrorHook      none
//	DeniedHandler  429 Too Many Requests with a text/plain body
//	Clock          time.Now, read only for X-RateLimit-Reset
type Option interface{ apply(*options) }

type options struct {
	key     KeyFunc
	permits PermitsFunc
	policy  PolicyName
	window  Window
	legacy  LegacyHeaders
	open    FailOpen
	hook    ErrorHook
	denied  DeniedHandler
	now     Clock

	name   string // the policy name as an sf-string
	wParam string // ";w=60", or "" without a Window
}

// KeyFunc names the client a request counts against: the limiter used is
// limiterFor(key). An error rejects the request with 400 Bad Request, whatever
// FailOpen says: the key comes from the request, and failing open would let a
// client skip the limit by leaving out what the key is made of.
type KeyFunc func(r *http.Request) (string, error)

// PermitsFunc is how many permits a request takes. Zero lets it through and
// only reports the limiter's state; a negative number is an error (ErrorHook,
// FailOpen).
type PermitsFunc func(r *http.Request) int64

// PolicyName identifies the policy in RateLimit-Policy and RateLimit. It must
// be printable ASCII: New panics otherwise.
type PolicyName string

// Window is the policy's time window, sent as RateLimit-Policy's w parameter
// in whole seconds, rounded up. Set it to the Interval of the limiters'
// config: it is not read from Redis, which would cost a round trip per request
// (a limiter's config can differ per key and change at any time).
type Window time.Duration

// LegacyHeaders adds the pre-standard fields many clients still read:
// X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, the last as
// a Unix time in seconds, as GitHub's API sends it.
type LegacyHeaders bool

// FailOpen lets requests through, without rate-limit fields, when Redis
// cannot decide (redlimit.ErrUnavailable: unreachable, timed out, failing
// over). Without it they are answered 503 Service Unavailable. Either way
// ErrorHook learns the error. Any other error (ErrNotInitialized, a negative
// PermitsFunc, corrupt state) is a bug to fix, not an outage to ride out: it
// is answered 500 Internal Server Error whatever FailOpen says.
//
// A Client made WithFailOpen grants such requests itself: Allow then reports
// no error, so ErrorHook is not told (the Client's observer is), and the
// response has no rate-limit fields, there being no decision to report.
type FailOpen bool

// ErrorHook is told of every error: the KeyFunc's, Redis's, the script's;
// not of a request whose client has gone away, which gets no answer. It runs
// on the request's goroutine, so it must be quick: a log line, a counter.
type ErrorHook func(r *http.Request, err error)

// DeniedHandler writes the response to a denied request. The rate-limit
// fields and Retry-After are set before it is called.
type DeniedHandler func(w http.ResponseWriter, r *http.Request)

// Clock is the time X-RateLimit-Reset counts from. Tests pass the clock
// their redlimit.Client has (redlimit.WithClock).
type Clock func() time.Time

func (o KeyFunc) apply(opts *options)       { opts.key = o }
func (o PermitsFunc) apply(opts *options)   { opts.permits = o }
func (o PolicyName) apply(opts *options)    { opts.policy = o }
func (o Window) apply(opts *options)        { opts.window = o }
func (o LegacyHeaders) apply(opts *options) { opts.legacy = o }
func (o FailOpen) apply(opts *options)      { opts.open = o }
func (o ErrorHook) apply(opts *options)     { opts.hook = o }
func (o DeniedHandler) apply(opts *options) { opts.denied = o }
func (o Clock) apply(opts *options)         { opts.now = o }

// New returns middleware that takes permits from limiterFor(key) for each
// request, key naming its client (KeyFunc). A Limiter is one named limit, so
// limiterFor returns a handle per key. Handles hold no state and cost no round
// trip to make; the config goes with the handle (WithDefault) or is stored
// once in Redis (SetRate):
//
//	cfg := redlimit.PerMinute(100)
//	limit := httplimit.New(func(key string) *redlimit.Limiter {
//		return client.FixedWindow("api:" + key).WithDefault(cfg)
//	}, httplimit.Window(cfg.Interval))
//	http.ListenAndServe(":8080", limit(mux))
//
// limiterFor must not return nil.
func New(limiterFor func(key string) *redlimit.Limiter, opts ...Option) func(http.Handler) http.Handler {
	o := options{
		key:     ClientIP(""),
		permits: func(*http.Request) int64 { return 1 },
		policy:  "default",
		denied:  tooManyRequests,
		now:     time.Now,
	}
	for _, opt := range opts {
		opt.apply(&o)
	}
	if !printable(string(o.policy)) {
		panic(fmt.Sprintf("httplimit: policy name %q is not printable ASCII", o.policy))
	}
	o.name = strconv.Quote(string(o.policy)) // for printable ASCII, Go's quoting is sf-string's
	if o.window > 0 {
		o.wParam = ";w=" + strconv.FormatInt(ceilSeconds(time.Duration(o.window)), 10)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, err := o.key(r)
			if err != nil {
				o.report(r, err)
				http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
				return
			}
			res, err := limiterFor(key).Allow(r.Context(), o.permits(r))
			switch {
			case err == nil:
			case r.Context().Err() != nil:
				return // the client is gone: nothing to answer
			case errors.Is(err, redlimit.ErrUnavailable):
				o.report(r, err)
				if o.open {
					next.ServeHTTP(w, r)
					return
				}
				http.Error(w, http.StatusText(http.StatusServiceUnavailable), http.StatusServiceUnavailable)
				return
			default:
				o.report(r, err)
				http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
				return
			}
			if res.Limit > 0 { // 0: granted by a Client's WithFailOpen, without a decision
				o.setFields(w.Header(), res)
			}
			if !res.Allowed {
				o.denied(w, r)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func (o *options) report(r *http.Request, err error) {
	if o.hook != nil {
		o.hook(r, err)
	}
}

// setFields writes the rate-limit fields of one decision. The effective
// window t is when the limiter is full again (ResetAfter); on a denial it is
// the wait (RetryAfter) instead, since the draft wants Retry-After to point
// no earlier than the end of the effective window. A request for more than
// Limit gets no Retry-After: no wait would help.
func (o *options) setFields(h http.Header, res redlimit.Result) {
	window := res.ResetAfter
	if !res.Allowed && res.RetryAfter >= 0 {
		window = res.RetryAfter
		h.Set("Retry-After", strconv.FormatInt(ceilSeconds(window), 10))
	}
	limit, remaining := strconv.FormatInt(res.Limit, 10), strconv.FormatInt(res.Remaining, 10)
	h.Set("RateLimit-Policy", o.name+";q="+limit+o.wParam)
	h.Set("RateLimit", o.name+";r="+remaining+";t="+strconv.FormatInt(ceilSeconds(window), 10))
	if o.legacy {
		reset := o.now().Add(window)
		h.Set("X-RateLimit-Limit", limit)
		h.Set("X-RateLimit-Remaining", remaining)
		h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(time.Duration(reset.UnixNano())), 10))
	}
}

func tooManyRequests(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
}

// ceilSeconds rounds up to whole seconds, the only unit the fields allow.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
