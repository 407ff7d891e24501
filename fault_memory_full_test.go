package redlimit

// Redis full: maxmemory reached, with noeviction (writes refused with OOM)
// or an eviction policy (limiter state evicted).

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fillUntilOOM writes persistent 1 KiB keys (a cache whose keys never
// expire) in batches until Redis refuses one with OOM, at most limit bytes,
// and returns how many it wrote and whether it met OOM.
func fillUntilOOM(t *testing.T, admin *redis.Client, limit int) (written int, oom bool) {
	t.Helper()
	ctx := context.Background()
	value := strings.Repeat("x", 1024)
	for written*len(value) < limit {
		cmds, err := admin.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range 64 {
				p.Set(ctx, "filler:"+strconv.Itoa(written+i), value, 0)
			}
			return nil
		})
		for _, c := range cmds {
			if c.Err() == nil {
				written++
			}
		}
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "OOM "), "filling: %v", err)
			return written, true
		}
	}
	return written, false
}

// setMaxmemory sets maxmemory to what the server uses now plus headroom.
func setMaxmemory(t *testing.T, admin *redis.Client, policy string, headroom int64) {
	t.Helper()
	ctx := context.Background()
	used, err := strconv.ParseInt(infoValue(t, admin, "memory", "used_memory"), 10, 64)
	require.NoError(t, err)
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", policy).Err())
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+headroom, 10)).Err())
}

// limiterDump returns every key whose name contains the limiter's name (its
// config, state and replay markers, whatever the key layout), each with its
// DUMP and absolute expiry (PEXPIRETIME), so two dumps are equal only if
// nothing was written.
func limiterDump(t *testing.T, admin *redis.Client, l *Limiter) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	iter := admin.Scan(ctx, 0, "*"+escapeGlob(l.Name())+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		dump, err := admin.Dump(ctx, k).Result()
		require.NoError(t, err)
		out[k] = fmt.Sprintf("%q expires %v", dump, pexpireTime(t, admin, k))
	}
	require.NoError(t, iter.Err())
	return out
}

// pexpireTime is PEXPIRETIME (Redis 7.0+): key's absolute expiry in Unix
// ms, -1 for none. Redis 6.2 lacks the command, so it is read there as TIME
// plus PTTL in one script, whose clock is read again after PTTL: when both
// readings fall in one millisecond, PTTL was measured from it, and the sum
// is the key's expiry exactly, as PEXPIRETIME gives it.
func pexpireTime(t *testing.T, admin *redis.Client, key string) int64 {
	t.Helper()
	ctx := context.Background()
	at, err := admin.Do(ctx, "PEXPIRETIME", key).Int64()
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown command") {
		require.NoError(t, err)
		return at
	}
	const script = `
for _ = 1, 1000 do
  local a = redis.call('TIME')
  local ttl = redis.call('PTTL', KEYS[1])
  local b = redis.call('TIME')
  local ms = a[1] * 1000 + math.floor(a[2] / 1000)
  if ms == b[1] * 1000 + math.floor(b[2] / 1000) then
    if ttl < 0 then return ttl end
    return ms + ttl
  end
end
return redis.error_reply('the clock never held still for a millisecond')`
	ms, err := admin.Eval(ctx, script, []string{key}).Int64()
	require.NoError(t, err)
	return ms
}

// A full Redis with maxmemory-policy noeviction refuses a script with OOM at
// its first write command, never after one (that would break its atomicity),
// so a decision that must write is refused before it changed anything. For
// every algorithm, with the rate stored (SetRate) and as a default: the
// refusal is ErrUnavailable with its cause, never ErrCorruptState and never a
// grant; WithFailOpen grants; a peek, which writes nothing, still answers;
// and every key of the limiter is as it was. Once memory is freed the
// limiter goes on from the same count.
func TestMemoryFullNoEviction(t *testing.T) {
	ctx := context.Background()
	clearOfHourEdge(t)
	admin, rdb := ownServer(t)
	closed, open := New(rdb), New(rdb, WithFailOpen())
	cfg := PerHour(10)
	type pair struct {
		name         string
		closed, open *Limiter
	}
	var pairs []pair
	for _, a := range algorithms {
		stored := uniqueName(t) + "-" + a.name + "-stored"
		require.NoError(t, a.new(closed, stored).SetRate(ctx, cfg))
		dflt := uniqueName(t) + "-" + a.name + "-default"
		pairs = append(pairs,
			pair{a.name + "/stored", a.new(closed, stored), a.new(open, stored)},
			pair{a.name + "/default", a.new(closed, dflt).WithDefault(cfg), a.new(open, dflt).WithDefault(cfg)})
	}
	for _, p := range pairs {
		for range 3 {
			ok, err := p.closed.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok)
		}
	}
	before := map[string]map[string]string{}
	for _, p := range pairs {
		before[p.name] = limiterDump(t, admin, p.closed)
		require.NotEmpty(t, before[p.name], "%s: keys found by the limiter's name", p.name)
	}

	setMaxmemory(t, admin, "noeviction", 1<<20)
	n, oom := fillUntilOOM(t, admin, 8<<20)
	require.True(t, oom, "1 MiB of headroom is full before 8 MiB were written")
	// Client buffers come and go: set the limit well below what is used, so
	// the server stays full whatever they do.
	setMaxmemory(t, admin, "noeviction", -256<<10)
	t.Logf("full after %d KiB of filler; used_memory %s, maxmemory now %s", n,
		infoValue(t, admin, "memory", "used_memory"), infoValue(t, admin, "memory", "maxmemory"))

	for _, p := range pairs {
		ok, err := p.closed.TryAcquire(ctx, 1)
		assert.False(t, ok, "%s: no grant when Redis cannot write", p.name)
		assert.ErrorIs(t, err, ErrUnavailable, p.name)
		assert.NotErrorIs(t, err, ErrCorruptState, p.name)
		assert.ErrorContains(t, err, "OOM", "%s: the cause is kept", p.name)
		r, err := p.closed.Allow(ctx, 2)
		assert.ErrorIs(t, err, ErrUnavailable, p.name)
		assert.Equal(t, Result{}, r, p.name)

		ok, err = p.open.TryAcquire(ctx, 1)
		assert.NoError(t, err, "%s: fail-open", p.name)
		assert.True(t, ok, "%s: fail-open grants", p.name)

		r, err = p.closed.Allow(ctx, 0)
		assert.NoError(t, err, "%s: a peek writes nothing, so a full Redis answers it", p.name)
		assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 7}, Result{Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining}, p.name)
		left, err := p.closed.AvailablePermits(ctx)
		assert.NoError(t, err, p.name)
		assert.Equal(t, int64(7), left, p.name)

		assert.ErrorIs(t, p.closed.SetRate(ctx, PerHour(20)), ErrUnavailable, "%s: storing a rate is a write too", p.name)
		assert.Equal(t, before[p.name], limiterDump(t, admin, p.closed), "%s: nothing half-written", p.name)
	}
	errstat := infoValue(t, admin, "errorstats", "errorstat_OOM")
	t.Logf("errorstat_OOM: %s", errstat)

	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "0").Err())
	for _, p := range pairs {
		r, err := p.closed.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 6}, Result{Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining},
			"%s: with memory back, the count goes on from where it was", p.name)
	}
}

// A policy that evicts may evict a limiter's state, and a limiter whose state
// is gone starts full again: it grants its limit once more within the hour.
//
// Each limiter (every algorithm, two callers each) uses up its limit; the
// callers go on, denied, while 1 KiB keys without TTL (a cache that never
// expires) fill the server well past maxmemory. Afterwards, with eviction
// off, what a limiter granted plus what it still grants is what it grants
// over the hour; anything above the limit is what eviction cost.
//
// Every state key has a TTL (the config only with KeepAlive), so
// volatile-lru beside data that never expires evicts limiter state, and only
// that, before it gives up with OOM: every limiter must over-admit. The
// allkeys policies are measured: the limiters' keys, read on every call, may
// still go (allkeys-lru: the LRU clock ticks once a second, so keys used
// within the same second look alike; allkeys-lfu evicted a fixed window's
// one key here). Whatever is evicted, callers only ever see ErrUnavailable
// (OOM) and never fewer grants than the limit: a state cut in half by
// eviction is never ErrCorruptState.
func TestMemoryFullEviction(t *testing.T) {
	for _, tc := range []struct {
		policy string
		reset  bool // every limiter's state must be evicted
	}{
		{"volatile-lru", true},
		{"allkeys-lru", false},
		{"allkeys-lfu", false},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			const rate = 100
			ctx := context.Background()
			clearOfHourEdge(t)
			admin, rdb := ownServer(t)
			client := New(rdb)

			type run struct {
				algo           string
				limiter        *Limiter
				granted, fails atomic.Int64
				loops          [2]atomic.Int64 // calls each caller has finished counting
			}
			var runs []*run
			for _, a := range algorithms {
				runs = append(runs, &run{algo: a.name, limiter: a.new(client, uniqueName(t)+"-"+a.name).WithDefault(PerHour(rate))})
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for _, r := range runs {
				for caller := range r.loops {
					wg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
							ok, err := r.limiter.TryAcquire(ctx, 1)
							switch {
							case err != nil:
								// OOM, when nothing is left to evict.
								assert.ErrorIs(t, err, ErrUnavailable, r.algo)
								r.fails.Add(1)
							case ok:
								r.granted.Add(1)
							}
							r.loops[caller].Add(1)
							time.Sleep(time.Millisecond)
						}
					})
				}
			}
			require.Eventually(t, func() bool {
				for _, r := range runs {
					if left, err := r.limiter.AvailablePermits(ctx); err != nil || left > 0 {
						return false
					}
				}
				return true
			}, 10*time.Second, 10*time.Millisecond, "every limiter uses up its limit")
			// A grant Redis made before the check above may not be counted
			// yet: wait until every caller has finished the call it was in.
			for _, r := range runs {
				for caller := range r.loops {
					seen := r.loops[caller].Load()
					require.Eventually(t, func() bool { return r.loops[caller].Load() > seen }, 10*time.Second, time.Millisecond)
				}
			}
			for _, r := range runs {
				require.Equal(t, int64(rate), r.granted.Load(), "%s: the limit, exactly, before any eviction", r.algo)
			}
			// Let the denied calls mark the limiter's keys as busy (LFU
			// counters grow with accesses).
			time.Sleep(200 * time.Millisecond)

			const headroom = 2 << 20
			setMaxmemory(t, admin, tc.policy, headroom)
			written, oom := fillUntilOOM(t, admin, 4*headroom)
			time.Sleep(200 * time.Millisecond)
			close(stop)
			wg.Wait()
			evicted := infoValue(t, admin, "stats", "evicted_keys")
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "0").Err())

			t.Logf("%s: %d KiB of filler written (OOM: %v), %s keys evicted", tc.policy, written, oom, evicted)
			for _, r := range runs {
				left, err := r.limiter.AvailablePermits(ctx)
				require.NoError(t, err)
				over := r.granted.Load() + left - rate
				t.Logf("%-14s %3d granted, %3d still to grant this hour: %+d against the limit of %d; %d calls refused (OOM)",
					r.algo, r.granted.Load(), left, over, rate, r.fails.Load())
				assert.GreaterOrEqual(t, over, int64(0), "%s: never fewer grants than the limit", r.algo)
				if tc.reset {
					assert.Positive(t, over, "%s: its state was evicted and it started full", r.algo)
				}
			}
			assert.NotEqual(t, "0", evicted, "the server evicted")
			if tc.reset {
				assert.True(t, oom, "%s: the filler met OOM once nothing volatile was left", tc.policy)
			}
		})
	}
}

// A full Redis (maxmemory, noeviction) is an outage for every algorithm,
// with the request log (WithRetryWindow) or without, Overall or PerClient,
// the rate stored or a default: ErrUnavailable with the OOM kept, never
// ErrCorruptState; WithFailOpen grants, and nothing is half-written.
func TestMemoryFullErrorClass(t *testing.T) {
	ctx := context.Background()
	admin, rdb := ownServer(t)
	type pair struct {
		name         string
		closed, open *Limiter
	}
	var pairs []pair
	for _, window := range []time.Duration{0, 15 * time.Second} {
		closed, open := New(rdb, WithRetryWindow(window)), New(rdb, WithRetryWindow(window), WithFailOpen())
		for _, a := range algorithms {
			for _, cfg := range []Config{PerHour(10), {Type: PerClient, Rate: 10, Interval: time.Hour}} {
				what := a.name + "/" + cfg.Type.String() + "/retry window " + window.String()
				stored := uniqueName(t) + "-" + what + "-stored"
				require.NoError(t, a.new(closed, stored).SetRate(ctx, cfg))
				dflt := uniqueName(t) + "-" + what + "-default"
				pairs = append(pairs,
					pair{what + "/stored", a.new(closed, stored), a.new(open, stored)},
					pair{what + "/default", a.new(closed, dflt).WithDefault(cfg), a.new(open, dflt).WithDefault(cfg)})
			}
		}
	}
	for _, p := range pairs {
		for range 3 {
			ok, err := p.closed.TryAcquire(ctx, 1)
			require.NoError(t, err, p.name)
			require.True(t, ok, p.name)
		}
	}
	before := map[string]map[string]string{}
	for _, p := range pairs {
		before[p.name] = limiterDump(t, admin, p.closed)
	}
	setMaxmemory(t, admin, "noeviction", 1<<20)
	_, oom := fillUntilOOM(t, admin, 8<<20)
	require.True(t, oom)
	setMaxmemory(t, admin, "noeviction", -256<<10)
	t.Cleanup(func() { admin.ConfigSet(context.Background(), "maxmemory", "0") })

	for _, p := range pairs {
		ok, err := p.closed.TryAcquire(ctx, 1)
		assert.False(t, ok, p.name)
		assert.ErrorIs(t, err, ErrUnavailable, p.name)
		assert.NotErrorIs(t, err, ErrCorruptState, p.name)
		assert.ErrorContains(t, err, "OOM", "%s: the cause is kept", p.name)
		if err != nil {
			assert.NotContains(t, err.Error(), "corrupt", p.name)
		}
		ok, err = p.open.TryAcquire(ctx, 1)
		assert.NoError(t, err, p.name)
		assert.True(t, ok, "%s: fail-open grants", p.name)
		assert.Equal(t, before[p.name], limiterDump(t, admin, p.closed), "%s: nothing half-written", p.name)
	}
}
