package httplimit

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// Policy is one limit of NewAll: a request takes Permits(r) from
// Limiter(key), key naming its client by Key.
type Policy struct {
	// Name names the policy in RateLimit-Policy and RateLimit, and in its
	// Decision: printable ASCII, and unique among a NewAll's policies.
	Name string
	// Limiter returns the limiter of the client key names, escaped by
	// redlimit.KeyPart, as New's limiterFor does; nil leaves the request
	// out of this policy. Its limiters must be of NewAll's client.
	Limiter func(key string) *redlimit.Limiter
	// Key names the client; nil: WithKey's (by default ClientIP).
	Key KeyFunc
	// Permits is what a request takes; nil: WithPermits's (by default 1).
	Permits func(r *http.Request) int64
}

// NewAll returns middleware that decides every policy of a request at
// once, all or nothing (redlimit.Client.AllowAll): a request that one
// policy denies takes no permit from the others.
//
// Stacked New middlewares, per IP outside and per user inside, decide one
// after the other, and the outer one has counted a request by the time the
// inner one denies it: a client that a per-user limit holds back keeps
// spending its IP's permits, and those of everyone behind that IP, with
// requests none of which are served. NewAll decides the policies in one
// script call, which counts in none of them unless all grant:
//
//	limit := httplimit.NewAll(client, []httplimit.Policy{
//		{Name: "per-ip", Limiter: func(ip string) *redlimit.Limiter {
//			return client.FixedWindow("{api}ip:" + ip).WithDefault(redlimit.PerMinute(100))
//		}},
//		{Name: "per-user", Key: httplimit.Header("X-User"), Limiter: func(user string) *redlimit.Limiter {
//			return client.FixedWindow("{api}user:" + user).WithDefault(redlimit.PerMinute(10))
//		}},
//	})
//
// One script call runs on one server, so on a Redis Cluster the limiters
// of a request must be in one hash slot: their names need one hash tag, as
// "{api}" above (through a Ring or a wrapper client too; through a plain or
// failover client any names do). Otherwise the request is answered 500
// Internal Server Error (redlimit.ErrMisconfigured, never failed open), and
// nothing is counted. Policies keyed apart, as per IP and per user, share
// nothing but the request, so their tag is a constant, which puts every
// client's limiters on one node; where that node cannot take the load,
// stack New middlewares instead. Policies keyed alike (per API key, and
// per API key on an expensive route) can tag their names with the key
// ("{"+key+"}:export"): each client's limiters share a slot, and the
// clients spread over the Cluster.
//
// The response is New's, with every policy in the lists: RateLimit-Policy
// and RateLimit hold an item for each policy, in order (after those of any
// middleware the request passed before), each reporting its own limiter's
// Result, a granted one's on a denied request too, which counted nothing
// and says what the limiter still has. A denial is 429 Too Many Requests
// (the denied handler) with Retry-After the longest wait of the policies
// that denied (redlimit.AllResult.RetryAfter, in whole seconds rounded up);
// the legacy fields (WithLegacyHeaders) hold the binding policy, the one
// Decision names. A request for more than a policy can ever grant is 413
// Content Too Large, as New answers it: no Retry-After, no RateLimit item
// for that policy. A policy whose Limiter is nil for the request has no
// part in it: no items and no decision; with none left the request goes to
// the next handler undecided.
//
// The handlers after it find in FromContext's Decision the binding
// policy's Policy, Key and Result, as New's are read, and every policy's in
// Decision.Policies. The options are New's: WithKey and WithPermits are the
// defaults of policies without their own, WithPolicy is not read; errors,
// WithFailOpen (all policies granted open), shadow mode (a policy in shadow
// mode does not hold back the others; WithShadowHeaders) and a client gone
// are handled as New handles them. NewAll panics if client is nil, a Name
// is repeated or not printable ASCII, or a Limiter is nil.
func NewAll(client *redlimit.Client, policies []Policy, opts ...Option) func(http.Handler) http.Handler {
	if client == nil {
		panic("httplimit: NewAll without a client")
	}
	o := newOptions(opts)
	names := make([]string, len(policies))
	for i, p := range policies {
		names[i] = p.Name
	}
	quoted := ratelimitfields.Policies("httplimit", names, func(i int) bool { return policies[i].Limiter != nil })
	ps := make([]policy, len(policies))
	for i, p := range policies {
		ps[i] = policy{Policy: p, name: quoted[i]}
		if ps[i].Key == nil {
			ps[i].Key = o.key
		}
		if ps[i].Permits == nil {
			ps[i].Permits = o.permits
		}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var d Decision
			var wants []redlimit.Want
			var names []string
			for _, p := range ps {
				key, err := requestKey(p.Key, r)
				if err != nil {
					o.fail(w, r, Decision{Policy: p.Name, Err: err}, http.StatusBadRequest)
					return
				}
				if l := p.Limiter(key); l != nil {
					wants = append(wants, redlimit.Want{Limiter: l, Permits: p.Permits(r)})
					names = append(names, p.name)
					d.Policies = append(d.Policies, Decision{Policy: p.Name, Key: key})
				}
			}
			if len(wants) == 0 {
				next.ServeHTTP(w, r) // not limited
				return
			}
			all, err := client.AllowAll(r.Context(), wants...)
			d.Err = err
			above := errors.Is(err, redlimit.ErrPermitsExceedRate)
			if err == nil || above {
				o.breakerRun.Decided()
			}
			switch {
			case r.Context().Err() != nil:
				return // the client is gone: see New
			case err == nil || above:
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
			for i := range d.Policies {
				d.Policies[i].Result = all.Results[i]
			}
			b := o.setAllFields(w.Header(), names, all)
			d.Policy, d.Key, d.Result = d.Policies[b].Policy, d.Policies[b].Key, d.Policies[b].Result
			r = withDecision(r, d)
			switch {
			case above:
				o.failed(w, r, http.StatusRequestEntityTooLarge, d.Err) // see New
			case !all.Allowed:
				o.denied.ServeHTTP(w, r)
			default:
				next.ServeHTTP(w, r)
			}
		})
	}
}

// policy is a Policy with its defaults filled in, and its name quoted.
type policy struct {
	Policy
	name string
}

// setAllFields writes the rate-limit fields of one AllowAll, its
// policies quoted as names, and returns the index of the binding policy,
// the tightest of those whose fields are sent (else of all). Each policy's
// fields are New's (setFields) but for Retry-After and the legacy fields,
// which are the binding policy's: on a denial, the longest wait, the call's.
func (o *options) setAllFields(h http.Header, names []string, all redlimit.AllResult) int {
	// Limit 0: granted by a Client's WithFailOpen, without a decision.
	sent := func(res redlimit.Result) bool { return res.Limit > 0 && (!res.Shadow || o.shadow) }
	fields := make([]ratelimitfields.Fields, len(names))
	b := 0
	for i, res := range all.Results {
		if sent(res) {
			fields[i] = addItems(h, names[i], res)
		} else {
			fields[i] = ratelimitfields.For(names[i], res)
		}
		switch bound := all.Results[b]; {
		case sent(res) != sent(bound):
			if sent(res) {
				b = i
			}
		case tighter(res, bound, fields[i], fields[b]):
			b = i
		}
	}
	if res := all.Results[b]; sent(res) && fields[b].Limit != "" { // none above the limit: no wait helps it
		if !res.Allowed {
			h.Set("Retry-After", strconv.FormatInt(ratelimitfields.Seconds(fields[b].Effective), 10))
		}
		o.setLegacy(h, res, fields[b])
	}
	return b
}

// tighter reports whether a binds a request tighter than b, their fields
// fa and fb: a denial over a grant; between denials the longer wait, no
// wait helping (Never) the longest; between grants the fewer permits
// left, then the later reset, as the legacy fields of stacked middlewares
// choose (binds).
func tighter(a, b redlimit.Result, fa, fb ratelimitfields.Fields) bool {
	switch {
	case a.Allowed != b.Allowed:
		return !a.Allowed
	case !a.Allowed:
		return a.RetryAfter != b.RetryAfter && (a.RetryAfter == redlimit.Never || b.RetryAfter != redlimit.Never && a.RetryAfter > b.RetryAfter)
	case a.Remaining != b.Remaining:
		return a.Remaining < b.Remaining
	}
	return fa.Effective > fb.Effective
}
