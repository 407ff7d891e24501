package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// Every key starts with the Client's prefix: a Redis user whose ACL allows
// only ~prefix* can run every op of every algorithm, PerClient and with the
// request log, and SCAN MATCH prefix* finds every key the limiter wrote.
func TestEveryKeyStartsWithThePrefix(t *testing.T) {
	srv := redistest.Shared(t)
	ctx := context.Background()
	admin := srv.Client(t)
	prefix := fmt.Sprintf("svc%x:", rand.Uint32())
	user := "redlimit-" + prefix[:len(prefix)-1]
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~"+prefix+"*", "+@all").Err())
	t.Cleanup(func() { admin.Do(ctx, "ACL", "DELUSER", user) })
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: "pw"})
	t.Cleanup(func() { rdb.Close() })

	for _, a := range algorithms {
		t.Run(a.name, func(t *testing.T) {
			name := fmt.Sprintf("partner-%s-%x", a.name, rand.Uint32())
			clk := newClock()
			cfg := Config{Type: PerClient, Rate: 5, Interval: time.Minute}
			var limiters []*Limiter
			for _, id := range []string{"a", "b"} {
				limiters = append(limiters, a.new(newClient(rdb, clk, WithPrefix(prefix), WithClientID(id), WithRetryWindow(time.Minute)), name))
			}
			l := limiters[0]
			assert.Equal(t, prefix+"{"+name+"}", l.Name())
			require.NoError(t, l.SetRate(ctx, cfg))
			for _, l := range limiters {
				_, err := l.Allow(ctx, 2)
				require.NoError(t, err)
				require.NoError(t, reserveAndRelease(ctx, l))
			}
			overall := l.WithDefault(Per(5, time.Minute))
			_, err := overall.Allow(ctx, 0)
			require.NoError(t, err)
			_, err = l.Config(ctx)
			require.NoError(t, err)
			_, err = l.RemainTimeToLive(ctx)
			require.NoError(t, err)
			_, err = l.Expire(ctx, time.Hour)
			require.NoError(t, err)

			var all []string
			iter := admin.Scan(ctx, 0, "*"+escapeGlob(name)+"*", 100).Iterator()
			for iter.Next(ctx) {
				all = append(all, iter.Val())
			}
			require.NoError(t, iter.Err())
			var prefixed []string
			iter = admin.Scan(ctx, 0, escapeGlob(prefix)+"*"+escapeGlob(name)+"*", 100).Iterator()
			for iter.Next(ctx) {
				prefixed = append(prefixed, iter.Val())
			}
			require.NoError(t, iter.Err())
			slices.Sort(all)
			slices.Sort(prefixed)
			// The config, the registry, the request log and two clients' state.
			assert.GreaterOrEqual(t, len(all), 5, "%v", all)
			assert.Equal(t, all, prefixed, "SCAN MATCH prefix* finds every key")

			ok, err := l.Delete(ctx)
			require.NoError(t, err)
			assert.True(t, ok)
			n, err := admin.Exists(ctx, all...).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "Delete removes every key, the request log too")
		})
	}
}

// A limiter with no stored config keeps one rate's Overall state as a plain
// string (common.lua's flat state), written with its expiry; every op reads
// it, a handle with several rates turns it into fields of the hash, and
// SetRate into fields of the config hash, keeping its usage.
func TestFlatState(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		if !a.namesItself {
			t.Skip("the token bucket keeps Redisson's layout")
		}
		ctx := context.Background()
		clk := newClock()
		c := newClient(rdb, clk)
		name := uniqueName(t)
		l := a.new(c, name).WithDefault(tenPer10s)
		_, err := l.Allow(ctx, 3)
		require.NoError(t, err)
		// The epoch starts a window and a sub-window; a funnel of 10 per
		// 10s takes 1s per permit to drain.
		ms := clk.Now().UnixMilli()
		want := map[string]struct {
			value string
			ttl   time.Duration
		}{
			"funnel":         {fmt.Sprint(clk.Now().UnixMicro() + 3_000_000), 3 * time.Second},
			"fixed_window":   {fmt.Sprintf("%d 3", ms), 10 * time.Second},
			"sliding_window": {fmt.Sprintf("%d:3", ms), 10 * time.Second},
		}[a.name]
		assert.Equal(t, "string", rdb.Type(ctx, l.Name()).Val())
		assert.Equal(t, want.value, rdb.Get(ctx, l.Name()).Val())
		assertTTL := func(want time.Duration) {
			t.Helper()
			ttl := rdb.PTTL(ctx, l.Name()).Val()
			assert.True(t, ttl <= want && ttl > want-time.Second, "ttl %v, want %v", ttl, want)
		}
		assertTTL(want.ttl)
		_, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		if a.name == "funnel" {
			want.ttl += time.Second // the windows' expiry stays where their (sub-)window ends
		}
		assertTTL(want.ttl)
		assertAvailable(t, l, 6)
		cfg, err := l.Config(ctx)
		require.NoError(t, err)
		assert.Equal(t, tenPer10s, cfg, "no config stored: the default")
		left, err := l.RemainTimeToLive(ctx)
		require.NoError(t, err)
		assert.True(t, left > want.ttl-time.Second && left <= want.ttl, "RemainTimeToLive %v", left)

		// Another handle with two rates keeps it flat, the minute's part
		// after a ';' (a funnel of 100 per minute: 600ms a permit), and both
		// handles count in it; the one-rate handle keeps the part it does not
		// know.
		two := a.new(c, name).WithDefault(tenPer10s.And(PerMinute(100)))
		_, err = two.Allow(ctx, 1)
		require.NoError(t, err)
		minute := map[string]string{
			"funnel":         fmt.Sprint(clk.Now().UnixMicro() + 600_000),
			"fixed_window":   fmt.Sprintf("%d 1", ms),
			"sliding_window": fmt.Sprintf("%d:1", ms),
		}[a.name]
		assert.Equal(t, "string", rdb.Type(ctx, l.Name()).Val())
		assert.Equal(t, []string{map[string]string{
			"funnel":         fmt.Sprint(clk.Now().UnixMicro() + 5_000_000),
			"fixed_window":   fmt.Sprintf("%d 5", ms),
			"sliding_window": fmt.Sprintf("%d:5", ms),
		}[a.name], minute}, strings.Split(rdb.Get(ctx, l.Name()).Val(), ";"))
		// It expires when the last rate is full again: the windows' when
		// the minute ends, the funnel's when its 10s rate has drained 5
		// permits.
		lastFull := time.Minute
		if a.name == "funnel" {
			lastFull = 5 * time.Second
		}
		assertTTL(lastFull)
		assertAvailable(t, l, 5)
		_, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assertAvailable(t, two, 4)
		assert.Equal(t, minute, strings.Split(rdb.Get(ctx, l.Name()).Val(), ";")[1])
		// SetRate turns each part into its rate's fields.
		require.NoError(t, a.new(c, name).SetRate(ctx, tenPer10s.And(PerMinute(100))))
		field := map[string][2]string{"funnel": {"tat2", minute}, "fixed_window": {"count2", "1"}, "sliding_window": {"counts2", minute}}[a.name]
		assert.Equal(t, field[1], rdb.HGet(ctx, l.Name(), field[0]).Val())
		assertAvailable(t, two, 4)

		// Released to nothing, a flat state goes.
		m := a.new(c, uniqueName(t)).WithDefault(tenPer10s)
		res, err := m.Reserve(ctx, 2)
		require.NoError(t, err)
		_, err = res.Release(ctx, 2)
		require.NoError(t, err)
		assert.Zero(t, rdb.Exists(ctx, m.Name()).Val(), "released to full: no key")

		// Expire, Reset and Delete act on it; a corrupt one is refused, untouched.
		_, err = m.Allow(ctx, 2)
		require.NoError(t, err)
		ok, err := m.Expire(ctx, 500*time.Millisecond)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.LessOrEqual(t, rdb.PTTL(ctx, m.Name()).Val(), 500*time.Millisecond)
		require.NoError(t, m.Reset(ctx))
		assert.Zero(t, rdb.Exists(ctx, m.Name()).Val(), "Reset")
		_, err = m.Allow(ctx, 2)
		require.NoError(t, err)
		ok, err = m.Delete(ctx)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Zero(t, rdb.Exists(ctx, m.Name()).Val(), "Delete")
		rdb.Set(ctx, m.Name(), "x", time.Minute)
		_, err = m.Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrCorruptState)
		assert.Equal(t, "x", rdb.Get(ctx, m.Name()).Val())

		// SetRate turns it into fields of the config hash and keeps its usage.
		s := a.new(c, uniqueName(t)).WithDefault(tenPer10s)
		_, err = s.Allow(ctx, 3)
		require.NoError(t, err)
		require.NoError(t, s.SetRate(ctx, tenPer10s))
		assert.Equal(t, "hash", rdb.Type(ctx, s.Name()).Val())
		assert.Equal(t, time.Duration(-1), rdb.PTTL(ctx, s.Name()).Val(), "a stored config does not expire")
		assertAvailable(t, s, 7)
	})
}

// A handle with a default sends it as 'default' while its decisions find no
// hash, and as 'defer' once one found a stored config, so that the script
// reads first what is most likely there; a stale guess costs a command,
// never a wrong answer.
func TestDefaultSourceFollowsTheLayout(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		log := &commandLog{}
		clk := newClock()
		name := uniqueName(t)
		x := a.new(newClient(recorded(t, rdb, log), clk), name).WithDefault(tenPer10s)
		admin := a.new(newClient(rdb, clk), name)
		limit := func() int64 {
			t.Helper()
			r, err := x.Allow(ctx, 1)
			require.NoError(t, err)
			return r.Limit
		}
		assert.Equal(t, int64(10), limit())
		log.sourcesSent() // and the first call's, sent again after SCRIPT LOAD
		require.NoError(t, admin.SetRate(ctx, Per(20, 10*time.Second)))
		assert.Equal(t, int64(20), limit(), "sent as default: the stored config still rules")
		assert.Equal(t, int64(20), limit())
		_, err := admin.Delete(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(10), limit(), "sent as defer: the default rules again")
		assert.Equal(t, int64(10), limit())
		assert.Equal(t, []string{"default", "stored", "stored", "default"}, log.sourcesSent())

		// Several rates: the token bucket's state is never in the hash; the
		// others' is flat.
		two := a.new(newClient(recorded(t, rdb, log), clk), uniqueName(t)).WithDefault(tenPer10s.And(PerHour(100)))
		for range 3 {
			r, err := two.Allow(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, []Quota{{Limit: 10, Window: 10 * time.Second}, {Limit: 100, Window: time.Hour}}, limitsAndWindows(r.Quotas))
		}
		assert.Equal(t, []string{"default", "default", "default"}, log.sourcesSent())
	})
}

func TestIdleKeysExpire(t *testing.T) {
	// Every key a limiter writes expires on its own: after the limiters go
	// idle and their windows pass, a server that held nothing but them holds
	// nothing at all. Real time, an interval of 300ms, for every algorithm,
	// Overall and PerClient, with the config as a default (no config key)
	// and stored with a keep-alive of 1s (the config key expires too),
	// through two clients whose request logs keep ids 300ms
	// (WithRetryWindow). While they run, no key is ever due to live more than
	// 300ms on (a config, 1s).
	//
	// Calls on the stored configs' names fall back to the same config as a
	// default: this machine's hiccups can outlast the keep-alive, and a
	// config left idle that long rightly expires.
	const interval, keepAlive = 300 * time.Millisecond, time.Second
	b := newFaultBed(t, &redis.Options{})
	ctx := context.Background()
	clients := []*Client{
		New(b.rdb, WithRetryWindow(interval), WithClientID("first")),
		New(b.rdb, WithRetryWindow(interval), WithClientID("second")),
	}
	var limiters []*Limiter
	for _, a := range algorithms {
		for _, typ := range []RateType{Overall, PerClient} {
			cfg := Config{Type: typ, Rate: 20, Interval: interval}
			name := fmt.Sprintf("%s-%s-%v", uniqueName(t), a.name, typ)
			kept := cfg
			kept.KeepAlive = keepAlive
			require.NoError(t, a.new(clients[0], name+"-stored").SetRate(ctx, kept))
			for _, c := range clients {
				limiters = append(limiters, a.new(c, name+"-default").WithDefault(cfg), a.new(c, name+"-stored").WithDefault(cfg))
			}
		}
	}

	// seen is the most keys of each kind seen at once.
	seen := map[string]int{}
	inspect := func() {
		keys, err := b.admin.Keys(ctx, "*").Result()
		require.NoError(t, err)
		ttls := make([]*redis.DurationCmd, len(keys))
		_, err = b.admin.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				ttls[i] = p.PTTL(ctx, k)
			}
			return nil
		})
		require.NoError(t, err)
		kinds := map[string]int{}
		for i, k := range keys {
			kinds[keyKind(k)]++
			// -2: it expired since KEYS; 0: it expires within the millisecond.
			ttl, within := ttls[i].Val(), interval
			if keyKind(k) == "configs" {
				within = keepAlive
			}
			assert.True(t, ttl == -2 || (ttl >= 0 && ttl <= within), "%s expires within %v: %v", k, within, ttl)
		}
		for kind, n := range kinds {
			seen[kind] = max(seen[kind], n)
		}
	}
	inspect()

	var grants atomic.Int64
	var wg sync.WaitGroup
	until := time.Now().Add(3 * interval)
	for _, l := range limiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(until) {
				ok, err := l.TryAcquire(ctx, 1)
				if !assert.NoError(t, err) {
					return
				}
				if ok {
					grants.Add(1)
				}
			}
		}()
	}
	for time.Now().Before(until) {
		time.Sleep(interval / 3)
		inspect()
	}
	wg.Wait()
	idle := time.Now()
	inspect()
	t.Logf("%d grants; keys of each kind, at most: %v", grants.Load(), seen)
	for _, kind := range []string{"request logs", "client registries", "per-client state", "configs", "shared state"} {
		assert.Positive(t, seen[kind], "the limiters wrote %s", kind)
	}

	// A key is gone once it expired (SCAN and KEYS skip it) and once Redis
	// reclaimed it (DBSIZE): lazily, or by its expiry cycle, ten times a second.
	require.Eventually(t, func() bool {
		keys, err := b.admin.Keys(ctx, "*").Result()
		return err == nil && len(keys) == 0
	}, keepAlive+2*time.Second, 10*time.Millisecond, "every key expired")
	expired := time.Since(idle)
	require.Eventually(t, func() bool {
		n, err := b.admin.DBSize(ctx).Result()
		return err == nil && n == 0
	}, 2*time.Second, 10*time.Millisecond, "and was reclaimed")
	t.Logf("all keys expired %v after the last call, reclaimed after %v", expired.Round(time.Millisecond), time.Since(idle).Round(time.Millisecond))
	assert.Less(t, expired, keepAlive+time.Second)
}

// keyKind names what a limiter's key holds, by its name.
func keyKind(key string) string {
	switch {
	case strings.HasSuffix(key, ":requests"):
		return "request logs"
	case strings.HasSuffix(key, ":clients"):
		return "client registries"
	case strings.HasSuffix(key, ":first") || strings.HasSuffix(key, ":second"):
		return "per-client state"
	case !strings.Contains(key, "}:"):
		return "configs"
	}
	return "shared state"
}

// A limiter's keys all live in one slot, whatever its name.
func TestClusterKeysShareASlot(t *testing.T) {
	c := New(redis.NewClient(&redis.Options{}), WithClientID("c1"))
	for _, name := range []string{"plain", "{tag}x", "a{b}c", "x}{y}", "ünï"} {
		for _, a := range algorithms {
			l := a.new(c, name)
			slot := redistest.KeySlot(l.keys[0])
			for _, k := range append(l.keys, l.alg.StateKeys(l.Name(), "other")...) {
				assert.Equal(t, slot, redistest.KeySlot(k), "%s %q: %q", a.name, name, k)
			}
		}
	}
}
