package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
)

// checks holds what the report shows besides the throughput tables.
type checks struct {
	allocs     []allocRow
	floor      float64 // go-redis, one EvalSha of `return 1` with one key
	shaped     float64 // go-redis, one EvalSha with a limiter's keys, arguments and reply
	memory     []memRow
	tbRecords  []recordRow
	tbAging    agingRow
	gone       []goneRow
	scaling    []scaleRow
	exact      []exactRow
	flush      []flushRow
	apExactCal int
	serial     []serialRow
}

type allocRow struct {
	name   string
	allocs float64
}

type memRow struct {
	limiter string
	keys    []keyBytes // every key the limiter holds
	target  int64      // bytes for its state keys; 0 for none
}

type keyBytes struct {
	key   string
	bytes int64
	ttl   time.Duration
}

// state is the bytes of the keys a limiter keeps for its rate: all but the
// config hash and the replay markers, which the report shows apart.
func (m memRow) state() int64 {
	var n int64
	for _, k := range m.keys {
		if kindOf(k.key) == "state" {
			n += k.bytes
		}
	}
	return n
}

func kindOf(key string) string {
	switch {
	case strings.Contains(key, "}:request:"):
		return "replay marker"
	case !strings.HasPrefix(key, "{"):
		return "config"
	}
	return "state"
}

type recordRow struct {
	records int64
	bytes   int64 // of the permits zset
}

type agingRow struct {
	granted, afterInterval int64
}

type goneRow struct {
	limiter     string
	retryWindow time.Duration
	wait        time.Duration
	left        []keyBytes // keys still there (SCAN) after wait
	dbsize      int64
}

type scaleRow struct {
	records        int64 // in the log before each batch
	held           int64 // after the last batch: the log kept its size
	usec, denyUsec float64
}

type exactRow struct {
	limiter string
	config  string
	asks    int // decisions asked for (the flowing runs: measured ones, warm-up aside)
	span    time.Duration
	grants  uint64
	bound   int64
	least   int64 // an hour's limit: a full limiter grants Rate at once, so fewer is under-admission; 0 otherwise
	errors  uint64
	err     error
}

type flushRow struct {
	limiter     string
	decisions   uint64
	after       uint64 // decisions completed after SCRIPT FLUSH returned
	rate        float64
	errors      uint64
	firstErr    error
	scriptLoads int64
	noscripts   int64 // EVALSHA calls Redis failed (NOSCRIPT)
}

func runChecks(ctx context.Context, e *env, l *load, o options) (*checks, error) {
	c := &checks{}
	steps := []struct {
		name string
		run  func(context.Context, *env, *load, options) error
	}{
		{"allocations", c.runAllocs},
		{"server time, one caller", c.runSerial},
		{"memory", c.runMemory},
		{"keys gone", c.runGone},
		{"token bucket scaling", c.runScaling},
		{"exactness", c.runExact},
		{"SCRIPT FLUSH", c.runFlush},
	}
	for _, s := range steps {
		start := time.Now()
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return nil, err
		}
		if err := s.run(ctx, e, l, o); err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		log("check %s done in %v", s.name, time.Since(start).Round(time.Millisecond))
	}
	return c, nil
}

// allocsPerCall counts Go heap allocations per call of f, on one goroutine
// so that little else runs meanwhile.
func allocsPerCall(n int, f func() error) (float64, error) {
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
	return float64(after.Mallocs-before.Mallocs) / float64(n), nil
}

func (c *checks) runAllocs(ctx context.Context, e *env, _ *load, _ options) error {
	const n = 3000
	key := []string{"bench:alloc:trivial"}
	if err := e.rdb.ScriptLoad(ctx, trivial).Err(); err != nil {
		return err
	}
	var err error
	c.floor, err = allocsPerCall(n, func() error { return e.rdb.EvalSha(ctx, trivialSHA, key).Err() })
	if err != nil {
		return err
	}
	// The same wire shape as a funnel's Allow: 5 keys, 13 arguments of the
	// same types (boxed once, here), a reply of 5 integers. What go-redis
	// costs for that, before the library does anything.
	const shapedSrc = "return {1, 1000000, 999999, 0, 1000000}"
	shapedSHA := redis.NewScript(shapedSrc).Hash()
	if err := e.rdb.ScriptLoad(ctx, shapedSrc).Err(); err != nil {
		return err
	}
	keys := []string{"shaped", "{shaped}:clients", "{shaped}:request:0123456789abcdef0123456789abcdef", "{shaped}:tat", "{shaped}:tat:0123456789abcdef"}
	args := []any{"allow", "", int64(1), "0123456789abcdef", "0123456789abcdef", int64(15000), "default",
		int64(1000000), int64(1000), int64(0), int64(0), int64(0), int64(0)}
	c.shaped, err = allocsPerCall(n, func() error {
		_, err := e.rdb.EvalSha(ctx, shapedSHA, keys, args...).Result()
		return err
	})
	if err != nil {
		return err
	}

	big := redlimit.PerSecond(bigRate)
	client := redlimit.New(e.rdb)
	for _, alg := range algorithms {
		l := alg.new(client, "bench:alloc:"+alg.short).WithDefault(big)
		a, err := allocsPerCall(n, func() error { _, err := l.Allow(ctx, 1); return err })
		if err != nil {
			return fmt.Errorf("%s: %w", alg.name, err)
		}
		c.allocs = append(c.allocs, allocRow{alg.name + " Allow", a})
	}
	for _, alg := range algorithms {
		l := alg.new(client, "bench:alloc:stored:"+alg.short)
		if err := l.SetRate(ctx, big); err != nil {
			return err
		}
		a, err := allocsPerCall(n, func() error { _, err := l.Allow(ctx, 1); return err })
		if err != nil {
			return fmt.Errorf("%s: %w", alg.name, err)
		}
		c.allocs = append(c.allocs, allocRow{alg.name + " Allow, stored config", a})
	}
	peer := redis_rate.NewLimiter(e.rdb)
	limit := redis_rate.PerSecond(bigRate)
	a, err := allocsPerCall(n, func() error { _, err := peer.Allow(ctx, "bench:alloc:peer", limit); return err })
	if err != nil {
		return err
	}
	c.allocs = append(c.allocs, allocRow{"redis_rate Allow", a})
	return nil
}

// memoryName is a typical limiter name (a user id), since the key names are
// part of what MEMORY USAGE counts.
const memoryName = "user:1234567"

func (c *checks) runMemory(ctx context.Context, e *env, _ *load, _ options) error {
	client := redlimit.New(e.rdb)
	short := redlimit.Per(1000, 200*time.Millisecond)
	cases := []struct {
		limiter string
		target  int64
		make    func() (*redlimit.Limiter, error)
		grants  int
		step    time.Duration // clock step between grants (sliding window: one per sub-window)
	}{
		{"Funnel, after 1 grant", 120, func() (*redlimit.Limiter, error) {
			return client.Funnel(memoryName).WithDefault(short), nil
		}, 1, 0},
		{"FixedWindow, after 1 grant", 120, func() (*redlimit.Limiter, error) {
			return client.FixedWindow(memoryName).WithDefault(short), nil
		}, 1, 0},
		{"SlidingWindow, 10 buckets, each holding a grant", 120 + 16*10, nil, 10, 0},
		{"SlidingWindow, 100 buckets, each holding a grant", 120 + 16*100, nil, 100, 0},
		{"Funnel, stored config (SetRate), after 1 grant", 0, func() (*redlimit.Limiter, error) {
			l := client.Funnel(memoryName)
			return l, l.SetRate(ctx, short)
		}, 1, 0},
	}
	for _, cs := range cases {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		var l *redlimit.Limiter
		var err error
		if cs.make != nil {
			l, err = cs.make()
		} else {
			l, err = slidingFilled(ctx, e.rdb, cs.grants)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", cs.limiter, err)
		}
		if cs.make != nil {
			for range cs.grants {
				if _, err := l.Allow(ctx, 1); err != nil {
					return fmt.Errorf("%s: %w", cs.limiter, err)
				}
			}
		}
		keys, err := allKeys(ctx, e.admin)
		if err != nil {
			return err
		}
		c.memory = append(c.memory, memRow{limiter: cs.limiter, keys: keys, target: cs.target})
	}

	// Token bucket: bytes per record of the permits log, below and above
	// the size where Redis turns a small listpack zset into a skiplist (128).
	for _, n := range []int64{100, 1000} {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		l := client.TokenBucket(memoryName).WithDefault(redlimit.Per(1_000_000, time.Hour))
		err := parallel(ctx, 16, int(n), func(int) error { _, err := l.Allow(ctx, 1); return err })
		if err != nil {
			return err
		}
		bytes, err := e.admin.MemoryUsage(ctx, "{"+memoryName+"}:permits", 0).Result()
		if err != nil {
			return err
		}
		c.tbRecords = append(c.tbRecords, recordRow{records: n, bytes: bytes})
	}

	// A token bucket holds no record older than Interval once it is written to.
	if err := e.admin.FlushAll(ctx).Err(); err != nil {
		return err
	}
	l := client.TokenBucket(memoryName).WithDefault(short)
	c.tbAging.granted = 300
	if err := parallel(ctx, 16, 300, func(int) error { _, err := l.Allow(ctx, 1); return err }); err != nil {
		return err
	}
	time.Sleep(short.Interval + 50*time.Millisecond)
	if _, err := l.Allow(ctx, 1); err != nil {
		return err
	}
	n, err := e.admin.ZCard(ctx, "{"+memoryName+"}:permits").Result()
	c.tbAging.afterInterval = n
	return err
}

// slidingFilled returns a sliding window of 1 s whose every sub-window holds a
// grant. Its client runs on a clock the benchmark steps one sub-window at a
// time, so no grant is left to timing luck.
func slidingFilled(ctx context.Context, rdb redis.Scripter, buckets int) (*redlimit.Limiter, error) {
	now := time.Now()
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	cfg := redlimit.Config{Rate: 1000, Interval: time.Second, Buckets: buckets}
	l := client.SlidingWindow(memoryName).WithDefault(cfg)
	for range buckets {
		r, err := l.Allow(ctx, 1)
		if err != nil {
			return nil, err
		}
		if !r.Allowed {
			return nil, fmt.Errorf("denied at %v", now)
		}
		now = now.Add(cfg.Interval / time.Duration(buckets))
	}
	return l, nil
}

// allKeys lists every key in the (benchmark's own) database with its
// MEMORY USAGE, SAMPLES 0 so that hashes and zsets are counted whole.
func allKeys(ctx context.Context, admin *redis.Client) ([]keyBytes, error) {
	var names []string
	iter := admin.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		names = append(names, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := make([]keyBytes, 0, len(names))
	for _, k := range names {
		bytes, err := admin.MemoryUsage(ctx, k, 0).Result()
		if err == redis.Nil {
			continue // expired between SCAN and now
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

// runGone checks that a limiter leaves nothing behind once it is full again:
// grants on a 200 ms interval, a wait of the interval plus the time Redis's
// active expiry takes to reclaim keys, then SCAN and DBSIZE.
func (c *checks) runGone(ctx context.Context, e *env, _ *load, _ options) error {
	short := redlimit.Per(1000, 200*time.Millisecond)
	wait := short.Interval + 300*time.Millisecond
	for _, window := range []time.Duration{0, short.Interval} {
		var opts []redlimit.Option
		label := "default retry window (15s)"
		if window > 0 {
			opts = append(opts, redlimit.WithRetryWindow(window))
			label = fmt.Sprintf("WithRetryWindow(%v)", window)
		}
		client := redlimit.New(e.rdb, opts...)
		for _, alg := range algorithms {
			if err := e.admin.FlushAll(ctx).Err(); err != nil {
				return err
			}
			l := alg.new(client, memoryName).WithDefault(short)
			if err := parallel(ctx, 8, 50, func(int) error { _, err := l.Allow(ctx, 1); return err }); err != nil {
				return err
			}
			time.Sleep(wait)
			left, err := allKeys(ctx, e.admin)
			if err != nil {
				return err
			}
			n, err := e.admin.DBSize(ctx).Result()
			if err != nil {
				return err
			}
			c.gone = append(c.gone, goneRow{limiter: alg.name + ", " + label, retryWindow: window, wait: wait, left: left, dbsize: n})
		}
	}
	return nil
}

// runScaling measures the token bucket's Redis time per Allow with logs of
// 10, 1,000 and 100,000 records. Each log is written directly in Redisson's
// layout (ZADD in chunks of 1,000, then the value key), which takes a second
// where 100,000 Allow calls would take ten; the first Allow checks that the
// script reads it as intended. Rate is records + 50 and the interval an
// hour, so in each batch 50 grants succeed, 50 more are denied with a full
// log, and Release(50) brings the log back to its size: the figures are the
// medians over the batches, the three sizes taking turns.
func (c *checks) runScaling(ctx context.Context, e *env, _ *load, _ options) error {
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
		r, err := limiters[i].Allow(ctx, 0)
		if err != nil {
			return err
		}
		if r.Remaining != batch {
			return fmt.Errorf("log of %d records: Remaining %d, want %d: the layout written is not the script's", n, r.Remaining, batch)
		}
	}
	grant := make([][]float64, len(sizes))
	deny := make([][]float64, len(sizes))
	timed := func(l *redlimit.Limiter, want bool) (float64, error) {
		if err := e.admin.ConfigResetStat(ctx).Err(); err != nil {
			return 0, err
		}
		for range batch {
			r, err := l.Allow(ctx, 1)
			if err != nil {
				return 0, err
			}
			if r.Allowed != want {
				return 0, fmt.Errorf("allowed %v, want %v", r.Allowed, want)
			}
		}
		return evalshaUsec(ctx, e.admin)
	}
	for range batches {
		for i, l := range limiters {
			g, err := timed(l, true)
			if err != nil {
				return fmt.Errorf("%d records, grants: %w", sizes[i], err)
			}
			d, err := timed(l, false)
			if err != nil {
				return fmt.Errorf("%d records, denials: %w", sizes[i], err)
			}
			if err := l.Release(ctx, batch); err != nil {
				return err
			}
			grant[i], deny[i] = append(grant[i], g), append(deny[i], d)
		}
	}
	for i, n := range sizes {
		card, err := e.admin.ZCard(ctx, "{"+fmt.Sprintf("%s:log%d", memoryName, n)+"}:permits").Result()
		if err != nil {
			return err
		}
		c.scaling = append(c.scaling, scaleRow{records: n, held: card, usec: median(grant[i]), denyUsec: median(deny[i])})
	}
	return nil
}

// fillLog writes a token bucket's log of n one-permit records granted now,
// as the script writes them: member 0x10, a 16-byte request id, the count as
// a little-endian uint32; score the grant's Unix time in ms. The value key
// caches rate − Σ counts.
func fillLog(ctx context.Context, rdb *redis.Client, name string, n, rate int64) error {
	permits, value := "{"+name+"}:permits", "{"+name+"}:value"
	now := float64(time.Now().UnixMilli())
	for from := int64(0); from < n; from += 1000 {
		members := make([]redis.Z, 0, 1000)
		for i := from; i < min(n, from+1000); i++ {
			var m [21]byte
			m[0] = 0x10
			binary.LittleEndian.PutUint64(m[1:], uint64(i))
			binary.LittleEndian.PutUint64(m[9:], rand.Uint64())
			binary.LittleEndian.PutUint32(m[17:], 1)
			members = append(members, redis.Z{Score: now, Member: string(m[:])})
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

// runExact counts the grants of limiters hammered through the
// AutoPipeliner by the largest number of callers and compares them with
// what each limit allows. First an hour's limit of 5,000, asked 7,500 times:
// every algorithm must grant exactly 5,000 (the funnel, plus the one or two
// permits that drain meanwhile). Then a flowing 1,000/s for 2 s: the grants
// must stay within the bound over the span.
func (c *checks) runExact(ctx context.Context, e *env, l *load, o options) error {
	callers := o.callers[len(o.callers)-1]
	c.apExactCal = callers
	hour := redlimit.Per(5000, time.Hour)
	for _, alg := range algorithms {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		ct := ours(alg.name, alg, e.ap, hour, nil)
		decide, err := ct.prepare(ctx, 1)
		if err != nil {
			return err
		}
		asks := int(hour.Rate) * 3 / 2
		var grants, errs atomic.Uint64
		var mu sync.Mutex
		var firstErr error
		start := time.Now()
		err = parallel(ctx, callers, asks, func(int) error {
			ok, err := decide(ctx, 0)
			if err != nil {
				errs.Add(1)
				mu.Lock()
				firstErr = cmpOr(firstErr, err)
				mu.Unlock()
			} else if ok {
				grants.Add(1)
			}
			return nil
		})
		if err != nil {
			return err
		}
		end := time.Now()
		row := exactRow{limiter: alg.name, config: hour.String(), asks: asks, span: end.Sub(start), grants: grants.Load(),
			bound: ct.bound(start, end), least: hour.Rate, errors: errs.Load(), err: firstErr}
		c.exact = append(c.exact, row)
	}

	flowing := redlimit.PerSecond(1000)
	run := &load{env: e, callers: l.callers, duration: 2 * time.Second}
	for _, alg := range algorithms {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		ct := ours(alg.name, alg, e.ap, flowing, nil)
		decide, err := ct.prepare(ctx, 1)
		if err != nil {
			return err
		}
		s, err := run.run(ctx, decide, callers, 1, nil)
		if err != nil {
			return err
		}
		c.exact = append(c.exact, exactRow{
			limiter: alg.name, config: flowing.String(), asks: int(s.decisions), span: s.end.Sub(s.start), grants: s.grants,
			bound: ct.bound(s.start, s.end), errors: s.errors, err: s.firstErr,
		})
	}
	return nil
}

// runFlush empties Redis's script cache half-way through an auto-pipelined
// run: every EVALSHA in the batches then in flight answers NOSCRIPT, and the
// library must reload and retry without the caller seeing it.
func (c *checks) runFlush(ctx context.Context, e *env, l *load, o options) error {
	callers := o.callers[len(o.callers)-1]
	run := &load{env: e, callers: l.callers, warmup: 100 * time.Millisecond, duration: time.Second}
	for _, alg := range algorithms {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		decide, err := ours(alg.name, alg, e.ap, redlimit.PerSecond(bigRate), nil).prepare(ctx, o.keys)
		if err != nil {
			return err
		}
		// Load the script with one call first: otherwise the warm-up's own
		// NOSCRIPT (the previous run flushed it) would blur the counts.
		if _, err := decide(ctx, 0); err != nil {
			return err
		}
		var flushErr error
		s, err := run.run(ctx, decide, callers, o.keys, func() { flushErr = e.admin.ScriptFlush(ctx).Err() })
		if err != nil {
			return err
		}
		if flushErr != nil {
			return flushErr
		}
		loads, err := commandStat(ctx, e.admin, "script|load", "calls")
		if err != nil {
			return err
		}
		failed, err := errorCount(ctx, e.admin, "NOSCRIPT")
		if err != nil {
			return err
		}
		c.flush = append(c.flush, flushRow{limiter: alg.name + ", auto-pipelined", decisions: s.decisions, after: s.late,
			rate: s.rate, errors: s.errors, firstErr: s.firstErr, scriptLoads: loads, noscripts: failed})
	}
	return nil
}

// errorCount reads how many replies of an error prefix Redis sent since
// the last CONFIG RESETSTAT (INFO errorstats).
func errorCount(ctx context.Context, admin *redis.Client, prefix string) (int64, error) {
	v, err := infoField(ctx, admin, "errorstats", "errorstat_"+prefix)
	if err == errNoField {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimPrefix(v, "count="), 10, 64)
}

// commandStat reads one field of one command's INFO commandstats line; 0
// when the command has not run.
func commandStat(ctx context.Context, admin *redis.Client, command, field string) (int64, error) {
	v, err := infoField(ctx, admin, "commandstats", "cmdstat_"+command)
	if err == errNoField {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	for _, f := range strings.Split(v, ",") {
		if n, ok := strings.CutPrefix(f, field+"="); ok {
			return strconv.ParseInt(n, 10, 64)
		}
	}
	return 0, nil
}
