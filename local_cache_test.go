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
		counted := cloneClient(t, rdb)
		t.Cleanup(func() { counted.Close() })
		log := &commandLog{}
		counted.AddHook(log)
		clk := newClock()
		name := uniqueName(t)
		var cachedDecisions int
		c := newClient(counted, clk, WithLocalCache(), WithObserver(func(d Decision) {
			if d.Cached {
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
