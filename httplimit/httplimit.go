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
// Every value comes from the decision, so each follows a SetRate at once: q is
// the Result's Limit (the config's Rate; a funnel's Burst), w its Window (the
// config's Interval; the time a funnel's Burst takes to drain), r Remaining;
// w and t are in whole seconds, rounded up.
//
// A request that costs more permits than the limit can ever grant
// (WithPermits above q: redlimit.ErrPermitsExceedRate) can never succeed, so
// it is not told to come back: it is answered 413 Content Too Large (the
// error handler, WithErrorHandler), with RateLimit-Policy, whose q is the
// most a request may ask for, and no Retry-After, RateLimit item or legacy
// field. It takes nothing, and is the client's doing, not an outage: the
// error hook (WithErrorHook) is not told.
//
// Middlewares can be stacked, say per IP outside and per user inside, each
// with a policy name of its own (WithPolicy). Both fields are lists: each middleware appends its
// policy to RateLimit-Policy and its decision to RateLimit, outer first, so
// the response reports every limit the request counted against (the draft
// lets RateLimit carry an item for each policy in force), and a client can
// see which one binds, the one with the fewest permits left:
//
//	RateLimit-Policy: "per-ip";q=100;w=60, "per-user";q=2;w=60
//	RateLimit: "per-ip";r=97;t=41, "per-user";r=0;t=41
//
// Stacked middlewares decide one after the other, so the outer one has
// counted a request by the time the inner one denies it: a client the
// per-user limit holds back keeps spending its IP's permits. NewAll
// decides several policies in one script call instead, counting in none of
// them unless all grant (redlimit.Client.AllowAll), with the same fields;
// on a Redis Cluster their limiters' names need one hash tag.
//
// A limiter of several rates (redlimit.Config.And) lists each in
// RateLimit-Policy, in config order, named after the policy and the
// rate's window written in its largest whole unit (1s, 90s, 1m, 1h, 1d, or
// 1500ms for a funnel's), and reports in RateLimit the rate that bound the
// decision (Result.Bound), as the draft lets a server do. With
// redlimit.PerSecond(10).And(redlimit.PerHour(1000)), after a first request:
//
//	RateLimit-Policy: "default/1s";q=10;w=1, "default/1h";q=1000;w=3600
//	RateLimit: "default/1s";r=9;t=1
//
// and once the hour has fewer permits left than the second, or denies, its
// item instead. r is the fewest permits any rate has left; t the wait on a
// denial, else the time until the limiter is full again, but no longer than
// the bound rate's window (it is full again within it; the slower rates'
// resets would have a client spread its permits over an hour). Two rates of
// a funnel can drain in the same time: the later one's name takes its
// position in the config too ("default/2s#2"). The names follow each
// decision, so a SetRate that changes an interval renames its rate, and one
// down to a single rate gives back the plain policy name.
//
// The handlers after the middleware, the denied and error handlers among
// them, find its Decision with FromContext.
//
// By default a client is its IP address (ClientIP): an IPv4 address, or an
// IPv6 address's /64 network, the block an ISP gives one subscriber, whose
// every address would otherwise be a fresh limit. WithKey(ClientPrefix(...))
// sets other prefix lengths, WithKey(Header(...)) keys by a header.
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// ErrNoKey: the request does not carry what its key is made of.
var ErrNoKey = errors.New("httplimit: no key")

// Allower is what the middleware asks for a decision: a *redlimit.Limiter,
// or a wrapper or fake of one. A Result with Limit 0 and no error is a grant
// without a decision (a Client's WithFailOpen): no rate-limit fields are set.
type Allower interface {
	Allow(ctx context.Context, permits int64) (redlimit.Result, error)
}

// Decision is what the middleware made of a request. The handlers after it
// (the next handler, the denied and error handlers) read it with FromContext.
//
// Under NewAll, Policy, Key and Result are those of the binding policy (the
// denial with the longest wait; else the fewest permits left), so a handler
// written for New reads it as it is; Policies holds every policy's.
type Decision struct {
	// Policy is WithPolicy's name. NewAll's is the binding policy's, or
	// the one whose KeyFunc failed; "" when the call made no decision.
	Policy string
	// Key is what limiterFor was given: the KeyFunc's key through
	// redlimit.KeyPart, so safe to log; "" when the KeyFunc failed.
	Key string
	// Result is the limiter's answer; Result.Reason says what decided (the
	// limit in Redis, a lease, the Client's cache of denials, shadow mode,
	// fail-open). It is zero when there is none (Err is set). A request
	// granted without a decision, by a Client made redlimit.WithFailOpen or
	// by WithFailOpen, has Allowed, Reason redlimit.ReasonFailOpen and
	// Limit 0.
	Result redlimit.Result
	// Err is why there is no decision: the KeyFunc's error, or Allow's
	// (redlimit.ErrUnavailable with WithFailOpen when the request was let
	// through without one). nil when there is a Result, but for a
	// request above the limit (413): its Result is the denial (RetryAfter
	// redlimit.Never) and Err redlimit.ErrPermitsExceedRate.
	Err error
	// Policies is, under NewAll, the decision of each policy that had a
	// limiter for the request, in order: its Policy, Key and Result (zero
	// when the call made none; Err is the call's, above). nil under New.
	Policies []Decision
}

type decisionKey struct{}

// FromContext returns the Decision of the innermost httplimit middleware the
// request has passed through, and whether there is one.
func FromContext(ctx context.Context) (Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(Decision)
	return d, ok
}

// New returns middleware that takes permits from limiterFor(key) for each
// request, key naming its client (KeyFunc), escaped by redlimit.KeyPart so
// that it is safe in a limiter name as it is. limiterFor returns a
// *redlimit.Limiter, or any Allower (a wrapper, a fake in tests): L is
// inferred from it. A Limiter is one named limit, so limiterFor returns a
// handle per key. Handles hold no state and cost no round
// trip to make; the config goes with the handle (WithDefault) or is stored
// once in Redis (SetRate):
//
//	limit := httplimit.New(func(key string) *redlimit.Limiter {
//		return client.FixedWindow("api:" + key).WithDefault(redlimit.PerMinute(100))
//	})
//	http.ListenAndServe(":8080", limit(mux))
//
// A nil Limiter (L's zero value) leaves the request unlimited (health checks, say): it goes
// to the next handler with no decision and no rate-limit fields.
//
// A request whose client goes away (its context cancelled) before the
// decision is made is answered with nothing, and the next handler never runs
// for it, even with WithFailOpen: a client that is gone is not an outage.
func New[L interface {
	comparable
	Allower
}](limiterFor func(key string) L, opts ...Option) func(http.Handler) http.Handler {
	o := newOptions(opts)
	name, ok := ratelimitfields.Name(o.policy)
	if !ok {
		panic(fmt.Sprintf("httplimit: policy name %q is not printable ASCII", o.policy))
	}
	o.name = name
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d := Decision{Policy: o.policy}
			if d.Key, d.Err = o.requestKey(r); d.Err != nil {
				o.fail(w, r, d, http.StatusBadRequest)
				return
			}
			limiter := limiterFor(d.Key)
			var none L
			if limiter == none {
				next.ServeHTTP(w, r) // not limited: health checks, say
				return
			}
			permits := o.permits(r)
			d.Result, d.Err = limiter.Allow(r.Context(), permits)
			above := aboveLimit(&d, permits)
			if d.Err == nil || above {
				o.breakerRun.Decided()
			}
			switch {
			case r.Context().Err() != nil:
				// The client is gone, whatever the limiter answered: nothing
				// to answer, and no handler to run for nobody (a grant it
				// took stays counted).
				return
			case d.Err == nil || above:
			case errors.Is(d.Err, redlimit.ErrMisconfigured):
				// Checked first: a refusal must never fail open, even were
				// it to wrap ErrUnavailable too.
				o.fail(w, r, d, http.StatusInternalServerError)
				return
			case errors.Is(d.Err, redlimit.ErrUnavailable):
				if o.open {
					o.passOpen(w, r, next, d)
					return
				}
				if errors.Is(d.Err, redlimit.ErrBreakerOpen) {
					w.Header().Set("Retry-After", "1")
				}
				o.fail(w, r, d, http.StatusServiceUnavailable)
				return
			default:
				o.fail(w, r, d, http.StatusInternalServerError)
				return
			}
			r = withDecision(r, d)
			// Limit 0: granted by a Client's WithFailOpen, without a decision.
			if d.Result.Limit > 0 && (!d.Result.Shadow || o.shadow) {
				o.setFields(w.Header(), d.Result)
			}
			switch {
			case above:
				// Not an outage nor a bug, so the error hook is not told: the
				// client asked for more than it can ever be granted.
				o.failed(w, r, http.StatusRequestEntityTooLarge, d.Err)
			case !d.Result.Allowed:
				o.denied.ServeHTTP(w, r)
			default:
				next.ServeHTTP(w, r)
			}
		})
	}
}

// aboveLimit reports whether d is the denial of a request for more permits
// than the limiter can ever grant, and makes its Err ErrPermitsExceedRate
// if the Allower said so only by RetryAfter Never, as Limiter.Allow did
// before it returned the error, and a wrapper or fake written then may.
func aboveLimit(d *Decision, permits int64) bool {
	if errors.Is(d.Err, redlimit.ErrPermitsExceedRate) {
		return true
	}
	if d.Err != nil || !ratelimitfields.AboveLimit(d.Result) {
		return false
	}
	d.Err = fmt.Errorf("%w: %d permits, limit %d", redlimit.ErrPermitsExceedRate, permits, d.Result.Limit)
	return true
}

// requestKey is the key WithKey's KeyFunc gives r, escaped (requestKey).
func (o *options) requestKey(r *http.Request) (string, error) { return requestKey(o.key, r) }

// requestKey is key's key of r, escaped: the one place a key from a
// request becomes part of a limiter name, so that no KeyFunc, ours or the
// caller's, can skip it.
func requestKey(key KeyFunc, r *http.Request) (string, error) {
	k, err := key(r)
	if err != nil {
		return "", err
	}
	return redlimit.KeyPart(k), nil
}

func withDecision(r *http.Request, d Decision) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), decisionKey{}, d))
}

// fail answers a request that got no decision.
func (o *options) fail(w http.ResponseWriter, r *http.Request, d Decision, status int) {
	o.report(r, d.Err)
	o.failed(w, withDecision(r, d), status, d.Err)
}

// passOpen lets a request Redis could not decide through (WithFailOpen),
// with the Result a Client made WithFailOpen would have given it.
func (o *options) passOpen(w http.ResponseWriter, r *http.Request, next http.Handler, d Decision) {
	o.report(r, d.Err)
	d.Result = redlimit.Result{Allowed: true, Reason: redlimit.ReasonFailOpen}
	for i := range d.Policies {
		d.Policies[i].Result = d.Result
	}
	next.ServeHTTP(w, withDecision(r, d))
}

func (o *options) report(r *http.Request, err error) {
	if o.hook == nil {
		return
	}
	if o.breakerRun.Tell(err) {
		o.hook(r, err)
	}
}

// setFields writes the rate-limit fields of one decision, after those of
// any middleware the request passed through before. A denial's Retry-After
// is its effective window (the wait), since the draft wants Retry-After to
// point no earlier than the end of the effective window. A request for more
// than Limit gets its policy only: no Retry-After, no RateLimit item and no
// legacy fields, whose remaining and reset would say when to come back, and
// no wait would help.
func (o *options) setFields(h http.Header, res redlimit.Result) {
	f := addItems(h, o.name, res)
	if f.Limit == "" {
		return
	}
	if !res.Allowed {
		h.Set("Retry-After", strconv.FormatInt(ratelimitfields.Seconds(f.Effective), 10))
	}
	o.setLegacy(h, res, f)
}

// addItems appends one decision's items, of the policy quoted as name, to
// RateLimit-Policy and RateLimit (to the policy only, for a request above
// the limit: f.Limit ""), and returns them.
func addItems(h http.Header, name string, res redlimit.Result) ratelimitfields.Fields {
	f := ratelimitfields.For(name, res)
	appendItem(h, "RateLimit-Policy", f.Policy)
	if f.Limit != "" {
		appendItem(h, "RateLimit", f.Limit)
	}
	return f
}

// setLegacy sets the legacy fields (WithLegacyHeaders) to res, whose
// fields are f, if it binds tighter than those already set.
func (o *options) setLegacy(h http.Header, res redlimit.Result, f ratelimitfields.Fields) {
	if !o.legacy {
		return
	}
	reset := ratelimitfields.Seconds(time.Duration(o.now().Add(f.Effective).UnixNano()))
	if binds(h, res, reset) {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(res.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(res.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	}
}

// appendItem adds item to a structured-field list, keeping the list on one
// field line: the draft allows several lines, but many clients read only the
// first (Header.Get among them).
func appendItem(h http.Header, field, item string) {
	if prev := h.Values(field); len(prev) > 0 {
		item = strings.Join(prev, ", ") + ", " + item
	}
	h.Set(field, item)
}

// binds reports whether res is a tighter limit than the one the legacy
// fields already hold, from a middleware the request passed before. A denial
// always is: the earlier middleware granted, or this one would not have run.
// Otherwise the fewer permits left, then the later reset.
func binds(h http.Header, res redlimit.Result, reset int64) bool {
	if !res.Allowed {
		return true
	}
	prev, err := strconv.ParseInt(h.Get("X-RateLimit-Remaining"), 10, 64)
	if err != nil {
		return true
	}
	if res.Remaining != prev {
		return res.Remaining < prev
	}
	prevReset, err := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
	return err != nil || reset > prevReset
}

func tooManyRequests(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
}

func errorStatus(w http.ResponseWriter, _ *http.Request, status int, _ error) {
	http.Error(w, http.StatusText(status), status)
}
