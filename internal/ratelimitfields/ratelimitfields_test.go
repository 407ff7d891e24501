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

	// No wait helps a request above the limit: t stays the reset.
	never := redlimit.Result{Limit: 4, RetryAfter: redlimit.Never, ResetAfter: time.Second}
	assert.Equal(t, Fields{`"f";q=4`, `"f";r=0;t=1`, time.Second}, For(`"f"`, never), "no Window, no w")
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
