package redlimit

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
	return func(c *Client) { c.denials = &denials{} }
}

// CacheMaxAge bounds how long WithLocalCache answers from a denial without
// asking Redis: the longest a change made by another instance (a higher
// rate, a Reset, shadow mode) takes to reach this one. A denied hot limit
// then costs each instance at most one round trip per CacheMaxAge.
const CacheMaxAge = time.Second

// denials holds the latest denial of each way a limiter is decided. Redis
// decides by the algorithm, the name and the config the script is given: the
// stored one; a handle's default while none is stored; Throttle's arguments
// whatever is stored. So two handles with different defaults, or Throttle and
// Funnel on one key, each get their own entry, and a denial answers only
// requests Redis would decide as it did. Entries are grouped by limiter so
// that a local change (forget) drops all of them at once.
type denials struct {
	m      sync.Map // limiter (algorithm:name) → *sync.Map: decision (see denialKey) → denial
	stored atomic.Int64
}

type denial struct {
	until   time.Time // when it stops answering, on the Client's clock
	retryAt time.Time // when the request may succeed, as Redis said
	permits int64     // the smallest request denied
	result  Result
	at      time.Time
}

// denialKey names one way of deciding a limiter: limiter, then a NUL (which
// the decision part never holds, so the last NUL splits them whatever the
// name holds), then the config source and config the script is given.
func denialKey(limiter, config string) string {
	return limiter + "\x00" + config
}

func splitDenialKey(key string) (limiter, decision string) {
	at := strings.LastIndexByte(key, 0)
	return key[:at], key[at+1:]
}

// sweepEvery bounds the memory of limiters that stop being asked: every so
// many stores, expired denials are dropped.
const sweepEvery = 1024

// lookup returns the cached denial of permits under key, as it stands at now.
func (d *denials) lookup(key string, permits int64, now time.Time) (Result, bool) {
	limiter, decision := splitDenialKey(key)
	ways, ok := d.m.Load(limiter)
	if !ok {
		return Result{}, false
	}
	v, ok := ways.(*sync.Map).Load(decision)
	if !ok {
		return Result{}, false
	}
	e := v.(*denial)
	if !now.Before(e.until) {
		ways.(*sync.Map).CompareAndDelete(decision, v)
		return Result{}, false
	}
	if permits < e.permits {
		return Result{}, false
	}
	r := e.result
	r.RetryAfter = e.retryAt.Sub(now)
	r.ResetAfter = max(0, r.ResetAfter-now.Sub(e.at))
	r.Reason = ReasonCache
	return r, true
}

// store remembers r, a denial of permits under key decided at now.
func (d *denials) store(key string, permits int64, r Result, now time.Time) {
	if r.Allowed || r.RetryAfter <= 0 || r.Shadow {
		// A grant, a request that can never succeed (an error, not cached),
		// or a decision in shadow mode, which its caller is granted: cached,
		// it would outlive the stored config's switching shadow off.
		return
	}
	limiter, decision := splitDenialKey(key)
	ways, ok := d.m.Load(limiter)
	if !ok {
		ways, _ = d.m.LoadOrStore(limiter, &sync.Map{})
	}
	ways.(*sync.Map).Store(decision, &denial{until: now.Add(min(r.RetryAfter, CacheMaxAge)), retryAt: now.Add(r.RetryAfter),
		permits: permits, result: r, at: now})
	if d.stored.Add(1)%sweepEvery == 0 {
		d.sweep(now)
	}
}

// sweep drops expired denials, and limiters left with none. A denial stored
// into a limiter's map just as it is dropped is lost: a round trip, no harm.
func (d *denials) sweep(now time.Time) {
	d.m.Range(func(limiter, ways any) bool {
		empty := true
		ways.(*sync.Map).Range(func(decision, v any) bool {
			if !now.Before(v.(*denial).until) {
				ways.(*sync.Map).CompareAndDelete(decision, v)
			} else {
				empty = false
			}
			return true
		})
		if empty {
			d.m.CompareAndDelete(limiter, ways)
		}
		return true
	})
}

// forget drops every cached denial of the limiter key belongs to, whatever
// way it was decided.
func (d *denials) forget(key string) {
	limiter, _ := splitDenialKey(key)
	d.m.Delete(limiter)
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
	l.denial = denialKey(limiter, config)
}
