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

func TestFixedWindowBoundary(t *testing.T) {
	// Rate granted just before an edge and Rate just after pass: the 2× burst
	// fixed windows are known for. Rate+1 inside one window never does.
	eachBackend(t, func(t *testing.T, rdb *redis.Client) {
		clk := newClock()
		l := newClient(rdb, clk).FixedWindow(uniqueName(t)).WithDefault(tenPer10s)
		ms := time.Millisecond
		runSteps(t, l, clk, []step{
			{9999 * ms, 10, true, 0, 0, 1 * ms},
			{9999 * ms, 1, false, 0, 1 * ms, 1 * ms},
			{10000 * ms, 10, true, 0, 0, 10000 * ms},
			{10000 * ms, 1, false, 0, 10000 * ms, 10000 * ms},
			{15000 * ms, 1, false, 0, 5000 * ms, 5000 * ms},
			{20000 * ms, 0, true, 10, 0, 0},
			{20000 * ms, 4, true, 6, 0, 10000 * ms},
			{29000 * ms, 7, false, 6, 1000 * ms, 1000 * ms},
			{30000 * ms, 7, true, 3, 0, 10000 * ms},
		})
	})
}

func TestFixedWindowNeverOverAdmits(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb *redis.Client) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(3, 4))
		clk := newClock()
		const rate, interval = 7, time.Minute
		l := newClient(rdb, clk).FixedWindow(uniqueName(t)).WithDefault(Per(rate, interval))
		granted := map[int64]int64{}
		for range 2000 {
			clk.Add(time.Duration(rng.Int64N(int64(2 * time.Second))))
			p := rng.Int64N(4)
			ok, err := l.TryAcquire(ctx, p)
			require.NoError(t, err)
			if ok {
				granted[clk.Now().UnixMilli()/interval.Milliseconds()] += p
			}
		}
		full := 0
		for w, n := range granted {
			require.LessOrEqual(t, n, int64(rate), "window %d", w)
			if n >= rate-2 {
				full++
			}
		}
		assert.Greater(t, full, len(granted)/2, "most windows were (nearly) filled: no under-admission")
	})
}
