package httplimit

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/redlimit/redlimit"
)

// releaseTimeout bounds the release after a handler: it runs on a context
// of its own, as the request's may have ended (a client gone).
const releaseTimeout = 5 * time.Second

// InFlight returns middleware that holds a slot of an in-flight limit
// (redlimit.InFlight) while the next handler runs, and releases it when the
// handler returns, panics included: at most Limit requests of a key are
// being served at once, across every instance. key names the request's
// client (KeyFunc, escaped by redlimit.KeyPart as New escapes it), and
// limitFor returns the limit it counts against, a handle per key, or one
// handle for all:
//
//	exports := client.InFlight("exports").WithDefault(redlimit.InFlightConfig{Limit: 10, TTL: 30 * time.Second})
//	limit := httplimit.InFlight(func(string) *redlimit.InFlight { return exports })
//	mux.Handle("/export", limit(exportHandler))
//
// A full limit is answered 429 Too Many Requests (the denied handler) at
// once, or after waiting up to WithMaxWait for a slot; no Retry-After is set, as a slot
// comes free when a handler returns, which nothing predicts. A nil
// *redlimit.InFlight leaves the request unlimited.
//
// The options are New's, where they apply: WithKey, WithPolicy,
// WithFailOpen, WithErrorHook, WithDeniedHandler and WithErrorHandler; and
// WithMaxWait. The handlers after it find
// the request's Hold with HoldFromContext, and its Decision with
// FromContext (its Result is zero: an in-flight limit has no rate to
// report). A release that fails, or finds the hold lost (redlimit.ErrHoldLost:
// the handler outlived its hold, refreshes failing), is told to the error
// hook.
// A request whose client is gone before a slot is granted is answered with
// nothing, and the handler never runs for it.
func InFlight(limitFor func(key string) *redlimit.InFlight, opts ...Option) func(http.Handler) http.Handler {
	o := newOptions(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d := Decision{Policy: o.policy}
			if d.Key, d.Err = o.requestKey(r); d.Err != nil {
				o.fail(w, r, d, http.StatusBadRequest)
				return
			}
			limit := limitFor(d.Key)
			if limit == nil {
				next.ServeHTTP(w, r)
				return
			}
			hold, err := acquire(r.Context(), limit, o.wait)
			if err == nil {
				o.breakerRun.Decided()
			}
			if hold != nil {
				defer func() {
					ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
					defer cancel()
					if err := hold.Release(ctx); err != nil {
						o.report(r, err)
					}
				}()
			}
			d.Err = err
			switch {
			case r.Context().Err() != nil:
				return // the client is gone: the deferred release frees a slot it may have got
			case err == nil:
			case errors.Is(err, redlimit.ErrMisconfigured):
				o.fail(w, r, d, http.StatusInternalServerError)
				return
			case errors.Is(err, redlimit.ErrUnavailable):
				if o.open {
					o.passOpen(w, r, next, d)
					return
				}
				if errors.Is(err, redlimit.ErrBreakerOpen) {
					w.Header().Set("Retry-After", "1")
				}
				o.fail(w, r, d, http.StatusServiceUnavailable)
				return
			default:
				o.fail(w, r, d, http.StatusInternalServerError)
				return
			}
			if hold == nil {
				o.denied.ServeHTTP(w, withDecision(r, d))
				return
			}
			d.Result = redlimit.Result{Allowed: true}
			r = withDecision(r, d)
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), holdKey{}, hold)))
		})
	}
}

// acquire takes a slot of limit: at once, or within wait. A wait that runs
// out is a denial (no Hold, no error), whatever the attempt it cut short
// said; the request's own end is its error.
func acquire(ctx context.Context, limit *redlimit.InFlight, wait time.Duration) (*redlimit.Hold, error) {
	if wait <= 0 {
		return limit.TryAcquire(ctx)
	}
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	hold, err := limit.Acquire(waitCtx)
	if err != nil && ctx.Err() == nil && waitCtx.Err() != nil {
		return nil, nil
	}
	return hold, err
}

type holdKey struct{}

// HoldFromContext returns the Hold the innermost InFlight middleware took
// for the request, and whether there is one (none with WithFailOpen, when Redis
// could not decide). A handler may watch its Lost channel: the slot may be
// another request's once it is closed.
func HoldFromContext(ctx context.Context) (*redlimit.Hold, bool) {
	h, ok := ctx.Value(holdKey{}).(*redlimit.Hold)
	return h, ok
}
