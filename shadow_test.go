package redlimit

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Shadow mode, each way it is turned on, decides exactly as enforcing does:
// a twin limiter that enforces the same config, given the same requests at
// the same times, answers the same, has the same state left in Redis, and
// costs the same script calls; the shadow's caller is granted every time,
// with ReasonShadow exactly where its twin was denied.
func TestShadowCountsAsEnforcing(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		for _, way := range []string{"handle", "client", "stored"} {
			t.Run(way, func(t *testing.T) {
				ctx := context.Background()
				clk := newClock()
				var shadowLog, enforceLog commandLog
				var opts []Option
				if way == "client" {
					opts = append(opts, WithShadow())
				}
				shadowed := a.new(newClient(recorded(t, rdb, &shadowLog), clk, opts...), uniqueName(t))
				enforced := a.new(newClient(recorded(t, rdb, &enforceLog), clk), uniqueName(t))
				switch way {
				case "handle":
					shadowed = shadowed.WithDefault(tenPer10s).WithShadow()
					enforced = enforced.WithDefault(tenPer10s)
				case "client":
					shadowed, enforced = shadowed.WithDefault(tenPer10s), enforced.WithDefault(tenPer10s)
				case "stored":
					require.NoError(t, shadowed.SetRate(ctx, tenPer10s))
					require.NoError(t, shadowed.SetShadow(ctx, true))
					require.NoError(t, enforced.SetRate(ctx, tenPer10s))
				}
				// A peek each loads the scripts: a first EVALSHA may meet NOSCRIPT.
				for _, l := range []*Limiter{shadowed, enforced} {
					_, err := l.AvailablePermits(ctx)
					require.NoError(t, err)
				}
				before, beforeEnforced := shadowLog.count("evalsha"), enforceLog.count("evalsha")
				denied := 0
				for i := range 30 {
					permits := int64(1 + i%3)
					want, err := enforced.Allow(ctx, permits)
					require.NoError(t, err)
					got, err := shadowed.Allow(ctx, permits)
					require.NoError(t, err)
					require.True(t, got.Allowed, "request %d: a shadow never denies", i)
					require.True(t, got.Shadow, "request %d", i)
					if !want.Allowed {
						denied++
						require.Equal(t, ReasonShadow, got.Reason, "request %d: enforcing denied it", i)
					} else {
						require.Equal(t, ReasonLimit, got.Reason, "request %d: enforcing granted it", i)
					}
					// Everything else is what enforcing answered.
					got.Allowed, got.Reason, got.Shadow = want.Allowed, want.Reason, want.Shadow
					require.Equal(t, want, got, "request %d", i)
					clk.Add(700 * time.Millisecond)
				}
				assert.Greater(t, denied, 5, "60 permits asked in 21 s of 10 per 10 s reach the limit")
				left, err := enforced.AvailablePermits(ctx)
				require.NoError(t, err)
				shadowLeft, err := shadowed.AvailablePermits(ctx)
				require.NoError(t, err)
				assert.Equal(t, left, shadowLeft, "the same usage counted")
				assert.Equal(t, enforceLog.count("evalsha")-beforeEnforced, shadowLog.count("evalsha")-before,
					"shadow mode costs no script call more")
			})
		}
	})
}

// SetShadow turns shadow mode on and off for every instance at runtime,
// through the stored config: it needs one, survives SetRate and Reset, and
// ends with Delete.
func TestShadowAtRuntime(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		operator := a.new(newClient(rdb, clk), name)
		service := a.new(newClient(rdb, clk), name).WithDefault(Per(3, time.Minute))
		assert.ErrorIs(t, operator.SetShadow(ctx, true), ErrNotInitialized, "no stored config to keep it")

		require.NoError(t, operator.SetRate(ctx, Per(2, time.Minute)))
		take := func(want bool, reason Reason, shadow bool, msg string) {
			t.Helper()
			r, err := service.Allow(ctx, 1)
			require.NoError(t, err, msg)
			assert.Equal(t, want, r.Allowed, msg)
			assert.Equal(t, reason, r.Reason, msg)
			assert.Equal(t, shadow, r.Shadow, msg)
		}
		take(true, ReasonLimit, false, "1 of 2")
		take(true, ReasonLimit, false, "2 of 2")
		take(false, ReasonLimit, false, "enforced")
		require.NoError(t, operator.SetShadow(ctx, true))
		take(true, ReasonShadow, true, "the other instance's next decision is in shadow mode")
		require.NoError(t, operator.SetRate(ctx, Per(1, time.Minute)))
		take(true, ReasonShadow, true, "SetRate keeps shadow mode")
		require.NoError(t, operator.Reset(ctx))
		take(true, ReasonLimit, true, "Reset keeps it, and the usage is forgotten")
		take(true, ReasonShadow, true, "1 per minute, shadowed")
		require.NoError(t, operator.SetShadow(ctx, false))
		take(false, ReasonLimit, false, "enforced again")
		require.NoError(t, operator.SetShadow(ctx, true))
		_, err := operator.Delete(ctx)
		require.NoError(t, err)
		for range 3 {
			take(true, ReasonLimit, false, "Delete ends it: the default, 3 per minute, enforced")
		}
		take(false, ReasonLimit, false, "the default's fourth")
	})
}

// Shadow mode never denies: when Redis cannot decide, its caller is granted
// as with WithFailOpen, and the observer sees the outage. Bad input is still
// an error.
func TestShadowFailsOpen(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	var seen []Decision
	c := New(rdb, WithObserver(func(d Decision) { seen = append(seen, d) }))
	for _, l := range []*Limiter{c.Funnel("x").WithDefault(tenPer10s).WithShadow(), New(rdb, WithShadow()).Funnel("x").WithDefault(tenPer10s)} {
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Reason: ReasonFailOpen, Shadow: true}, r)
		_, err = l.Allow(ctx, -1)
		assert.ErrorIs(t, err, ErrInvalidPermits, "bad input is never waved through")
	}
	require.NotEmpty(t, seen)
	var netErr net.Error
	assert.ErrorIs(t, seen[0].Err, ErrUnavailable, "the observer still sees the outage")
	assert.ErrorAs(t, seen[0].Err, &netErr)

	enforced, err := c.Funnel("x").WithDefault(tenPer10s).Allow(ctx, 1)
	assert.ErrorIs(t, err, ErrUnavailable, "a handle not in shadow mode fails closed, as the Client does")
	assert.Equal(t, Result{}, enforced)
}

// Every Result says what decided it: the limit (and which rate, Bound), a
// denial cached locally, or a grant made open while Redis could not decide.
func TestReasons(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		var seen []Decision
		c := newClient(rdb, clk, WithLocalCache(), WithObserver(func(d Decision) { seen = append(seen, d) }))
		l := c.FixedWindow(uniqueName(t)).WithDefault(Per(2, time.Second).And(Per(3, time.Minute)))
		for i, want := range []struct {
			allowed bool
			reason  Reason
			bound   int
		}{{true, ReasonLimit, 0}, {true, ReasonLimit, 0}, {false, ReasonLimit, 0}, {false, ReasonCache, 0}} {
			r, err := l.Allow(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, want.allowed, r.Allowed, "request %d", i)
			assert.Equal(t, want.reason, r.Reason, "request %d", i)
			assert.Equal(t, want.bound, r.Bound, "request %d", i)
			assert.Equal(t, want.reason, seen[len(seen)-1].Result.Reason, "request %d: the observer sees it", i)
		}
		clk.Add(time.Second)
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 3, Window: time.Minute, RetryAfter: 0, Remaining: 0, ResetAfter: time.Minute - time.Second,
			Bound: 1, Quotas: []Quota{{Limit: 2, Window: time.Second, ResetAfter: time.Second}, {Limit: 3, Window: time.Minute, ResetAfter: time.Minute - time.Second}}, Reason: ReasonLimit}, r, "the minute's rate bound the third grant")
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, ReasonLimit, r.Reason)
		assert.Equal(t, 1, r.Bound, "and its denial")
		assert.False(t, r.Allowed)
	})
	assert.Equal(t, "limit cache fail-open shadow Reason(9)",
		ReasonLimit.String()+" "+ReasonCache.String()+" "+ReasonFailOpen.String()+" "+ReasonShadow.String()+" "+Reason(9).String())
}

// A reply's shadow field becomes Result.Shadow; a limit's decision is
// ReasonLimit, the zero value, whatever the reply.
func TestReplyShadow(t *testing.T) {
	r, err := parseResult("h 0 10 3 -1 1500 60000 1", Config{})
	require.NoError(t, err)
	assert.Equal(t, Result{Limit: 10, Remaining: 3, RetryAfter: Never, ResetAfter: 1500 * time.Microsecond, Window: time.Minute, Shadow: true}, r)
}
