package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// Degraded mode (degraded.go) on miniredis and a controlled clock: the
// local decisions are the scripts' own on the share (every field of every
// Result of random sequences), the heartbeat counts what it should under
// the key it should, and the interplay with fail-open, shadow mode and the
// other layers is the documented one. The bound across processes, with a
// real Redis killed and restarted, is degraded_process_test.go's.

// degradedClient is a Client in degraded mode on clk, whose first beat has
// returned.
func degradedClient(t *testing.T, rdb redis.Scripter, clk *clock, d Degraded, opts ...Option) *Client {
	t.Helper()
	c := newClient(rdb, clk, append([]Option{WithDegraded(d)}, opts...)...)
	select {
	case <-c.degraded.heart.First():
	case <-time.After(10 * time.Second):
		t.Fatal("no first heartbeat")
	}
	return c
}

// outageRedis is a fresh miniredis, and a hook that takes it away.
func outageRedis(t *testing.T) (*redis.Client, *outageHook) {
	rdb := redistest.Miniredis(t)
	hook := &outageHook{}
	rdb.AddHook(hook)
	return rdb, hook
}

// beatAll beats every client in turn, twice: then each has counted all.
func beatAll(t *testing.T, clients ...*Client) {
	t.Helper()
	for range 2 {
		for _, c := range clients {
			require.NoError(t, c.degraded.heart.Beat(context.Background()))
		}
	}
}

// shareOf is cfg as one of n instances enforces it, worked out apart from
// the code under test: each rate's Rate (and a funnel's Burst) divided by
// n, rounded up.
func shareOf(a algo, cfg Config, n int64) Config {
	share := func(x int64) int64 { return (x + n - 1) / n }
	s := cfg
	s.Rate, s.More = share(cfg.Rate), nil
	if a.name == funnelAlgo.name && cfg.Burst != 0 {
		s.Burst = share(cfg.Burst)
	}
	for _, o := range cfg.More {
		o.Rate = share(o.Rate)
		if a.name == funnelAlgo.name && o.Burst != 0 {
			o.Burst = share(o.Burst)
		}
		s.More = append(s.More, o)
	}
	return s
}

// Each algorithm decides locally as its script decides in Redis: a handle
// whose Redis is down, with a default of cfg and n instances, answers every
// request of a random sequence exactly as a handle in Redis with the share
// of cfg for its default does, Reason aside.
func TestDegradedMatchesScripts(t *testing.T) {
	ctx := context.Background()
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	cases := []struct {
		a   algo
		cfg Config
	}{
		{tokenBucketAlgo, PerSecond(10)},
		{tokenBucketAlgo, PerSecond(10).And(PerMinute(100))},
		{funnelAlgo, Config{Rate: 10, Interval: time.Second, Burst: 7}},
		{funnelAlgo, Config{Rate: 1000, Interval: 3 * time.Second, Burst: 20}}, // shared by 3: 334 per 3 s, 8982 2/167 µs a permit
		{funnelAlgo, Config{Rate: 10, Interval: time.Second, Burst: 4}.And(Config{Rate: 100, Interval: time.Minute, Burst: 30})},
		{fixedWindowAlgo, PerSecond(10)},
		{fixedWindowAlgo, PerSecond(10).And(PerDay(500, berlin))}, // the clock starts an hour before Berlin's midnight
		{slidingWindowAlgo, Config{Rate: 10, Interval: time.Second, Buckets: 7}},
		{slidingWindowAlgo, Per(20, 10*time.Second).And(PerSecond(5))},
	}
	rdb := redistest.Miniredis(t)
	down := cloneClient(t, rdb)
	hook := &outageHook{}
	hook.down.Store(true)
	down.(*redis.Client).AddHook(hook)
	for _, tc := range cases {
		for _, n := range []int64{1, 3, 7} {
			t.Run(fmt.Sprintf("%s/%v/%d", tc.a.name, tc.cfg, n), func(t *testing.T) {
				clk := newClock()
				shared := shareOf(tc.a, tc.cfg, n)
				inRedis := tc.a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(shared)
				local := tc.a.new(degradedClient(t, down, clk, Degraded{Heartbeat: time.Hour, MinInstances: int(n)}), uniqueName(t)).WithDefault(tc.cfg)
				// most is the largest request every rate can grant; step,
				// the shortest time a rate takes to grant a permit.
				most, step := shared.Rate, shared.Interval/time.Duration(shared.Rate)
				for _, o := range shared.More {
					most, step = min(most, o.Rate), min(step, o.Interval/time.Duration(o.Rate))
				}
				if shared.Burst != 0 {
					most = min(most, shared.Burst)
				}
				rng := rand.New(rand.NewPCG(uint64(n), 38))
				denied := 0
				// Demand is about 2.5 times the fastest rate: 1.5 permits a
				// request, a request every 0.6 × step on average.
				for i := range 400 {
					switch x := rng.IntN(100); {
					case x < 3:
						clk.Add(10 * time.Minute)
					case x < 63:
						clk.Add(time.Duration(rng.Int64N(int64(2 * step))))
					}
					permits := rng.Int64N(min(most, 3) + 1)
					want, err := inRedis.Allow(ctx, permits)
					require.NoError(t, err)
					got, err := local.Allow(ctx, permits)
					require.NoError(t, err)
					require.Equal(t, ReasonDegraded, got.Reason, "step %d", i)
					got.Reason = ReasonLimit
					require.Equal(t, want, got, "step %d: %d permits at %v", i, permits, clk.Now().Sub(epoch))
					if !want.Allowed {
						denied++
					}
				}
				assert.Greater(t, denied, 20, "the sequence met the limit")
			})
		}
	}
}

// Three instances learn they are three; one of them, cut off from Redis,
// grants its share, ⌈10 / 3⌉ = 4, of a window, and goes back to Redis
// when it answers again, where nothing it granted locally was counted.
func TestDegradedSteps(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	rdb := redistest.Miniredis(t)
	hook := &outageHook{}
	rdb.AddHook(hook)
	var mu sync.Mutex
	var observed []Decision
	d := Degraded{Heartbeat: time.Hour}
	a := degradedClient(t, rdb, clk, d, WithPrefix("svc:"), WithObserver(func(d Decision) {
		mu.Lock()
		observed = append(observed, d)
		mu.Unlock()
	}))
	b, c := degradedClient(t, rdb, clk, d, WithPrefix("svc:")), degradedClient(t, rdb, clk, d, WithPrefix("svc:"))
	beatAll(t, a, b, c)
	assert.Equal(t, DegradedState{Enabled: true, Instances: 3, SameID: 1, Beat: clk.Now()}, a.DegradedState())
	assert.Equal(t, DegradedState{}, New(rdb).DegradedState(), "without WithDegraded")

	l := a.FixedWindow(uniqueName(t)).WithDefault(PerMinute(10))
	r, err := l.Allow(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Minute, Window: time.Minute}, r)

	clk.Add(time.Second)
	hook.down.Store(true)
	began := clk.Now()
	for i := range 4 {
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		left := 59*time.Second - time.Duration(i)*time.Millisecond
		assert.Equal(t, Result{Allowed: true, Limit: 4, Remaining: int64(3 - i), ResetAfter: left, Window: time.Minute, Reason: ReasonDegraded}, r)
		clk.Add(time.Millisecond)
	}
	r, err = l.Allow(ctx, 1)
	require.NoError(t, err)
	left := 59*time.Second - 4*time.Millisecond
	assert.Equal(t, Result{Limit: 4, RetryAfter: left, ResetAfter: left, Window: time.Minute, Reason: ReasonDegraded}, r)
	mu.Lock()
	last := observed[len(observed)-1]
	mu.Unlock()
	assert.ErrorIs(t, last.Err, ErrUnavailable, "the observer is told of the outage")
	assert.Equal(t, r, last.Result)
	assert.Equal(t, DegradedState{Enabled: true, Instances: 3, SameID: 1, Beat: epoch, Active: true, Since: began}, a.DegradedState())

	// Above the share, within the limit: not while Redis is away.
	r, err = l.Allow(ctx, 5)
	require.NoError(t, err)
	assert.False(t, r.Allowed)
	assert.Equal(t, time.Hour, r.RetryAfter, "a Heartbeat")
	// Above the limit: never, as Redis says.
	r, err = l.Allow(ctx, 11)
	require.ErrorIs(t, err, ErrPermitsExceedRate)
	assert.Equal(t, Never, r.RetryAfter)
	r, err = l.Allow(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, Result{Allowed: true, Limit: 4, ResetAfter: left, Window: time.Minute, Reason: ReasonDegraded}, r)

	// Redis answers: it counted its own grant only.
	hook.down.Store(false)
	r, err = l.Allow(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 8, ResetAfter: left, Window: time.Minute}, r)
	assert.False(t, a.DegradedState().Active)

	// Away again in the same window: the local count stands.
	hook.down.Store(true)
	r, err = l.Allow(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, Result{Limit: 4, RetryAfter: left, ResetAfter: left, Window: time.Minute, Reason: ReasonDegraded}, r)
	clk.Add(left)
	r, err = l.Allow(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, Result{Allowed: true, Limit: 4, Remaining: 3, ResetAfter: time.Minute, Window: time.Minute, Reason: ReasonDegraded}, r)
	require.ErrorIs(t, a.degraded.heart.Beat(ctx), ErrUnavailable)
	assert.Equal(t, 3, a.DegradedState().Instances, "a failed heartbeat keeps what the last one counted")
}

// The heartbeat: one zset under the prefix, a member per Client (its id, a
// space, 16 hex digits) scored by its last beat in ms, kept for Expire;
// members not heard from for longer than Expire are no longer counted.
func TestDegradedHeartbeatKey(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	rdb := redistest.Miniredis(t)
	d := Degraded{Heartbeat: 10 * time.Second, Expire: 25 * time.Second}
	a := degradedClient(t, rdb, clk, d, WithPrefix("svc:"), WithClientID("api"))
	b := degradedClient(t, rdb, clk, d, WithPrefix("svc:"), WithClientID("api"))
	c := degradedClient(t, rdb, clk, d, WithPrefix("svc:"), WithClientID("worker"))
	beatAll(t, a, b, c)

	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"svc:redlimit:instances"}, keys, "one key a prefix")
	members, err := rdb.ZRangeWithScores(ctx, "svc:redlimit:instances", 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, members, 3)
	ids := map[string]int{}
	for _, m := range members {
		id, nonce, _ := strings.Cut(m.Member.(string), " ")
		assert.Regexp(t, "^[0-9a-f]{16}$", nonce)
		assert.Equal(t, float64(epoch.UnixMilli()), m.Score)
		ids[id]++
	}
	assert.Equal(t, map[string]int{"api": 2, "worker": 1}, ids)
	assert.Equal(t, 25*time.Second, rdb.PTTL(ctx, "svc:redlimit:instances").Val())
	assert.Equal(t, DegradedState{Enabled: true, Instances: 3, SameID: 2, Beat: epoch}, a.DegradedState())
	assert.Equal(t, DegradedState{Enabled: true, Instances: 3, SameID: 1, Beat: epoch}, c.DegradedState())

	// An instance is counted until Expire after its last beat, to the ms;
	// c's count of 3 is as old, and gives way to its new count.
	clk.Set(epoch.Add(25 * time.Second))
	require.NoError(t, b.degraded.heart.Beat(ctx))
	assert.Equal(t, 3, b.DegradedState().Instances, "a's and c's last beats are Expire old: still counted")
	clk.Add(time.Millisecond)
	require.NoError(t, c.degraded.heart.Beat(ctx))
	assert.Equal(t, DegradedState{Enabled: true, Instances: 2, SameID: 1, Beat: clk.Now()}, c.DegradedState(), "a's is older: gone")
	clk.Set(epoch.Add(50 * time.Second))
	require.NoError(t, a.degraded.heart.Beat(ctx))
	assert.Equal(t, DegradedState{Enabled: true, Instances: 3, SameID: 2, Beat: clk.Now()}, a.DegradedState(), "b and c beat 25 s ago")
	// Redis loses its data: a's next beat counts a alone, but a lower
	// count replaces a higher one only once that is Expire old.
	require.NoError(t, rdb.Del(ctx, "svc:redlimit:instances").Err())
	clk.Add(time.Millisecond)
	require.NoError(t, a.degraded.heart.Beat(ctx))
	assert.Equal(t, int64(1), rdb.ZCard(ctx, "svc:redlimit:instances").Val())
	assert.Equal(t, DegradedState{Enabled: true, Instances: 3, SameID: 2, Beat: clk.Now()}, a.DegradedState(), "held")
	clk.Set(epoch.Add(75*time.Second + time.Millisecond))
	require.NoError(t, a.degraded.heart.Beat(ctx))
	assert.Equal(t, DegradedState{Enabled: true, Instances: 1, SameID: 1, Beat: clk.Now()}, a.DegradedState(), "the 3 is Expire old")

	// Without a prefix.
	o := degradedClient(t, rdb, clk, d)
	require.NoError(t, o.degraded.heart.Beat(ctx))
	assert.Equal(t, int64(1), rdb.ZCard(ctx, "redlimit:instances").Val())
	// Defaults.
	assert.Equal(t, Degraded{Heartbeat: 5 * time.Second, Expire: 15 * time.Second}, New(rdb, WithDegraded(Degraded{MinInstances: -1})).degraded.cfg)
	assert.Equal(t, Degraded{Heartbeat: time.Second, Expire: 3 * time.Second}, New(rdb, WithDegraded(Degraded{Heartbeat: time.Second, Expire: time.Second})).degraded.cfg)
}

// A stored config is learnt from Redis (read once, and again when the
// limits decisions report change), and is what a local decision shares.
func TestDegradedStoredConfig(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	rdb := redistest.Miniredis(t)
	hook := &outageHook{}
	rdb.AddHook(hook)
	c := degradedClient(t, rdb, clk, Degraded{Heartbeat: time.Hour, MinInstances: 3})
	name := uniqueName(t)
	require.NoError(t, c.FixedWindow(name).SetRate(ctx, PerMinute(9)))
	l := c.FixedWindow(name)
	withDefault := c.FixedWindow(name).WithDefault(PerMinute(100))

	granted := func(l *Limiter, tries int) (n int) {
		t.Helper()
		for range tries {
			r, err := l.Allow(ctx, 1)
			require.NoError(t, err)
			require.Equal(t, ReasonDegraded, r.Reason)
			if r.Allowed {
				n++
			}
		}
		return n
	}
	ok, err := l.TryAcquire(ctx, 1)
	require.NoError(t, err)
	require.True(t, ok)
	seen := l.family.degraded.Seen()
	require.NotNil(t, seen)
	assert.True(t, seen.Config.equal(PerMinute(9)), "%v", seen.Config)
	for range 5 {
		_, err := withDefault.TryAcquire(ctx, 1) // the same limits: nothing more to read
		require.NoError(t, err)
	}
	assert.Same(t, seen, l.family.degraded.Seen(), "read once")
	hook.down.Store(true)
	assert.Equal(t, 3, granted(withDefault, 5), "⌈9 / 3⌉: the stored config's share, not the default's")
	hook.down.Store(false)

	require.NoError(t, c.FixedWindow(name).SetRate(ctx, PerMinute(30)))
	_, err = l.Allow(ctx, 0)
	require.NoError(t, err)
	hook.down.Store(true)
	assert.Equal(t, 10, granted(l, 12), "⌈30 / 3⌉, counted afresh under the new config")

	// Never decided and no default: nothing to share. It fails closed, or
	// open with WithFailOpen.
	fresh := c.FixedWindow(uniqueName(t))
	_, err = fresh.Allow(ctx, 1)
	assert.ErrorIs(t, err, ErrUnavailable)
	open := degradedClient(t, rdb, clk, Degraded{Heartbeat: time.Hour, MinInstances: 3}, WithFailOpen())
	r, err := open.FixedWindow(uniqueName(t)).Allow(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, Result{Allowed: true, Reason: ReasonFailOpen}, r)
	// A default without a decision: the default's share.
	assert.Equal(t, 4, granted(open.FixedWindow(uniqueName(t)).WithDefault(PerMinute(12)), 6), "degraded, not failed open")
	// An instance that never reached Redis and no MinInstances: it cannot
	// tell its share.
	alone := degradedClient(t, rdb, clk, Degraded{Heartbeat: time.Hour})
	_, err = alone.FixedWindow(uniqueName(t)).WithDefault(PerMinute(12)).Allow(ctx, 1)
	assert.ErrorIs(t, err, ErrUnavailable)
}

// A PerClient limit is shared by the instances that share the Client's id.
func TestDegradedPerClient(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	rdb := redistest.Miniredis(t)
	hook := &outageHook{}
	rdb.AddHook(hook)
	d := Degraded{Heartbeat: time.Hour}
	a := degradedClient(t, rdb, clk, d, WithClientID("svc"))
	b := degradedClient(t, rdb, clk, d, WithClientID("svc"))
	other := degradedClient(t, rdb, clk, d, WithClientID("other"))
	beatAll(t, a, b, other)
	cfg := PerMinute(9)
	cfg.Type = PerClient
	name := uniqueName(t)
	hook.down.Store(true)
	for _, tc := range []struct {
		c    *Client
		want int64
	}{{a, 5}, {other, 9}} {
		l := tc.c.FixedWindow(name).WithDefault(cfg)
		r, err := l.Allow(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, tc.want, r.Limit)
		assert.Equal(t, tc.want, r.Remaining)
	}
	// Overall, the three share it.
	r, err := a.FixedWindow(uniqueName(t)).WithDefault(PerMinute(9)).Allow(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(3), r.Limit)
}

// Degraded mode against the other layers: fail-open grants only what it
// cannot decide; shadow mode grants what it denies; a caller's cancellation
// is no outage; reservations and leased handles are degraded too; Charge,
// Throttle and AsClient handles are not.
func TestDegradedInterplay(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	d := Degraded{Heartbeat: time.Hour, MinInstances: 2}
	cfg := PerMinute(6)

	t.Run("fail-open", func(t *testing.T) {
		rdb, hook := outageRedis(t)
		c := degradedClient(t, rdb, clk, d, WithFailOpen())
		l := c.SlidingWindow(uniqueName(t)).WithDefault(cfg)
		hook.down.Store(true)
		defer hook.down.Store(false)
		var got []string
		for range 4 {
			r, err := l.Allow(ctx, 1)
			require.NoError(t, err)
			got = append(got, fmt.Sprint(r.Allowed, " ", r.Reason))
		}
		assert.Equal(t, []string{"true degraded", "true degraded", "true degraded", "false degraded"}, got, "bounded: the share, 3, then denied")
		r, err := c.FixedWindow(uniqueName(t)).Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Reason: ReasonFailOpen}, r, "no config to share: failed open")
	})
	t.Run("shadow", func(t *testing.T) {
		rdb, hook := outageRedis(t)
		c := degradedClient(t, rdb, clk, d, WithShadow())
		l := c.Funnel(uniqueName(t)).WithDefault(cfg)
		hook.down.Store(true)
		defer hook.down.Store(false)
		for i := range 4 {
			r, err := l.Allow(ctx, 1)
			require.NoError(t, err)
			assert.True(t, r.Allowed)
			assert.True(t, r.Shadow)
			want := ReasonDegraded
			if i == 3 {
				want = ReasonShadow // the share, 3, denied it
			}
			assert.Equal(t, want, r.Reason, "request %d", i)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		rdb, hook := outageRedis(t)
		c := degradedClient(t, rdb, clk, d)
		l := c.TokenBucket(uniqueName(t)).WithDefault(cfg)
		hook.down.Store(true)
		defer hook.down.Store(false)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := l.Allow(cctx, 1)
		assert.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, ErrUnavailable)
		r, err := l.Allow(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, int64(3), r.Remaining, "nothing counted")
	})
	t.Run("reserve and lease", func(t *testing.T) {
		rdb, hook := outageRedis(t)
		c := degradedClient(t, rdb, clk, d)
		name := uniqueName(t)
		l := c.FixedWindow(name).WithDefault(cfg)
		hook.down.Store(true)
		defer hook.down.Store(false)
		res, err := l.Reserve(ctx, 2)
		require.NoError(t, err)
		assert.True(t, res.Allowed)
		assert.Equal(t, ReasonDegraded, res.Reason)
		assert.Zero(t, res.Taken, "nothing Redis counted")
		back, err := res.Release(ctx, 2)
		require.NoError(t, err)
		assert.Zero(t, back)
		leased := l.WithLease(Lease{Time: time.Second})
		defer leased.Close(ctx)
		r, err := leased.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 3, ResetAfter: time.Minute, Window: time.Minute, Reason: ReasonDegraded}, r, "the share's last")
	})
	t.Run("not degraded", func(t *testing.T) {
		rdb, hook := outageRedis(t)
		c := degradedClient(t, rdb, clk, d)
		name := uniqueName(t)
		l := c.Funnel(name).WithDefault(cfg)
		_, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		hook.down.Store(true)
		defer hook.down.Store(false)
		_, err = l.Charge(ctx, 1)
		assert.ErrorIs(t, err, ErrUnavailable)
		_, err = c.Throttle(ctx, name, 5, 6, time.Minute, 1)
		assert.ErrorIs(t, err, ErrUnavailable)
		_, err = l.AsClient("another").Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrUnavailable)
	})
}

// On a Redis Cluster the heartbeat is one key like any other, on Redis
// TIME.
func TestDegradedHeartbeatCluster(t *testing.T) {
	ctx := context.Background()
	cc := redistest.SharedCluster(t).Client(t)
	prefix := redistest.UniqueName(t, "deg")
	d := Degraded{Heartbeat: time.Hour}
	var clients []*Client
	for range 2 {
		c := New(cc, WithPrefix(prefix), WithDegraded(d))
		<-c.degraded.heart.First()
		clients = append(clients, c)
	}
	require.NoError(t, clients[0].degraded.heart.Beat(ctx))
	s := clients[0].DegradedState()
	assert.Equal(t, 2, s.Instances)
	assert.WithinDuration(t, time.Now(), s.Beat, time.Minute)
	key := prefix + "redlimit:instances"
	members, err := cc.ZRangeWithScores(ctx, key, 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, members, 2)
	for _, m := range members {
		assert.InDelta(t, float64(time.Now().UnixMilli()), m.Score, float64(time.Minute.Milliseconds()), "Redis TIME, in ms")
	}
	ttl := cc.PTTL(ctx, key).Val()
	assert.True(t, ttl > 3*time.Hour-time.Minute && ttl <= 3*time.Hour, "PTTL %v", ttl)
}

// Client.Close ends the heartbeat: no beat is sent after it.
func TestDegradedCloseEndsHeartbeat(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	var beats atomic.Int64
	rdb.AddHook(scriptCallHook(func() { beats.Add(1) }))
	c := New(rdb, WithDegraded(Degraded{Heartbeat: 5 * time.Millisecond}))
	require.Eventually(t, func() bool { return beats.Load() >= 2 }, 10*time.Second, time.Millisecond, "the heartbeat beats")
	require.NoError(t, c.Close(context.Background()))
	time.Sleep(100 * time.Millisecond) // a beat under way when Close came ends
	before := beats.Load()
	time.Sleep(200 * time.Millisecond) // 40 heartbeats' time
	assert.Equal(t, before, beats.Load(), "no beat after Close")
	runtime.KeepAlive(c) // the heartbeat also ends once the Client is collected
}

// scriptCallHook calls f on every script call (EVALSHA, EVAL).
type scriptCallHook func()

func (h scriptCallHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h scriptCallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h()
		}
		return next(ctx, cmd)
	}
}
func (h scriptCallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
