package redlimit

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/leasing"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/requestid"
	"github.com/redlimit/redlimit/internal/wire"
)

// leaseOf takes want permits, or as few as least, as a lease does: the
// block, with the grant's time (µs on Redis's clock, here the test's) and
// the take's id, which a refund names.
func leaseOf(t *testing.T, l *Limiter, want, least int64) leasing.Block {
	t.Helper()
	id := requestid.New()
	_, d, err := l.ask(context.Background(), request{op: opReserve, permits: want, least: least, id: id, logWindow: time.Minute.Milliseconds()})
	require.NoError(t, err)
	return leasing.Block{Held: d.Taken, Size: d.Taken, At: d.GrantAt, ID: id}
}

// refundOf gives back what b holds, and returns what Redis took back.
func refundOf(t *testing.T, l *Limiter, b leasing.Block) int64 {
	t.Helper()
	r, _, err := l.ask(context.Background(), request{op: opRelease, permits: b.Held, id: b.ID, grantAt: b.At, grantSize: b.Size})
	require.NoError(t, err)
	return r.Remaining
}

func available(t *testing.T, l *Limiter) int64 {
	t.Helper()
	n, err := l.AvailablePermits(context.Background())
	require.NoError(t, err)
	return n
}

// A refund gives back only what is still counted of its grant, so however
// late it comes it frees no permit that a grant made since, or time, has
// made another's: exactly, for each algorithm, on the limiter's own clock.
func TestLeaseRefundGivesBackOnlyItsGrant(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		t.Run("funnel", func(t *testing.T) {
			// 10 a second, burst 10: a permit drains in 100 ms.
			clk := newClock()
			l := newClient(rdb, clk).Funnel(uniqueName(t)).WithDefault(PerSecond(10))
			b := leaseOf(t, l, 5, 1)
			require.Equal(t, int64(5), b.Size)
			assert.Equal(t, clk.Now().UnixMicro(), b.At)
			clk.Add(200 * time.Millisecond)
			assert.Equal(t, int64(3), refundOf(t, l, b), "2 of the 5 have drained by 200 ms")
			assert.Equal(t, int64(10), available(t, l), "as if they were never taken")

			// Drained, then filled by others: a late refund takes back nothing.
			b = leaseOf(t, l, 5, 1)
			clk.Add(500 * time.Millisecond)
			ok, err := l.TryAcquire(ctx, 10)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, int64(0), refundOf(t, l, b))
			assert.Equal(t, int64(0), available(t, l))
		})
		t.Run("fixed_window", func(t *testing.T) {
			clk := newClock()
			l := newClient(rdb, clk).FixedWindow(uniqueName(t)).WithDefault(PerSecond(10))
			clk.Add(100 * time.Millisecond)
			b := leaseOf(t, l, 5, 1)
			clk.Add(100 * time.Millisecond)
			assert.Equal(t, int64(5), refundOf(t, l, b), "within its window")
			assert.Equal(t, int64(10), available(t, l))

			// Taken at 0.9 s, given back at 1.1 s: the next window's
			// count is others', and stays.
			clk.Add(700 * time.Millisecond)
			b = leaseOf(t, l, 5, 1)
			clk.Add(200 * time.Millisecond)
			ok, err := l.TryAcquire(ctx, 10)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, int64(0), refundOf(t, l, b))
			assert.Equal(t, int64(0), available(t, l))
		})
		t.Run("sliding_window", func(t *testing.T) {
			// 10 per 10 s in 1 s sub-windows.
			clk := newClock()
			l := newClient(rdb, clk).SlidingWindow(uniqueName(t)).WithDefault(tenPer10s)
			clk.Add(500 * time.Millisecond)
			b := leaseOf(t, l, 5, 1)
			clk.Add(time.Second)
			ok, err := l.TryAcquire(ctx, 5)
			require.NoError(t, err)
			require.True(t, ok)
			clk.Add(500 * time.Millisecond)
			assert.Equal(t, int64(5), refundOf(t, l, b), "from its own sub-window")
			assert.Equal(t, int64(5), available(t, l))
			r, err := l.Allow(ctx, 0)
			require.NoError(t, err)
			assert.Equal(t, 9*time.Second, r.ResetAfter, "the 5 at 1.5 s still count, until 11 s")

			// Its sub-window gone, a refund takes nothing from a later one.
			b = leaseOf(t, l, 5, 1)   // at 2 s
			clk.Add(10 * time.Second) // 12 s: sub-window 2 is out
			require.Equal(t, int64(10), available(t, l))
			ok, err = l.TryAcquire(ctx, 10)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, int64(0), refundOf(t, l, b))
			assert.Equal(t, int64(0), available(t, l))
		})
		t.Run("token_bucket", func(t *testing.T) {
			clk := newClock()
			l := newClient(rdb, clk).TokenBucket(uniqueName(t)).WithDefault(tenPer10s)
			b := leaseOf(t, l, 5, 1)
			assert.Equal(t, int64(5), refundOf(t, l, b), "from its own record")
			assert.Equal(t, int64(10), available(t, l))

			// Its record out of the window, a refund takes nothing.
			b = leaseOf(t, l, 5, 1)
			clk.Add(10 * time.Second)
			ok, err := l.TryAcquire(ctx, 10)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, int64(0), refundOf(t, l, b))
			assert.Equal(t, int64(0), available(t, l))
		})
	})
}

// A lease takes what it wants, or, when fewer fit, what fits down to the
// request's own permits; else it is denied as the request alone would be.
func TestLeaseTakesWhatFits(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		clk := newClock()
		l := a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(a.counting(10))
		assert.Equal(t, int64(6), leaseOf(t, l, 6, 2).Size)
		assert.Equal(t, int64(4), leaseOf(t, l, 6, 2).Size, "4 fit")
		assert.Equal(t, int64(0), leaseOf(t, l, 6, 1).Size)
	})
}

// A hot limiter, far above demand: a leased handle grants from memory,
// and calls Redis a few times per thousand decisions.
func TestLeaseServesFromMemory(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		clk := newClock()
		// An hour's million: nothing drains within the test's millisecond.
		l := a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(Per(1_000_000, time.Hour)).WithLease(Lease{Time: time.Second})
		for i := range 1000 {
			r, err := l.Allow(ctx, 1)
			require.NoError(t, err)
			require.True(t, r.Allowed, "request %d", i)
			clk.Add(time.Microsecond)
		}
		s := l.LeaseStats()
		t.Logf("%+v", s)
		assert.Equal(t, int64(1000), s.Used)
		assert.LessOrEqual(t, s.Calls, int64(10), "Redis calls for 1,000 decisions")
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, ReasonLease, r.Reason)
		assert.Equal(t, int64(1_000_000), r.Limit)
		assert.Equal(t, s.Taken-s.Used-1, r.Remaining-(1_000_000-s.Taken), "the block's left, and what Redis had left")

		require.NoError(t, l.Close(ctx))
		s = l.LeaseStats()
		assert.Equal(t, s.Taken-s.Used, s.Returned, "the unused, given back")
		assert.Equal(t, int64(1_000_000-1001), available(t, l))
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, ReasonLimit, r.Reason, "closed: decided in Redis")
	})
}

// A rate change reaches a leased handle within its lease time; a request
// larger than a block's cap is decided in Redis.
func TestLeaseFollowsSetRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		admin := newClient(rdb, clk).Funnel(name)
		require.NoError(t, admin.SetRate(ctx, PerSecond(1000)))
		l := newClient(rdb, clk).Funnel(name).WithLease(Lease{Time: 100 * time.Millisecond, Share: 0.5})
		for range 3 {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok)
		}
		require.NoError(t, admin.SetRate(ctx, PerSecond(10)))
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, ReasonLease, r.Reason)
		assert.Equal(t, int64(1000), r.Limit, "within the lease time, the block taken at the old rate")
		clk.Add(100 * time.Millisecond)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, int64(10), r.Limit, "the lease time passed: a new block, at the new rate")
		assert.Equal(t, ReasonLimit, r.Reason)
		r, err = l.Allow(ctx, 6)
		require.NoError(t, err)
		assert.Equal(t, ReasonLimit, r.Reason, "above the cap, half of 10: decided in Redis")
	})
}

// Bad lease settings are refused, and reach Redis with nothing.
func TestLeaseRefusesBadSettings(t *testing.T) {
	c := newClient(redistest.Miniredis(t), newClock())
	for _, cfg := range []Lease{{}, {Time: -1}, {Time: time.Second, Max: -1}, {Time: time.Second, Share: 1.5}} {
		_, err := c.Funnel("x").WithDefault(PerSecond(10)).WithLease(cfg).Allow(context.Background(), 1)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
}

// The bound, on a model: three instances lease from one limiter at its
// limit, with random demand on a controlled clock, and every grant they
// make is checked against the bound each algorithm states (lease.go).
func TestLeaseBound(t *testing.T) {
	const rate, d = 100, 100 * time.Millisecond
	interval := time.Second
	for _, tc := range []struct {
		name string
		new  func(c *Client, name string) *Limiter
		cfg  Config
		// over returns how far the grants (ms, sorted) pass the bound.
		over func(ms []int64) int
	}{
		{"fixed_window", (*Client).FixedWindow, PerSecond(rate), func(ms []int64) int {
			// No window grants more than the rate.
			worst := 0
			for i := range ms {
				j, _ := slices.BinarySearch(ms, ms[i]-ms[i]%1000+1000)
				if i == 0 || ms[i]/1000 != ms[i-1]/1000 {
					worst = max(worst, j-i-rate)
				}
			}
			return worst
		}},
		{"sliding_window", (*Client).SlidingWindow, Config{Rate: rate, Interval: interval, Buckets: 10}, func(ms []int64) int {
			return inSpan(ms, (interval*9/10 - d).Milliseconds(), func(int64) int { return rate })
		}},
		{"tokenbucket", (*Client).TokenBucket, PerSecond(rate), func(ms []int64) int {
			return inSpan(ms, (interval - d).Milliseconds(), func(int64) int { return rate })
		}},
		{"funnel", (*Client).Funnel, Config{Rate: rate, Interval: interval, Burst: 20}, func(ms []int64) int {
			// No span of t ms grants more than Burst + Rate × (t + d) / Interval.
			worst := 0
			for i := range ms {
				for j := i; j < len(ms); j++ {
					bound := 20 + int((ms[j]-ms[i]+d.Milliseconds())*rate/interval.Milliseconds())
					worst = max(worst, j-i+1-bound)
				}
			}
			return worst
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
				leased, stats := leaseModel(t, rdb, tc.new, tc.cfg, &Lease{Time: d})
				plain, _ := leaseModel(t, rdb, tc.new, tc.cfg, nil)
				t.Logf("%d grants in %v at %d/s, %d unleased on the same demand; leases: %d calls, %d taken, %d used, %d returned",
					len(leased), modelTime(), rate, len(plain), stats.Calls, stats.Taken, stats.Used, stats.Returned)
				assert.Equal(t, 0, tc.over(leased), "grants past the bound")
				assert.Equal(t, 0, tc.over(plain), "the unleased limiter's grants past the bound")
				// Under-admission: what blocks hold unused, at most a cap (a
				// tenth of the limit) per instance, lost for at most an
				// interval at a time (a token bucket's, until its records
				// age out).
				lost := 3 * rate / 10 * int(modelTime()/interval+1)
				assert.GreaterOrEqual(t, len(leased), len(plain)-lost, "under-admission")
			})
		})
	}
}

// modelTime is how long leaseModel runs, on its clock: 5 s, or 2 s in the
// short suites, which CI runs on every server under -race too.
func modelTime() time.Duration {
	if testing.Short() {
		return 2 * time.Second
	}
	return 5 * time.Second
}

// leaseModel runs three instances on one limiter for modelTime of a controlled
// clock, with lease (or none), and returns when each grant was made (ms
// since epoch, sorted) and the instances' lease figures. Each instance's
// demand changes every 250 ms, from none to ten times the limit, so that
// blocks both run out and outlive their use, and are taken at every point
// of a window; a seed fixes it, the same for every run.
func leaseModel(t *testing.T, rdb redis.UniversalClient, newLimiter func(c *Client, name string) *Limiter, cfg Config, lease *Lease) ([]int64, LeaseStats) {
	ctx := context.Background()
	clk := newClock()
	name := uniqueName(t)
	var handles []*Limiter
	for range 3 {
		l := newLimiter(newClient(rdb, clk), name).WithDefault(cfg)
		if lease != nil {
			l = l.WithLease(*lease)
		}
		handles = append(handles, l)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var grants []int64
	demand := make([]float64, len(handles))
	for step := 0; clk.Now().Sub(epoch) < modelTime(); step++ {
		if step%62 == 0 { // steps are 4 ms on average
			for i := range demand {
				demand[i] = []float64{0, 0.05, 0.2, 1}[rng.IntN(4)] // requests per ms
			}
		}
		for i, l := range handles {
			for range poisson(rng, demand[i]*4) {
				r, err := l.Allow(ctx, 1)
				require.NoError(t, err)
				if r.Allowed {
					grants = append(grants, clk.Now().Sub(epoch).Milliseconds())
				}
			}
		}
		clk.Add(time.Duration(1+rng.IntN(7)) * time.Millisecond)
	}
	var all LeaseStats
	for _, l := range handles {
		s := l.LeaseStats()
		all.Calls, all.Taken, all.Used, all.Returned = all.Calls+s.Calls, all.Taken+s.Taken, all.Used+s.Used, all.Returned+s.Returned
	}
	return grants, all
}

// poisson draws from a Poisson distribution of mean m (Knuth's way: fine
// for the small means here).
func poisson(rng *rand.Rand, m float64) int {
	limit, k, p := math.Exp(-m), 0, rng.Float64()
	for p > limit {
		k++
		p *= rng.Float64()
	}
	return k
}

// inSpan returns how far the grants (ms, sorted) in any span of span ms,
// [x, x+span), pass limit(x).
func inSpan(ms []int64, span int64, limit func(int64) int) int {
	worst := 0
	for i := range ms {
		j, _ := slices.BinarySearch(ms, ms[i]+span)
		worst = max(worst, j-i-limit(ms[i]))
	}
	return worst
}

// A refund re-sent, as go-redis re-sends a call whose reply it did not
// read, gives back once: the request log knows its id.
func TestLeaseRefundOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		last := &lastCall{}
		rec := cloneClient(t, rdb)
		rec.AddHook(last)
		l := newClient(rec, clk).FixedWindow(uniqueName(t)).WithDefault(PerSecond(10))
		b := leaseOf(t, l, 5, 1)
		_ = leaseOf(t, l, 5, 1)
		_, err := leaseCalls{l: l, time: time.Second}.Refund(ctx, b)
		require.NoError(t, err)
		assert.Equal(t, int64(5), available(t, l))
		assert.Equal(t, int64(0), rec.Do(ctx, last.refund...).Val(), "the same refund, again")
		assert.Equal(t, int64(5), available(t, l))
	})
}

// lastCall keeps the arguments of the last refund a client sent.
type lastCall struct {
	passHook
	refund []any
}

func (h *lastCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if r := requestsOf(cmd.Args()); len(r) == 1 && r[0].op == string(wire.OpRelease) {
			h.refund = cmd.Args()
		}
		return next(ctx, cmd)
	}
}

// A fixed window's block ends with its window: taken at 0.9 s with a lease
// time of a second, it serves no request at 1 s, where the next window
// grants its own Rate; what it held is lost with its window.
func TestLeaseEndsWithItsWindow(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		l := newClient(rdb, clk).FixedWindow(name).WithDefault(PerSecond(10)).WithLease(Lease{Time: time.Second, Share: 0.5})
		other := newClient(rdb, clk).FixedWindow(name).WithDefault(PerSecond(10))
		clk.Add(900 * time.Millisecond)
		for range 2 {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok)
		}
		require.Equal(t, int64(6), l.LeaseStats().Taken, "1, then a block of 5")
		clk.Add(99 * time.Millisecond)
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, ReasonLease, r.Reason)
		assert.Equal(t, time.Millisecond, r.ResetAfter)
		clk.Add(time.Millisecond)
		ok, err := other.TryAcquire(ctx, 10)
		require.NoError(t, err)
		require.True(t, ok, "the next window")
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "the block's 3 left went with its window")
		assert.Equal(t, ReasonLimit, r.Reason)
		assert.Equal(t, int64(0), l.LeaseStats().Returned)
	})
}

// Several rates: blocks are capped by the smallest limit's share, and the
// handle grants exactly what the limiter would; PerClient: each client's
// handle leases from its own limit.
func TestLeaseSeveralRatesAndPerClient(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		l := newClient(rdb, clk).FixedWindow(uniqueName(t)).WithDefault(PerSecond(20).And(Per(30, time.Minute))).WithLease(Lease{Time: time.Second})
		var r Result
		for second, want := range []int{20, 10} {
			granted := 0
			for range 40 {
				var err error
				r, err = l.Allow(ctx, 1)
				require.NoError(t, err)
				if r.Allowed {
					granted++
				}
			}
			assert.Equal(t, want, granted, "second %d", second)
			clk.Add(time.Second)
		}
		assert.Equal(t, 1, r.Bound, "denied by the minute")
		assert.Equal(t, 59*time.Second, r.RetryAfter)
		s := l.LeaseStats()
		assert.Equal(t, int64(30), s.Taken, "never more than fit")
		assert.LessOrEqual(t, s.Calls, int64(20), "blocks of 2 at most: 10%% of 20")

		name := uniqueName(t)
		perClient := Config{Rate: 10, Interval: time.Minute, Type: PerClient}
		for _, id := range []string{"a", "b"} {
			h := newClient(rdb, clk, WithClientID(id)).Funnel(name).WithDefault(perClient).WithLease(Lease{Time: time.Second, Share: 0.5})
			n := 0
			for range 15 {
				ok, err := h.TryAcquire(ctx, 1)
				require.NoError(t, err)
				if ok {
					n++
				}
			}
			assert.Equal(t, 10, n, "client %s", id)
		}
	})
}

// Acquire on a leased handle waits out what Redis said, then takes a block.
func TestLeaseAcquire(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	l := newClient(redistest.Miniredis(t), clk).FixedWindow("x").WithDefault(PerSecond(10)).WithLease(Lease{Time: time.Second})
	for range 10 {
		require.NoError(t, l.Acquire(ctx, 1))
	}
	before := clk.Now()
	require.NoError(t, l.Acquire(ctx, 1))
	assert.GreaterOrEqual(t, clk.Now().Sub(before), time.Second, "the next window")
	r, err := l.Allow(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(9), r.Remaining)
}

// A block keeps granting while Redis is down, until its time is up; then
// the take fails as any decision does: closed by default, granted with
// WithFailOpen.
func TestLeaseOutage(t *testing.T) {
	for _, open := range []bool{false, true} {
		t.Run(map[bool]string{false: "closed", true: "open"}[open], func(t *testing.T) {
			ctx := context.Background()
			srv := miniredis.RunT(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
			defer rdb.Close()
			clk := newClock()
			var opts []Option
			if open {
				opts = append(opts, WithFailOpen())
			}
			l := newClient(rdb, clk, opts...).Funnel("x").WithDefault(PerSecond(100)).WithLease(Lease{Time: 100 * time.Millisecond})
			for range 2 {
				ok, err := l.TryAcquire(ctx, 1)
				require.NoError(t, err)
				require.True(t, ok)
			}
			srv.Close()
			for range 9 {
				r, err := l.Allow(ctx, 1)
				require.NoError(t, err)
				require.Equal(t, ReasonLease, r.Reason, "the block of 10 serves on")
			}
			r, err := l.Allow(ctx, 1)
			if open {
				require.NoError(t, err)
				assert.True(t, r.Allowed)
				assert.Equal(t, ReasonFailOpen, r.Reason)
			} else {
				assert.ErrorIs(t, err, ErrUnavailable)
				assert.False(t, r.Allowed)
			}
		})
	}
}

// On the real clock, a block nobody asks from again goes back when its
// lease time is up, by a timer.
func TestLeaseTimerGivesBack(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := New(rdb)
		if p, ok := rdb.(prefixed); ok {
			c = New(rdb, WithPrefix(p.prefix))
		}
		l := c.FixedWindow(uniqueName(t)).WithDefault(Per(100, time.Hour)).WithLease(Lease{Time: 300 * time.Millisecond})
		_, err := l.Allow(ctx, 0) // a peek: the script loaded and the connection dialled before the first take
		require.NoError(t, err)
		for range 2 {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok)
		}
		// 1, then a block sized to the real time the first took.
		taken := l.LeaseStats().Taken
		require.Greater(t, taken, int64(2))
		require.Eventually(t, func() bool { return l.LeaseStats().Returned == taken-2 }, 5*time.Second, 10*time.Millisecond)
		assert.Equal(t, int64(98), available(t, l))
	})
}

// A take re-sent under a request log (go-redis re-sends a call whose reply
// it did not read) is counted once, and says no more than its first run
// took: its first run took the 4 that fit of the 6 it wanted; the second
// says 1, the least it asked for.
func TestLeaseTakeResent(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		l := newClient(rdb, clk, WithRetryWindow(time.Minute)).FixedWindow(uniqueName(t)).WithDefault(PerSecond(10))
		require.Equal(t, int64(6), leaseOf(t, l, 6, 1).Size)
		id := requestid.New()
		take := func() int64 {
			_, d, err := l.ask(ctx, request{op: opReserve, permits: 6, least: 1, id: id, logWindow: time.Minute.Milliseconds()})
			require.NoError(t, err)
			return d.Taken
		}
		assert.Equal(t, int64(4), take(), "the 4 that fit")
		assert.Equal(t, int64(1), take(), "the same take, again")
		assert.Equal(t, int64(0), available(t, l), "counted once")
	})
}

// A calendar quota stored by another handle: a leased handle with no
// default learns its calendar as any handle does, and its block ends with
// the local day.
func TestLeaseCalendar(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock() // 17:00 in New York
		name := uniqueName(t)
		require.NoError(t, newClient(rdb, clk).FixedWindow(name).SetRate(ctx, PerDay(100, zone(t, "America/New_York"))))
		l := newClient(rdb, clk).FixedWindow(name).WithLease(Lease{Time: 10 * time.Hour})
		r := allow(t, l, 1)
		assert.True(t, r.Allowed)
		assert.Equal(t, 7*time.Hour, r.ResetAfter, "to midnight in New York")
		r = allow(t, l, 1)
		assert.Equal(t, ReasonLimit, r.Reason, "the first block was the request's own")
		clk.Add(7*time.Hour - time.Millisecond)
		r = allow(t, l, 1)
		assert.Equal(t, ReasonLease, r.Reason)
		assert.Equal(t, time.Millisecond, r.ResetAfter)
		clk.Add(time.Millisecond)
		r = allow(t, l, 1)
		assert.Equal(t, ReasonLimit, r.Reason, "the day ended, and its block with it")
		assert.Equal(t, int64(99), r.Remaining, "a new day: its block and what Redis has left")
	})
}

// Client.Close gives back what every leased handle made from it holds, once:
// a handle closed already gives nothing more.
func TestClientCloseGivesBackLeases(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	c := newClient(redistest.Miniredis(t), clk)
	var handles []*Limiter
	for _, name := range []string{"a", "b", "c"} {
		l := c.FixedWindow(name).WithDefault(PerMinute(100)).WithLease(Lease{Time: time.Second})
		for range 2 {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok)
		}
		handles = append(handles, l)
	}
	require.NoError(t, handles[2].Close(ctx))
	require.Equal(t, int64(9), handles[2].LeaseStats().Returned, "1, then a block of 10: 9 unused")
	require.NoError(t, c.Close(ctx))
	for _, l := range handles {
		assert.Equal(t, int64(9), l.LeaseStats().Returned, l.Name())
		assert.Equal(t, int64(98), available(t, l), l.Name())
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, ReasonLimit, r.Reason, "closed: decided in Redis")
	}
	require.NoError(t, c.Close(ctx), "nothing left to give back")
}

// A refund names its take in the request log, which new rates forget (see
// TestLeaseAttackRefundIntoAddedRate); SetRate with the rates in force, as
// every instance of a service may make as it starts, forgets nothing.
func TestLeaseRefundAfterSameSetRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		admin, l := blockOut(t, rdb, newClock(), uniqueName(t))
		require.NoError(t, admin.SetRate(ctx, PerSecond(100)))
		require.NoError(t, l.Close(ctx))
		assert.Equal(t, int64(49), l.LeaseStats().Returned, "the block's unused 49")
		assert.Equal(t, int64(98), available(t, admin), "the 2 granted still count")
	})
}
