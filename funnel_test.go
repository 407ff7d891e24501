package redlimit

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The worked vectors of ../shared/REFERENCE.md §2: CL.THROTTLE key 4 1 1 [quantity].
func TestThrottleMatchesCLThrottle(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		c := newClient(rdb, clk)
		key := uniqueName(t)
		ms := time.Millisecond
		for i, v := range []struct {
			at       time.Duration
			quantity int64
			want     ThrottleResult
		}{
			{0, 6, ThrottleResult{true, 5, 5, -1, 0}}, // more than the capacity: never
			{0, 1, ThrottleResult{false, 5, 4, -1, 1}},
			{0, 1, ThrottleResult{false, 5, 3, -1, 2}},
			{0, 1, ThrottleResult{false, 5, 2, -1, 3}},
			{0, 1, ThrottleResult{false, 5, 1, -1, 4}},
			{0, 1, ThrottleResult{false, 5, 0, -1, 5}},
			{0, 1, ThrottleResult{true, 5, 0, 1, 5}},
			{3000 * ms, 1, ThrottleResult{false, 5, 2, -1, 3}},
			{3100 * ms, 1, ThrottleResult{false, 5, 1, -1, 4}},
			{4000 * ms, 1, ThrottleResult{false, 5, 1, -1, 4}},
			{8000 * ms, 1, ThrottleResult{false, 5, 4, -1, 1}},
			{9500 * ms, 1, ThrottleResult{false, 5, 4, -1, 1}}, // a stale TAT counts from now
			{9500 * ms, 0, ThrottleResult{false, 5, 4, -1, 1}},
			{9500 * ms, 2, ThrottleResult{false, 5, 2, -1, 3}},
			{9500 * ms, 5, ThrottleResult{true, 5, 2, 3, 3}},
		} {
			clk.Set(epoch.Add(v.at))
			got, err := c.Throttle(context.Background(), key, 4, 1, time.Second, v.quantity)
			require.NoError(t, err)
			assert.Equal(t, v.want, got, "vector %d: %v quantity %d", i, v.at, v.quantity)
		}
	})
}

func TestThrottleIgnoresStoredConfig(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := newClient(rdb, newClock())
		key := uniqueName(t)
		require.NoError(t, c.Funnel(key).SetRate(ctx, Per(1000, time.Second)))
		got, err := c.Throttle(ctx, key, 0, 1, time.Minute, 1)
		require.NoError(t, err)
		assert.Equal(t, ThrottleResult{false, 1, 0, -1, 60}, got)
		_, err = c.Throttle(ctx, key, -1, 1, time.Minute, 1)
		assert.ErrorIs(t, err, ErrInvalidConfig)
		_, err = c.Throttle(ctx, key, 1, 1, time.Minute, -1)
		assert.ErrorIs(t, err, ErrInvalidPermits)

		// Ignored, but not overwritten: another algorithm's config stays its own.
		other := uniqueName(t) + "-tb"
		require.NoError(t, c.TokenBucket(other).SetRate(ctx, Per(1000, time.Second)))
		_, err = c.Throttle(ctx, other, 0, 1, time.Minute, 1)
		assert.ErrorIs(t, err, ErrAlgorithmMismatch)
		require.NoError(t, rdb.HSet(ctx, c.Funnel(key).Name(), "rate", "x").Err())
		_, err = c.Throttle(ctx, key, 0, 1, time.Minute, 1)
		assert.ErrorIs(t, err, ErrCorruptState)
	})
}

func TestCLSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		0: 0, time.Microsecond: 0, 999 * time.Microsecond: 0, time.Millisecond: 1,
		time.Second: 1, time.Second + 999*time.Microsecond: 1, time.Second + time.Millisecond: 2,
	} {
		assert.Equal(t, want, clSeconds(d), "%v", d)
	}
}

// Random requests against one funnel rate, every Result checked against
// the funnel's model (model_test.go). Emission intervals are whole µs here:
// CL.THROTTLE's integer arithmetic (REFERENCE.md §2) and exact GCRA agree.
func TestFunnelMatchesModel(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(1, 2))
		calls := 3000
		if testing.Short() {
			calls = 300
		}
		for round := range 10 {
			clk := newClock()
			rate := rng.Int64N(20) + 1
			// Emission intervals of 10s and more keep every key's TTL far above
			// the real time a test takes (real Redis ages TTLs in real time).
			interval := time.Duration(rate*(10_000+rng.Int64N(50_000))) * time.Millisecond
			capacity := rng.Int64N(2*rate) + 1
			emission := interval.Microseconds() / rate
			l := newClient(rdb, clk).Funnel(uniqueName(t)).WithDefault(Config{Rate: rate, Interval: interval, Burst: capacity})
			model := newLimiterModel(funnelAlgo, Config{Rate: rate, Interval: interval, Burst: capacity})
			for i := range calls / 10 {
				clk.Add(time.Duration(rng.Int64N(emission*2)) * time.Microsecond)
				q := rng.Int64N(capacity + 2)
				got, err := allowAny(ctx, l, q)
				require.NoError(t, err)
				want := model.allow(clk.Now().UnixMicro(), q)
				require.Equal(t, want, got, "round %d call %d: rate %d per %v, capacity %d, quantity %d", round, i, rate, interval, capacity, q)
			}
		}
	})
}

func TestFunnelDrainsSmoothly(t *testing.T) {
	s := time.Second
	stepTable(t, (*Client).Funnel, Config{Rate: 10, Interval: 10 * time.Second, Burst: 3}, []step{
		{0, 3, true, 0, 0, 3 * s, 0},
		{0, 1, false, 0, 1 * s, 3 * s, 0},
		{500 * time.Millisecond, 1, false, 0, 500 * time.Millisecond, 2500 * time.Millisecond, 0},
		{1 * s, 1, true, 0, 0, 3 * s, 0}, // one permit leaks out every second
		{1 * s, 4, false, 0, -1, 3 * s, 0},
		{10 * s, 2, true, 1, 0, 2 * s, 0},
	})
}
