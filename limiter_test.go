package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/wire"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// epoch is where every controlled clock starts: a whole hour, so windows of
// a second, a minute or ten minutes all begin there.
var epoch = time.Unix(1_699_999_200, 0)

// clock is the controlled clock limiters built by newClient decide on; their
// waits (Acquire, TryAcquireWithin) advance it instead of sleeping.
type clock = redistest.Clock

func newClock() *clock { return redistest.NewClock(epoch) }

func newClient(rdb redis.Scripter, clk *clock, opts ...Option) *Client {
	if p, ok := rdb.(prefixed); ok {
		opts = append([]Option{WithPrefix(p.prefix)}, opts...)
	}
	c := New(rdb, append([]Option{WithClock(clk.Now)}, opts...)...)
	c.sleep = func(ctx context.Context, d time.Duration) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		clk.Add(d)
		return nil
	}
	return c
}

// prefixed is a backend whose limiters get a prefix (newClient adds it) and
// hash-tagged names (uniqueName adds them).
type prefixed struct {
	redis.UniversalClient
	prefix string
}

// eachBackend runs f on a fresh miniredis, on the test process's real
// redis-server, and on its real Redis Cluster, plainly and with prefixed,
// hash-tagged names (the real ones are skipped without redis-server unless
// REDLIMIT_REQUIRE_REDIS=1).
func eachBackend(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient)) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		f(t, connect())
	})
	t.Run("cluster-tagged", func(t *testing.T) {
		f(t, prefixed{redistest.SharedCluster(t).Client(t), "app:"})
	})
}

// cloneClient returns a new client to rdb's server(s), for tests that add hooks.
func cloneClient(t *testing.T, rdb redis.UniversalClient) redis.UniversalClient {
	var c redis.UniversalClient
	switch r := rdb.(type) {
	case *redis.Client:
		c = redis.NewClient(r.Options())
	case *redis.ClusterClient:
		c = redis.NewClusterClient(r.Options())
	case prefixed:
		return prefixed{cloneClient(t, r.UniversalClient), r.prefix}
	default:
		t.Fatalf("cannot clone %T", rdb)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// eachAlgorithm runs f for every algorithm on every backend.
func eachAlgorithm(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient, a algo)) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, a := range algorithms {
			t.Run(a.name, func(t *testing.T) { f(t, rdb, a) })
		}
	})
}

// uniqueName gives each test its own limiter names on a shared server. On
// the cluster-tagged backend the name carries a hash tag.
func uniqueName(t *testing.T) string {
	name := fmt.Sprintf("%s-%x", t.Name(), rand.Uint32())
	if strings.Contains(t.Name(), "/cluster-tagged/") {
		name = fmt.Sprintf("{t%x}", rand.Uint32()) + name
	}
	return name
}

// limiterKeys lists the keys in Redis that hold the limiter called name's
// config and state.
func limiterKeys(t *testing.T, rdb redis.UniversalClient, name string) []string {
	t.Helper()
	ctx := context.Background()
	pattern := "*" + escapeGlob(name) + "*"
	var keys []string
	if p, ok := rdb.(prefixed); ok {
		rdb = p.UniversalClient
	}
	if cluster, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		require.NoError(t, cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			found, err := node.Keys(ctx, pattern).Result()
			mu.Lock()
			keys = append(keys, found...)
			mu.Unlock()
			return err
		}))
	} else {
		var err error
		keys, err = rdb.Keys(ctx, pattern).Result()
		require.NoError(t, err)
	}
	sort.Strings(keys)
	return keys
}

func escapeGlob(s string) string {
	r := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`, `\`, `\\`)
	return r.Replace(s)
}

// snapshot captures the limiter's keys byte for byte, to prove an operation
// changed nothing.
func snapshot(t *testing.T, rdb redis.UniversalClient, name string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, k := range limiterKeys(t, rdb, name) {
		typ := rdb.Type(ctx, k).Val()
		var v any
		switch typ {
		case "string":
			v = rdb.Get(ctx, k).Val()
		case "hash":
			v = rdb.HGetAll(ctx, k).Val()
		case "zset":
			v = rdb.ZRangeWithScores(ctx, k, 0, -1).Val()
		default:
			v = typ
		}
		out[k] = fmt.Sprintf("%s %v ttl>0:%v", typ, v, rdb.PTTL(ctx, k).Val() > 0)
	}
	return out
}

// limiter is a limiter of this algorithm with a name of its own, on a
// client deciding on a fresh controlled clock.
func (a algo) limiter(t *testing.T, rdb redis.UniversalClient) *Limiter {
	return a.new(newClient(rdb, newClock()), uniqueName(t))
}

// assertAvailable checks that l has want permits available.
func assertAvailable(t *testing.T, l *Limiter, want int64, msgAndArgs ...any) {
	t.Helper()
	n, err := l.AvailablePermits(context.Background())
	require.NoError(t, err)
	assert.Equal(t, want, n, msgAndArgs...)
}

// inUse stores tenPer10s as l's rate, takes n permits, and returns l.
func inUse(t *testing.T, l *Limiter, n int64) *Limiter {
	t.Helper()
	require.NoError(t, l.SetRate(context.Background(), tenPer10s))
	_, err := l.Allow(context.Background(), n)
	require.NoError(t, err)
	return l
}

// assertConfig checks that l's config is want.
func assertConfig(t *testing.T, l *Limiter, want Config, msgAndArgs ...any) {
	t.Helper()
	got, err := l.Config(context.Background())
	require.NoError(t, err)
	assert.Equal(t, want, got, msgAndArgs...)
}

// eachUnprefixedBackend is eachBackend but for cluster-tagged, for tests
// that spell out Redisson's key names.
func eachUnprefixedBackend(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient)) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		if _, ok := rdb.(prefixed); ok {
			t.Skip("spells out Redisson's key names for unprefixed names")
		}
		f(t, rdb)
	})
}

// ownServer starts a redis-server for this test alone, and returns an admin
// client and a client for the limiters.
func ownServer(t *testing.T) (admin, rdb *redis.Client) {
	srv := redistest.Start(t)
	rdb = redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return srv.Client(t), rdb
}

// --- The suite every algorithm passes, on every backend. ---

var tenPer10s = Per(10, 10*time.Second)

func TestConfigPrecedence(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		c := newClient(rdb, newClock())
		l := a.new(c, name)

		_, err := l.Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrNotInitialized)
		_, err = l.Config(ctx)
		assert.ErrorIs(t, err, ErrNotInitialized)
		assert.Empty(t, limiterKeys(t, rdb, name), "a failed call writes nothing")

		withDefault := l.WithDefault(Per(2, time.Minute))
		assertConfig(t, withDefault, Per(2, time.Minute))
		r, err := withDefault.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, int64(2), r.Limit)
		assert.Equal(t, int64(1), r.Remaining)
		// The funnel and the windows keep their state in the config hash;
		// a default is never stored there.
		assert.Empty(t, slices.DeleteFunc(rdb.HMGet(ctx, l.Name(), "rate", "interval").Val(), func(v any) bool { return v == nil }), "a default is never stored")

		ok, err := l.TrySetRate(ctx, tenPer10s)
		require.NoError(t, err)
		assert.True(t, ok)
		ok, err = l.TrySetRate(ctx, Per(99, time.Second))
		require.NoError(t, err)
		assert.False(t, ok, "TrySetRate twice keeps the first")
		for _, h := range []*Limiter{l, withDefault} {
			assertConfig(t, h, tenPer10s, "the stored config wins over the default")
		}
		r, err = withDefault.Allow(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, int64(10), r.Limit)
	})
}

func TestConfigRoundTrip(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		l := a.limiter(t, rdb)
		want := a.tune(Config{Type: PerClient, Rate: 7, Interval: 3 * time.Second, KeepAlive: time.Hour}, 9, 3)
		require.NoError(t, l.SetRate(ctx, want))
		assertConfig(t, l, want)
	})
}

// A field an algorithm does not use is refused, not stored: Burst is the
// funnel's, Buckets the sliding window's. Validate says so at start-up.
func TestConfigFieldsPerAlgorithm(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		l := a.new(newClient(rdb, newClock()), name)
		for _, cfg := range []Config{
			{Rate: 10, Interval: time.Second, Burst: 50},
			{Rate: 10, Interval: time.Second, Buckets: 7},
		} {
			if a.reads(cfg) {
				assert.NoError(t, l.Validate(cfg), "%v", cfg)
				continue
			}
			assert.ErrorIs(t, l.Validate(cfg), ErrInvalidConfig, "%v", cfg)
			assert.ErrorIs(t, l.SetRate(ctx, cfg), ErrInvalidConfig, "%v", cfg)
			_, err := l.TrySetRate(ctx, cfg)
			assert.ErrorIs(t, err, ErrInvalidConfig, "%v", cfg)
			_, err = l.WithDefault(cfg).Allow(ctx, 1)
			assert.ErrorIs(t, err, ErrInvalidConfig, "%v", cfg)
			assert.Empty(t, limiterKeys(t, rdb, name), "nothing stored")
		}
		assert.NoError(t, l.Validate(PerSecond(10)))
		assert.ErrorIs(t, l.Validate(Config{Rate: 0, Interval: time.Second}), ErrInvalidConfig)
	})
}

func TestPeekWritesNothing(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		clk := newClock()
		l := a.new(newClient(rdb, clk), name).WithDefault(tenPer10s)
		r, err := l.Allow(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 10, Window: 10 * time.Second}, r)
		assert.Empty(t, limiterKeys(t, rdb, name))

		_, err = l.Allow(ctx, 4)
		require.NoError(t, err)
		clk.Add(time.Second)
		before := snapshot(t, rdb, name)
		n, err := l.AvailablePermits(ctx)
		require.NoError(t, err)
		assert.Equal(t, map[string]int64{"tokenbucket": 6, "funnel": 7, "fixed_window": 6, "sliding_window": 6}[a.name], n)
		assert.Equal(t, before, snapshot(t, rdb, name), "a peek changes no key, value or expiry")
	})
}

func TestPermitsAboveLimit(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		l := a.new(newClient(rdb, newClock()), name).WithDefault(tenPer10s)
		r, err := l.Allow(ctx, 11)
		require.ErrorIs(t, err, ErrPermitsExceedRate, "Allow answers as TryAcquire does: no caller reads RetryAfter -1 as \"now\"")
		assert.False(t, r.Allowed)
		assert.Equal(t, Never, r.RetryAfter)
		assert.Equal(t, int64(10), r.Remaining)
		_, err = l.TryAcquire(ctx, 11)
		assert.ErrorIs(t, err, ErrPermitsExceedRate)
		assert.ErrorIs(t, l.Acquire(ctx, 11), ErrPermitsExceedRate, "Acquire never blocks forever")
		_, err = l.TryAcquireWithin(ctx, 11, time.Hour)
		assert.ErrorIs(t, err, ErrPermitsExceedRate)
		assert.Empty(t, limiterKeys(t, rdb, name))
	})
}

func TestBadInputLeavesStateUntouched(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		l := inUse(t, a.new(newClient(rdb, newClock()), name), 3)
		before := snapshot(t, rdb, name)

		_, err := l.Allow(ctx, -1)
		assert.ErrorIs(t, err, ErrInvalidPermits)
		_, err = l.TryAcquire(ctx, -5)
		assert.ErrorIs(t, err, ErrInvalidPermits)
		assert.ErrorIs(t, l.Acquire(ctx, -1), ErrInvalidPermits)
		_, err = l.Reserve(ctx, -1)
		assert.ErrorIs(t, err, ErrInvalidPermits)
		_, err = Reservation{limiter: l, Taken: 1}.Release(ctx, -1)
		assert.ErrorIs(t, err, ErrInvalidPermits)
		for _, cfg := range []Config{
			{Rate: 0, Interval: time.Second},
			{Rate: -1, Interval: time.Second},
			{Rate: 1, Interval: 0},
			{Rate: 1, Interval: time.Microsecond},
			{Rate: 1, Interval: 1500 * time.Microsecond},
			{Rate: 10, Interval: time.Second, KeepAlive: time.Millisecond},
			{Rate: 10, Interval: time.Second, Type: 7},
			{Rate: 10, Interval: time.Second, Buckets: 1001},
			{Rate: 10, Interval: time.Second, Burst: -1},
			{Rate: 2_000_000, Interval: time.Second},
		} {
			assert.ErrorIs(t, l.SetRate(ctx, cfg), ErrInvalidConfig, "%+v", cfg)
			_, err := l.TrySetRate(ctx, cfg)
			assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
		}
		_, err = l.WithDefault(Config{}).Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrInvalidConfig)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, err = l.Allow(cancelled, 1)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, before, snapshot(t, rdb, name))

		for _, bad := range []string{"", "a{b", "a{}b", "}{"} {
			_, err := a.new(newClient(rdb, newClock()), bad).WithDefault(tenPer10s).Allow(ctx, 1)
			assert.ErrorIs(t, err, ErrInvalidName, "%q", bad)
		}
	})
}

// A reservation gives back what its grant still counts, once: a second
// Release, or one of a copy, takes back nothing, and a release is capped at
// the grant.
func TestRelease(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		l := a.limiter(t, rdb).WithDefault(tenPer10s)
		res, err := l.Reserve(ctx, 6)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		require.Equal(t, int64(6), res.Taken)
		back, err := res.Release(ctx, 4)
		require.NoError(t, err)
		assert.Equal(t, int64(4), back)
		assertAvailable(t, l, 8)
		back, err = res.Release(ctx, 2)
		require.NoError(t, err)
		assert.Zero(t, back, "a reservation gives back once")
		assertAvailable(t, l, 8)
		other, err := l.Reserve(ctx, 3)
		require.NoError(t, err)
		back, err = other.Release(ctx, 100)
		require.NoError(t, err)
		assert.Equal(t, int64(3), back, "a release is capped at its grant")
		assertAvailable(t, l, 8)
		back, err = other.Release(ctx, 0)
		require.NoError(t, err)
		assert.Zero(t, back)
	})
}

func TestResetKeepsConfig(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		l := inUse(t, a.limiter(t, rdb), 8)
		require.NoError(t, l.Reset(ctx))
		assertAvailable(t, l, 10)
		assertConfig(t, l, tenPer10s)
	})
}

func TestSetRateKeepsUsage(t *testing.T) {
	// After 6 of 10 permits, the rate changes. Window counters and the token
	// bucket keep the 6 permits; the funnel keeps the time they fill (6s of 10s).
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		l := inUse(t, a.limiter(t, rdb), 6)
		for _, c := range []struct {
			cfg  Config
			want map[string]int64
		}{
			{Per(20, 10*time.Second), map[string]int64{"tokenbucket": 14, "funnel": 8, "fixed_window": 14, "sliding_window": 14}},
			{Per(5, 10*time.Second), map[string]int64{"tokenbucket": 0, "funnel": 2, "fixed_window": 0, "sliding_window": 0}},
			{Per(10, 10*time.Second), map[string]int64{"tokenbucket": 4, "funnel": 4, "fixed_window": 4, "sliding_window": 4}},
		} {
			require.NoError(t, l.SetRate(ctx, c.cfg))
			n, err := l.AvailablePermits(ctx)
			require.NoError(t, err)
			assert.Equal(t, c.want[a.name], n, "after SetRate(%v)", c.cfg)
		}
		// SetRate on every request (Redisson #5487) still limits.
		for range 10 {
			require.NoError(t, l.SetRate(ctx, tenPer10s))
			_, _ = l.Allow(ctx, 1)
		}
		assertAvailable(t, l, 0)
	})
}

func TestTypeChangeClearsUsage(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		clk := newClock()
		x, y := a.new(newClient(rdb, clk), name), a.new(newClient(rdb, clk), name)
		perClient := tenPer10s
		perClient.Type = PerClient
		require.NoError(t, x.SetRate(ctx, perClient))
		for _, l := range []*Limiter{x, y} {
			_, err := l.Allow(ctx, 7)
			require.NoError(t, err)
		}
		require.NoError(t, y.SetRate(ctx, tenPer10s))
		for _, l := range []*Limiter{x, y} {
			assertAvailable(t, l, 10)
		}
		assert.Equal(t, []string{x.Name()}, limiterKeys(t, rdb, name), "every client's keys are gone")
	})
}

func TestPerClient(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		clk := newClock()
		cfg := Config{Type: PerClient, Rate: 2, Interval: time.Minute}
		x := a.new(newClient(rdb, clk, WithClientID("x")), name)
		y := a.new(newClient(rdb, clk, WithClientID("y")), name)
		require.NoError(t, x.SetRate(ctx, cfg))
		for _, l := range []*Limiter{x, y} {
			for i, want := range []bool{true, true, false} {
				ok, err := l.TryAcquire(ctx, 1)
				require.NoError(t, err)
				assert.Equal(t, want, ok, "attempt %d", i)
			}
		}
		require.NoError(t, x.Reset(ctx))
		for _, l := range []*Limiter{x, y} {
			assertAvailable(t, l, 2, "Reset clears every client")
		}
		for _, l := range []*Limiter{x, y} {
			_, err := l.Allow(ctx, 1)
			require.NoError(t, err)
		}
		ok, err := y.Expire(ctx, 5*time.Second)
		require.NoError(t, err)
		assert.True(t, ok)
		keys := limiterKeys(t, rdb, name)
		assert.Greater(t, len(keys), 2)
		for _, k := range keys {
			ttl := rdb.PTTL(ctx, k).Val()
			assert.True(t, ttl > 0 && ttl <= 5*time.Second, "%s ttl %v", k, ttl)
		}
		ok, err = y.Delete(ctx)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Empty(t, limiterKeys(t, rdb, name), "Delete removes every client's keys")
		ok, err = x.Delete(ctx)
		require.NoError(t, err)
		assert.False(t, ok)
	})
}

// A decision sends only the keys an Overall limiter uses, until the limiter
// turns out to be PerClient: the call is then sent again with every key, and
// so are the handle's later ones.
func TestDecisionSendsClientKeysOnceNeeded(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		clk := newClock()
		log := &commandLog{}
		x := a.new(newClient(recorded(t, rdb, log), clk, WithClientID("x")), name)
		y := a.new(newClient(rdb, clk, WithClientID("y")), name)
		short, all := 1, 4 // the config hash; then the registry, the request log, x's hash
		if !x.alg.InConfig {
			short, all = 4, 9 // and the Overall state's 3 keys; x's are 3
		}

		require.NoError(t, y.SetRate(ctx, Config{Rate: 3, Interval: time.Minute}))
		loadScripts(t, rdb) // no NOSCRIPT below
		log.keysSent()
		for i, want := range []bool{true, true} {
			ok, err := x.TryAcquire(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, want, ok, "Overall attempt %d", i)
		}
		_, err := x.AvailablePermits(ctx)
		require.NoError(t, err)
		assert.Equal(t, []any{short, short, short}, log.keysSent(), "Overall decisions send the short list")

		require.NoError(t, y.SetRate(ctx, Config{Type: PerClient, Rate: 2, Interval: time.Minute}))
		for i, want := range []bool{true, true, false} {
			ok, err := x.TryAcquire(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, want, ok, "x's attempt %d", i)
		}
		assert.Equal(t, []any{short, all, all, all}, log.keysSent(), "refused once, then every key")
		assertAvailable(t, y, 2, "x's grants counted against x alone")
		clients, err := x.Clients(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"x"}, clients, "x's grants are in the registry")
	})
}

func TestExpireFamily(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		clk := newClock()
		l := a.new(newClient(rdb, clk), name)

		ttl, err := l.RemainTimeToLive(ctx)
		require.NoError(t, err)
		assert.Equal(t, NoKey, ttl, "no key")
		ok, err := l.Expire(ctx, time.Minute)
		require.NoError(t, err)
		assert.False(t, ok)

		require.NoError(t, l.SetRate(ctx, Per(10, time.Hour)))
		ttl, err = l.RemainTimeToLive(ctx)
		require.NoError(t, err)
		assert.Equal(t, NoExpiry, ttl, "the config persists")
		_, err = l.Allow(ctx, 1)
		require.NoError(t, err)

		ok, err = l.Expire(ctx, 30*time.Second)
		require.NoError(t, err)
		assert.True(t, ok)
		ttl, err = l.RemainTimeToLive(ctx)
		require.NoError(t, err)
		assert.True(t, ttl > 29*time.Second && ttl <= 30*time.Second, "ttl %v", ttl)
		_, err = l.Allow(ctx, 1) // later grants keep within the config's expiry
		require.NoError(t, err)
		for _, k := range limiterKeys(t, rdb, name) {
			ttl := rdb.PTTL(ctx, k).Val()
			assert.True(t, ttl > 0 && ttl <= 30*time.Second, "%s ttl %v", k, ttl)
		}

		ok, err = l.ClearExpire(ctx)
		require.NoError(t, err)
		assert.True(t, ok)
		ttl, err = l.RemainTimeToLive(ctx)
		require.NoError(t, err)
		assert.Equal(t, NoExpiry, ttl)
		ok, err = l.ClearExpire(ctx)
		require.NoError(t, err)
		assert.False(t, ok)

		ok, err = l.ExpireAt(ctx, clk.Now().Add(20*time.Second))
		require.NoError(t, err)
		assert.True(t, ok)
		ttl, err = l.RemainTimeToLive(ctx)
		require.NoError(t, err)
		assert.True(t, ttl > 19*time.Second && ttl <= 20*time.Second, "ttl %v", ttl)

		ok, err = l.Expire(ctx, 0)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Empty(t, limiterKeys(t, rdb, name), "a zero ttl deletes")
	})
}

func TestKeepAlive(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		l := a.new(newClient(rdb, newClock()), name)
		require.NoError(t, l.SetRate(ctx, Config{Rate: 10, Interval: time.Second, KeepAlive: time.Minute}))
		ttl := rdb.PTTL(ctx, l.Name()).Val()
		assert.True(t, ttl > 59*time.Second && ttl <= time.Minute, "ttl %v", ttl)
		require.NoError(t, rdb.PExpire(ctx, l.Name(), 30*time.Second).Err())
		_, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		ttl = rdb.PTTL(ctx, l.Name()).Val()
		assert.True(t, ttl > 59*time.Second, "an acquire refreshes the keep-alive: %v", ttl)
	})
}

// A stored config's keep-alive is an idle TTL "refreshed on every acquire"
// (Config.KeepAlive), as Redisson's keepAliveTime is: its tryAcquire
// refreshes it whether it grants or not. A limiter kept saturated by steady
// traffic is busy, not idle: were only grants to refresh it, its config would
// expire one keep-alive after the last grant, and every call then fail with
// ErrNotInitialized.
//
// The limiters decide on a clock that stands still (newClient), so after its
// one grant each denies every request, whatever the algorithm; the keep-alive
// is a Redis TTL and runs in real time.
func TestKeepAliveWhileDenied(t *testing.T) {
	rdb := redistest.Shared(t).Client(t)
	ctx := context.Background()
	for _, a := range algorithms {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			l := a.limiter(t, rdb)
			require.NoError(t, l.SetRate(ctx, Config{Rate: 1, Interval: time.Minute, KeepAlive: time.Minute}))
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok)
			// Unrefreshed since the grant, the TTL would be 57s at most
			// after this; refreshed, it stays above 58s unless this machine
			// stalls 2s between the denial and the TTL's reply. (It slept
			// 1s, with 0.5s to spare, which a busy machine can outlast.)
			time.Sleep(3 * time.Second)
			ok, err = l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.False(t, ok)
			ttl, err := l.RemainTimeToLive(ctx)
			require.NoError(t, err)
			assert.Greater(t, ttl, time.Minute-2*time.Second, "a denied acquire refreshes the keep-alive, as a grant does")
		})
		// Asked every 20ms and nearly always denied, the limiter is never
		// idle: its config, kept alive 2s, must outlive 3s of asking. (2s, not
		// less: a -race run on a loaded machine can stall a goroutine ~1s.)
		t.Run(a.name+"/saturated", func(t *testing.T) {
			t.Parallel()
			l := a.limiter(t, rdb)
			require.NoError(t, l.SetRate(ctx, Config{Rate: 1, Interval: 100 * time.Millisecond, KeepAlive: 2 * time.Second}))
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				_, err := l.TryAcquire(ctx, 1)
				require.NoError(t, err, "asked every 20ms, the limiter is not idle")
			}
		})
	}
}

func TestDelete(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		l := inUse(t, a.new(newClient(rdb, newClock()), name), 2)
		ok, err := l.Delete(ctx)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Empty(t, limiterKeys(t, rdb, name))
		ok, err = l.Delete(ctx)
		require.NoError(t, err)
		assert.False(t, ok)
		_, err = l.Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrNotInitialized)
	})
}

// Every key a limiter writes expires, and is gone once the limiter is full again.
func TestEveryKeyExpires(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		clk := newClock()
		cfg := Config{Type: PerClient, Rate: 5, Interval: 10 * time.Second}
		l := a.new(newClient(rdb, clk, WithClientID("c1")), name).WithDefault(cfg)
		var last Reservation
		for range 3 {
			var err error
			last, err = l.Reserve(ctx, 2)
			require.NoError(t, err)
			clk.Add(time.Second)
		}
		_, err := last.Release(ctx, 1)
		require.NoError(t, err)
		for _, k := range limiterKeys(t, rdb, name) {
			ttl := rdb.PTTL(ctx, k).Val()
			assert.True(t, ttl > 0 && ttl <= 10*time.Second, "%s ttl %v", k, ttl)
		}
	})
}

func TestCorruptState(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		hset := func(name string, fields ...any) {
			if a.namesItself {
				fields = append(fields, "algorithm", a.name)
			}
			rdb.HSet(ctx, name, fields...)
		}
		for _, c := range []struct {
			what    string
			corrupt func(name string, l *Limiter)
			want    error
		}{
			{"config of the wrong type", func(name string, _ *Limiter) { rdb.Set(ctx, name, "x", 0) }, ErrCorruptState},
			{"non-numeric rate", func(name string, _ *Limiter) { hset(name, "rate", "ten", "interval", "1000") }, ErrCorruptState},
			{"fractional interval", func(name string, _ *Limiter) { hset(name, "rate", "10", "interval", "1.5") }, ErrCorruptState},
			{"missing interval", func(name string, _ *Limiter) { hset(name, "rate", "10") }, ErrCorruptState},
			{"unknown type", func(name string, _ *Limiter) { hset(name, "rate", "10", "interval", "1000", "type", "3") }, ErrCorruptState},
			{"state of the wrong type", func(_ string, l *Limiter) {
				for _, k := range l.keys[len(l.keys)-len(l.alg.State):] { // this client's
					rdb.SAdd(ctx, k, "x")
				}
			}, ErrCorruptState},
			{"garbage state", func(_ string, l *Limiter) { a.setState(rdb, l, "garbage") }, ErrCorruptState},
		} {
			name := uniqueName(t)
			cfg := tenPer10s
			if c.what == "state of the wrong type" {
				cfg.Type = PerClient // the state read is this client's own key
			}
			l := a.new(newClient(rdb, newClock()), name).WithDefault(cfg)
			c.corrupt(l.Name(), l)
			before := snapshot(t, rdb, name)
			_, err := l.Allow(ctx, 1)
			assert.ErrorIs(t, err, c.want, c.what)
			if err != nil {
				assert.Contains(t, err.Error(), name, "%s: the error names the key", c.what)
				assert.NotContains(t, err.Error(), "user_script", "%s: no Lua trace", c.what)
			}
			_, err = l.Allow(ctx, 0)
			assert.ErrorIs(t, err, c.want, c.what)
			assert.Equal(t, before, snapshot(t, rdb, name), c.what)
		}
	})
}

func TestAlgorithmMismatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		name := uniqueName(t)
		c := newClient(rdb, newClock())
		require.NoError(t, c.Funnel(name).SetRate(ctx, tenPer10s))
		_, err := c.TokenBucket(name).Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrAlgorithmMismatch)
		_, err = c.SlidingWindow(name).Config(ctx)
		assert.ErrorIs(t, err, ErrAlgorithmMismatch)
	})
}

func TestTimeFromRedis(t *testing.T) {
	// Without WithClock the scripts read Redis TIME.
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		l := a.new(New(rdb), uniqueName(t)).WithDefault(Per(3, time.Hour))
		for i, want := range []bool{true, true, true, false} {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, want, ok, "attempt %d", i)
		}
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.True(t, r.RetryAfter > 0 && r.RetryAfter <= time.Hour, "retry %v", r.RetryAfter)
	})
}

func TestAcquireWaits(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		clk := newClock()
		l := a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(tenPer10s)
		_, err := l.Allow(ctx, 10)
		require.NoError(t, err)
		require.NoError(t, l.Acquire(ctx, 1))
		waited := clk.Now().Sub(epoch)
		want := map[string]time.Duration{"tokenbucket": 10 * time.Second, "funnel": time.Second, "fixed_window": 10 * time.Second, "sliding_window": 10 * time.Second}[a.name]
		assert.True(t, waited >= want && waited <= want+want/10+time.Millisecond, "waited %v, want %v plus jitter", waited, want)

		deadline, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err = l.Allow(ctx, 9)
		require.NoError(t, err)
		err = l.Acquire(deadline, 10)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "refused at once: the wait passes the deadline")
	})
}

func TestTryAcquireWithin(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		clk := newClock()
		l := a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(Per(1, 10*time.Second))
		ok, err := l.TryAcquireWithin(ctx, 1, 0)
		require.NoError(t, err)
		assert.True(t, ok)
		ok, err = l.TryAcquireWithin(ctx, 1, 0)
		require.NoError(t, err)
		assert.False(t, ok, "zero timeout: one attempt")
		ok, err = l.TryAcquireWithin(ctx, 1, 9*time.Second)
		require.NoError(t, err)
		assert.False(t, ok, "the wait is longer than the timeout")
		assert.Equal(t, epoch, clk.Now(), "and it gave up without waiting")
		ok, err = l.TryAcquireWithin(ctx, 1, 10*time.Second)
		require.NoError(t, err)
		assert.True(t, ok, "waits exactly RetryAfter and makes a last attempt")
		assert.Equal(t, 10*time.Second, clk.Now().Sub(epoch))
	})
}

func TestReplyShapes(t *testing.T) {
	for _, reply := range []any{nil, "x", "", "h", "h ", "d", int64(1), []any{}, []any{int64(1)}, "h 1 2 3 4 5", "h 1 2 3 4 5 6", "h 1 2 3 4 5 6 0 7", "h 1  2 3 4 5 6 0", "h 1 2 3 4 5 6 0 ",
		"h 1.5 2 3 4 5 6 0", "h 1 2 3 4 5 x 0", "h 1 2 3 4 5 6 x", "h 1 2 3 4 5 6 -1", "1 2 3 4 5 6 0", "x 1 2 3 4 5 6 0", "h  1 2 3 4 5 6 0", "d 1 2 3 4 5 6",
		[]any{int64(0), int64(10), int64(3), int64(-1), int64(1500), int64(60000)}} {
		_, err := parseResult(reply, Config{})
		assert.ErrorIs(t, err, ErrUnexpectedReply, "%#v", reply)
	}
	r, err := parseResult("h 0 10 3 -1 1500 60000 0", Config{})
	require.NoError(t, err)
	assert.Equal(t, Result{Limit: 10, Remaining: 3, RetryAfter: -1, ResetAfter: 1500 * time.Microsecond, Window: time.Minute}, r)
	// The short reply of a handle's default: the limit and window are the default's.
	_, err = parseResult("d 1 7 0 2000", Config{})
	assert.ErrorIs(t, err, ErrUnexpectedReply, "a short reply needs the handle's default")
	r, err = parseResult("d 1 7 0 2000", Config{Rate: 10, Interval: time.Second, Burst: 25})
	require.NoError(t, err)
	assert.Equal(t, Result{Allowed: true, Limit: 25, Remaining: 7, ResetAfter: 2 * time.Millisecond, Window: 2500 * time.Millisecond}, r)
	// With several rates, the bound follows, then each rate's reset; the
	// limits and windows are the default's.
	two := Per(10, time.Second).And(PerMinute(100))
	r, err = parseResult("d 0 4 3000 2000 1 500 2000", two)
	require.NoError(t, err)
	assert.Equal(t, Result{Limit: 100, Remaining: 4, RetryAfter: 3 * time.Millisecond, ResetAfter: 2 * time.Millisecond,
		Window: time.Minute, Bound: 1, Quotas: []Quota{{Limit: 10, Window: time.Second, ResetAfter: 500 * time.Microsecond},
			{Limit: 100, Window: time.Minute, ResetAfter: 2 * time.Millisecond}}}, r)
	// A full reply: the bound, the resets, then the further rates.
	r, err = parseResult("h 0 10 4 3000 2000 1000 0 1 500 2000 100 60000 0 0", Config{})
	require.NoError(t, err)
	assert.Equal(t, Result{Limit: 100, Remaining: 4, RetryAfter: 3 * time.Millisecond, ResetAfter: 2 * time.Millisecond,
		Window: time.Minute, Bound: 1, Quotas: []Quota{{Limit: 10, Window: time.Second, ResetAfter: 500 * time.Microsecond},
			{Limit: 100, Window: time.Minute, ResetAfter: 2 * time.Millisecond}}}, r)
	for _, reply := range []string{"d 0 4 3000 2000 2 500 2000", "d 0 4 3000 2000 -1 500 2000", "d 1 7 0 2000", "h 0 4 3000 2000 1 0",
		"d 0 4 3000 2000 1", "d 0 4 3000 2000 1 500", "d 0 4 3000 2000 1 500 -1", "d 0 4 3000 2000 1 500 2000 7",
		"h 0 10 4 3000 2000 1000 0 1 100 60000 0 0", "h 0 10 4 3000 2000 1000 0 1 500 -1 100 60000 0 0"} {
		_, err = parseResult(reply, two)
		assert.ErrorIs(t, err, ErrUnexpectedReply, "%s: a bound the default has, and one with several rates", reply)
	}
	for _, reply := range []any{[]any{"missing"}, []any{"missing", "x"}, []any{"missing", []any{int64(1)}}} {
		_, ok := wire.MissingClients(reply)
		assert.False(t, ok, "%#v", reply)
	}
}

// Result.Window is the span Limit applies to, as the config in force says:
// it follows SetRate, and a funnel's is the time its burst takes to drain.
func TestResultWindow(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		l := a.limiter(t, rdb).WithDefault(PerMinute(6))
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, time.Minute, r.Window)
		require.NoError(t, l.SetRate(ctx, Per(10, 10*time.Second)))
		r, err = l.Allow(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, 10*time.Second, r.Window, "SetRate's interval")
		if burst := (Config{Rate: 10, Interval: 10 * time.Second, Burst: 25}); a.reads(burst) {
			require.NoError(t, l.SetRate(ctx, burst))
			r, err = l.Allow(ctx, 1)
			require.NoError(t, err)
			// The 10s of usage the first grant left (one in 6/min) carry over: SetRate keeps usage.
			assert.Equal(t, Result{Allowed: true, Limit: 25, Remaining: 14, ResetAfter: 11 * time.Second, Window: 25 * time.Second}, r)
		}
	})
}

// deadlineIn is a context whose deadline is always d away, so that the time
// a test takes does not shrink what Acquire sees as left.
type deadlineIn struct {
	context.Context
	d time.Duration
}

func (c deadlineIn) Deadline() (time.Time, bool) { return time.Now().Add(c.d), true }

// Acquire never sleeps past its context's deadline: the jitter that spreads
// retries takes only half of the slack the deadline leaves beyond RetryAfter,
// so the last attempt comes before the deadline. (It used to add up to 10ms
// whatever the deadline, and fail with the permit free.)
func TestAcquireNeverSleepsPastTheDeadline(t *testing.T) {
	rdb := redistest.Miniredis(t)
	clk := newClock()
	c := newClient(rdb, clk)
	var slept []time.Duration
	c.sleep = func(_ context.Context, d time.Duration) error {
		slept = append(slept, d)
		clk.Add(d)
		return nil
	}
	l := c.Funnel(uniqueName(t)).WithDefault(PerSecond(2)) // a permit every 500ms
	// 16ms of slack beyond the wait: Deadline and Acquire's time.Until read
	// the clock apart, and a busy machine (the README's run, packages in
	// parallel) has put over 2ms between them; half of it, 8ms, is still
	// below the jitter's 10ms, so the cap is what the test sees.
	ctx := deadlineIn{context.Background(), 516 * time.Millisecond}
	for i := range 100 {
		clk.Set(epoch.Add(time.Duration(i) * time.Hour))
		ok, err := l.TryAcquire(ctx, 2)
		require.NoError(t, err)
		require.True(t, ok)
		slept = slept[:0]
		require.NoError(t, l.Acquire(ctx, 1), "attempt %d", i)
		require.Len(t, slept, 1, "one wait, then the permit")
		assert.GreaterOrEqual(t, slept[0], 500*time.Millisecond)
		assert.LessOrEqual(t, slept[0], 508*time.Millisecond, "attempt %d: half the 16ms of slack at most", i)
	}
}

// Each error says one thing once: the sentinel's words, then the detail,
// with no repeated prefix or kind word.
func TestErrorMessages(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := newClient(rdb, newClock())
		name := uniqueName(t)
		l := c.Funnel(name)
		_, err := l.Allow(ctx, 1)
		assert.EqualError(t, err, "redlimit: rate not set: "+l.Name()+" holds no config and the handle has no default (WithDefault)")
		require.NoError(t, l.SetRate(ctx, PerSecond(1)))
		err = c.TokenBucket(name).SetRate(ctx, PerSecond(1))
		assert.EqualError(t, err, "redlimit: limiter holds another algorithm: "+l.Name()+" holds a funnel config, not tokenbucket; Delete it to use the name with another algorithm")
		rdb.HSet(ctx, l.Name(), "tat", "x")
		_, err = l.Allow(ctx, 1)
		assert.EqualError(t, err, `redlimit: corrupt state: `+l.Name()+`: field tat = "x"`)
		_, err = c.Throttle(ctx, name, -1, 1, time.Second, 1)
		assert.Equal(t, 1, strings.Count(err.Error(), "redlimit"), "%v", err)
	})
}

// An operator can list a PerClient limiter's clients and see each one's
// usage, writing nothing.
func TestClientsAndAsClient(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		clk := newClock()
		x := a.new(newClient(rdb, clk, WithClientID("x")), name)
		y := a.new(newClient(rdb, clk, WithClientID("y")), name)
		require.NoError(t, x.SetRate(ctx, Config{Type: PerClient, Rate: 5, Interval: time.Minute}))
		_, err := x.Allow(ctx, 2)
		require.NoError(t, err)
		_, err = y.Allow(ctx, 4)
		require.NoError(t, err)

		operator := a.new(newClient(rdb, clk, WithClientID("operator")), name)
		before := snapshot(t, rdb, name)
		ids, err := operator.Clients(ctx)
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"x", "y"}, ids)
		for id, want := range map[string]int64{"x": 3, "y": 1, "nobody": 5} {
			n, err := operator.AsClient(id).AvailablePermits(ctx)
			require.NoError(t, err)
			assert.Equal(t, want, n, id)
		}
		assert.Equal(t, before, snapshot(t, rdb, name), "inspection writes nothing")
	})
}
