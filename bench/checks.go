package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
)

// checks holds what the report shows besides the throughput tables.
type checks struct {
	floor     float64 // go-redis, one EvalSha of `return 1` with one key
	shaped    float64 // go-redis, one EvalSha with a funnel's keys, arguments and reply
	allocs    []allocRow
	serial    []serialRow
	memory    []memRow
	tbRecords []recordRow
	keys      []keysRow
	loaded    []loadedRow
	// loaded: callers deciding for loadedFor over loadedLimiters limiters
	loadedCallers, loadedLimiters int
	loadedFor                     time.Duration
	scaling                       []scaleRow
}

type allocRow struct {
	name   string
	allocs float64
}

type memRow struct {
	limiter string
	keys    []keyBytes // every key the limiter holds
	target  int64      // 0 for none
}

func (m memRow) bytes() (n int64) {
	for _, k := range m.keys {
		n += k.bytes
	}
	return n
}

type keyBytes struct {
	key   string
	bytes int64
	ttl   time.Duration
}

type recordRow struct {
	records int64
	bytes   int64 // of the permits zset
}

// keysRow is what a limiter leaves in Redis once it should leave nothing.
type keysRow struct {
	limiter, after string
	held           int        // keys before (after the grants)
	left           []keyBytes // keys after
}

// loadedRow is DBSIZE right after callers decided over many limiters.
type loadedRow struct {
	limiter   string
	decisions uint64
	dbsize    int64
	target    int64 // 0 for none
}

type scaleRow struct {
	records        int64 // in the log before each batch
	usec, denyUsec float64
}

func runChecks(ctx context.Context, e *env, l *load, o options) (*checks, error) {
	c := &checks{}
	steps := []struct {
		name string
		run  func(context.Context, *env) error
	}{
		{"allocations", c.runAllocs},
		{"server time, one caller", c.runSerial},
		{"memory", c.runMemory},
		{"keys left", c.runKeys},
		{"keys under load", func(ctx context.Context, e *env) error { return c.runLoaded(ctx, e, l, o) }},
		{"token bucket scaling", c.runScaling},
	}
	for _, s := range steps {
		start := time.Now()
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return nil, err
		}
		if err := s.run(ctx, e); err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		log("check %s done in %v", s.name, time.Since(start).Round(time.Millisecond))
	}
	return c, nil
}

// allocsPerCall counts Go heap allocations per call of f, on one goroutine
// so that little else runs meanwhile.
func allocsPerCall(f func() error) (float64, error) {
	const n = 3000
	for range 100 {
		if err := f(); err != nil {
			return 0, err
		}
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		if err := f(); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / n, nil
}

func (c *checks) runAllocs(ctx context.Context, e *env) error {
	if err := e.rdb.ScriptLoad(ctx, trivial).Err(); err != nil {
		return err
	}
	var err error
	key := []string{"bench:alloc:trivial"}
	if c.floor, err = allocsPerCall(func() error { return e.rdb.EvalSha(ctx, trivialSHA, key).Err() }); err != nil {
		return err
	}
	// The wire shape of a funnel's Allow with a default config: 4 keys, 13
	// arguments of the same types (boxed once, here), a reply of 5
	// integers. What go-redis costs for that, before the library does anything.
	const shapedSrc = "return {1, 1000000, 999999, 0, 1000000}"
	shapedSHA := redis.NewScript(shapedSrc).Hash()
	if err := e.rdb.ScriptLoad(ctx, shapedSrc).Err(); err != nil {
		return err
	}
	keys := []string{"shaped", "{shaped}:clients", "{shaped}:requests", "{shaped}:tat:0123456789abcdef"}
	args := []any{"allow", "", int64(1), "0123456789abcdef", "", "", "default",
		int64(1000000), int64(1000), int64(0), int64(0), int64(0), int64(0)}
	c.shaped, err = allocsPerCall(func() error { return e.rdb.EvalSha(ctx, shapedSHA, keys, args...).Err() })
	if err != nil {
		return err
	}

	big := redlimit.PerSecond(bigRate)
	client := redlimit.New(e.rdb)
	for _, stored := range []bool{false, true} {
		for _, alg := range algorithms {
			name := alg.name + " Allow"
			l := alg.new(client, "bench:alloc:"+alg.short).WithDefault(big)
			if stored {
				name += ", stored config"
				l = alg.new(client, "bench:alloc:stored:"+alg.short)
				if err := l.SetRate(ctx, big); err != nil {
					return err
				}
			}
			a, err := allocsPerCall(func() error { _, err := l.Allow(ctx, 1); return err })
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			c.allocs = append(c.allocs, allocRow{name, a})
		}
	}
	peer := redis_rate.NewLimiter(e.rdb)
	limit := redis_rate.PerSecond(bigRate)
	a, err := allocsPerCall(func() error { _, err := peer.Allow(ctx, "bench:alloc:peer", limit); return err })
	c.allocs = append(c.allocs, allocRow{"redis_rate Allow", a})
	return err
}

// memoryName is a typical limiter name (a user id), since the key names are
// part of what MEMORY USAGE counts.
const memoryName = "user:1234567"

func (c *checks) runMemory(ctx context.Context, e *env) error {
	short := redlimit.Per(1000, 200*time.Millisecond)
	plain := redlimit.New(e.rdb)
	withDefault := func(alg algorithm) func() (*redlimit.Limiter, error) {
		return func() (*redlimit.Limiter, error) { return alg.new(plain, memoryName).WithDefault(short), nil }
	}
	cases := []struct {
		name    string
		target  int64
		limiter func() (*redlimit.Limiter, error) // nil: slidingFilled
		grants  int
	}{
		{"Funnel", 120, withDefault(funnel), 1},
		{"FixedWindow", 120, withDefault(fixedWindow), 1},
		{"SlidingWindow, 10 buckets, each holding a grant", 120 + 16*10, nil, 10},
		{"SlidingWindow, 100 buckets, each holding a grant", 120 + 16*100, nil, 100},
		{"TokenBucket", 0, withDefault(tokenBucket), 1},
		{"Funnel, stored config (SetRate)", 0, func() (*redlimit.Limiter, error) {
			l := plain.Funnel(memoryName)
			return l, l.SetRate(ctx, short)
		}, 1},
		{"Funnel, WithRetryWindow(15s)", 0, func() (*redlimit.Limiter, error) {
			return redlimit.New(e.rdb, redlimit.WithRetryWindow(15*time.Second)).Funnel(memoryName).WithDefault(short), nil
		}, 1},
	}
	for _, cs := range cases {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		var err error
		if cs.limiter == nil {
			err = slidingFilled(ctx, e.rdb, cs.grants)
		} else {
			err = grant(ctx, cs.limiter, cs.grants)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", cs.name, err)
		}
		keys, err := allKeys(ctx, e.admin)
		if err != nil {
			return err
		}
		c.memory = append(c.memory, memRow{limiter: cs.name, keys: keys, target: cs.target})
	}

	// Token bucket: bytes per record of the permits log, below and above
	// the size where Redis turns a small listpack zset into a skiplist (128).
	for _, n := range []int64{100, 1000} {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		l := plain.TokenBucket(memoryName).WithDefault(redlimit.Per(1_000_000, time.Hour))
		if err := parallel(ctx, 16, int(n), func(int) error { _, err := l.Allow(ctx, 1); return err }); err != nil {
			return err
		}
		bytes, err := e.admin.MemoryUsage(ctx, "{"+memoryName+"}:permits", 0).Result()
		if err != nil {
			return err
		}
		c.tbRecords = append(c.tbRecords, recordRow{records: n, bytes: bytes})
	}
	return nil
}

// grant makes a limiter and has it grant n requests, 8 at a time.
func grant(ctx context.Context, limiter func() (*redlimit.Limiter, error), n int) error {
	l, err := limiter()
	if err != nil {
		return err
	}
	return parallel(ctx, 8, n, func(int) error { _, err := l.Allow(ctx, 1); return err })
}

// slidingFilled makes a sliding window of 1 s whose every sub-window holds a
// grant. Its client runs on a clock stepped one sub-window at a time, so no
// grant is left to timing luck.
func slidingFilled(ctx context.Context, rdb redis.Scripter, buckets int) error {
	now := time.Now()
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	cfg := redlimit.Config{Rate: 1000, Interval: time.Second, Buckets: buckets}
	l := client.SlidingWindow(memoryName).WithDefault(cfg)
	for range buckets {
		if _, err := l.Allow(ctx, 1); err != nil {
			return err
		}
		now = now.Add(cfg.Interval / time.Duration(buckets))
	}
	return nil
}

// allKeys lists every key in the (benchmark's own) database with its
// MEMORY USAGE, SAMPLES 0 so that hashes and zsets are counted whole.
func allKeys(ctx context.Context, admin *redis.Client) ([]keyBytes, error) {
	names, err := admin.Keys(ctx, "*").Result()
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := make([]keyBytes, 0, len(names))
	for _, k := range names {
		bytes, err := admin.MemoryUsage(ctx, k, 0).Result()
		if err == redis.Nil {
			continue // expired since
		}
		if err != nil {
			return nil, err
		}
		ttl, err := admin.PTTL(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		out = append(out, keyBytes{key: k, bytes: bytes, ttl: ttl})
	}
	return out, nil
}

// runKeys counts the keys a limiter leaves (1) once it is full again, having
// no stored config: 50 grants on Per(1000, 200ms), then the interval and the
// time Redis's active expiry takes to reclaim keys; and (2) after Delete,
// with a stored PerClient config, two clients and the retry window on, so
// that every kind of key is there to remove.
func (c *checks) runKeys(ctx context.Context, e *env) error {
	short := redlimit.Per(1000, 200*time.Millisecond)
	perClient := redlimit.Config{Rate: 1000, Interval: time.Hour, Type: redlimit.PerClient}
	count := func(alg algorithm, after string, held int) error {
		left, err := allKeys(ctx, e.admin)
		c.keys = append(c.keys, keysRow{limiter: alg.name, after: after, held: held, left: left})
		return err
	}
	for _, alg := range algorithms {
		for _, window := range []time.Duration{0, short.Interval} {
			if err := e.admin.FlushAll(ctx).Err(); err != nil {
				return err
			}
			after := "drained"
			var opts []redlimit.Option
			if window > 0 {
				after, opts = fmt.Sprintf("drained, WithRetryWindow(%v)", window), []redlimit.Option{redlimit.WithRetryWindow(window)}
			}
			err := grant(ctx, func() (*redlimit.Limiter, error) {
				return alg.new(redlimit.New(e.rdb, opts...), memoryName).WithDefault(short), nil
			}, 50)
			if err != nil {
				return err
			}
			held, err := e.admin.DBSize(ctx).Result()
			if err != nil {
				return err
			}
			time.Sleep(short.Interval + 300*time.Millisecond)
			if err := count(alg, after, int(held)); err != nil {
				return err
			}
		}

		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		var limiters []*redlimit.Limiter
		for range 2 {
			l := alg.new(redlimit.New(e.rdb, redlimit.WithRetryWindow(15*time.Second)), memoryName)
			limiters = append(limiters, l)
			if err := grant(ctx, func() (*redlimit.Limiter, error) { return l, l.SetRate(ctx, perClient) }, 50); err != nil {
				return err
			}
		}
		held, err := e.admin.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		if _, err := limiters[0].Delete(ctx); err != nil {
			return err
		}
		if err := count(alg, "Delete (stored PerClient config, 2 clients, WithRetryWindow(15s))", int(held)); err != nil {
			return err
		}
	}
	return nil
}

// runLoaded counts the keys in Redis right after the first number of
// callers decided for 2 s over -keys limiters, with a limit that never
// denies and whose state outlives the run (each grant keeps a funnel full
// for 3.6 s more), so that every limiter touched still holds all its keys.
func (c *checks) runLoaded(ctx context.Context, e *env, l *load, o options) error {
	c.loadedCallers, c.loadedLimiters, c.loadedFor = o.callers[0], o.keys, 2*time.Second
	run := &load{env: e, callers: l.callers, warmup: l.warmup, duration: c.loadedFor}
	long := redlimit.Per(bigRate, 1000*time.Hour)
	cases := []struct {
		limiter string
		alg     algorithm
		target  int64
		opts    []redlimit.Option
	}{
		{"Funnel", funnel, int64(o.keys), nil},
		{"FixedWindow", fixedWindow, 0, nil},
		{"SlidingWindow", slidingWindow, 0, nil},
		{"TokenBucket", tokenBucket, 0, nil},
		{"Funnel, WithRetryWindow(15s)", funnel, 0, []redlimit.Option{redlimit.WithRetryWindow(15 * time.Second)}},
	}
	for _, cs := range cases {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		decide, err := ours(cs.limiter, cs.alg, e.rdb, long, nil, cs.opts...).prepare(ctx, c.loadedLimiters)
		if err != nil {
			return err
		}
		s, err := run.run(ctx, decide, c.loadedCallers, c.loadedLimiters)
		if err != nil {
			return err
		}
		n, err := e.admin.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		c.loaded = append(c.loaded, loadedRow{limiter: cs.limiter, decisions: s.decisions, dbsize: n, target: cs.target})
	}
	return nil
}

// runScaling measures the token bucket's Redis time per Allow with logs of
// 10, 1,000 and 100,000 records. Each log is written directly in Redisson's
// layout (ZADD in chunks of 1,000, then the value key), which takes a second
// where 100,000 Allow calls would take ten. Rate is records + 50 and the
// interval an hour, so in each batch 50 grants succeed, 50 more are denied
// with a full log, and Release(50) brings the log back to its size: the
// figures are the medians over the batches, the three sizes taking turns.
func (c *checks) runScaling(ctx context.Context, e *env) error {
	const batch, batches = 50, 15
	sizes := []int64{10, 1000, 100_000}
	client := redlimit.New(e.rdb)
	limiters := make([]*redlimit.Limiter, len(sizes))
	for i, n := range sizes {
		name := fmt.Sprintf("%s:log%d", memoryName, n)
		cfg := redlimit.Per(n+batch, time.Hour)
		if err := fillLog(ctx, e.rdb, name, n, cfg.Rate); err != nil {
			return err
		}
		limiters[i] = client.TokenBucket(name).WithDefault(cfg)
		if r, err := limiters[i].Allow(ctx, 0); err != nil || r.Remaining != batch {
			return fmt.Errorf("log of %d records: Remaining %d (%v), want %d: the layout written is not the script's", n, r.Remaining, err, batch)
		}
	}
	grants := make([][]float64, len(sizes))
	denials := make([][]float64, len(sizes))
	timed := func(l *redlimit.Limiter, want bool) (float64, error) {
		if err := e.admin.ConfigResetStat(ctx).Err(); err != nil {
			return 0, err
		}
		for range batch {
			if r, err := l.Allow(ctx, 1); err != nil || r.Allowed != want {
				return 0, fmt.Errorf("allowed %v (%v), want %v", r.Allowed, err, want)
			}
		}
		_, usec, err := evalshaStats(ctx, e.admin)
		return usec, err
	}
	for range batches {
		for i, l := range limiters {
			g, err := timed(l, true)
			if err != nil {
				return err
			}
			d, err := timed(l, false)
			if err != nil {
				return err
			}
			if err := l.Release(ctx, batch); err != nil {
				return err
			}
			grants[i], denials[i] = append(grants[i], g), append(denials[i], d)
		}
	}
	for i, n := range sizes {
		c.scaling = append(c.scaling, scaleRow{records: n, usec: median(grants[i]), denyUsec: median(denials[i])})
	}
	return nil
}

// fillLog writes a token bucket's log of n one-permit records granted now,
// as the script writes them: member 0x10, a request id of 16 hex digits,
// the count as a little-endian uint32; score the grant's Unix time in ms.
// The value key caches rate − Σ counts.
func fillLog(ctx context.Context, rdb *redis.Client, name string, n, rate int64) error {
	permits, value := "{"+name+"}:permits", "{"+name+"}:value"
	now := float64(time.Now().UnixMilli())
	for from := int64(0); from < n; from += 1000 {
		members := make([]redis.Z, 0, 1000)
		for i := from; i < min(n, from+1000); i++ {
			members = append(members, redis.Z{Score: now, Member: fmt.Sprintf("\x10%016x\x01\x00\x00\x00", i)})
		}
		if err := rdb.ZAdd(ctx, permits, members...).Err(); err != nil {
			return err
		}
	}
	if err := rdb.PExpire(ctx, permits, time.Hour).Err(); err != nil {
		return err
	}
	return rdb.Set(ctx, value, rate-n, time.Hour).Err()
}
