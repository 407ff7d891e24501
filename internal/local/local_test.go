package local

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// t0 is a whole 10 s since the epoch, in µs: every window below starts there.
const t0 int64 = 1_700_000_000_000_000

const ms = 1000 // µs

type step struct {
	at, permits int64 // µs after t0
	want        Decision
}

func run(t *testing.T, l *Limiter, steps []step) {
	t.Helper()
	for i, s := range steps {
		assert.Equal(t, s.want, l.Allow(t0+s.at, s.permits), "step %d: %d permits at +%dµs", i, s.permits, s.at)
	}
}

func newLimiter(t *testing.T, algorithm string, rates ...Rate) *Limiter {
	t.Helper()
	l, err := New(algorithm, rates)
	require.NoError(t, err)
	return l
}

func TestShare(t *testing.T) {
	for _, c := range []struct{ limit, n, want int64 }{
		{10, 3, 4}, {9, 3, 3}, {31, 3, 11}, {1, 5, 1}, {0, 3, 0}, {7, 1, 7}, {7, 0, 7}, {100, 7, 15},
	} {
		assert.Equal(t, c.want, Share(c.limit, c.n), "%d among %d", c.limit, c.n)
	}
	// The shares add up to the limit and less than one more a sharer.
	for limit := int64(1); limit <= 200; limit++ {
		for n := int64(1); n <= 12; n++ {
			over := n*Share(limit, n) - limit
			require.True(t, over >= 0 && over <= n-1, "%d among %d: %d over", limit, n, over)
		}
	}
	assert.Equal(t, Rate{Rate: 4, IntervalMS: 1000, Burst: 2, Buckets: 5}, Rate{Rate: 10, IntervalMS: 1000, Burst: 5, Buckets: 5}.Shared(3))
	assert.Equal(t, Rate{Rate: 4, IntervalMS: 1000}, Rate{Rate: 10, IntervalMS: 1000}.Shared(3), "a default burst stays the rate's")
}

func TestFixedWindow(t *testing.T) {
	l := newLimiter(t, "fixed_window", Rate{Rate: 3, IntervalMS: 1000})
	run(t, l, []step{
		{100 * ms, 2, Decision{Allowed: true, Remaining: 1, Reset: 900 * ms}},
		{200 * ms, 2, Decision{Remaining: 1, Retry: 800 * ms, Reset: 800 * ms}},
		{300 * ms, 1, Decision{Allowed: true, Remaining: 0, Reset: 700 * ms}},
		{1000 * ms, 3, Decision{Allowed: true, Remaining: 0, Reset: 1000 * ms}},
		{1000 * ms, 4, Decision{Remaining: 0, Retry: -1, Reset: 1000 * ms}},
		{2500 * ms, 0, Decision{Allowed: true, Remaining: 3}},
	})
}

// A calendar's windows are Window's, whatever the Interval.
func TestFixedWindowEdges(t *testing.T) {
	tens := func(now int64) (int64, int64) { s := now - now%10; return s, s + 10 }
	l := newLimiter(t, "fixed_window", Rate{Rate: 1, IntervalMS: 1000, Window: tens})
	run(t, l, []step{
		{12, 1, Decision{Allowed: true, Remaining: 0, Reset: 8}},
		{19, 1, Decision{Remaining: 0, Retry: 1, Reset: 1}},
		{20, 1, Decision{Allowed: true, Remaining: 0, Reset: 10}},
	})
}

// Grants of one slice (1000 ms / 64, rounded up: 16 ms) share a record,
// freed with the latest of them.
func TestTokenBucket(t *testing.T) {
	l := newLimiter(t, "tokenbucket", Rate{Rate: 3, IntervalMS: 1000})
	run(t, l, []step{
		{0, 2, Decision{Allowed: true, Remaining: 1, Reset: 1000 * ms}},
		{10 * ms, 1, Decision{Allowed: true, Remaining: 0, Reset: 1000 * ms}}, // joins the first record, now at +10ms
		{500 * ms, 1, Decision{Remaining: 0, Retry: 510 * ms, Reset: 510 * ms}},
		{1009 * ms, 1, Decision{Remaining: 0, Retry: 1 * ms, Reset: 1 * ms}},
		{1010 * ms, 1, Decision{Allowed: true, Remaining: 2, Reset: 1000 * ms}},
		{1020 * ms, 1, Decision{Allowed: true, Remaining: 1, Reset: 1000 * ms}}, // slice [1008, 1024): joins
		{1030 * ms, 1, Decision{Allowed: true, Remaining: 0, Reset: 1000 * ms}}, // slice [1024, 1040): a new record
		{2025 * ms, 0, Decision{Allowed: true, Remaining: 2, Reset: 5 * ms}},
		{2030 * ms, 0, Decision{Allowed: true, Remaining: 3}},
	})
}

// 3 per 10 ms: an emission interval of 3333⅓ µs, kept exactly.
func TestFunnel(t *testing.T) {
	l := newLimiter(t, "funnel", Rate{Rate: 3, IntervalMS: 10, Burst: 2})
	run(t, l, []step{
		{0, 2, Decision{Allowed: true, Remaining: 0, Reset: 6667}}, // TAT +6666⅔
		{1000, 1, Decision{Remaining: 0, Retry: 2334, Reset: 5667}},
		{3333, 1, Decision{Remaining: 0, Retry: 1, Reset: 3334}},      // 3333 + 3333⅓ < 6666⅔
		{3334, 1, Decision{Allowed: true, Remaining: 0, Reset: 6666}}, // TAT +10000
		{3334, 3, Decision{Remaining: 0, Retry: -1, Reset: 6666}},
		{6666, 0, Decision{Allowed: true, Remaining: 0, Reset: 3334}}, // 6666⅔ − 3334 µs left of 6666⅔: not a whole interval free
		{6667, 0, Decision{Allowed: true, Remaining: 1, Reset: 3333}},
		{20 * ms, 0, Decision{Allowed: true, Remaining: 2}},
	})
}

// A huge burst at a rate whose emission interval is not whole: the 128-bit
// steps stay exact where 64-bit products would not.
func TestFunnelLarge(t *testing.T) {
	const rate, interval = 999_999_937, 1_000_000 // ms: 1000000/999999937 ms a permit
	burst := int64(1) << 40
	l := newLimiter(t, "funnel", Rate{Rate: rate, IntervalMS: interval, Burst: burst})
	d := l.Allow(t0, burst)
	require.True(t, d.Allowed)
	assert.Zero(t, d.Remaining)
	// burst × interval µs / rate, rounded up: 2^40 × 10^9 / 999999937.
	assert.Equal(t, int64(1_099_511_697_046), d.Reset)
	assert.Equal(t, int64(0), l.Allow(t0+1, 0).Remaining, "less than an emission interval drained")
	assert.Equal(t, int64(1), l.Allow(t0+2, 0).Remaining, "one emission interval drained")
}

// 4 per 1000 ms in 3 sub-windows, starting at ⌈i × 1000 / 3⌉ ms: t0 starts
// one, the next start 334 ms and 667 ms after it.
func TestSlidingWindow(t *testing.T) {
	l := newLimiter(t, "sliding_window", Rate{Rate: 4, IntervalMS: 1000, Buckets: 3})
	run(t, l, []step{
		{100 * ms, 3, Decision{Allowed: true, Remaining: 1, Reset: 900 * ms}},
		{400 * ms, 1, Decision{Allowed: true, Remaining: 0, Reset: 934 * ms}},
		{900 * ms, 2, Decision{Remaining: 0, Retry: 100 * ms, Reset: 434 * ms}},
		{1000 * ms, 2, Decision{Allowed: true, Remaining: 1, Reset: 1000 * ms}},
		{1000 * ms, 5, Decision{Remaining: 1, Retry: -1, Reset: 1000 * ms}},
	})
}

// Several rates: granted only when every one allows, counted in all.
func TestRates(t *testing.T) {
	l := newLimiter(t, "fixed_window", Rate{Rate: 2, IntervalMS: 1000}, Rate{Rate: 3, IntervalMS: 10_000})
	run(t, l, []step{
		{0, 2, Decision{Allowed: true, Remaining: 0, Reset: 10_000 * ms, Resets: []int64{1000 * ms, 10_000 * ms}}},
		{1000 * ms, 2, Decision{Remaining: 1, Retry: 9000 * ms, Reset: 9000 * ms, Resets: []int64{0, 9000 * ms}, Bound: 1}},
		{1000 * ms, 1, Decision{Allowed: true, Remaining: 0, Reset: 9000 * ms, Resets: []int64{1000 * ms, 9000 * ms}, Bound: 1}},
		{2000 * ms, 3, Decision{Remaining: 0, Retry: -1, Reset: 8000 * ms, Resets: []int64{0, 8000 * ms}, Bound: 0}},
	})
	assert.Equal(t, int64(3), l.Capacity(1))
}

// A clock stepped back does not reopen a window.
func TestClockBack(t *testing.T) {
	l := newLimiter(t, "fixed_window", Rate{Rate: 1, IntervalMS: 1000})
	run(t, l, []step{
		{1500 * ms, 1, Decision{Allowed: true, Remaining: 0, Reset: 500 * ms}},
		{900 * ms, 1, Decision{Remaining: 0, Retry: 500 * ms, Reset: 500 * ms}},
	})
}

func TestInvalid(t *testing.T) {
	for _, c := range []struct {
		alg   string
		rates []Rate
	}{
		{"fixed_window", nil},
		{"leaky", []Rate{{Rate: 1, IntervalMS: 1}}},
		{"fixed_window", []Rate{{Rate: 0, IntervalMS: 1}}},
		{"fixed_window", []Rate{{Rate: 1, IntervalMS: 0}}},
		{"funnel", []Rate{{Rate: 1, IntervalMS: 1, Burst: -1}}},
		{"funnel", []Rate{{Rate: 1001, IntervalMS: 1}}},
		{"sliding_window", []Rate{{Rate: 1, IntervalMS: 5, Buckets: 6}}},
	} {
		_, err := New(c.alg, c.rates)
		assert.True(t, errors.Is(err, ErrRate), "%s %+v: %v", c.alg, c.rates, err)
	}
}
