// Package denials remembers, in process memory, the latest denial of each
// way a limiter is decided: the package redlimit's WithLocalCache, which
// says what it promises. A denial answers later requests for as many
// permits or more, without a round trip, until the wait Redis gave it or
// a maximum age, whichever comes first: nothing but time frees permits
// sooner, so it never admits more than Redis would.
package denials

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Key names one way of deciding a limiter: limiter, then a NUL (which the
// decision part never holds, so the last NUL splits them whatever the name
// holds), then the decision: what Redis decides by beyond the limiter (the
// config source and config the script is given).
func Key(limiter, decision string) string {
	return limiter + "\x00" + decision
}

// Split splits a Key.
func Split(key string) (limiter, decision string) {
	at := strings.LastIndexByte(key, 0)
	return key[:at], key[at+1:]
}

// Cache holds the latest denial of each Key, grouped by limiter, so that a
// local change drops all of a limiter's at once (Forget). Its results are
// R, as stored. The zero Cache is ready to use.
type Cache[R any] struct {
	m      sync.Map // limiter → *sync.Map: decision → *denial[R]
	stored atomic.Int64
}

type denial[R any] struct {
	until   time.Time // when it stops answering, on the Client's clock
	retryAt time.Time // when the request may succeed, as Redis said
	permits int64     // the smallest request denied
	result  R
	at      time.Time
}

// sweepEvery bounds the memory of limiters that stop being asked: every so
// many stores, expired denials are dropped.
const sweepEvery = 1024

// Lookup returns the denial that answers a request of permits under key at
// now, if one does: its result as stored, when it was stored, and when the
// request may succeed.
func (d *Cache[R]) Lookup(key string, permits int64, now time.Time) (r R, at, retryAt time.Time, ok bool) {
	limiter, decision := Split(key)
	ways, ok := d.m.Load(limiter)
	if !ok {
		return r, at, retryAt, false
	}
	v, ok := ways.(*sync.Map).Load(decision)
	if !ok {
		return r, at, retryAt, false
	}
	e := v.(*denial[R])
	if !now.Before(e.until) {
		ways.(*sync.Map).CompareAndDelete(decision, v)
		return r, at, retryAt, false
	}
	if permits < e.permits {
		return r, at, retryAt, false
	}
	return e.result, e.at, e.retryAt, true
}

// Store remembers r, a denial of permits under key at now whose request
// may succeed after retryAfter: it answers for retryAfter or maxAge,
// whichever is shorter.
func (d *Cache[R]) Store(key string, permits int64, r R, retryAfter, maxAge time.Duration, now time.Time) {
	limiter, decision := Split(key)
	ways, ok := d.m.Load(limiter)
	if !ok {
		ways, _ = d.m.LoadOrStore(limiter, &sync.Map{})
	}
	ways.(*sync.Map).Store(decision, &denial[R]{until: now.Add(min(retryAfter, maxAge)), retryAt: now.Add(retryAfter),
		permits: permits, result: r, at: now})
	if d.stored.Add(1)%sweepEvery == 0 {
		d.sweep(now)
	}
}

// sweep drops expired denials, and limiters left with none. A denial stored
// into a limiter's map just as it is dropped is lost: a round trip, no harm.
func (d *Cache[R]) sweep(now time.Time) {
	d.m.Range(func(limiter, ways any) bool {
		empty := true
		ways.(*sync.Map).Range(func(decision, v any) bool {
			if !now.Before(v.(*denial[R]).until) {
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

// Forget drops every denial of the limiter key belongs to, whatever way it
// was decided.
func (d *Cache[R]) Forget(key string) {
	limiter, _ := Split(key)
	d.m.Delete(limiter)
}
