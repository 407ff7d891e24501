package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A late Release gave back into whatever the limiter counted then: on a
// fixed window of 10 a minute, 10 taken at 59.9 s and not used, 10 others
// granted at 60.1 s, then the 10 given back, and the second window granted
// 20. A reservation's release gives back only what its own grant still
// counts: nothing of a window that has ended.
func TestLateReleaseFixedWindow(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		l := newClient(rdb, clk).FixedWindow(name).WithDefault(PerMinute(10))
		other := newClient(rdb, clk).FixedWindow(name).WithDefault(PerMinute(10))
		edge := epoch.Truncate(time.Minute).Add(time.Minute)
		clk.Set(edge.Add(-100 * time.Millisecond))
		res, err := l.Reserve(ctx, 10)
		require.NoError(t, err)
		require.Equal(t, int64(10), res.Taken)
		clk.Set(edge.Add(100 * time.Millisecond))
		ok, err := other.TryAcquire(ctx, 10)
		require.NoError(t, err)
		require.True(t, ok, "the next window's own 10")
		back, err := res.Release(ctx, 10)
		require.NoError(t, err)
		assert.Zero(t, back, "its window ended, and took its permits with it")
		ok, err = other.TryAcquire(ctx, 1)
		require.NoError(t, err)
		assert.False(t, ok, "the second window granted 10, not 20")
	})
}

// A release gave back from the newest counts, which may be other requests'
// that came between: on a sliding window of 10 a minute in 10 s
// sub-windows, 5 reserved at 0 s, 5 others at 10 s, the 5 given back at
// 20 s came off the 10 s sub-window; at 60 s the 0 s one left with the 5
// left in it, and 10 more were granted: 15 in [10 s, 70 s). A reservation
// gives back from its own sub-window.
func TestLateReleaseSlidingWindow(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		cfg := Config{Rate: 10, Interval: time.Minute, Buckets: 6}
		l := newClient(rdb, clk).SlidingWindow(name).WithDefault(cfg)
		other := newClient(rdb, clk).SlidingWindow(name).WithDefault(cfg)
		start := epoch.Truncate(10 * time.Second)
		clk.Set(start)
		res, err := l.Reserve(ctx, 5)
		require.NoError(t, err)
		require.Equal(t, int64(5), res.Taken)
		clk.Set(start.Add(10 * time.Second))
		ok, err := other.TryAcquire(ctx, 5)
		require.NoError(t, err)
		require.True(t, ok)
		clk.Set(start.Add(20 * time.Second))
		back, err := res.Release(ctx, 5)
		require.NoError(t, err)
		assert.Equal(t, int64(5), back, "from its own sub-window")
		clk.Set(start.Add(60 * time.Second))
		assertAvailable(t, other, 5, "the 5 granted at 10 s still count")
		ok, err = other.TryAcquire(ctx, 10)
		require.NoError(t, err)
		assert.False(t, ok, "no span of the window holds more than 10")
		clk.Set(start.Add(70 * time.Second))
		assertAvailable(t, other, 10)
	})
}

// The same holds for a token bucket: a reservation gives back from its own
// record, never from one another request's grant made; and for a funnel,
// only what has not drained of its grant.
func TestLateReleaseTokenBucketAndFunnel(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		for _, a := range []algo{tokenBucketAlgo, funnelAlgo} {
			t.Run(a.name, func(t *testing.T) {
				clk := newClock()
				name := uniqueName(t)
				l := a.new(newClient(rdb, clk), name).WithDefault(PerMinute(10))
				other := a.new(newClient(rdb, clk), name).WithDefault(PerMinute(10))
				res, err := l.Reserve(ctx, 5)
				require.NoError(t, err)
				require.Equal(t, int64(5), res.Taken)
				clk.Add(time.Minute) // the grant has aged out (drained)
				ok, err := other.TryAcquire(ctx, 10)
				require.NoError(t, err)
				require.True(t, ok)
				back, err := res.Release(ctx, 5)
				require.NoError(t, err)
				assert.Zero(t, back, "its grant no longer counts")
				assertAvailable(t, other, 0, "the other's 10 still count")
			})
		}
	})
}
