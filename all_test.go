package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/evalsha"
	"github.com/redlimit/redlimit/internal/redistest"
)

// allBase is a name prefix for one test's limiters, with a hash tag of its
// own, so that every limiter named from it lives in one Cluster slot.
func allBase(t *testing.T) string {
	return fmt.Sprintf("{all%x}%s:", rand.Uint32(), uniqueName(t))
}

// evalCounter counts the EVALSHAs a client sends; with twice, it sends each
// twice, as go-redis re-sends a script whose reply it did not read.
type evalCounter struct {
	passHook
	twice bool
	n     atomic.Int64
}

func (h *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.n.Add(1)
			if h.twice {
				if err := next(ctx, cmd); err != nil {
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}

// counted returns a client to rdb's server(s) whose EVALSHAs h counts, with
// every script loaded (no NOSCRIPT to count).
func counted(t *testing.T, rdb redis.UniversalClient, h *evalCounter) redis.UniversalClient {
	loadScripts(t, rdb)
	c := cloneClient(t, rdb)
	c.AddHook(h)
	return c
}

// availableAll lists each limiter's AvailablePermits.
func availableAll(t *testing.T, ls ...*Limiter) []int64 {
	t.Helper()
	out := make([]int64, len(ls))
	for i, l := range ls {
		n, err := l.AvailablePermits(context.Background())
		require.NoError(t, err, l.Name())
		out[i] = n
	}
	return out
}

// verdicts lists each Result's Allowed, Remaining and RetryAfter.
func verdicts(all AllResult) []string {
	out := make([]string, len(all.Results))
	for i, r := range all.Results {
		out[i] = fmt.Sprintf("%v %d %v", r.Allowed, r.Remaining, r.RetryAfter)
	}
	return out
}

func wants(permits int64, ls ...*Limiter) []Want {
	out := make([]Want, len(ls))
	for i, l := range ls {
		out[i] = Want{l, permits}
	}
	return out
}

// One limiter of each algorithm, per IP, per user, per API key and global:
// a call one denies counts in none, byte for byte, and reports each one's
// state; a call all grant counts in each. On every backend, a Cluster's in
// one slot.
func TestAllowAllNoneUnlessAll(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		h := &evalCounter{}
		c := newClient(counted(t, rdb, h), clk)
		base := allBase(t)
		tb := c.TokenBucket(base + "ip").WithDefault(Per(10, 10*time.Second))
		fu := c.Funnel(base + "user").WithDefault(Per(10, 10*time.Second))
		fw := c.FixedWindow(base + "key").WithDefault(Per(10, time.Minute))
		sw := c.SlidingWindow(base + "global").WithDefault(Per(10, 10*time.Second))
		ls := []*Limiter{tb, fu, fw, sw}

		all, err := c.AllowAll(ctx, wants(4, ls...)...)
		require.NoError(t, err)
		assert.True(t, all.Allowed)
		assert.Zero(t, all.RetryAfter)
		assert.Equal(t, []string{"true 6 0s", "true 6 0s", "true 6 0s", "true 6 0s"}, verdicts(all))
		assert.Equal(t, int64(1), h.n.Load(), "one script call")
		assert.Equal(t, []int64{6, 6, 6, 6}, availableAll(t, ls...))

		// The fixed window has 1 left: the call is denied, and counts in none.
		_, err = fw.Allow(ctx, 5)
		require.NoError(t, err)
		before := snapshot(t, rdb, base)
		h.n.Store(0)
		all, err = c.AllowAll(ctx, wants(4, ls...)...)
		require.NoError(t, err)
		assert.False(t, all.Allowed)
		assert.Equal(t, time.Minute, all.RetryAfter, "the fixed window's, to its window's end")
		assert.Equal(t, []string{"true 6 0s", "true 6 0s", "false 1 1m0s", "true 6 0s"}, verdicts(all))
		assert.Equal(t, int64(1), h.n.Load(), "one script call")
		assert.Equal(t, before, snapshot(t, rdb, base), "nothing written")
		assert.Equal(t, []int64{6, 6, 1, 6}, availableAll(t, ls...))

		// A second later the funnel has drained 1 (7 left); it gives them
		// all, and two limiters deny: the call waits for the longer.
		clk.Add(time.Second)
		_, err = fu.Allow(ctx, 7)
		require.NoError(t, err)
		before = snapshot(t, rdb, base)
		all, err = c.AllowAll(ctx, wants(4, ls...)...)
		require.NoError(t, err)
		assert.False(t, all.Allowed)
		assert.Equal(t, 59*time.Second, all.RetryAfter)
		assert.Equal(t, []string{"true 6 0s", "false 0 4s", "false 1 59s", "true 6 0s"}, verdicts(all))
		assert.Equal(t, before, snapshot(t, rdb, base), "nothing written")
		assert.Equal(t, []int64{6, 0, 1, 6}, availableAll(t, ls...))

		// A minute on, every limiter is full, and grants all it has.
		clk.Set(epoch.Add(time.Minute))
		all, err = c.AllowAll(ctx, wants(10, ls...)...)
		require.NoError(t, err)
		assert.True(t, all.Allowed)
		assert.Equal(t, []string{"true 0 0s", "true 0 0s", "true 0 0s", "true 0 0s"}, verdicts(all))
		assert.Equal(t, []int64{0, 0, 0, 0}, availableAll(t, ls...))
	})
}

// A denied call writes nothing at all, not even what a denied Allow
// tidies or refreshes: a token bucket's missing cache and marker, a stored
// config's keep-alive.
func TestAllowAllDeniedWritesNothing(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		rdb := connect()
		c := newClient(rdb, clk)
		base := allBase(t)
		tb := c.TokenBucket(base + "tb").WithDefault(Per(10, 10*time.Second))
		_, err := tb.Allow(ctx, 3)
		require.NoError(t, err)
		// Its marker and its cache gone, as state from before markers, or
		// a cache lost, have neither: a denied Allow writes them again.
		require.Equal(t, int64(2), rdb.Del(ctx, tb.keys[0], tb.keys[1]).Val())
		kept := c.Funnel(base + "kept")
		require.NoError(t, kept.SetRate(ctx, Config{Rate: 10, Interval: 10 * time.Second, KeepAlive: time.Minute}))
		_, err = kept.Allow(ctx, 1)
		require.NoError(t, err)
		require.True(t, rdb.PExpire(ctx, kept.Name(), 5*time.Second).Val())
		deny := c.FixedWindow(base + "deny").WithDefault(Per(1, time.Minute))
		_, err = deny.Allow(ctx, 1)
		require.NoError(t, err)

		before := snapshot(t, rdb, base)
		all, err := c.AllowAll(ctx, Want{tb, 1}, Want{kept, 1}, Want{deny, 1})
		require.NoError(t, err)
		assert.False(t, all.Allowed)
		assert.Equal(t, []string{"true 7 0s", "true 9 0s", "false 0 1m0s"}, verdicts(all))
		assert.Equal(t, before, snapshot(t, rdb, base))
		assert.LessOrEqual(t, rdb.PTTL(ctx, kept.Name()).Val(), 5*time.Second, "the keep-alive not refreshed")
	})
}

// Limiters of every kind a Client makes in one call: several rates,
// a stored config another instance set, PerClient ones (a default's, and a
// stored one this Client learns of from the script), a peek.
func TestAllowAllMixedLimiters(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		h := &evalCounter{}
		rdb := connect()
		c := newClient(counted(t, rdb, h), clk, WithClientID("me"))
		other := newClient(rdb, clk, WithClientID("other"))
		base := allBase(t)
		perClientHour := Config{Rate: 2, Interval: time.Hour, Type: PerClient}
		ip := c.SlidingWindow(base + "ip").WithDefault(Per(3, time.Second).And(Per(5, time.Minute)))
		user := c.Funnel(base + "user")
		require.NoError(t, other.Funnel(base+"user").SetRate(ctx, Per(4, 4*time.Second)))
		global := c.TokenBucket(base + "global").WithDefault(perClientHour)
		key := c.FixedWindow(base + "key")
		require.NoError(t, other.FixedWindow(base+"key").SetRate(ctx, Config{Rate: 5, Interval: time.Minute, Type: PerClient}))
		ls := []*Limiter{ip, user, global, key}

		all, err := c.AllowAll(ctx, wants(1, ls...)...)
		require.NoError(t, err)
		assert.True(t, all.Allowed)
		assert.Equal(t, []string{"true 2 0s", "true 3 0s", "true 1 0s", "true 4 0s"}, verdicts(all))
		assert.Equal(t, int64(2), h.n.Load(), "one call, and one more to learn that key is PerClient")
		assert.Equal(t, []Quota{{Limit: 3, Window: time.Second, ResetAfter: time.Second}, {Limit: 5, Window: time.Minute, ResetAfter: time.Minute}}, all.Results[0].Quotas,
			"a sliding window is full again a window after its grant")

		h.n.Store(0)
		all, err = c.AllowAll(ctx, wants(1, ls...)...)
		require.NoError(t, err)
		assert.True(t, all.Allowed)
		assert.Equal(t, []string{"true 1 0s", "true 2 0s", "true 0 0s", "true 3 0s"}, verdicts(all))
		assert.Equal(t, int64(1), h.n.Load())

		// This client's global limit is spent: denied, the others untouched.
		before := snapshot(t, rdb, base)
		all, err = c.AllowAll(ctx, wants(1, ls...)...)
		require.NoError(t, err)
		assert.False(t, all.Allowed)
		assert.Equal(t, time.Hour, all.RetryAfter)
		assert.Equal(t, []string{"true 1 0s", "true 2 0s", "false 0 1h0m0s", "true 3 0s"}, verdicts(all))
		assert.Equal(t, before, snapshot(t, rdb, base), "nothing written")
		assert.Equal(t, []int64{1, 2, 0, 3}, availableAll(t, ls...))
		otherGlobal := other.TokenBucket(base + "global").WithDefault(perClientHour)
		assert.Equal(t, []int64{2, 5}, availableAll(t, otherGlobal, other.FixedWindow(base+"key")), "the other client's own")

		// A second on the ip's first rate is free again (its second has 3
		// left) and the funnel has drained one: a call takes the ip's 3,
		// with a peek at global.
		clk.Add(time.Second)
		all, err = c.AllowAll(ctx, Want{ip, 3}, Want{user, 1}, Want{global, 0}, Want{key, 1})
		require.NoError(t, err)
		assert.True(t, all.Allowed)
		assert.Equal(t, []string{"true 0 0s", "true 2 0s", "true 0 0s", "true 2 0s"}, verdicts(all))
		assert.Zero(t, all.Results[0].Bound, "both ip's rates have none left: the first reports")
		assert.Equal(t, []int64{0, 2, 0, 2}, availableAll(t, ls...))

		// The ip's second rate binds now: its grants leave its window a
		// minute after the first.
		before = snapshot(t, rdb, base)
		all, err = c.AllowAll(ctx, Want{ip, 1}, Want{user, 1}, Want{key, 1})
		require.NoError(t, err)
		assert.False(t, all.Allowed)
		assert.Equal(t, 59*time.Second, all.RetryAfter)
		assert.Equal(t, []string{"false 0 59s", "true 2 0s", "true 2 0s"}, verdicts(all))
		assert.Equal(t, 1, all.Results[0].Bound)
		assert.Equal(t, before, snapshot(t, rdb, base), "nothing written")
	})
}

// Bad input is refused with a sentinel, and nothing is written: negative
// permits, more than a limiter can ever grant, a limiter twice, none, a
// mistaken handle, another Client's.
func TestAllowAllBadInput(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		rdb := connect()
		h := &evalCounter{}
		c := newClient(counted(t, rdb, h), newClock())
		base := allBase(t)
		a := c.FixedWindow(base + "a").WithDefault(Per(5, time.Minute))
		b := c.Funnel(base + "b").WithDefault(Per(3, time.Minute))
		_, err := a.Allow(ctx, 2)
		require.NoError(t, err)
		before := snapshot(t, rdb, base)
		h.n.Store(0)

		_, err = c.AllowAll(ctx, Want{a, 1}, Want{b, -1})
		assert.ErrorIs(t, err, ErrInvalidPermits)
		_, err = c.AllowAll(ctx, Want{a, 1}, Want{b, 1}, Want{c.FixedWindow(base + "a").WithDefault(Per(9, time.Minute)), 1})
		assert.ErrorIs(t, err, ErrInvalidPermits, "one limiter twice, through two handles")
		_, err = c.AllowAll(ctx, Want{a, 1}, Want{})
		assert.ErrorIs(t, err, ErrInvalidName)
		_, err = c.AllowAll(ctx, Want{a, 1}, Want{c.Funnel(base + "bad").WithDefault(Per(0, time.Minute)), 1})
		assert.ErrorIs(t, err, ErrInvalidConfig)
		_, err = c.AllowAll(ctx, Want{a, 1}, Want{New(rdb).Funnel(base + "c"), 1})
		assert.ErrorIs(t, err, ErrMisconfigured, "another Client's limiter")
		assert.Zero(t, h.n.Load(), "refused before anything is sent")

		// More than b can ever grant: ErrPermitsExceedRate, as Allow
		// answers it, with what each limiter said.
		all, err := c.AllowAll(ctx, Want{a, 1}, Want{b, 4})
		assert.ErrorIs(t, err, ErrPermitsExceedRate)
		assert.False(t, all.Allowed)
		assert.Equal(t, Never, all.RetryAfter)
		assert.Equal(t, []string{"true 3 0s", "false 3 -1ns"}, verdicts(all))
		assert.Equal(t, before, snapshot(t, rdb, base), "nothing written")
		assert.Equal(t, []int64{3, 3}, availableAll(t, a, b))

		none, err := c.AllowAll(ctx)
		require.NoError(t, err)
		assert.True(t, none.Allowed, "no wants: nothing to deny")
	})
}

// On a Cluster, limiters in different slots cannot be decided in one call:
// ErrMisconfigured, before anything is sent. Through a wrapper the
// transport cannot see into, the names must share a hash tag, even on one
// server; through a *redis.Client, any names go.
func TestAllowAllAcrossSlots(t *testing.T) {
	ctx := context.Background()
	t.Run("cluster", func(t *testing.T) {
		rdb := redistest.SharedCluster(t).Client(t)
		h := &evalCounter{}
		c := newClient(counted(t, rdb, h), newClock())
		name := uniqueName(t)
		other := "b"
		for evalsha.ClusterSlot(name+other) == evalsha.ClusterSlot(name+"a") {
			other += "b" // two names in one slot: one in 16384
		}
		a := c.FixedWindow(name + "a").WithDefault(Per(5, time.Minute))
		b := c.Funnel(name + other).WithDefault(Per(5, time.Minute))
		_, err := c.AllowAll(ctx, Want{a, 1}, Want{b, 1})
		assert.ErrorIs(t, err, ErrMisconfigured)
		assert.Zero(t, h.n.Load(), "nothing sent")
		assert.Empty(t, limiterKeys(t, rdb, name), "nothing written")

		// Under a prefix, names that carry one tag share a slot.
		p := newClient(counted(t, rdb, h), newClock(), WithPrefix("app:"))
		all, err := p.AllowAll(ctx, Want{p.FixedWindow("{" + name + "}a").WithDefault(Per(5, time.Minute)), 1},
			Want{p.Funnel("{" + name + "}b").WithDefault(Per(5, time.Minute)), 1})
		require.NoError(t, err)
		assert.True(t, all.Allowed)
	})
	t.Run("wrapper", func(t *testing.T) {
		m := miniredis.RunT(t)
		plain := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { plain.Close() })
		wrapped := newClient(prefixed{plain, ""}, newClock())
		cfg := Per(5, time.Minute)
		_, err := wrapped.AllowAll(ctx, Want{wrapped.FixedWindow("a").WithDefault(cfg), 1}, Want{wrapped.Funnel("b").WithDefault(cfg), 1})
		assert.ErrorIs(t, err, ErrMisconfigured)
		assert.Empty(t, m.Keys(), "nothing written")
		all, err := wrapped.AllowAll(ctx, Want{wrapped.FixedWindow("{u1}a").WithDefault(cfg), 1}, Want{wrapped.Funnel("{u1}b").WithDefault(cfg), 1})
		require.NoError(t, err)
		assert.True(t, all.Allowed)

		direct := newClient(plain, newClock())
		all, err = direct.AllowAll(ctx, Want{direct.FixedWindow("a").WithDefault(cfg), 1}, Want{direct.Funnel("b").WithDefault(cfg), 1})
		require.NoError(t, err)
		assert.True(t, all.Allowed, "one server: any names")
	})
}

// Shadow mode lets a limiter's denial pass, the handle's, the stored
// config's or the Client's; what it grants it counts with the rest.
func TestAllowAllShadow(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		rdb := connect()
		c := newClient(rdb, newClock())
		base := allBase(t)
		cfg := Per(2, time.Minute)
		spent := c.FixedWindow(base + "spent").WithDefault(cfg)
		_, err := spent.Allow(ctx, 2)
		require.NoError(t, err)
		fresh := c.Funnel(base + "fresh").WithDefault(cfg)

		all, err := c.AllowAll(ctx, Want{spent.WithShadow(), 1}, Want{fresh, 1})
		require.NoError(t, err)
		assert.True(t, all.Allowed, "the shadowed denial lets the call pass")
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 0, RetryAfter: time.Minute, ResetAfter: time.Minute, Window: time.Minute,
			Reason: ReasonShadow, Shadow: true}, all.Results[0])
		assert.Equal(t, []int64{0, 1}, availableAll(t, spent, fresh))

		// The stored config's shadow mode, which only the script sees.
		stored := c.SlidingWindow(base + "stored")
		require.NoError(t, stored.SetRate(ctx, cfg))
		require.NoError(t, stored.SetShadow(ctx, true))
		all, err = c.AllowAll(ctx, Want{stored, 3}, Want{fresh, 1})
		require.NoError(t, err, "beyond the limit, in shadow mode: granted, as Allow grants it")
		assert.True(t, all.Allowed)
		assert.Equal(t, ReasonShadow, all.Results[0].Reason)
		assert.Equal(t, Never, all.Results[0].RetryAfter)
		all, err = c.AllowAll(ctx, Want{stored, 1}, Want{fresh, 1})
		require.NoError(t, err)
		assert.False(t, all.Allowed, "fresh is spent: it binds")
		assert.Equal(t, []string{"true 2 0s", "false 0 30s"}, verdicts(all))
		assert.Equal(t, []int64{2, 0}, availableAll(t, stored, fresh), "none counted")

		shadowed := newClient(rdb, newClock(), WithShadow())
		all, err = shadowed.AllowAll(ctx, wants(1, shadowed.FixedWindow(base+"spent").WithDefault(cfg), shadowed.Funnel(base+"fresh").WithDefault(cfg))...)
		require.NoError(t, err)
		assert.True(t, all.Allowed)
		assert.Equal(t, []Reason{ReasonShadow, ReasonShadow}, []Reason{all.Results[0].Reason, all.Results[1].Reason})
	})
}

// Redis down: WithFailOpen grants the call, as does shadow mode on every
// limiter; otherwise it is ErrUnavailable.
func TestAllowAllUnavailable(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	m.Close()
	cfg := Per(2, time.Minute)
	var seen []Decision
	open := newClient(rdb, newClock(), WithFailOpen(), WithObserver(func(d Decision) { seen = append(seen, d) }))
	all, err := open.AllowAll(ctx, wants(1, open.FixedWindow("{u}a").WithDefault(cfg), open.Funnel("{u}b").WithDefault(cfg))...)
	require.NoError(t, err)
	assert.True(t, all.Allowed)
	assert.Equal(t, []Result{{Allowed: true, Reason: ReasonFailOpen}, {Allowed: true, Reason: ReasonFailOpen}}, all.Results)
	require.Len(t, seen, 2)
	assert.ErrorIs(t, seen[1].Err, ErrUnavailable, "the observer hears the outage")

	closed := newClient(rdb, newClock())
	a, b := closed.FixedWindow("{u}a").WithDefault(cfg), closed.Funnel("{u}b").WithDefault(cfg)
	all, err = closed.AllowAll(ctx, Want{a.WithShadow(), 1}, Want{b, 1})
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.False(t, all.Allowed)
	all, err = closed.AllowAll(ctx, Want{a.WithShadow(), 1}, Want{b.WithShadow(), 1})
	require.NoError(t, err)
	assert.True(t, all.Allowed, "every limiter in shadow mode")
}

// A script go-redis sends twice (its reply lost) counts once: the token
// bucket's records know their request, the others' request log
// (WithRetryWindow) does; a granted call's second run is granted too.
func TestAllowAllResent(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		rdb := connect()
		c := newClient(counted(t, rdb, &evalCounter{twice: true}), newClock(), WithRetryWindow(time.Minute))
		base := allBase(t)
		var ls []*Limiter
		for _, a := range algorithms {
			ls = append(ls, a.new(c, base+a.name).WithDefault(Per(3, time.Minute)))
		}
		for range 3 {
			all, err := c.AllowAll(ctx, wants(1, ls...)...)
			require.NoError(t, err)
			assert.True(t, all.Allowed)
		}
		assert.Equal(t, []int64{0, 0, 0, 0}, availableAll(t, ls...), "each call counted once")
	})
}

// Calls that race plain Allows on one of their limiters never count in
// the other when that one denies: the other's usage is exactly the calls
// granted.
func TestAllowAllAtomic(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Shared(t).Client(t)
	c := newClient(rdb, newClock())
	base := allBase(t)
	wide := c.FixedWindow(base + "wide").WithDefault(PerHour(100))
	narrow := c.Funnel(base + "narrow").WithDefault(PerHour(8))
	var calls, singles atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 10 {
				if g%2 == 0 {
					all, err := c.AllowAll(ctx, Want{wide, 1}, Want{narrow, 1})
					assert.NoError(t, err)
					if all.Allowed {
						calls.Add(1)
					}
					continue
				}
				r, err := narrow.Allow(ctx, 1)
				assert.NoError(t, err)
				if r.Allowed {
					singles.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d calls and %d single Allows granted", calls.Load(), singles.Load())
	assert.Equal(t, int64(8), calls.Load()+singles.Load(), "narrow granted all it has, once")
	assert.Equal(t, []int64{100 - calls.Load(), 0}, availableAll(t, wide, narrow), "wide counted only the calls granted")
}

// The denials a call meets are cached for Allow (WithLocalCache), and a
// leased handle is decided in Redis.
func TestAllowAllLocalLayers(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Miniredis(t)
	h := &evalCounter{}
	c := newClient(counted(t, rdb, h), newClock(), WithLocalCache())
	cfg := Per(2, time.Minute)
	spent := c.FixedWindow("{u}spent").WithDefault(cfg)
	_, err := spent.Allow(ctx, 2)
	require.NoError(t, err)
	plain := c.Funnel("{u}leased").WithDefault(PerHour(100))
	leased := plain.WithLease(Lease{Time: time.Minute})
	t.Cleanup(func() { _ = leased.Close(ctx) })

	h.n.Store(0)
	all, err := c.AllowAll(ctx, Want{spent, 1}, Want{leased, 1})
	require.NoError(t, err)
	assert.False(t, all.Allowed)
	assert.Equal(t, int64(1), h.n.Load())
	r, err := spent.Allow(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, ReasonCache, r.Reason, "the call's denial, cached")
	assert.Equal(t, int64(1), h.n.Load(), "no round trip")

	// The leased handle takes a block for its own Allow; the call is
	// decided in Redis, and leaves the block as it was.
	r, err = leased.Allow(ctx, 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	stats := leased.LeaseStats()
	require.NotZero(t, stats.Taken)
	inRedis, err := plain.AvailablePermits(ctx)
	require.NoError(t, err)
	all, err = c.AllowAll(ctx, Want{leased, 1})
	require.NoError(t, err)
	assert.Equal(t, ReasonLimit, all.Results[0].Reason)
	assert.Equal(t, inRedis-1, all.Results[0].Remaining, "decided in Redis, not from the block")
	assert.Equal(t, stats, leased.LeaseStats())
}
