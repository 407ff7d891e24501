package redlimit

import (
	"time"

	"github.com/redlimit/redlimit/internal/denials"
)

// WithLocalCache makes the Client remember denials in process memory. When
// Redis answers "denied, retry after d", later requests for as many permits
// or more on the same limiter are denied locally, without a round trip, for
// d or CacheMaxAge, whichever is shorter: nothing but time frees permits
// sooner, so this never admits more than Redis would.
//
// What it can do is deny too long: a denial stays cached even if another
// instance raises the rate, resets, deletes, releases or turns shadow mode on
// in the meantime. Such a change reaches this instance within CacheMaxAge;
// SetRate, TrySetRate, SetShadow, Reset, Delete, Expire and a reservation's
// Release on this Client drop its cached denials at once. A decision made in
// shadow mode (the stored config's, SetShadow) is never cached, so switching
// shadow off reaches the next request. Requests for fewer permits, and peeks,
// always go to Redis. A denial answers only requests decided the same way:
// the same algorithm, name and config (the handle's default, or Throttle's
// arguments).
func WithLocalCache() Option {
	return func(c *Client) { c.denials = &denials.Cache[Result]{} }
}

// CacheMaxAge bounds how long WithLocalCache answers from a denial without
// asking Redis: the longest a change made by another instance (a higher
// rate, a Reset, shadow mode) takes to reach this one. A denied hot limit
// then costs each instance at most one round trip per CacheMaxAge.
const CacheMaxAge = time.Second

// cachedDenial is the cached denial that answers a request of permits on
// l now, if one does (WithLocalCache's): its wait and reset as they stand
// now.
func (c *Client) cachedDenial(l *Limiter, permits int64) (Result, bool) {
	now := c.clock()
	r, at, retryAt, ok := c.denials.Lookup(l.denial, permits, now)
	if !ok {
		return Result{}, false
	}
	r.RetryAfter = retryAt.Sub(now)
	r.ResetAfter = max(0, r.ResetAfter-now.Sub(at))
	r.Reason = ReasonCache
	return r, true
}

// cacheDenial remembers r, Redis's answer to a request of permits on l, if
// it is a denial that waiting can end. Redis decides by the algorithm, the
// name and the config the script is given (the stored one; a handle's
// default while none is stored; Throttle's arguments whatever is stored),
// so a denial is kept under all three (setDenial), and answers only
// requests Redis would decide as it did.
func (c *Client) cacheDenial(l *Limiter, permits int64, r Result) {
	if r.Allowed || r.RetryAfter <= 0 || r.Shadow {
		// A grant, a request that can never succeed (an error, not cached),
		// or a decision in shadow mode, which its caller is granted: cached,
		// it would outlive the stored config's switching shadow off.
		return
	}
	c.denials.Store(l.denial, permits, r, r.RetryAfter, CacheMaxAge, c.clock())
}

// setDenial names the way Redis decides the handle's requests, for the
// cache of denials: the limiter (algorithm and name, and the client for a
// handle AsClient made) and the config the scripts are given.
func (l *Limiter) setDenial() {
	limiter := l.alg.Name + ":" + l.name
	if id, _ := l.clientID.(string); id != l.client.clientID {
		limiter += " as " + id
	}
	config, _ := l.config.(string)
	l.denial = denials.Key(limiter, config)
}
