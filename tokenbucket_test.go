package redlimit

import (
	"context"
	"encoding/binary"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// assertLogAgrees checks the invariant the token bucket keeps: the value key
// equals rate − Σ(permits in the log).
func assertLogAgrees(t *testing.T, rdb redis.UniversalClient, l *Limiter, rate int64) {
	t.Helper()
	ctx := context.Background()
	var sum int64
	for _, m := range rdb.ZRange(ctx, l.keys[2], 0, -1).Val() {
		sum += int64(binary.LittleEndian.Uint32([]byte(m)[len(m)-4:]))
	}
	value, err := rdb.Get(ctx, l.keys[1]).Int64()
	if err == redis.Nil {
		assert.Zero(t, sum, "no value key, so no log either")
		return
	}
	require.NoError(t, err)
	assert.Equal(t, rate-sum, value, "value = rate − Σ log")
}

// Redisson's testAcquisitionInterval: 2 permits per 5 seconds.
func TestTokenBucketAcquisitionInterval(t *testing.T) {
	ms := time.Millisecond
	stepTable(t, (*Client).TokenBucket, Per(2, 5*time.Second), []step{
		{0, 1, true, 1, 0, 5000 * ms, 0},
		{0, 1, true, 0, 0, 5000 * ms, 0},
		{0, 1, false, 0, 5000 * ms, 5000 * ms, 0},
		{4900 * ms, 1, false, 0, 100 * ms, 100 * ms, 0},
		{4999 * ms, 2, false, 0, 1 * ms, 1 * ms, 0},
		{5000 * ms, 1, true, 1, 0, 5000 * ms, 0}, // a record at s is out once s <= now − interval
		{5000 * ms, 2, false, 1, 5000 * ms, 5000 * ms, 0},
		{7000 * ms, 1, true, 0, 0, 5000 * ms, 0},
		{9999 * ms, 1, false, 0, 1 * ms, 2001 * ms, 0},
		{10000 * ms, 2, false, 1, 2000 * ms, 2000 * ms, 0},
		{12000 * ms, 2, true, 0, 0, 5000 * ms, 0},
	})
}

// RetryAfter walks the log: Redisson answered "oldest record + 3ms", too
// short for a request that needs several records to age out.
func TestTokenBucketExactRetryAfter(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		l := newClient(rdb, clk).TokenBucket(uniqueName(t)).WithDefault(tenPer10s)
		s := time.Second
		runSteps(t, l, clk, tenPer10s, []step{
			{0, 3, true, 7, 0, 10 * s, 0},
			{2 * s, 3, true, 4, 0, 10 * s, 0},
			{4 * s, 4, true, 0, 0, 10 * s, 0},
			{5 * s, 5, false, 0, 7 * s, 9 * s, 0}, // frees 3 at 10s, 3 more at 12s
		})
		clk.Set(epoch.Add(12 * s))
		r, err := l.Allow(context.Background(), 5)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 1, ResetAfter: 10 * s, Window: 10 * s}, r, "the wait it gave was enough")
	})
}

func TestTokenBucketRecordsNeverCollide(t *testing.T) {
	// Redisson #3804: records packed from a float collided and were lost, and the limit drifted.
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newClient(rdb, newClock()).TokenBucket(uniqueName(t)).WithDefault(Per(500, time.Minute))
		for i := range 500 {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok, "grant %d", i)
		}
		// Grants in one slice of the interval share one record (the bound in
		// scripts/tokenbucket.lua): it holds every one of them.
		records := rdb.ZRange(ctx, l.keys[2], 0, -1).Val()
		require.Len(t, records, 1, "500 grants at the same millisecond share one record")
		assert.Equal(t, uint32(500), binary.LittleEndian.Uint32([]byte(records[0])[17:]), "and it counts all of them")
		ok, err := l.TryAcquire(ctx, 1)
		require.NoError(t, err)
		assert.False(t, ok)
		assertLogAgrees(t, rdb, l, 500)
	})
}

func TestTokenBucketLogAndValueAgree(t *testing.T) {
	// Redisson #3639, #7329, #7342: after a rate decrease or a release, the
	// value exceeded the rate or disagreed with the log.
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		l := newClient(rdb, clk).TokenBucket(uniqueName(t))
		require.NoError(t, l.SetRate(ctx, tenPer10s))
		var reserved []Reservation
		for _, p := range []int64{3, 2, 4} {
			res, err := l.Reserve(ctx, p)
			require.NoError(t, err)
			reserved = append(reserved, res)
			clk.Add(time.Second)
		}
		assertLogAgrees(t, rdb, l, 10)
		for _, back := range []struct{ of, n int64 }{{2, 4}, {1, 1}} { // the 4, and 1 of the 2
			gave, err := reserved[back.of].Release(ctx, back.n)
			require.NoError(t, err)
			require.Equal(t, back.n, gave)
		}
		assertLogAgrees(t, rdb, l, 10)
		n, _ := l.AvailablePermits(ctx)
		assert.Equal(t, int64(6), n)
		require.NoError(t, l.SetRate(ctx, Per(3, 10*time.Second)))
		assertLogAgrees(t, rdb, l, 3) // value −1: 4 permits in the log, rate 3
		n, _ = l.AvailablePermits(ctx)
		assert.Zero(t, n, "never below 0")
		require.NoError(t, l.SetRate(ctx, tenPer10s))
		n, _ = l.AvailablePermits(ctx)
		assert.Equal(t, int64(6), n, "raising the rate back restores exactly what the log allows")
		res, err := l.Reserve(ctx, 2)
		require.NoError(t, err)
		gave, err := res.Release(ctx, 100)
		require.NoError(t, err)
		assert.Equal(t, int64(2), gave, "never more than its grant")
		n, _ = l.AvailablePermits(ctx)
		assert.Equal(t, int64(6), n)
		assertLogAgrees(t, rdb, l, 10)
	})
}

func TestTokenBucketLostValueKey(t *testing.T) {
	// Redisson reset a limiter whose value key was lost to the full rate,
	// whatever its log held.
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newClient(rdb, newClock()).TokenBucket(uniqueName(t)).WithDefault(tenPer10s)
		_, err := l.Allow(ctx, 10)
		require.NoError(t, err)
		require.NoError(t, rdb.Del(ctx, l.keys[1]).Err())
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.Equal(t, 10*time.Second, r.RetryAfter)
		assertLogAgrees(t, rdb, l, 10)
	})
}

func TestTokenBucketValueWithoutLog(t *testing.T) {
	// Redisson raised a Lua error (nil arithmetic) when the value key existed
	// but the log did not; a stale low value must not deny forever either.
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newClient(rdb, newClock()).TokenBucket(uniqueName(t)).WithDefault(tenPer10s)
		require.NoError(t, rdb.Set(ctx, l.keys[1], "0", 0).Err())
		r, err := l.Allow(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, int64(0), r.Remaining, "a peek reports the cache")
		r, err = l.Allow(ctx, 4)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 6, ResetAfter: 10 * time.Second, Window: 10 * time.Second}, r)
		assertLogAgrees(t, rdb, l, 10)
		assert.Positive(t, rdb.PTTL(ctx, l.keys[1]).Val(), "and the repaired value expires")
	})
}

func TestTokenBucketConfigExpired(t *testing.T) {
	// Redisson #3260: "RateLimiter is not initialized" once the config hash expired.
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		name := uniqueName(t)
		l := newClient(rdb, newClock()).TokenBucket(name)
		require.NoError(t, l.SetRate(ctx, tenPer10s))
		require.NoError(t, rdb.Del(ctx, l.Name()).Err()) // as when its keep-alive runs out
		_, err := l.Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrNotInitialized, "a clear sentinel, not a script error")
		ok, err := l.WithDefault(tenPer10s).TryAcquire(ctx, 1)
		require.NoError(t, err)
		assert.True(t, ok, "a handle with a default carries on")
	})
}

func TestTokenBucketKeepAliveValidation(t *testing.T) {
	err := Config{Rate: 1, Interval: time.Minute, KeepAlive: 59 * time.Second}.validate()
	assert.ErrorIs(t, err, ErrInvalidConfig)
	assert.NoError(t, Config{Rate: 1, Interval: time.Minute, KeepAlive: time.Minute}.validate())
}

func TestRedissonReadsOurs(t *testing.T) {
	eachUnprefixedBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		l := newClient(rdb, clk).TokenBucket(name)
		require.NoError(t, l.SetRate(ctx, Per(5, 10*time.Second)))
		_, err := l.Allow(ctx, 2)
		require.NoError(t, err)

		assert.Equal(t, map[string]string{"rate": "5", "interval": "10000", "type": "0", "keepAliveTime": "0"}, rdb.HGetAll(ctx, name).Val())
		assert.Equal(t, "3", rdb.Get(ctx, "{"+name+"}:value").Val())
		records := rdb.ZRangeWithScores(ctx, "{"+name+"}:permits", 0, -1).Val()
		require.Len(t, records, 1)
		m := []byte(records[0].Member.(string))
		require.Len(t, m, 21)
		assert.Equal(t, byte(16), m[0])
		assert.Equal(t, uint32(2), binary.LittleEndian.Uint32(m[17:]))
		assert.Equal(t, float64(clk.Now().UnixMilli()), records[0].Score)

		perClient := newClient(rdb, clk, WithClientID("c7")).TokenBucket(name + "{tag}")
		require.NoError(t, perClient.SetRate(ctx, Config{Type: PerClient, Rate: 5, Interval: 10 * time.Second}))
		_, err = perClient.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, "4", rdb.Get(ctx, name+"{tag}:value:c7").Val(), "a name with a hash tag gets no extra braces")
		assert.Equal(t, int64(1), rdb.ZCard(ctx, name+"{tag}:permits:c7").Val())
		assert.Equal(t, "1", rdb.HGet(ctx, name+"{tag}", "type").Val())
	})
}

func TestWeReadRedissons(t *testing.T) {
	eachUnprefixedBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		now := clk.Now().UnixMilli()
		redistest.WriteRedisson(ctx, rdb, name, clk.Now())
		l := newClient(rdb, clk).TokenBucket(name)
		assertConfig(t, l, Per(5, 10*time.Second))
		s := time.Second
		runSteps(t, l, clk, Per(5, 10*time.Second), []step{
			{0, 0, true, 2, 0, 9 * s, 0},
			{0, 3, false, 2, 6 * s, 9 * s, 0}, // the 2-permit record, granted 4s ago, ages out at 6s
			{6 * s, 3, true, 1, 0, 10 * s, 0},
		})
		assert.Equal(t, "1", rdb.Get(ctx, "{"+name+"}:value").Val())
		assert.Equal(t, []string{redistest.RedissonPermit(2, 1)}, rdb.ZRange(ctx, "{"+name+"}:permits", 0, 0).Val())
		assert.Equal(t, strconv.FormatInt(now+6000, 10), strconv.FormatFloat(rdb.ZRangeWithScores(ctx, "{"+name+"}:permits", -1, -1).Val()[0].Score, 'f', -1, 64))
	})
}
