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
	// Windows of 10 minutes keep every TTL in seconds: real Redis ages TTLs in
	// real time while the test's clock stands still.
	s := time.Second
	stepTable(t, (*Client).FixedWindow, Per(10, 10*time.Minute), []step{
		{599 * s, 10, true, 0, 0, 1 * s, 0},
		{599 * s, 1, false, 0, 1 * s, 1 * s, 0},
		{600 * s, 10, true, 0, 0, 600 * s, 0},
		{600 * s, 1, false, 0, 600 * s, 600 * s, 0},
		{900 * s, 1, false, 0, 300 * s, 300 * s, 0},
		{1200 * s, 0, true, 10, 0, 0, 0},
		{1200 * s, 4, true, 6, 0, 600 * s, 0},
		{1799 * s, 7, false, 6, 1 * s, 1 * s, 0},
		{1800 * s, 7, true, 3, 0, 600 * s, 0},
	})
}

func TestFixedWindowNeverGoesBack(t *testing.T) {
	// A request whose clock is behind the stored window (clocks that disagree,
	// or a request that reached Redis late) counts in the stored window. It
	// used to reset the count, granting a whole window's worth again.
	s := time.Second
	stepTable(t, (*Client).FixedWindow, Per(10, 10*time.Minute), []step{
		{600 * s, 8, true, 2, 0, 600 * s, 0},
		{599 * s, 3, false, 2, 601 * s, 601 * s, 0}, // the late request waits for the newer window's end
		{599 * s, 2, true, 0, 0, 601 * s, 0},
		{600 * s, 1, false, 0, 600 * s, 600 * s, 0},
		{1200 * s, 10, true, 0, 0, 600 * s, 0},
	})
}

func TestFixedWindowSetRateKeepsUsageAcrossIntervals(t *testing.T) {
	// The stored window is its start in ms, so a longer interval still finds
	// the usage of the window it falls in.
	s := time.Second
	stepsAcrossSetRate(t, (*Client).FixedWindow, Per(10, 10*time.Minute), []step{{60 * s, 6, true, 4, 0, 540 * s, 0}}, Per(10, time.Hour), []step{
		{60 * s, 5, false, 4, 3540 * s, 3540 * s, 0},
		{60 * s, 4, true, 0, 0, 3540 * s, 0},
	})
}

func TestFixedWindowNeverOverAdmits(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
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
