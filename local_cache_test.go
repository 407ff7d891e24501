package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLocalCacheFlood(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		log := &commandLog{}
		counted := recorded(t, rdb, log)
		clk := newClock()
		name := uniqueName(t)
		var cachedDecisions int
		c := newClient(counted, clk, WithLocalCache(), WithObserver(func(d Decision) {
			if d.Result.Reason == ReasonCache {
				cachedDecisions++
			}
		}))
		l := a.new(c, name).WithDefault(tenPer10s)
		// Another instance without the cache, sharing the limit.
		other := a.new(newClient(rdb, clk), name).WithDefault(tenPer10s)

		granted := 0
		for range 1000 { // 100 seconds of a flood: 10 requests every 100ms
			for range 10 {
				ok, err := l.TryAcquire(ctx, 1)
				require.NoError(t, err)
				if ok {
					granted++
				}
			}
			clk.Add(100 * time.Millisecond)
		}
		// 10 per 10s over 100s; the funnel also lets its burst of 10 through first.
		limit := map[string]int{"tokenbucket": 100, "funnel": 109, "fixed_window": 100, "sliding_window": 100}[a.name]
		assert.LessOrEqual(t, granted, limit, "never more than Redis would grant")
		assert.GreaterOrEqual(t, granted, limit-10, "and no starvation")
		assert.Less(t, log.count("evalsha"), 10_000/10, "at least 10× fewer round trips than decisions")
		assert.GreaterOrEqual(t, cachedDecisions, 10_000-log.count("evalsha"), "the rest were denied locally")

		// A local Reset drops the cached denial at once.
		for ok := true; ok; {
			var err error
			ok, err = l.TryAcquire(ctx, 1)
			require.NoError(t, err)
		}
		require.NoError(t, l.Reset(ctx))
		ok, err := l.TryAcquire(ctx, 1)
		require.NoError(t, err)
		assert.True(t, ok)

		// A denial cached for 5 permits does not stop a peek, and stops 6.
		_, err = other.Allow(ctx, 9)
		require.NoError(t, err)
		r, err := l.Allow(ctx, 5)
		require.NoError(t, err)
		require.False(t, r.Allowed)
		ok, err = l.TryAcquire(ctx, 0)
		require.NoError(t, err)
		assert.True(t, ok, "a peek goes to Redis")
		before := log.count("evalsha")
		r2, err := l.Allow(ctx, 6)
		require.NoError(t, err)
		assert.False(t, r2.Allowed)
		assert.Equal(t, before, log.count("evalsha"), "a bigger request is denied locally")
		assert.Equal(t, r.RetryAfter, r2.RetryAfter, "with the same wait: the clock has not moved")
		require.NoError(t, l.SetRate(ctx, Per(100, 10*time.Second)))
		before = log.count("evalsha")
		_, err = l.Allow(ctx, 6)
		require.NoError(t, err)
		assert.Equal(t, before+1, log.count("evalsha"), "a local SetRate drops the cached denial: Redis decides")
	})
}

// cacheTwins decides the same requests, on the same clock, through a Client
// with the local cache and one without, on two limiters of their own. A
// cached denial may only answer what Redis would have answered: every answer
// of the cached Client must equal its twin's, and roundTrips tells which ones
// were answered locally.
type cacheTwins struct {
	cached, plain *Client
	name, twin    string
	log           *commandLog
}

func newCacheTwins(t *testing.T, rdb redis.UniversalClient, clk *clock) *cacheTwins {
	log := &commandLog{}
	counted := recorded(t, rdb, log)
	name := uniqueName(t)
	return &cacheTwins{cached: newClient(counted, clk, WithLocalCache()), plain: newClient(rdb, clk), name: name, twin: name + "-twin", log: log}
}

func (tw *cacheTwins) roundTrips() int { return tw.log.count("evalsha") }

// throttle calls Throttle on both and returns the cached Client's answer.
func (tw *cacheTwins) throttle(t *testing.T, maxBurst, count int64, period time.Duration) ThrottleResult {
	t.Helper()
	ctx := context.Background()
	got, err := tw.cached.Throttle(ctx, tw.name, maxBurst, count, period, 1)
	require.NoError(t, err)
	want, err := tw.plain.Throttle(ctx, tw.twin, maxBurst, count, period, 1)
	require.NoError(t, err)
	assert.Equal(t, want, got, "Throttle %d %d %v: as Redis decides it", maxBurst, count, period)
	return got
}

// allow calls Allow on the handle made by handle on both and returns the
// cached Client's answer.
func (tw *cacheTwins) allow(t *testing.T, handle func(c *Client, name string) *Limiter) Result {
	t.Helper()
	ctx := context.Background()
	got, err := handle(tw.cached, tw.name).Allow(ctx, 1)
	require.NoError(t, err)
	want, err := handle(tw.plain, tw.twin).Allow(ctx, 1)
	require.NoError(t, err)
	if got.Reason == ReasonCache {
		assert.False(t, got.Allowed, "only denials are cached")
		want.Reason = ReasonCache // the one field where a cached answer differs
	}
	assert.Equal(t, want, got, "as Redis decides it")
	return got
}

// The case: Throttle's rate comes from its arguments, so a denial
// under one rate says nothing of another on the same key.
func TestLocalCacheThrottleRates(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		tw := newCacheTwins(t, rdb, newClock())
		assert.False(t, tw.throttle(t, 0, 1, time.Hour).Limited)
		assert.True(t, tw.throttle(t, 0, 1, time.Hour).Limited) // cached from here
		before := tw.roundTrips()
		r := tw.throttle(t, 0, 1000, time.Second)
		assert.Equal(t, before+1, tw.roundTrips(), "another rate: Redis decides")
		assert.Equal(t, ThrottleResult{Limited: true, Limit: 1, Remaining: 0, RetryAfter: 1, ResetAfter: 1}, r)
		before = tw.roundTrips()
		r = tw.throttle(t, 0, 1, time.Hour)
		assert.Equal(t, before, tw.roundTrips(), "the first rate again: still cached")
		assert.Equal(t, int64(3600), r.RetryAfter)
	})
}

// Throttle and Funnel on one key share the funnel's state but not its rate:
// Funnel decides by the stored config, Throttle by its arguments. Neither's
// denial may answer the other, and a local change through Funnel drops both.
func TestLocalCacheThrottleAndFunnel(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		tw := newCacheTwins(t, rdb, newClock())
		funnelHandle := (*Client).Funnel
		for _, c := range []*Client{tw.cached, tw.plain} {
			for _, name := range []string{tw.name, tw.twin} {
				require.NoError(t, c.Funnel(name).SetRate(ctx, Per(1000, time.Second)))
			}
		}
		// Throttle denied under one permit an hour…
		assert.False(t, tw.throttle(t, 0, 1, time.Hour).Limited)
		assert.True(t, tw.throttle(t, 0, 1, time.Hour).Limited)
		// …while Funnel decides by the stored rate, 1000 a second.
		before := tw.roundTrips()
		r := tw.allow(t, funnelHandle)
		assert.Equal(t, before+1, tw.roundTrips(), "a Throttle denial does not answer Funnel")
		assert.Equal(t, int64(1000), r.Limit)

		// The other way round: Funnel denied under one permit an hour…
		for _, name := range []string{tw.name, tw.twin} {
			require.NoError(t, tw.cached.Funnel(name).SetRate(ctx, PerHour(1)))
		}
		assert.False(t, tw.allow(t, funnelHandle).Allowed)
		before = tw.roundTrips()
		// …and Throttle, at 1000 a second, decided by Redis.
		tw.throttle(t, 999, 1000, time.Second)
		assert.Equal(t, before+1, tw.roundTrips(), "a Funnel denial does not answer Throttle")

		// A local Reset through Funnel frees what both cached.
		tw.throttle(t, 0, 1, time.Hour)
		before = tw.roundTrips()
		tw.throttle(t, 0, 1, time.Hour)
		assert.Equal(t, before, tw.roundTrips(), "Throttle's own denial answers it again")
		for _, name := range []string{tw.name, tw.twin} {
			require.NoError(t, tw.cached.Funnel(name).Reset(ctx))
		}
		assert.False(t, tw.throttle(t, 0, 1, time.Hour).Limited, "Reset dropped Throttle's cached denial too")
	})
}

// Two handles on one name with different defaults decide differently while
// no config is stored: each has its own cached denials. Handles with equal
// defaults decide alike and share them, and a local change through any
// handle drops them all.
func TestLocalCacheDefaults(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		tw := newCacheTwins(t, rdb, newClock())
		hourly := func(c *Client, name string) *Limiter { return a.new(c, name).WithDefault(PerHour(1)) }
		fast := func(c *Client, name string) *Limiter { return a.new(c, name).WithDefault(Per(1000, time.Second)) }

		assert.True(t, tw.allow(t, hourly).Allowed)
		assert.False(t, tw.allow(t, hourly).Allowed) // cached from here
		before := tw.roundTrips()
		tw.allow(t, fast)
		assert.Equal(t, before+1, tw.roundTrips(), "another default: Redis decides")
		before = tw.roundTrips()
		assert.False(t, tw.allow(t, hourly).Allowed)
		assert.Equal(t, before, tw.roundTrips(), "a new handle with the same default shares the cached denial")

		require.NoError(t, fast(tw.cached, tw.name).Reset(ctx))
		require.NoError(t, fast(tw.plain, tw.twin).Reset(ctx))
		before = tw.roundTrips()
		assert.True(t, tw.allow(t, hourly).Allowed, "Reset through one handle dropped the other's cached denial")
		assert.Equal(t, before+1, tw.roundTrips())
	})
}

// A cached denial answers only what Redis would answer, and shadow mode is
// the stored config's (SetShadow, from any instance): a decision made in
// shadow mode is never cached, so switching shadow off reaches the next
// request; and a cached enforcing denial lasts at most CacheMaxAge, so
// switching shadow on (an operator ending enforcement in an incident)
// reaches every instance within it. Before, a denial cached in shadow mode
// kept granting for its whole RetryAfter (an hour on a per-hour limit)
// after shadow was switched off, and an enforcing one kept denying as long.
func TestLocalCacheFollowsShadowMode(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		cfg := a.tune(PerHour(3), 0, 0)
		l := a.new(newClient(rdb, clk, WithLocalCache()), name).WithDefault(cfg)
		operator := a.new(newClient(rdb, clk), name)
		require.NoError(t, operator.SetRate(ctx, cfg))
		require.NoError(t, operator.SetShadow(ctx, true))
		for range 3 {
			r, err := l.Allow(ctx, 1)
			require.NoError(t, err)
			require.Equal(t, ReasonLimit, r.Reason)
		}
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.Equal(t, ReasonShadow, r.Reason, "the limit denied it; shadow mode grants")
		require.GreaterOrEqual(t, r.RetryAfter, 20*time.Minute)

		require.NoError(t, operator.SetShadow(ctx, false))
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "shadow off: the next decision enforces")
		assert.Equal(t, ReasonLimit, r.Reason)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.Equal(t, ReasonCache, r.Reason, "an enforcing denial is cached")

		require.NoError(t, operator.SetShadow(ctx, true))
		clk.Add(CacheMaxAge - time.Millisecond)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "until CacheMaxAge has passed, the cached denial stands")
		clk.Add(time.Millisecond)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "shadow on reaches the instance within CacheMaxAge")
		assert.Equal(t, ReasonShadow, r.Reason)
	})
}
