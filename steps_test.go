package redlimit

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// step is one Allow at a fixed instant and the whole Result it must get:
// Limit, Window and (with several rates) Quotas come from the config in
// force, bound is the rate that bound it (0 with one rate).
type step struct {
	at        time.Duration // clock position, from epoch
	permits   int64
	allowed   bool
	remaining int64
	retry     time.Duration
	reset     time.Duration
	bound     int
}

// runSteps plays steps against l on clk, under cfg, asserting every field of
// every Result. Every step table runs through it.
func runSteps(t *testing.T, l *Limiter, clk *clock, cfg Config, steps []step) {
	t.Helper()
	for i, s := range steps {
		clk.Set(epoch.Add(s.at))
		got, err := allowAny(context.Background(), l, s.permits)
		require.NoError(t, err, "step %d", i)
		assert.Equal(t, want(quotasOf(cfg), s.allowed, s.remaining, s.retry, s.reset, s.bound), withoutResets(t, got), "step %d: %d at %v under %v", i, s.permits, s.at, cfg)
	}
}

// withoutResets checks what every Result of several rates must hold of its
// rates' resets (the limiter is full again when its last rate is: the
// latest of them is ResetAfter) and returns r without them, for tables
// that give the limiter's reset only.
func withoutResets(t *testing.T, r Result) Result {
	t.Helper()
	if len(r.Quotas) == 0 {
		return r
	}
	latest := time.Duration(0)
	for _, q := range r.Quotas {
		latest = max(latest, q.ResetAfter)
	}
	assert.Equal(t, r.ResetAfter, latest, "the limiter is full again when its last rate is: %+v", r.Quotas)
	r.Quotas = limitsAndWindows(r.Quotas)
	return r
}

// want is the Result of a limiter whose rates report quotas: Limit and
// Window are the bound rate's; Quotas and Bound only with several rates.
func want(quotas []Quota, allowed bool, remaining int64, retry, reset time.Duration, bound int) Result {
	r := Result{Allowed: allowed, Limit: quotas[bound].Limit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset,
		Window: quotas[bound].Window}
	if len(quotas) > 1 {
		r.Bound, r.Quotas = bound, quotas
	}
	return r
}

// stepTable plays steps, on every backend, against a limiter newLimiter
// makes with cfg as its default, on a fresh controlled clock.
func stepTable(t *testing.T, newLimiter func(c *Client, name string) *Limiter, cfg Config, steps []step) {
	stepsAcrossSetRate(t, newLimiter, cfg, steps, Config{}, nil)
}

// stepsAcrossSetRate is stepTable, then SetRate(next) unless next is zero,
// then the steps after.
func stepsAcrossSetRate(t *testing.T, newLimiter func(c *Client, name string) *Limiter, cfg Config, steps []step, next Config, after []step) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		l := newLimiter(newClient(rdb, clk), uniqueName(t)).WithDefault(cfg)
		runSteps(t, l, clk, cfg, steps)
		if !reflect.DeepEqual(next, Config{}) {
			require.NoError(t, l.SetRate(context.Background(), next))
			runSteps(t, l, clk, next, after)
		}
	})
}
