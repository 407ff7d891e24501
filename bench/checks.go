package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
)

// runChecks measures what a limiter keeps in Redis (bytes, keys) and the
// token bucket's Redis time per operation against the grants in its window,
// each on an emptied database, into rep's sections.
func runChecks(ctx context.Context, e *env, rep *report) error {
	for _, s := range []struct {
		name string
		run  func(context.Context, *env, *report) error
	}{{"memory", runMemory}, {"keys left", runKeysLeft}, {"keys under load", runLoaded}, {"token bucket log", runLogGrants}} {
		start := time.Now()
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		if err := s.run(ctx, e, rep); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		log("check %s done in %v", s.name, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// memoryName is a typical limiter name (a user id), since the key names are
// part of what MEMORY USAGE counts.
const memoryName = "user:1234567"

func runMemory(ctx context.Context, e *env, rep *report) error {
	short, hour := redlimit.Per(1000, 200*time.Millisecond), redlimit.Per(1_000_000, time.Hour)
	plain := redlimit.New(e.rdb)
	named := func(c *redlimit.Client, alg algorithm, cfg redlimit.Config) *redlimit.Limiter {
		return alg.new(c, memoryName).WithDefault(cfg)
	}
	stored := plain.Funnel(memoryName)
	cases := []struct {
		name   string
		target int64 // bytes; 0 for none
		fill   func() error
	}{
		// 500 grants: one would leave a funnel state that expires 1 ms later.
		{"Funnel, 500 grants", 120, grants(ctx, named(plain, funnel, short), 500)},
		{"FixedWindow", 120, grants(ctx, named(plain, fixedWindow, short), 1)},
		{"SlidingWindow, 10 buckets", 120 + 16*10, slidingFilled(ctx, e.rdb, 10)},
		{"SlidingWindow, 100 buckets", 120 + 16*100, slidingFilled(ctx, e.rdb, 100)},
		{"TokenBucket", 0, grants(ctx, named(plain, tokenBucket, short), 1)},
		// Below and above the size where Redis turns a small listpack zset into a skiplist (128).
		{"TokenBucket, 100 grants in its log (`Per(1000000, 1h)`)", 0, grants(ctx, named(plain, tokenBucket, hour), 100)},
		{"TokenBucket, 1,000 grants in its log", 0, grants(ctx, named(plain, tokenBucket, hour), 1000)},
		{"Funnel, stored config (SetRate)", 0, func() error {
			if err := stored.SetRate(ctx, short); err != nil {
				return err
			}
			return grants(ctx, stored, 1)()
		}},
		{"Funnel, WithRetryWindow(15s)", 0, grants(ctx, named(redlimit.New(e.rdb, redlimit.WithRetryWindow(15*time.Second)), funnel, short), 1)},
	}
	s := rep.section("Memory", fmt.Sprintf("MEMORY USAGE (SAMPLES 0) of every key a limiter named `%s` holds (no prefix), right after\n", memoryName)+
		"its grants: 1 on `Per(1000, 200ms)` unless the row says otherwise; the sliding windows: `Rate 1000,\n"+
		"Interval 1s`, the client's clock stepped one sub-window per grant so every bucket holds one.",
		"| limiter | bytes | target | keys |\n|---|--:|--:|---|")
	for _, cs := range cases {
		if err := e.admin.FlushAll(ctx).Err(); err != nil {
			return err
		}
		if err := cs.fill(); err != nil {
			return fmt.Errorf("%s: %w", cs.name, err)
		}
		keys, err := allKeys(ctx, e.admin)
		if err != nil {
			return err
		}
		var bytes int64
		var names []string
		for _, k := range keys {
			bytes += k.bytes
			names = append(names, fmt.Sprintf("`%s` %d B, ttl %s", k.key, k.bytes, fmtTTL(k.ttl)))
		}
		target := "–"
		if cs.target > 0 {
			target = fmt.Sprintf("≤ %d", cs.target)
		}
		s.row(cs.name, bytes, target, strings.Join(names, "<br>"))
	}
	return nil
}

// grants has l decide n requests, 8 at a time.
func grants(ctx context.Context, l *redlimit.Limiter, n int) func() error {
	return func() error {
		return parallel(ctx, 8, n, func(int) error { _, err := l.Allow(ctx, 1); return err })
	}
}

// slidingFilled grants once in every sub-window of a sliding window of 1 s.
// Its client runs on a clock stepped one sub-window at a time, so no grant
// is left to timing luck.
func slidingFilled(ctx context.Context, rdb redis.Scripter, buckets int) func() error {
	return func() error {
		now := time.Now()
		cfg := redlimit.Config{Rate: 1000, Interval: time.Second, Buckets: buckets}
		l := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now })).SlidingWindow(memoryName).WithDefault(cfg)
		for range buckets {
			if _, err := l.Allow(ctx, 1); err != nil {
				return err
			}
			now = now.Add(cfg.Interval / time.Duration(buckets))
		}
		return nil
	}
}

type keyBytes struct {
	key   string
	bytes int64
	ttl   time.Duration
}

// allKeys lists every key in the (benchmark's own) database with its
// MEMORY USAGE, SAMPLES 0 so that hashes and zsets are counted whole.
func allKeys(ctx context.Context, admin *redis.Client) ([]keyBytes, error) {
	names, err := admin.Keys(ctx, "*").Result()
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []keyBytes
	for _, k := range names {
		bytes, err := admin.MemoryUsage(ctx, k, 0).Result()
		if err == redis.Nil {
			continue // expired since
		}
		ttl, err2 := admin.PTTL(ctx, k).Result()
		if err := cmp.Or(err, err2); err != nil {
			return nil, err
		}
		out = append(out, keyBytes{key: k, bytes: bytes, ttl: ttl})
	}
	return out, nil
}

// runKeysLeft counts the keys a limiter leaves once it is full again, having
// no stored config, and after Delete, with a stored PerClient config, two
// clients and the retry window on, so that every kind of key is there to
// remove.
func runKeysLeft(ctx context.Context, e *env, rep *report) error {
	short := redlimit.Per(1000, 200*time.Millisecond)
	perClient := redlimit.Config{Rate: 1000, Interval: time.Hour, Type: redlimit.PerClient}
	s := rep.section("Keys", "Keys left in the benchmark's own, otherwise empty, database. Drained: 50 grants on\n"+
		"`Per(1000, 200ms)` with no stored config, then a wait of 500 ms (the interval, plus time for\n"+
		"Redis's active expiry). Delete: 50 grants from each of two Clients on a stored PerClient config\n"+
		"`Per(1000, 1h)` with `WithRetryWindow(15s)`, then `Delete` from one of them.",
		"| limiter | after | keys before | keys left | what is left |\n|---|---|--:|--:|---|")
	for _, alg := range algorithms {
		for _, cs := range []struct {
			after  string
			window time.Duration // 0: off
		}{{"drained", 0}, {"drained, WithRetryWindow(200ms)", short.Interval}, {"Delete", 15 * time.Second}} {
			if err := e.admin.FlushAll(ctx).Err(); err != nil {
				return err
			}
			del := cs.after == "Delete"
			var l *redlimit.Limiter
			for range 1 + b2u(del) { // Delete: from two Clients, so two clients' keys
				l = alg.new(redlimit.New(e.rdb, redlimit.WithRetryWindow(cs.window)), memoryName)
				if !del {
					l = l.WithDefault(short)
				} else if err := l.SetRate(ctx, perClient); err != nil {
					return err
				}
				if err := grants(ctx, l, 50)(); err != nil {
					return err
				}
			}
			before := e.admin.DBSize(ctx).Val()
			if !del {
				time.Sleep(short.Interval + 300*time.Millisecond)
			} else if _, err := l.Delete(ctx); err != nil {
				return err
			}
			left, err := allKeys(ctx, e.admin)
			if err != nil {
				return err
			}
			var names []string
			for _, k := range left {
				names = append(names, fmt.Sprintf("`%q` ttl %s", k.key, fmtTTL(k.ttl)))
			}
			s.row(alg.name, cs.after, before, len(left), cmp.Or(strings.Join(names, "<br>"), "nothing"))
		}
	}
	return nil
}

// runLoaded counts the keys in Redis right after 64 callers decided for 2 s
// over -keys limiters, with a limit that never denies and whose state
// outlives the run, so that every limiter touched still holds all its keys.
func runLoaded(ctx context.Context, e *env, rep *report) error {
	callers, limiters := 64, rep.keys
	run := &load{env: e, warmup: rep.warmup, duration: 2 * time.Second}
	long := redlimit.Per(bigRate, 1000*time.Hour) // a grant keeps a funnel's state 3.6 s
	s := rep.section("", fmt.Sprintf("DBSIZE right after %d callers decided for %v over %s limiters, at `Per(%d, 1000h)`: it never\n",
		callers, run.duration, fmtRate(float64(limiters)), bigRate)+
		"denies, and each grant keeps a limiter's state 3.6 s longer, so every limiter touched still holds its keys.",
		"| limiter | decisions | keys in Redis | keys per limiter |\n|---|--:|--:|--:|")
	contenders := everyAlgorithm("", e.rdb, long, nil)
	contenders = append(contenders, ours("Funnel, WithRetryWindow(15s)", funnel, e.rdb, long, nil, redlimit.WithRetryWindow(15*time.Second)))
	for _, c := range contenders {
		sm, err := run.measure(ctx, c, callers, limiters)
		if err != nil {
			return err
		}
		n, err := e.admin.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		s.row(c.name, fmtRate(float64(sm.decisions)), fmtRate(float64(n)), float64(n)/float64(limiters))
	}
	return nil
}

// logSlices is the number of slices of its interval the token bucket's
// grants coalesce by (scripts/tokenbucket.lua): at most logSlices + 1
// records in its log, whatever the number of grants.
const logSlices = 64

// runLogGrants measures the Redis time of every token-bucket operation with
// 10,000, 100,000 and 1,000,000 single-permit grants in its window of an
// hour. The grants go through the auto-pipeliner on a clock the benchmark
// sets, spread over the hour's slices as a steady load would leave them;
// every operation then runs at the same instant, on that log or on a COPY
// of it (server-side, not timed), so that an operation that changes the log
// (Release, SetRate, the first call after the burst aged out) is timed
// again and again on the same log, and the clock jumps an hour with no
// wait.
func runLogGrants(ctx context.Context, e *env, rep *report) error {
	const warmup, batches, batch = 2, 7, 20
	sizes := []int{10_000, 100_000, 1_000_000}
	var clock atomic.Int64 // Unix ns
	client := redlimit.New(e.rdb, redlimit.WithClock(func() time.Time { return time.Unix(0, clock.Load()) }))
	filler := redlimit.New(e.ap, redlimit.WithClock(func() time.Time { return time.Unix(0, clock.Load()) }))
	type op struct {
		name   string
		calls  int                                    // per batch: 1 is a single call on a fresh copy
		at     func(last time.Time) time.Time         // the instant it runs at, from the last slice's
		run    func(l *redlimit.Limiter, n int) error // n: the grants in the window
		figure []float64
	}
	inWindow := func(last time.Time) time.Time { return last.Add(500 * time.Millisecond) }
	check := func(_ any, err error) error { return err }
	ops := []*op{
		{name: "Allow(1), granted", calls: batch, at: inWindow, run: func(l *redlimit.Limiter, _ int) error {
			r, err := l.Allow(ctx, 1)
			if err == nil && !r.Allowed {
				err = fmt.Errorf("Allow(1) denied, %d remaining", r.Remaining)
			}
			return err
		}},
		{name: "Allow(Rate), denied: more than is free, so its retry-after waits for every record", calls: batch, at: inWindow, run: func(l *redlimit.Limiter, n int) error {
			r, err := l.Allow(ctx, logRate(n))
			if err == nil && r.Allowed {
				err = fmt.Errorf("Allow(%d) granted", logRate(n))
			}
			return err
		}},
		{name: "AvailablePermits", calls: batch, at: inWindow, run: func(l *redlimit.Limiter, _ int) error {
			return check(l.AvailablePermits(ctx))
		}},
		{name: "Reserve(1) and its Release: the release reads its own record only", calls: 1, at: inWindow, run: func(l *redlimit.Limiter, _ int) error {
			res, err := l.Reserve(ctx, 1)
			if err != nil {
				return err
			}
			_, err = res.Release(ctx, 1)
			return err
		}},
		{name: "Allow(1) after the value key was deleted: the log summed again", calls: 1, at: inWindow, run: func(l *redlimit.Limiter, _ int) error {
			if err := e.rdb.Del(ctx, tokenBucketKeys(l.Name())[1]).Err(); err != nil {
				return err
			}
			return check(l.Allow(ctx, 1))
		}},
		{name: "SetRate(Rate × 9/10)", calls: 1, at: inWindow, run: func(l *redlimit.Limiter, n int) error {
			return l.SetRate(ctx, redlimit.PerHour(logRate(n)*9/10))
		}},
		{name: "the first TryAcquire(1) after the burst aged out: drops every record", calls: 1,
			at: func(last time.Time) time.Time { return last.Add(time.Hour + time.Second) },
			run: func(l *redlimit.Limiter, _ int) error {
				ok, err := l.TryAcquire(ctx, 1)
				if err == nil && !ok {
					err = errors.New("TryAcquire(1) denied")
				}
				return err
			}},
	}
	records := []any{"records in the log after the grants", "–"}
	header := "| operation | calls per batch |"
	for _, n := range sizes {
		start := time.Now()
		name := fmt.Sprintf("bench:tb:%d", n)
		cfg := redlimit.PerHour(logRate(n))
		if err := client.TokenBucket(name).SetRate(ctx, cfg); err != nil {
			return err
		}
		// Slices of the interval as the script cuts them, from the next one
		// on the wall clock; slice k gets its share of n at its start.
		q := (cfg.Interval.Milliseconds() + logSlices - 1) / logSlices
		first := (time.Now().UnixMilli()/q + 1) * q
		f := filler.TokenBucket(name)
		for k := range logSlices {
			clock.Store(time.UnixMilli(first + int64(k)*q).UnixNano())
			err := parallel(ctx, 256, n*(k+1)/logSlices-n*k/logSlices, func(int) error {
				ok, err := f.TryAcquire(ctx, 1)
				if err == nil && !ok {
					err = errors.New("a grant of the fill denied")
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("%d grants, slice %d: %w", n, k, err)
			}
		}
		last := time.UnixMilli(first + (logSlices-1)*q)
		held, err := e.admin.ZCard(ctx, tokenBucketKeys(name)[2]).Result()
		if err != nil {
			return err
		}
		records = append(records, fmtRate(float64(held)))
		header += fmt.Sprintf(" %s grants |", fmtRate(float64(n)))
		log("token bucket: %s grants in %v, %d records", fmtRate(float64(n)), time.Since(start).Round(time.Millisecond), held)

		for _, o := range ops {
			var usecs []float64
			// The first batches warm up: in every trial run, the first
			// two Releases took 4 to 10 times as long as the rest, and
			// the first batch of Allow(1) twice as long.
			for b := range warmup + batches {
				l := client.TokenBucket(name)
				if o.calls == 1 {
					copied := fmt.Sprintf("%s:copy%d", name, b)
					for k, src := range tokenBucketKeys(name) {
						if err := e.admin.Copy(ctx, src, tokenBucketKeys(copied)[k], 0, true).Err(); err != nil {
							return fmt.Errorf("COPY %s: %w", src, err)
						}
					}
					l = client.TokenBucket(copied)
					// A single call starts on a collected Lua heap, so that
					// it does not pay for the garbage of the calls before it.
					if err := e.admin.Eval(ctx, "collectgarbage('collect') return 1", nil).Err(); err != nil {
						return err
					}
				}
				clock.Store(o.at(last).UnixNano())
				if err := e.admin.ConfigResetStat(ctx).Err(); err != nil {
					return err
				}
				for range o.calls {
					if err := o.run(l, n); err != nil {
						return fmt.Errorf("%d grants, %s: %w", n, o.name, err)
					}
				}
				st, err := evalshaStats(ctx, e.admin)
				if err != nil {
					return err
				} else if st.calls != int64(o.calls) {
					return fmt.Errorf("%d grants, %s: %d EVALSHA, want %d", n, o.name, st.calls, o.calls)
				}
				if b >= warmup {
					usecs = append(usecs, st.perCall())
				}
			}
			o.figure = append(o.figure, median(usecs))
			log("token bucket: %s grants, %s: %.2f µs (batches %v)", fmtRate(float64(n)), o.name, median(usecs), usecs)
		}
	}
	s := rep.section("Token bucket: Redis time against the grants in its window",
		fmt.Sprintf("`PerHour(Rate)`, Rate = grants × 5/4, stored with SetRate; the grants, of one permit each, spread\n"+
			"evenly over the %d slices of the hour that the log coalesces by (the benchmark sets the limiter's\n"+
			"clock with `WithClock`, so filling the window takes no hour). Every operation then runs half a\n"+
			"second into the last slice (the first TryAcquire an hour and a second later). Redis µs per call:\n"+
			"`usec_per_call` of `cmdstat_evalsha`, reset before each batch, the median of %d batches. A batch of\n"+
			"%d calls runs on the filled log itself; a batch of 1 is a single call, on a fresh COPY of the filled\n"+
			"keys (not timed) since it changes the log, and after a full Lua garbage collection (not timed), so\n"+
			"that it does not pay for the garbage of the calls before it: single calls are noisier (a median of\n"+
			"%d single calls). Each operation's first %d batches warm up and are not counted.",
			logSlices, batches, batch, batches, warmup),
		header+"\n|---|--:|"+strings.Repeat("--:|", len(sizes)))
	s.row(records...)
	for _, o := range ops {
		s.row(append([]any{o.name, o.calls}, toAny(o.figure)...)...)
	}
	return nil
}

// logRate is the rate of the limiter holding n grants: above them, with
// room for the grants the batches add.
func logRate(n int) int64 { return int64(n) * 5 / 4 }

// tokenBucketKeys are the keys of the token bucket named name (a name
// without braces) in Redisson's layout: its config hash, the value key and
// the log.
func tokenBucketKeys(name string) [3]string {
	return [3]string{name, "{" + name + "}:value", "{" + name + "}:permits"}
}

// toAny is xs as row cells.
func toAny[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}
