package redlimit

import (
	"strconv"
	"time"
)

// Never is the RetryAfter of a request no wait can satisfy: more permits
// than Limit.
const Never time.Duration = -1

// What RemainTimeToLive returns, as go-redis's TTL does, for a limiter whose
// config never expires (NoExpiry) and for one with no key at all (NoKey).
const (
	NoExpiry time.Duration = -1
	NoKey    time.Duration = -2
)

// Result is the outcome of one Allow. With WithFailOpen, a request Redis
// could not decide gets Result{Allowed: true} and nothing else: Limit 0 tells
// it apart.
type Result struct {
	Allowed    bool
	Limit      int64         // the most permits one request can ever get (Rate; a funnel's Burst)
	Remaining  int64         // permits that could be granted right now
	RetryAfter time.Duration // denied: exact wait before this request can succeed; Never if it never can; 0 if allowed
	ResetAfter time.Duration // until the limiter is back to full
	// Window is the span Limit applies to: the config's Interval, or for a
	// funnel the time its Burst takes to drain (Burst × Interval / Rate).
	// With SetRate it follows the config in force.
	Window time.Duration
	// With several rates (Config.And), Bound is the one that bound the
	// answer, whose Limit and Window these are: 0 for the config's own, i for
	// More[i-1]. Denied, it is the rate with the longest wait (or one that can
	// never grant that many); allowed, the one with the fewest permits left.
	// Quotas lists every rate's Limit, Window and ResetAfter, in config
	// order; with one rate it is nil.
	Bound  int
	Quotas []Quota
	// Reason says what decided: the limit (ReasonLimit, the zero value),
	// a denial cached by WithLocalCache, WithFailOpen granting what Redis
	// could not decide (the observer's Decision.Err says why), shadow
	// mode granting what the limit denied, the handle's lease, or
	// degraded mode deciding locally, within the instance's share, what
	// Redis could not (WithDegraded: Limit is then the share).
	Reason Reason
	// Shadow: the decision was made in shadow mode (WithShadow,
	// Limiter.WithShadow, or the stored config's, Limiter.SetShadow). It
	// was made and counted as ever, and Allowed is true whatever the limit
	// said: Reason is ReasonShadow when the limit denied, and RetryAfter
	// and Remaining are what enforcing would have answered.
	Shadow bool
}

// Reason is what decided a Result.
type Reason uint8

const (
	ReasonLimit    Reason = iota // the limit, in Redis: Bound says which rate
	ReasonCache                  // a denial cached by WithLocalCache, without a round trip
	ReasonFailOpen               // granted by WithFailOpen, or in shadow mode, while Redis could not decide
	ReasonShadow                 // granted in shadow mode; the limit denied it
	ReasonLease                  // decided from this handle's lease (WithLease), without a round trip
	ReasonDegraded               // decided locally within this instance's share while Redis could not decide (WithDegraded)
)

func (r Reason) String() string {
	switch r {
	case ReasonLimit:
		return "limit"
	case ReasonCache:
		return "cache"
	case ReasonFailOpen:
		return "fail-open"
	case ReasonShadow:
		return "shadow"
	case ReasonLease:
		return "lease"
	case ReasonDegraded:
		return "degraded"
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Quota is one rate's Limit and Window, as Result reports them, and the
// time until that rate is full again: its window resets (a funnel's burst
// has drained).
type Quota struct {
	Limit      int64
	Window     time.Duration
	ResetAfter time.Duration
}
