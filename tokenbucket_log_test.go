package redlimit

import (
	"context"
	"encoding/binary"
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

	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/wire"
)

// Issue 24, item 1: Redisson's log keeps a record's permits in 4 bytes, so
// Per(1<<33, 3h) granted 2^34 permits in one window (2^32 + 1 logged as 1,
// 2^32 as 0). A token bucket's own rate must fit: 2^32 or more is refused,
// from Go and from a stored config, and the largest that fits counts
// exactly.
func TestTokenBucketRateFitsTheLog(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		name := uniqueName(t)
		l := newClient(rdb, newClock()).TokenBucket(name)
		for _, cfg := range []Config{Per(1<<33, 3*time.Hour), Per(1<<32, 3*time.Hour), Per(1<<32, 3*time.Hour).And(Per(1<<33, 4*time.Hour))} {
			err := l.Validate(cfg)
			assert.ErrorIs(t, err, ErrInvalidConfig, "%v", cfg)
			assert.ErrorContains(t, err, "4 bytes")
			assert.ErrorIs(t, l.SetRate(ctx, cfg), ErrInvalidConfig)
			_, err = l.TrySetRate(ctx, cfg)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			_, err = l.WithDefault(cfg).Allow(ctx, 4294967297)
			assert.ErrorIs(t, err, ErrInvalidConfig)
		}
		assert.Empty(t, limiterKeys(t, rdb, name), "nothing written")
		// A further rate keeps decimal counts: it may be larger.
		assert.NoError(t, l.Validate(Per(1<<31, time.Hour).And(Per(1<<33, 3*time.Hour))))
		assert.NoError(t, newClient(rdb, newClock()).Funnel(name).Validate(Per(1<<33, 3*time.Hour)), "only the token bucket keeps Redisson's log")

		// A config stored by another client (a Java service) is refused too.
		require.NoError(t, rdb.HSet(ctx, l.Name(), "rate", strconv.FormatInt(1<<33, 10), "interval", "10800000", "type", "0").Err())
		before := snapshot(t, rdb, name)
		_, err := l.Allow(ctx, 4294967297)
		assert.ErrorIs(t, err, ErrCorruptState)
		assert.ErrorContains(t, err, "rate")
		_, err = l.Config(ctx)
		assert.ErrorIs(t, err, ErrCorruptState)
		assert.Equal(t, before, snapshot(t, rdb, name), "and nothing written")
		_, err = l.Delete(ctx)
		require.NoError(t, err)

		// The largest rate that fits: every permit counted, in one record.
		largest := Per(1<<32-1, 3*time.Hour)
		require.NoError(t, l.SetRate(ctx, largest))
		r, err := l.Allow(ctx, 1<<32-2)
		require.NoError(t, err)
		assert.True(t, r.Allowed)
		assert.Equal(t, int64(1), r.Remaining)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.True(t, r.Allowed)
		assert.Zero(t, r.Remaining)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "2^32 − 1 granted of 2^32 − 1")
		records := rdb.ZRange(ctx, l.keys[2], 0, -1).Val()
		require.Len(t, records, 1)
		assert.Equal(t, uint32(1<<32-1), binary.LittleEndian.Uint32([]byte(records[0])[17:]))
		assertLogAgrees(t, rdb, l, 1<<32-1)
	})
}

// logSlices is the number of slices the token bucket's records coalesce by
// (scripts/tokenbucket.lua): at most logSlices + 1 records in a window.
const logSlices = 64

// fillLog grants perSlice single permits in each of slices consecutive
// slices of l's interval, at each slice's start, through many callers at
// once on an AutoPipeliner, and returns the slices' times.
func fillLog(t *testing.T, rdb redis.UniversalClient, alg *wire.Algorithm, name string, clk *clock, cfg Config, slices, perSlice int) []time.Time {
	t.Helper()
	ctx := context.Background()
	var ap redis.Scripter = rdb
	if c, ok := rdb.(*redis.Client); ok {
		p, err := c.AutoPipeline()
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		ap = p
	}
	l := newClient(ap, clk).limiter(name, alg)
	q := ceilDiv(cfg.Interval.Milliseconds(), logSlices)
	first := (floorDiv(clk.Now().UnixMilli(), q) + 1) * q
	var at []time.Time
	for k := range slices {
		clk.Set(time.UnixMilli(first + int64(k)*q))
		at = append(at, clk.Now())
		var left, denied atomic.Int64
		left.Store(int64(perSlice))
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					ok, err := l.TryAcquire(ctx, 1)
					if err != nil || !ok {
						denied.Add(1)
					}
				}
			})
		}
		wg.Wait()
		require.Zero(t, denied.Load(), "slice %d: every grant allowed", k)
	}
	return at
}

// Issue 24, item 6: a token-bucket call did work in proportion to its log
// (a denied Allow(1_000_000) took 725ms with 200,000 grants logged). After
// a million grants in one window (real Redis; fewer on miniredis, which
// runs the same script), the log holds at most logSlices + 1 records, and
// every operation answers exactly as tokenModel (coalescing by slices) says.
func TestTokenBucketLogBoundedAfterManyGrants(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		rdb := connect()
		ctx := context.Background()
		perSlice := 1_000_000 / logSlices // 15,625 a slice, a million in all
		if _, ok := rdb.(*redis.ClusterClient); ok || testing.Short() {
			perSlice = 100_000 / logSlices
		}
		if strings.Contains(t.Name(), "miniredis") {
			perSlice = 50
		}
		cfg := PerHour(1_250_000) // room for a reservation after the million
		clk := newClock()
		name := uniqueName(t)
		l := newClient(rdb, clk).TokenBucket(name)
		require.NoError(t, l.SetRate(ctx, cfg))
		at := fillLog(t, rdb, wire.TokenBucket, name, clk, cfg, logSlices, perSlice)
		n := int64(perSlice * logSlices)

		model := &tokenModel{rate: cfg.Rate, intervalMS: cfg.Interval.Milliseconds()}
		for _, t := range at {
			model.take(t.UnixMicro(), int64(perSlice))
		}
		records := func(what string) {
			t.Helper()
			got := rdb.ZCard(ctx, l.keys[2]).Val()
			assert.LessOrEqual(t, got, int64(logSlices+1), "%s: %d records", what, got)
			assert.Equal(t, int64(len(model.live(clk.Now().UnixMicro()))), got, "%s: one record a slice", what)
			assertLogAgrees(t, rdb, l, model.rate)
		}
		// allow checks one Allow's answer against the model's.
		allow := func(what string, permits int64) {
			t.Helper()
			now := clk.Now().UnixMicro()
			wait := model.wait(now, permits)
			if permits > model.rate {
				wait = -1
			}
			if wait == 0 && permits > 0 {
				model.take(now, permits)
			}
			remaining, reset := model.state(now)
			r, err := l.Allow(ctx, permits)
			require.NoError(t, err)
			want := Result{Allowed: wait == 0, Limit: model.rate, Remaining: max(0, remaining), ResetAfter: time.Duration(reset) * time.Microsecond,
				RetryAfter: time.Duration(wait) * time.Microsecond, Window: cfg.Interval}
			if wait < 0 {
				want.RetryAfter = Never
			}
			assert.Equal(t, want, r, "%s", what)
			records(what)
		}
		records(fmt.Sprintf("%d grants", n))
		clk.Add(500 * time.Millisecond) // in the last slice

		allow("a denied Allow(Rate)", cfg.Rate)
		available, err := l.AvailablePermits(ctx)
		require.NoError(t, err)
		assert.Equal(t, cfg.Rate-n, available)

		// A reservation's release gives back from its own record: it joins
		// the last slice's, and leaves it as it was but for its time.
		back := (cfg.Rate - n) / 2
		res, err := l.Reserve(ctx, back)
		require.NoError(t, err)
		require.Equal(t, back, res.Taken)
		model.take(clk.Now().UnixMicro(), back)
		records("Reserve")
		gave, err := res.Release(ctx, back)
		require.NoError(t, err)
		assert.Equal(t, back, gave)
		model.log[len(model.log)-1].n -= back
		records("Release")
		available, err = l.AvailablePermits(ctx)
		require.NoError(t, err)
		assert.Equal(t, cfg.Rate-n, available)

		require.NoError(t, rdb.Del(ctx, l.keys[1]).Err())
		allow("Allow(1) after the value key was lost", 1)

		cfg = PerHour(900_000)
		require.NoError(t, l.SetRate(ctx, cfg))
		model.rate = cfg.Rate
		records("SetRate")
		allow("a peek after SetRate", 0)

		// The burst ages out: the first call after it drops every record.
		clk.Set(time.UnixMilli(model.log[len(model.log)-1].ms).Add(cfg.Interval + time.Millisecond))
		allow("the first TryAcquire(1) after the burst aged out", 1)
		assert.Equal(t, int64(1), rdb.ZCard(ctx, l.keys[2]).Val())
		allow("a denied Allow(900_000)", 900_000)
	})
}

// The further rates' grants log (several rates, Config.And) coalesces by
// slices of each rate's interval too: after a million grants (real Redis)
// each rate holds at most logSlices + 1 records, and every answer is
// limiterModel's.
func TestTokenBucketGrantsLogBoundedAfterManyGrants(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		rdb := connect()
		ctx := context.Background()
		perSlice := 1_000_000 / logSlices
		if _, ok := rdb.(*redis.ClusterClient); ok || testing.Short() {
			perSlice = 100_000 / logSlices
		}
		if strings.Contains(t.Name(), "miniredis") {
			perSlice = 50
		}
		cfg := PerMinute(1_000_000).And(PerHour(2_000_000), Per(3_000_000, 2*time.Hour))
		clk := newClock()
		name := uniqueName(t)
		l := newClient(rdb, clk).TokenBucket(name)
		require.NoError(t, l.SetRate(ctx, cfg))
		// 64 slices of the hour, each a grant of perSlice single permits.
		at := fillLog(t, rdb, wire.TokenBucket, name, clk, PerHour(1), logSlices, perSlice)
		model := newLimiterModel(tokenBucketAlgo, cfg)
		for _, t := range at {
			model.allow(t.UnixMicro(), int64(perSlice))
		}
		grants := wire.KeyOf(l.Name(), "grants")
		records := func(what string) {
			t.Helper()
			got := rdb.ZCard(ctx, grants).Val()
			assert.LessOrEqual(t, got, int64(2*(logSlices+1)), "%s: %d records for the two further rates", what, got)
			assert.LessOrEqual(t, rdb.ZCard(ctx, l.keys[2]).Val(), int64(logSlices+1), "%s: the first rate's", what)
		}
		allow := func(what string, permits int64) {
			t.Helper()
			want := model.allow(clk.Now().UnixMicro(), permits)
			got, err := l.Allow(ctx, permits)
			require.NoError(t, err)
			assert.Equal(t, want, got, "%s", what)
			records(what)
		}
		records(fmt.Sprintf("%d grants", perSlice*logSlices))
		slices := len(model.rates[1].(*tokenModel).log) + len(model.rates[2].(*tokenModel).log)
		assert.Equal(t, int64(slices), rdb.ZCard(ctx, grants).Val(), "a record a slice: of the hour (64), of the two hours (32 or 33)")
		clk.Add(500 * time.Millisecond)
		allow("a peek", 0)
		allow("a denied Allow(1_000_000)", 1_000_000)
		allow("Allow(1)", 1)

		// A reservation's release gives back from its own record in each
		// rate.
		back := int64(perSlice * logSlices / 5)
		res, err := l.Reserve(ctx, back)
		require.NoError(t, err)
		require.Equal(t, back, res.Taken)
		model.allow(clk.Now().UnixMicro(), back)
		gave, err := res.Release(ctx, back)
		require.NoError(t, err)
		assert.Equal(t, back, gave)
		for _, r := range model.rates {
			m := r.(*tokenModel)
			m.log[len(m.log)-1].n -= back
			if m.log[len(m.log)-1].n == 0 {
				m.log = m.log[:len(m.log)-1]
			}
		}
		allow("a peek after Release", 0)
		require.NoError(t, rdb.Del(ctx, l.keys[1]).Err())
		allow("Allow(1) after the value key was lost", 1)

		// The minute's grants age out, the hour's stay.
		clk.Add(time.Minute + time.Second)
		allow("Allow(900_000) a minute later", 900_000)
		allow("a denied Allow(900_000)", 900_000)
		// The burst ages out of the hour, not of the two hours.
		clk.Set(at[len(at)-1].Add(time.Hour + time.Minute))
		allow("Allow(1) an hour later", 1)
		allow("a denied Allow(1_000_000) an hour later", 1_000_000)
		clk.Add(2 * time.Hour)
		allow("Allow(1) when everything aged out", 1)
		records("at last")
	})
}
