package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSlidingWindowSteps(t *testing.T) {
	ms := time.Millisecond
	// 10 per 10s in 10 sub-windows of 1s.
	stepTable(t, (*Client).SlidingWindow, tenPer10s, []step{
		{0, 4, true, 6, 0, 10000 * ms, 0},        // sub-window 0 leaves the window at 10s
		{9500 * ms, 6, true, 0, 0, 9500 * ms, 0}, // sub-window 9 leaves at 19s
		{9999 * ms, 1, false, 0, 1 * ms, 9001 * ms, 0},
		{10000 * ms, 5, false, 4, 9000 * ms, 9000 * ms, 0}, // 5 need sub-window 9 gone
		{10000 * ms, 4, true, 0, 0, 10000 * ms, 0},
		{18999 * ms, 1, false, 0, 1 * ms, 1001 * ms, 0},
		{19000 * ms, 6, true, 0, 0, 10000 * ms, 0},
		{20000 * ms, 0, true, 4, 0, 9000 * ms, 0},
		{29000 * ms, 0, true, 10, 0, 0, 0},
	})
}

func TestSlidingWindowNeverGoesBack(t *testing.T) {
	// A request whose clock is behind the newest sub-window is decided as of
	// that sub-window and counted in it, so a later request still sees it.
	ms := time.Millisecond
	stepTable(t, (*Client).SlidingWindow, tenPer10s, []step{
		{10000 * ms, 6, true, 4, 0, 10000 * ms, 0},
		{0, 4, true, 0, 0, 20000 * ms, 0}, // counted in sub-window 10, not 0
		{10000 * ms, 1, false, 0, 10000 * ms, 10000 * ms, 0},
		{19999 * ms, 1, false, 0, 1 * ms, 1 * ms, 0},
		{20000 * ms, 10, true, 0, 0, 10000 * ms, 0},
	})
}

// A state can hold sub-windows that are live as of the request's clock but
// not as of the newest sub-window (an interval change re-indexes them, and
// a clock may be behind): the newest one's window is what counts.
func TestSlidingWindowBehindDropsWhatTheNewestLeftOut(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		l := newClient(rdb, clk).SlidingWindow(uniqueName(t))
		require.NoError(t, l.SetRate(ctx, tenPer10s))
		// 4 in sub-window 0 and 5 in sub-window 11: as of 11, sub-window 0
		// is out (11 − 10 sub-windows), as of 5 it is not.
		require.NoError(t, rdb.HSet(ctx, l.Name(), "counts", fmt.Sprintf("%d:4,11000:5", epoch.UnixMilli())).Err())
		clk.Add(5 * time.Second)
		r, err := l.Allow(ctx, 5)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "only sub-window 11's 5 count")
		assert.Equal(t, int64(0), r.Remaining)
	})
}

func TestSlidingWindowSetRateKeepsUsageAcrossIntervals(t *testing.T) {
	// Fields are sub-window starts in ms: after a change to a longer interval
	// the old grants fall in the new sub-window of their time, and age out
	// with it.
	s := time.Second
	stepsAcrossSetRate(t, (*Client).SlidingWindow, tenPer10s, []step{{5 * s, 6, true, 4, 0, 10 * s, 0}}, Per(10, 100*time.Second), []step{ // sub-windows of 10s
		{5 * s, 5, false, 4, 95 * s, 95 * s, 0},
		{5 * s, 4, true, 0, 0, 95 * s, 0},
		{100 * s, 10, true, 0, 0, 100 * s, 0},
	})
}

// The guarantee: no span shorter than interval × (buckets−1)/buckets ever
// holds more than rate granted permits.
func TestSlidingWindowSpanGuarantee(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(5, 6))
		for _, buckets := range []int{1, 2, 10, 60} {
			clk := newClock()
			const rate, interval = 20, time.Minute
			l := newClient(rdb, clk).SlidingWindow(uniqueName(t)).WithDefault(Config{Rate: rate, Interval: interval, Buckets: buckets})
			type grant struct {
				at time.Time
				n  int64
			}
			var grants []grant
			var total int64
			for range 1500 {
				clk.Add(time.Duration(rng.Int64N(int64(time.Second))))
				p := rng.Int64N(5) + 1
				ok, err := l.TryAcquire(ctx, p)
				require.NoError(t, err)
				if ok {
					grants = append(grants, grant{clk.Now(), p})
					total += p
				}
			}
			sort.Slice(grants, func(i, j int) bool { return grants[i].at.Before(grants[j].at) })
			span := interval * time.Duration(buckets-1) / time.Duration(buckets)
			var inSpan int64
			end := 0
			for start := range grants {
				for end < len(grants) && grants[end].at.Sub(grants[start].at) < span {
					inSpan += grants[end].n
					end++
				}
				require.LessOrEqual(t, inSpan, int64(rate), "%d buckets: span from %v", buckets, grants[start].at)
				inSpan -= grants[start].n
			}
			elapsed := clk.Now().Sub(epoch)
			assert.Greater(t, total, int64(float64(rate)*elapsed.Minutes()*0.8), "%d buckets: used most of the capacity", buckets)
		}
	})
}
