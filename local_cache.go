package redlimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// WithLocalCache makes the Client remember denials in process memory. When
// Redis answers "denied, retry after d", later requests for as many permits
// or more on the same limiter are denied locally, without a round trip, until
// d has passed: nothing but time frees permits sooner, so this never admits
// more than Redis would.
//
// What it can do is deny too long: a denial stays cached even if another
// instance raises the rate, resets, deletes or releases in the meantime. Such
// a stale denial lasts at most the RetryAfter Redis gave, which is at most
// Interval (a funnel's Burst × Interval / Rate). SetRate, TrySetRate, Reset,
// Delete, Release and Expire on this Client drop its cached denials at once.
// Requests for fewer permits, and peeks, always go to Redis.
func WithLocalCache() Option {
	return func(c *Client) { c.denials = &denials{} }
}

// denials maps a limiter (name and algorithm) to its latest denial.
type denials struct {
	m      sync.Map // string → denial
	stored atomic.Int64
}

type denial struct {
	until   time.Time // on the Client's clock
	permits int64     // the smallest request denied
	result  Result
	at      time.Time
}

// sweepEvery bounds the memory of limiters that stop being asked: every so
// many stores, expired denials are dropped.
const sweepEvery = 1024

// lookup returns the cached denial of permits on key, as it stands at now.
func (d *denials) lookup(key string, permits int64, now time.Time) (Result, bool) {
	v, ok := d.m.Load(key)
	if !ok {
		return Result{}, false
	}
	e := v.(denial)
	if !now.Before(e.until) {
		d.m.CompareAndDelete(key, v)
		return Result{}, false
	}
	if permits < e.permits {
		return Result{}, false
	}
	r := e.result
	r.RetryAfter = e.until.Sub(now)
	r.ResetAfter = max(0, r.ResetAfter-now.Sub(e.at))
	return r, true
}

// store remembers r, a denial of permits on key decided at now.
func (d *denials) store(key string, permits int64, r Result, now time.Time) {
	if r.Allowed || r.RetryAfter <= 0 {
		return // a grant, or a request that can never succeed (an error, not cached)
	}
	d.m.Store(key, denial{until: now.Add(r.RetryAfter), permits: permits, result: r, at: now})
	if d.stored.Add(1)%sweepEvery == 0 {
		d.m.Range(func(k, v any) bool {
			if !now.Before(v.(denial).until) {
				d.m.CompareAndDelete(k, v)
			}
			return true
		})
	}
}

func (d *denials) forget(key string) { d.m.Delete(key) }
