package ratelimitfields

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlimit/redlimit"
)

func TestFor(t *testing.T) {
	granted := redlimit.Result{Allowed: true, Limit: 100, Remaining: 42, ResetAfter: 16100 * time.Millisecond, Window: time.Minute}
	assert.Equal(t, Fields{`"default";q=100;w=60`, `"default";r=42;t=17`, granted.ResetAfter}, For(`"default"`, granted))

	// A denial's effective window is its wait; a funnel's w rounds up.
	denied := redlimit.Result{Limit: 4, RetryAfter: 2500 * time.Millisecond, ResetAfter: 9 * time.Second, Window: 1500 * time.Millisecond}
	assert.Equal(t, Fields{`"f";q=4;w=2`, `"f";r=0;t=3`, denied.RetryAfter}, For(`"f"`, denied))

	// No wait helps a request above the limit: its policy only, no r or t.
	never := redlimit.Result{Limit: 4, RetryAfter: redlimit.Never, ResetAfter: time.Second}
	assert.Equal(t, Fields{`"f";q=4`, "", 0}, For(`"f"`, never), "no Window, no w")
	assert.True(t, AboveLimit(never))
	assert.False(t, AboveLimit(denied))
	assert.False(t, AboveLimit(granted))
}

// TestForSeveralRates: RateLimit-Policy lists every rate, each named after
// its window, and RateLimit reports the bound one.
func TestForSeveralRates(t *testing.T) {
	// Each rate's reset: the second's in 400ms, the hour's in 1800.5s.
	perSecondAndHour := []redlimit.Quota{{Limit: 10, Window: time.Second, ResetAfter: 400 * time.Millisecond},
		{Limit: 1000, Window: time.Hour, ResetAfter: 1800500 * time.Millisecond}}
	const policy = `"api/1s";q=10;w=1, "api/1h";q=1000;w=3600`

	// Allowed, the per-second rate has the fewest left. ResetAfter is the
	// hour's; t is the bound rate's own reset, rounded up.
	granted := redlimit.Result{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: 1800500 * time.Millisecond, Window: time.Second, Quotas: perSecondAndHour}
	assert.Equal(t, Fields{policy, `"api/1s";r=9;t=1`, 400 * time.Millisecond}, For(`"api"`, granted))

	// Allowed, the hour has fewer left: it binds, and its reset stands.
	hourly := redlimit.Result{Allowed: true, Limit: 1000, Remaining: 4, ResetAfter: 1800500 * time.Millisecond, Window: time.Hour, Bound: 1, Quotas: perSecondAndHour}
	assert.Equal(t, Fields{policy, `"api/1h";r=4;t=1801`, hourly.ResetAfter}, For(`"api"`, hourly))

	// Denied: t is the longest wait, the bound rate's.
	denied := redlimit.Result{Limit: 1000, RetryAfter: 20 * time.Minute, ResetAfter: 40 * time.Minute, Window: time.Hour, Bound: 1, Quotas: perSecondAndHour}
	assert.Equal(t, Fields{policy, `"api/1h";r=0;t=1200`, denied.RetryAfter}, For(`"api"`, denied))

	// Above the per-second limit: no wait helps; every rate's policy, no r or t.
	never := redlimit.Result{Limit: 10, Remaining: 3, RetryAfter: redlimit.Never, ResetAfter: 50 * time.Minute, Window: time.Second, Quotas: perSecondAndHour}
	assert.Equal(t, Fields{policy, "", 0}, For(`"api"`, never))
}

func TestNames(t *testing.T) {
	quotas := func(windows ...time.Duration) []redlimit.Quota {
		q := make([]redlimit.Quota, len(windows))
		for i, w := range windows {
			q[i] = redlimit.Quota{Limit: int64(i + 1), Window: w}
		}
		return q
	}
	assert.Equal(t, []string{`"a/1s"`, `"a/90s"`, `"a/1m"`, `"a/1h"`}, names(`"a"`, quotas(time.Second, 90*time.Second, time.Minute, time.Hour)))
	assert.Equal(t, []string{`"a/1d"`, `"a/36h"`, `"a/1500ms"`, `"a/0ms"`}, names(`"a"`, quotas(24*time.Hour, 36*time.Hour, 1500*time.Millisecond, 0)))
	// A funnel's windows can repeat: each after the first has its position.
	assert.Equal(t, []string{`"f/2s"`, `"f/1m"`, `"f/2s#3"`, `"f/2s#4"`}, names(`"f"`, quotas(2*time.Second, time.Minute, 2*time.Second, 2*time.Second)))
	// Inside a quoted name's quotes: the quoted name of the whole.
	quoted, _ := Name(`per "ip"`)
	want, _ := Name(`per "ip"/1s`)
	assert.Equal(t, []string{want, `"per \"ip\"/1m"`}, names(quoted, quotas(time.Second, time.Minute)))
}

func TestName(t *testing.T) {
	name, ok := Name(`per "user"`)
	assert.True(t, ok)
	assert.Equal(t, `"per \"user\""`, name)
	for _, bad := range []string{"ünï", "tab\there", "\x7f"} {
		_, ok := Name(bad)
		assert.False(t, ok, "%q", bad)
	}
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{-time.Second: 0, 0: 0, time.Nanosecond: 1, time.Second: 1, time.Second + 1: 2} {
		assert.Equal(t, want, Seconds(d), "%v", d)
	}
}

func TestPolicies(t *testing.T) {
	has := func(int) bool { return true }
	assert.Equal(t, []string{`"per-ip"`, `"user"`}, Policies("pkg", []string{"per-ip", "user"}, has))
	assert.PanicsWithValue(t, `pkg: policy name "a\x01" is not printable ASCII`, func() { Policies("pkg", []string{"a\x01"}, has) })
	assert.PanicsWithValue(t, `pkg: two policies named "ip"`, func() { Policies("pkg", []string{"ip", "ip"}, has) })
	assert.PanicsWithValue(t, `pkg: policy "user" has no Limiter`, func() {
		Policies("pkg", []string{"ip", "user"}, func(i int) bool { return i == 0 })
	})
}
