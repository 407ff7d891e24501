package redlimit

import (
	"context"
	"encoding/binary"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/wire"
)

// algo is what the suites know of one algorithm, said once: how to make a
// limiter, how to configure it, its guarantee, and how to read its usage
// from a reply or from Redis. Every suite takes it from algorithms.
type algo struct {
	name string
	new  func(c *Client, name string) *Limiter

	// tune sets the config field only this algorithm reads (the funnel's
	// Burst, the sliding window's Buckets) to burst or buckets.
	tune func(cfg Config, burst int64, buckets int) Config
	// counting grants capacity permits and refills none while a test runs.
	counting func(capacity int64) Config
	overallState
	// corruptions are broken states of this algorithm's own keys, which the
	// scripts must refuse as ErrCorruptState.
	corruptions func(rdb redis.UniversalClient) []corruption

	// cells states a window algorithm's guarantee as a bound over a span: no
	// n consecutive cells of width µs hold more than Rate grants. nil for
	// the funnel, whose bound is GCRA's: Burst + Rate × span / Interval.
	cells func(cfg Config) (width, n int64)
	// breaches reports (until report says stop) grants sorted by lo that
	// break the guarantee, each placed where it is most favourable to the
	// library; latest(i, j) is where grants[i..j] can end at the latest.
	breaches func(cfg Config, grants []placed, latest func(i, j int) int64, report func(format string, args ...any) bool)
	// grid is what a reply says of when it was decided: now + ResetAfter
	// lands on a multiple of grid µs (0: the reply does not say).
	grid func(cfg Config, d decision) (int64, error)
	// counted reads how many permits Redis counts as granted (Overall state,
	// one permit a grant) and checks the state agrees with itself.
	counted func(t *testing.T, admin *redis.Client, l *Limiter, cfg Config) int64
}

// overallState is where an algorithm keeps a limiter's Overall state, and
// what follows from that.
type overallState struct {
	// namesItself: the config hash says which algorithm it is (Redisson's,
	// the token bucket's, does not).
	namesItself bool
	// grantedTwice is how many of ten TryAcquire(1) on tenPer10s are granted
	// when every script runs twice: the token bucket's log counts a record
	// once, the others count each run.
	grantedTwice int
	// stateKeys are the keys a limiter called name holds with a default
	// config and some usage.
	stateKeys func(name string) []string
	// setState puts value where a limiter keeps its Overall state.
	setState func(rdb redis.UniversalClient, l *Limiter, value string)
}

// inConfigHash is the Overall state of the funnel and the windows: one
// field of the config hash, which names the algorithm, so a limiter with a
// default holds that one key; a grant whose script ran twice counts twice.
func inConfigHash(field string) overallState {
	return overallState{
		namesItself:  true,
		grantedTwice: 5,
		stateKeys:    func(name string) []string { return []string{name} },
		setState: func(rdb redis.UniversalClient, l *Limiter, value string) {
			ctx := context.Background()
			if rdb.Type(ctx, l.Name()).Val() == "string" { // a flat state
				rdb.Set(ctx, l.Name(), value, redis.KeepTTL)
				return
			}
			rdb.HSet(ctx, l.Name(), field, value)
		},
	}
}

// overallField reads a field of a limiter's Overall state (the funnel's and
// the windows'): from the config hash, or from the flat state a limiter
// without a stored config keeps, a string of the fields in order.
func overallField(admin *redis.Client, name, field string) *redis.StringCmd {
	ctx := context.Background()
	if admin.Type(ctx, name).Val() != "string" {
		return admin.HGet(ctx, name, field)
	}
	value, err := admin.Get(ctx, name).Result()
	parts := strings.Fields(value)
	if at := map[string]int{"count": 1}[field]; err == nil && at < len(parts) {
		value = parts[at]
	}
	return redis.NewStringResult(value, err)
}

// corruption breaks a limiter's state in one way.
type corruption struct {
	what  string
	apply func(l *Limiter)
}

// reads says whether cfg sets a field only this algorithm reads.
func (a algo) reads(cfg Config) bool {
	return !reflect.DeepEqual(a.tune(Config{}, cfg.Burst, cfg.Buckets), Config{})
}

var (
	tokenBucketAlgo = algo{
		name:     "tokenbucket",
		new:      (*Client).TokenBucket,
		tune:     func(cfg Config, _ int64, _ int) Config { return cfg },
		counting: countingWindow,
		overallState: overallState{
			grantedTwice: 10,
			// With a default, the marker in name tells the other algorithms
			// that the name holds a token bucket (scripts/common.lua).
			stateKeys: func(name string) []string {
				return []string{name, wire.KeyOf(name, "permits"), wire.KeyOf(name, "value")}
			},
			setState: func(rdb redis.UniversalClient, l *Limiter, value string) {
				rdb.Del(context.Background(), l.keys[1])
				rdb.Set(context.Background(), l.keys[1], value, 0)
			},
		},
		corruptions: func(rdb redis.UniversalClient) []corruption {
			return []corruption{{"a record too short to hold a count (read as it ages out)", func(l *Limiter) {
				rdb.ZAdd(context.Background(), l.keys[2], redis.Z{Score: float64(epoch.Add(-time.Minute).UnixMilli()), Member: "ab"})
			}}}
		},
		cells: func(cfg Config) (int64, int64) { return 1000, cfg.Interval.Milliseconds() },
		breaches: func(cfg Config, grants []placed, latest func(i, j int) int64, report func(string, ...any) bool) {
			// The log keeps grants by millisecond: rate+1 grants whose
			// milliseconds are less than the interval apart are one too many.
			rate := int(cfg.Rate)
			intervalMS := cfg.Interval.Milliseconds()
			for i := 0; i+rate < len(grants); i++ {
				first, last := floorDiv(grants[i].lo, 1000), floorDiv(latest(i, i+rate), 1000)
				if last-first < intervalMS && !report("%d grants within %dms (< interval %dms) from %d", rate+1, last-first, intervalMS, grants[i].lo) {
					break
				}
			}
		},
		grid: func(cfg Config, d decision) (int64, error) {
			if !d.Allowed {
				return 0, nil
			}
			// ResetAfter = (now_ms + interval_ms)·1000 − now_µs.
			interval := cfg.Interval.Microseconds()
			if d.Reset <= interval-1000 || d.Reset > interval {
				return 0, fmt.Errorf("token bucket grant with ResetAfter %dµs: its own record is not the newest in the log", d.Reset)
			}
			return 1000, nil
		},
		counted: func(t *testing.T, admin *redis.Client, l *Limiter, cfg Config) int64 {
			state := l.keys[1:] // the token bucket's shared state keys
			members, err := admin.ZRange(context.Background(), state[1], 0, -1).Result()
			require.NoError(t, err)
			var sum int64
			for _, m := range members {
				require.Len(t, m, 21, "a log record: 0x10, 16 id bytes, count")
				sum += int64(binary.LittleEndian.Uint32([]byte(m[17:])))
			}
			value, err := admin.Get(context.Background(), state[0]).Int64()
			require.NoError(t, err)
			assert.Equal(t, cfg.Rate-sum, value, "the cached value agrees with the log")
			return sum
		},
	}

	funnelAlgo = algo{
		name:         "funnel",
		new:          (*Client).Funnel,
		tune:         func(cfg Config, burst int64, _ int) Config { cfg.Burst = burst; return cfg },
		counting:     func(capacity int64) Config { return Config{Rate: 1, Interval: time.Hour, Burst: capacity} },
		overallState: inConfigHash("tat"),
		corruptions:  func(redis.UniversalClient) []corruption { return nil },
		breaches: func(cfg Config, grants []placed, _ func(i, j int) int64, report func(string, ...any) bool) {
			// GCRA: any k grants span at least (k − burst) emission intervals.
			emission := cfg.Interval.Microseconds() / cfg.Rate
			for i := range grants {
				hi := grants[i].hi
				for j := i; j < len(grants); j++ {
					hi = max(hi, grants[j].hi)
					k := int64(j - i + 1)
					if (k-cfg.Burst)*emission > hi-grants[i].lo {
						if !report("%d grants within %dµs: more than burst %d + %dµs / %dµs", k, hi-grants[i].lo, cfg.Burst, hi-grants[i].lo, emission) {
							return
						}
						break
					}
				}
			}
		},
		grid: func(Config, decision) (int64, error) { return 0, nil },
		counted: func(t *testing.T, admin *redis.Client, l *Limiter, cfg Config) int64 {
			// TAT = first grant + n × emission; the first grant was less than
			// one emission (an hour) ago.
			tat, err := overallField(admin, l.Name(), "tat").Int64()
			require.NoError(t, err)
			now, err := admin.Time(context.Background()).Result()
			require.NoError(t, err)
			emission := cfg.Interval.Microseconds() / cfg.Rate
			return ceilDiv(tat-now.UnixMicro(), emission)
		},
	}

	fixedWindowAlgo = algo{
		name:         "fixed_window",
		new:          (*Client).FixedWindow,
		tune:         func(cfg Config, _ int64, _ int) Config { return cfg },
		counting:     countingWindow,
		overallState: inConfigHash("window"),
		corruptions: func(rdb redis.UniversalClient) []corruption {
			return []corruption{{"half a window", func(l *Limiter) { rdb.HDel(context.Background(), l.Name(), "count") }}}
		},
		cells: func(cfg Config) (int64, int64) { return cfg.Interval.Microseconds(), 1 },
		breaches: func(cfg Config, grants []placed, _ func(i, j int) int64, report func(string, ...any) bool) {
			interval := cfg.Interval.Microseconds()
			counts := map[int64]int{}
			for _, p := range grants {
				// A wide bracket counts in the window it may be in that holds
				// fewer: the favourable choice.
				w, v := floorDiv(p.lo, interval), floorDiv(p.hi, interval)
				if w != v && counts[v] < counts[w] {
					w = v
				}
				counts[w]++
			}
			for w, n := range counts {
				if n > int(cfg.Rate) && !report("%d grants in the window starting at %d", n, w*interval) {
					break
				}
			}
		},
		grid: func(cfg Config, _ decision) (int64, error) { return cfg.Interval.Microseconds(), nil },
		counted: func(t *testing.T, admin *redis.Client, l *Limiter, _ Config) int64 {
			n, err := overallField(admin, l.Name(), "count").Int64()
			require.NoError(t, err)
			return n
		},
	}

	slidingWindowAlgo = algo{
		name:         "sliding_window",
		new:          (*Client).SlidingWindow,
		tune:         func(cfg Config, _ int64, buckets int) Config { cfg.Buckets = buckets; return cfg },
		counting:     countingWindow,
		overallState: inConfigHash("counts"),
		corruptions: func(rdb redis.UniversalClient) []corruption {
			set := func(counts string) func(l *Limiter) {
				return func(l *Limiter) { rdb.HSet(context.Background(), l.Name(), "counts", counts) }
			}
			return []corruption{
				{"a sub-window that is not a number", set("x:1")},
				{"a sub-window without its count", set("1700000000000:1,100")},
				{"an empty sub-window", set("1700000000000:1,,100:1")},
				{"a trailing comma", set("1700000000000:1,")},
			}
		},
		cells: slidingCells,
		breaches: func(cfg Config, grants []placed, latest func(i, j int) int64, report func(string, ...any) bool) {
			rate := int(cfg.Rate)
			interval := cfg.Interval.Microseconds()
			// No span shorter than interval × (buckets−1)/buckets holds more than rate.
			span := interval * int64(cfg.Buckets-1) / int64(cfg.Buckets)
			for i := 0; i+rate < len(grants); i++ {
				if d := latest(i, i+rate) - grants[i].lo; d < span && !report("%d grants within %dµs (< %dµs) from %d", rate+1, d, span, grants[i].lo) {
					break
				}
			}
			// And exactly: no buckets consecutive sub-windows hold more than rate.
			width, n := slidingCells(cfg)
			counts := map[int64]int{}
			for _, p := range grants {
				if p.lo == p.hi {
					counts[floorDiv(p.lo, width)]++
				}
			}
			for c := range counts {
				total := 0
				for k := c - n + 1; k <= c; k++ {
					total += counts[k]
				}
				if total > rate && !report("%d grants in the %d sub-windows ending with sub-window %d", total, n, c) {
					break
				}
			}
		},
		grid: func(cfg Config, d decision) (int64, error) {
			if !d.Allowed {
				return 0, nil
			}
			return cfg.Interval.Microseconds() / int64(cfg.Buckets), nil
		},
		counted: func(t *testing.T, admin *redis.Client, l *Limiter, _ Config) int64 {
			counts, err := overallField(admin, l.Name(), "counts").Result()
			require.NoError(t, err)
			var sum int64
			for _, sub := range strings.Split(counts, ",") {
				_, count, ok := strings.Cut(sub, ":")
				require.True(t, ok, counts)
				n, err := strconv.ParseInt(count, 10, 64)
				require.NoError(t, err)
				sum += n
			}
			return sum
		},
	}

	algorithms = []algo{tokenBucketAlgo, funnelAlgo, fixedWindowAlgo, slidingWindowAlgo}
)

// countingWindow is a window algorithm's counting config: windows of ten
// years, aligned to the epoch, so a test crosses an edge once a decade (the
// next in December 2029).
func countingWindow(capacity int64) Config { return Per(capacity, maxInterval) }

// slidingCells are the sliding window's sub-windows.
func slidingCells(cfg Config) (int64, int64) {
	return cfg.Interval.Microseconds() / int64(cfg.Buckets), int64(cfg.Buckets)
}

// otherThan is an algorithm that is not a, for a config hash claiming the
// wrong one.
func otherThan(a algo) algo {
	if a.name == funnelAlgo.name {
		return fixedWindowAlgo
	}
	return funnelAlgo
}

func algorithmNamed(name string) (algo, bool) {
	for _, a := range algorithms {
		if a.name == name {
			return a, true
		}
	}
	return algo{}, false
}
