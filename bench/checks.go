package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
)

// runChecks measures what a limiter keeps in Redis (bytes, keys) and how the
// token bucket's Redis time grows with its log, each on an emptied
// database, into rep's sections.
func runChecks(ctx context.Context, e *env, rep *report) error {
	for _, s := range []struct {
		name string
		run  func(context.Context, *env, *report) error
	}{{"memory", runMemory}, {"keys left", runKeysLeft}, {"keys under load", runLoaded}, {"token bucket log size", runLogSize}} {
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

// runLogSize measures the token bucket's Redis time per Allow with logs of
// 10, 1,000 and 100,000 records, granted through the auto-pipeliner. Rate is
// records + 50 and the interval an hour, so in each batch 50 grants succeed,
// 50 more are denied with a full log, and Release(50) brings the log back to
// its size: the figures are the medians over the batches, the three sizes
// taking turns.
func runLogSize(ctx context.Context, e *env, rep *report) error {
	const batch, batches = 50, 15
	sizes := []int{10, 1000, 100_000}
	limiters := make([]*redlimit.Limiter, len(sizes))
	for i, n := range sizes {
		cfg, name := redlimit.Per(int64(n+batch), time.Hour), fmt.Sprintf("%s:log%d", memoryName, n)
		limiters[i] = redlimit.New(e.rdb).TokenBucket(name).WithDefault(cfg)
		filler := redlimit.New(e.ap).TokenBucket(name).WithDefault(cfg)
		if err := parallel(ctx, 256, n, func(int) error { _, err := filler.Allow(ctx, 1); return err }); err != nil {
			return err
		}
	}
	usecs := make([][2][]float64, len(sizes)) // grants, denials
	for range batches {
		for i, l := range limiters {
			for _, granted := range []bool{true, false} {
				if err := e.admin.ConfigResetStat(ctx).Err(); err != nil {
					return err
				}
				for range batch {
					if r, err := l.Allow(ctx, 1); err != nil || r.Allowed != granted {
						return fmt.Errorf("%d records: allowed %v (%v), want %v", sizes[i], r.Allowed, err, granted)
					}
				}
				_, usec, err := evalshaStats(ctx, e.admin)
				if err != nil {
					return err
				}
				usecs[i][b2u(!granted)] = append(usecs[i][b2u(!granted)], usec)
			}
			if err := l.Release(ctx, batch); err != nil {
				return err
			}
		}
	}
	s := rep.section("Token bucket: Redis time against the size of its log",
		"Interval 1h, Rate = records + 50. Then 15 batches, the sizes taking turns: 50 grants, 50 denials\n"+
			"on the full log, Release(50); medians of the batches' Redis µs per call.",
		"| records in the log | Redis µs per grant | Redis µs per denial |\n|--:|--:|--:|")
	for i, n := range sizes {
		s.row(fmtRate(float64(n)), median(usecs[i][0]), median(usecs[i][1]))
	}
	return nil
}
