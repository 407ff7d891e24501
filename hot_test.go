package redlimit

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/hotkeys"
	"github.com/redlimit/redlimit/internal/redistest"
)

// hot100 leases a limiter above 100 decisions a second, and gives it back
// below 50.
var hot100 = HotLeases{Above: 100, Lease: Lease{Time: time.Second}}

// A limiter leased while it is hot: its first 100 decisions in a second go
// to Redis; the 101st takes a block of its own permit, the 102nd one sized
// to its pace (2,000 wanted, capped at a tenth of the limit), and the rest
// come from memory. Once its rate falls below 50 a second, what its block
// holds goes back, and it decides through Redis again.
func TestHotLeaseFollowsDemand(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		loadScripts(t, rdb) // no NOSCRIPT in the count
		log := &commandLog{}
		clk := newClock()
		c := newClient(recorded(t, rdb, log), clk, WithHotLeases(hot100))
		name := uniqueName(t)
		handle := func() *Limiter { return a.new(c, name).WithDefault(a.counting(10_000)) } // per request, as a service makes them
		reasons := map[Reason]int{}
		for range 1000 {
			r := allow(t, handle(), 1)
			require.True(t, r.Allowed)
			reasons[r.Reason]++
			clk.Add(time.Millisecond)
		}
		assert.Equal(t, map[Reason]int{ReasonLimit: 102, ReasonLease: 898}, reasons)
		assert.Equal(t, 102, log.count("evalsha"), "script calls for 1,000 decisions")
		s := c.HotLeaseStats()
		assert.Equal(t, []HotLease{{Limiter: handle().Name(), Algorithm: a.name, Rate: 1000, Held: 101, Cap: 1000}}, s.Leased)
		assert.Equal(t, LeaseStats{Calls: 2, Taken: 1001, Used: 900}, s.LeaseStats)
		assert.Equal(t, [2]int64{1, 0}, [2]int64{s.Started, s.Cooled})

		// At 1 s its rate is 1,000 + 1; at 1.96 s, 1,000 × 4% + 2: below 50.
		assert.Equal(t, ReasonLease, allow(t, handle(), 1).Reason)
		clk.Add(960 * time.Millisecond)
		r := allow(t, handle(), 1)
		assert.Equal(t, ReasonLimit, r.Reason)
		assert.True(t, r.Allowed)
		assert.Equal(t, 104, log.count("evalsha"), "the refund, and the decision")
		s = c.HotLeaseStats()
		assert.Empty(t, s.Leased)
		assert.Equal(t, LeaseStats{Calls: 3, Taken: 1001, Used: 901, Returned: 100}, s.LeaseStats, "every unused permit back")
		assert.Equal(t, [2]int64{1, 1}, [2]int64{s.Started, s.Cooled})
		assert.Equal(t, int64(10_000-1002), available(t, handle()), "1,002 granted, each counted once")

		// 80 a second is not above 100: every decision goes to Redis.
		before := log.count("evalsha")
		for range 300 {
			clk.Add(12500 * time.Microsecond)
			assert.Equal(t, ReasonLimit, allow(t, handle(), 1).Reason)
		}
		assert.Equal(t, before+300, log.count("evalsha"))
		assert.Equal(t, int64(1), c.HotLeaseStats().Started)
		require.NoError(t, c.Close(ctx))
	})
}

// The bound, on a model: three instances decide on one limiter at its
// limit, each with demand changing every half second from none to ten
// times the limit, so that each turns hot and cools again and again; every
// grant is checked against the bound an explicit lease of the same Time
// states (lease.go), as TestLeaseBound checks explicit leases.
func TestHotLeaseBound(t *testing.T) {
	const rate, d = 100, 100 * time.Millisecond
	interval := time.Second
	hot := HotLeases{Above: 100, Lease: Lease{Time: d}}
	for _, tc := range []struct {
		name string
		new  func(c *Client, name string) *Limiter
		cfg  Config
		over func(ms []int64) int // how far grants (ms, sorted) pass the bound
	}{
		{"fixed_window", (*Client).FixedWindow, PerSecond(rate), func(ms []int64) int {
			return inWindows(ms, 1000, rate)
		}},
		{"sliding_window", (*Client).SlidingWindow, Config{Rate: rate, Interval: interval, Buckets: 10}, func(ms []int64) int {
			return inSpan(ms, (interval*9/10 - d).Milliseconds(), func(int64) int { return rate })
		}},
		{"tokenbucket", (*Client).TokenBucket, PerSecond(rate), func(ms []int64) int {
			return inSpan(ms, (interval - d).Milliseconds(), func(int64) int { return rate })
		}},
		// A burst of a second's rate: the funnel's state then lives as long
		// as the others' (an Interval), a Redis TTL that runs in real time
		// while the model's clock runs far faster; a shorter one would
		// expire in a stall of this machine, and the funnel forget grants.
		{"funnel", (*Client).Funnel, Config{Rate: rate, Interval: interval, Burst: rate}, func(ms []int64) int {
			worst := 0
			for i := range ms {
				for j := i; j < len(ms); j++ {
					bound := rate + int((ms[j]-ms[i]+d.Milliseconds())*rate/interval.Milliseconds())
					worst = max(worst, j-i+1-bound)
				}
			}
			return worst
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
				leased, s, calls := hotModel(t, rdb, tc.new, tc.cfg, &hot)
				plain, _, plainCalls := hotModel(t, rdb, tc.new, tc.cfg, nil)
				t.Logf("%d grants in %v at %d/s (%d unleased on the same demand); %d script calls (%d unleased); "+
					"hot leases: %d started, %d cooled; %d calls, %d taken, %d used, %d returned",
					len(leased), hotModelTime(), rate, len(plain), calls, plainCalls, s.Started, s.Cooled, s.Calls, s.Taken, s.Used, s.Returned)
				assert.Equal(t, 0, tc.over(leased), "grants past the bound")
				assert.Equal(t, 0, tc.over(plain), "the unleased limiter's grants past the bound")
				// The demand is the same every run, and so are the changes.
				want := map[bool][2]int64{true: {5, 3}, false: {10, 8}}[testing.Short()]
				assert.Equal(t, want, [2]int64{s.Started, s.Cooled}, "leases started and given back")
				assert.Less(t, 2*calls, plainCalls, "script calls saved")
				// Under-admission: what blocks hold unused, at most a cap (a
				// tenth of the limit) per instance, for at most an interval
				// at a time.
				lost := 3 * rate / 10 * int(hotModelTime()/interval+1)
				assert.GreaterOrEqual(t, len(leased), len(plain)-lost, "under-admission")
			})
		})
	}
}

// inWindows returns how far the grants (ms, sorted) in any window of width
// ms, aligned, pass limit.
func inWindows(ms []int64, width int64, limit int) int {
	worst := 0
	for i := range ms {
		if i == 0 || ms[i]/width != ms[i-1]/width {
			j, _ := slices.BinarySearch(ms, ms[i]-ms[i]%width+width)
			worst = max(worst, j-i-limit)
		}
	}
	return worst
}

// hotModelTime is how long hotModel runs, on its clock: 12 s, or 6 s in
// the short suites.
func hotModelTime() time.Duration {
	if testing.Short() {
		return 6 * time.Second
	}
	return 12 * time.Second
}

// hotModel runs three instances (Clients, with hot leases or none) on one
// limiter for hotModelTime of a controlled clock and returns when each
// grant was made (ms since epoch, sorted), their hot leases' figures (taken
// before Close, which cools every lease), and the script calls they made.
// Each instance's demand swings, every 1 to 2 s, between above a rate of
// 100 a second (150, or 500) and below it (none, 30, or 70: still leased,
// above half of 100, its blocks used slowly), so that each turns hot and
// cools again and again; a seed fixes it, the same for every run. The
// model sees blocks used late: with a lease Time of 500 ms checked against
// a bound of 100 ms, the token bucket's and the sliding window's grants
// pass it.
func hotModel(t *testing.T, rdb redis.UniversalClient, newLimiter func(c *Client, name string) *Limiter, cfg Config, hot *HotLeases) ([]int64, HotLeaseStats, int) {
	ctx := context.Background()
	clk := newClock()
	name := uniqueName(t)
	log := &commandLog{}
	rec := recorded(t, rdb, log)
	var clients []*Client
	for range 3 {
		var opts []Option
		if hot != nil {
			opts = append(opts, WithHotLeases(*hot))
		}
		clients = append(clients, newClient(rec, clk, opts...))
	}
	rng := rand.New(rand.NewPCG(5, 4))
	var grants []int64
	demand := make([]float64, len(clients)) // requests per ms
	change := make([]time.Duration, len(clients))
	for i := range change {
		change[i] = time.Duration(rng.IntN(1000)) * time.Millisecond
	}
	for at := time.Duration(0); at < hotModelTime(); at = clk.Now().Sub(epoch) {
		for i := range demand {
			if at >= change[i] {
				change[i] += time.Second + time.Duration(rng.IntN(1000))*time.Millisecond
				if demand[i] < 0.1 {
					demand[i] = []float64{0.15, 0.5}[rng.IntN(2)]
				} else {
					demand[i] = []float64{0, 0.03, 0.07}[rng.IntN(3)]
				}
			}
		}
		step := time.Duration(1+rng.IntN(7)) * time.Millisecond
		for i, c := range clients {
			for range poisson(rng, demand[i]*float64(step/time.Millisecond)) {
				r, err := newLimiter(c, name).WithDefault(cfg).Allow(ctx, 1)
				require.NoError(t, err)
				if r.Allowed {
					grants = append(grants, at.Milliseconds())
				}
			}
		}
		clk.Add(step)
	}
	calls := log.count("evalsha")
	var all HotLeaseStats
	for _, c := range clients {
		s := c.HotLeaseStats() // before Close, which cools every lease
		all.Started, all.Cooled = all.Started+s.Started, all.Cooled+s.Cooled
		all.Leased = append(all.Leased, s.Leased...)
		require.NoError(t, c.Close(ctx))
		all.LeaseStats.add(c.HotLeaseStats().LeaseStats)
	}
	return grants, all, calls
}

// Many callers at once, on one hot limiter and on keys of their own, while
// the clock runs and stops: leases start and cool under them, and the
// limiter grants no more than its Rate in its window, every permit taken
// into a block used or given back.
func TestHotLeaseConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		c := newClient(rdb, clk, WithHotLeases(HotLeases{Above: 100, Lease: Lease{Time: 100 * time.Millisecond}}))
		name := uniqueName(t)
		hot := func() *Limiter { return c.FixedWindow(name).WithDefault(PerHour(6000)) }
		var granted atomic.Int64
		phase := func() {
			hammer(ctx, 8, func(g, n int) bool {
				r, err := hot().Allow(ctx, 1)
				require.NoError(t, err)
				if r.Allowed {
					granted.Add(1)
				}
				if n%50 == 0 {
					_, err := c.FixedWindow(fmt.Sprintf("%s-user-%d-%d", name, g, n)).WithDefault(PerHour(10)).Allow(ctx, 1)
					require.NoError(t, err)
					_ = c.HotLeaseStats()
				}
				if g == 0 {
					clk.Add(time.Millisecond)
				}
				return n == 500
			})()
		}
		phase()
		require.Equal(t, int64(1), c.HotLeaseStats().Started)
		clk.Add(3 * time.Second) // a quiet spell: the lease cools
		phase()
		s := c.HotLeaseStats()
		t.Logf("%d granted of %d asked; %+v", granted.Load(), 2*8*501, s)
		assert.Equal(t, [2]int64{2, 1}, [2]int64{s.Started, s.Cooled})
		require.NoError(t, c.Close(ctx))
		s = c.HotLeaseStats()
		assert.LessOrEqual(t, granted.Load(), int64(6000), "the window's Rate")
		assert.Equal(t, s.Taken, s.Used+s.Returned, "every permit taken used or given back")
		assert.Equal(t, 6000-granted.Load(), available(t, hot()))
	})
}

// The table of limiters is bounded: a flood of keys, one decision each,
// leaves at most two generations, and a hot limiter decided on meanwhile
// stays leased; one left alone while a whole generation of keys passes is
// dropped, and gives its block back.
func TestHotLeaseTableBounded(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	c := newClient(redistest.Miniredis(t), clk, WithHotLeases(hot100))
	hot := func() *Limiter { return c.FixedWindow("hot").WithDefault(PerHour(1_000_000)) }
	key := 0
	flood := func(n int, every int) {
		for i := range n {
			_, err := c.FixedWindow(fmt.Sprint("user:", key)).WithDefault(PerHour(10)).Allow(ctx, 1)
			require.NoError(t, err)
			key++
			if every > 0 && i%every == 0 {
				_, err := hot().Allow(ctx, 1)
				require.NoError(t, err)
			}
			clk.Add(100 * time.Microsecond)
		}
	}
	for range 200 {
		_, err := hot().Allow(ctx, 1)
		require.NoError(t, err)
	}
	flood(3*hotkeys.PerGeneration, 8)
	t.Logf("%d entries after %d keys", c.hot.table.Len(), key)
	assert.LessOrEqual(t, c.hot.table.Len(), 2*hotkeys.PerGeneration)
	s := c.HotLeaseStats()
	require.Len(t, s.Leased, 1)
	assert.Equal(t, hot().Name(), s.Leased[0].Limiter)
	assert.Equal(t, [2]int64{1, 0}, [2]int64{s.Started, s.Cooled})
	assert.Equal(t, int64(200+3*hotkeys.PerGeneration/8), s.Used+100, "the first 100 from Redis")

	flood(2*hotkeys.PerGeneration, 0) // within the same second: it is still hot, but forgotten
	s = c.HotLeaseStats()
	assert.Empty(t, s.Leased)
	assert.Equal(t, [2]int64{1, 1}, [2]int64{s.Started, s.Cooled})
	assert.Equal(t, s.Taken-s.Used, s.Returned, "its block given back")
	assert.Equal(t, int64(1_000_000-200-3*hotkeys.PerGeneration/8), available(t, hot()))
	assert.LessOrEqual(t, c.hot.table.Len(), 2*hotkeys.PerGeneration)
}

// Bad settings are refused: every decision that takes permits fails with
// ErrInvalidConfig, and nothing reaches Redis.
func TestHotLeaseRefusesBadSettings(t *testing.T) {
	rdb := redistest.Miniredis(t)
	for _, cfg := range []HotLeases{
		{Lease: Lease{Time: time.Second}},
		{Above: -1, Lease: Lease{Time: time.Second}},
		{Above: math.NaN(), Lease: Lease{Time: time.Second}},
		{Above: math.Inf(1), Lease: Lease{Time: time.Second}},
		{Above: 100},
		{Above: 100, Lease: Lease{Time: time.Second, Share: 2}},
		{Above: 100, Lease: Lease{Time: time.Second, Max: -1}},
	} {
		log := &commandLog{}
		c := newClient(recorded(t, rdb, log), newClock(), WithHotLeases(cfg))
		_, err := c.Funnel("x").WithDefault(PerSecond(10)).Allow(context.Background(), 1)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
		assert.Zero(t, log.count("evalsha"), "%+v", cfg)
	}
}

// heat makes the limiter hot on its Client: 200 decisions in 200 ms.
func heat(t *testing.T, clk *clock, l *Limiter) {
	t.Helper()
	for range 200 {
		allow(t, l, 1)
		clk.Add(time.Millisecond)
	}
}

// Client.Close gives back the hot leases' blocks and ends hot leasing.
func TestHotLeaseClientClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		c := newClient(rdb, clk, WithHotLeases(hot100))
		l := c.Funnel(uniqueName(t)).WithDefault(Config{Rate: 1, Interval: time.Hour, Burst: 1000})
		heat(t, clk, l)
		require.Len(t, c.HotLeaseStats().Leased, 1)
		require.NoError(t, c.Close(ctx))
		s := c.HotLeaseStats()
		assert.Empty(t, s.Leased)
		assert.Equal(t, [2]int64{1, 1}, [2]int64{s.Started, s.Cooled})
		assert.Positive(t, s.Returned)
		assert.Equal(t, s.Taken-s.Used, s.Returned)
		assert.Equal(t, int64(800), available(t, l))
		heat(t, clk, l)
		assert.Equal(t, int64(1), c.HotLeaseStats().Started, "no lease after Close")
		assert.Equal(t, int64(600), available(t, l))
	})
}

// A local change (Reset here) reaches a hot lease at once, as it reaches a
// leased handle's: its denial is forgotten.
func TestHotLeaseForgetsDenial(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	c := newClient(redistest.Miniredis(t), clk, WithHotLeases(HotLeases{Above: 100, Lease: Lease{Time: time.Minute}}))
	l := c.FixedWindow("x").WithDefault(PerHour(150))
	denied := map[Reason]int{}
	for range 200 {
		if r := allow(t, l, 1); !r.Allowed {
			denied[r.Reason]++
		}
	}
	require.Equal(t, map[Reason]int{ReasonLimit: 1, ReasonLease: 49}, denied, "denied by Redis once, then by the lease")
	require.Len(t, c.HotLeaseStats().Leased, 1)
	require.NoError(t, l.Reset(ctx))
	r := allow(t, l, 1)
	assert.True(t, r.Allowed, "the lease forgot its denial")
	assert.Equal(t, ReasonLimit, r.Reason, "a new block")
}

// On the real clock a timer sweeps the leases: a hot limiter left alone
// gives its block back within two seconds, long before its lease time.
func TestHotLeaseTimerCools(t *testing.T) {
	ctx := context.Background()
	c := New(redistest.Miniredis(t), WithHotLeases(HotLeases{Above: 100, Lease: Lease{Time: time.Minute}}))
	l := c.FixedWindow("x").WithDefault(PerHour(1_000_000))
	for range 300 {
		_, err := l.Allow(ctx, 1)
		require.NoError(t, err)
	}
	s := c.HotLeaseStats()
	if len(s.Leased) == 0 {
		t.Skip("300 decisions took more than a second here")
	}
	require.Eventually(t, func() bool { return len(c.HotLeaseStats().Leased) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		s := c.HotLeaseStats()
		return s.Returned > 0 && s.Returned == s.Taken-s.Used
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, int64(1_000_000-300), available(t, l))
}
