package redlimit

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/evalsha"
	"github.com/redlimit/redlimit/internal/redistest"
)

// BenchmarkTokenBucketCost decides with the token bucket on a real
// redis-server from 64 goroutines, batching on, as BenchmarkDecisions does
// with the funnel: the time Redis spends per decision (cmdstat_evalsha's
// usec over the decisions), the commands the scripts ran per decision (the
// batch's TIME included), and decisions a second. Over 10,000 keys
// nearly every grant starts a record of its own slice (a key sees a few
// grants a second); over 10 hot keys nearly every grant joins its slice's.
func BenchmarkTokenBucketCost(b *testing.B) {
	s := redistest.Shared(b)
	for _, keys := range []int64{10_000, 10} {
		b.Run("keys="+strconv.FormatInt(keys, 10), func(b *testing.B) {
			c := New(s.Client(b), WithPrefix(redistest.UniqueName(b, "bench")))
			admin := s.Client(b)
			if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
				b.Fatal(err)
			}
			cfg := Config{Rate: 1_000_000, Interval: time.Second}
			var next atomic.Int64
			b.SetParallelism(32)
			b.ResetTimer()
			began := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					key := strconv.FormatInt(next.Add(1)%keys, 10)
					if _, err := c.TokenBucket(key).WithDefault(cfg).Allow(ctx, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "ops/s")
			b.ReportMetric(evalshaMicros(b, admin)/float64(b.N), "redis-µs/decision")
			commands := 0
			for _, n := range scriptCommands(b, admin) {
				commands += n
			}
			b.ReportMetric(float64(commands)/float64(b.N), "commands/decision")
			if calls, decisions := c.transport.BatchStats(); calls > 0 {
				b.ReportMetric(float64(decisions)/float64(calls), "decisions/batch")
			}
		})
	}
}

// evalshaMicros is the time Redis spent in EVALSHA since its stats were reset.
func evalshaMicros(tb testing.TB, admin *redis.Client) float64 {
	info, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	_, rest, ok := strings.Cut(info, "cmdstat_evalsha:")
	if !ok {
		return 0
	}
	_, rest, _ = strings.Cut(rest, "usec=")
	usec, err := strconv.ParseFloat(rest[:strings.IndexByte(rest, ',')], 64)
	if err != nil {
		tb.Fatal(err)
	}
	return usec
}

// The Redis commands a token bucket decision runs, by path: each costs
// about a microsecond of Redis's time (BenchmarkTokenBucketCost). Counted by
// Redis itself (INFO commandstats counts a script's commands), on a server
// of the test's own, for an Overall default of 10 per 64s: slices of 1s,
// from the epoch.
func TestTokenBucketCommandsPerDecision(t *testing.T) {
	ctx := context.Background()
	admin, rdb := ownServer(t)
	clk := newClock()
	c := newClient(rdb, clk, WithoutBatching())
	l := c.TokenBucket(uniqueName(t)).WithDefault(Per(10, 64*time.Second))
	stored := c.TokenBucket(uniqueName(t))
	require.NoError(t, stored.SetRate(ctx, Per(10, 64*time.Second)))
	starting := map[string]int{"get": 2, "zrangebyscore": 1, "zrevrangebyscore": 1, "zadd": 1, "set": 2, "pexpire": 1}
	joining := map[string]int{"zrem": 1}
	maps.Copy(joining, starting)
	aged := func(grant map[string]int) map[string]int {
		with := map[string]int{"zremrangebyscore": 1}
		maps.Copy(with, grant)
		return with
	}
	var last Reservation
	for _, step := range []struct {
		what    string
		at      time.Duration
		l       *Limiter
		permits int64          // < 0: a release of the last reservation
		want    map[string]int // a step whose what starts "reservation" reserves permits
	}{
		// A grant on a default: the marker's GET and SET (common.lua), the
		// value's GET and SET, the log's records out of the window, its
		// slice's record, the grant's record (and the old one's removal
		// when it joins it), the log's expiry; the records out of the window
		// go. A new limiter's log is read whole, once: empty, no slice.
		{"first grant", 0, l, 1, map[string]int{"get": 2, "zrangebyscore": 1, "zadd": 1, "set": 2, "pexpire": 1}},
		{"grant joining its slice's record", 0, l, 1, joining},
		{"grant starting a slice", 1500 * time.Millisecond, l, 1, starting},
		{"grant starting a slice, a record aged", 64 * time.Second, l, 1, aged(starting)},
		{"grant joining its slice's record", 64200 * time.Millisecond, l, 1, joining},
		{"grant starting a slice", 65 * time.Second, l, 1, starting},
		{"grant joining its slice's record, a record aged", 65900 * time.Millisecond, l, 1, aged(joining)},
		// The oldest records in the window, for the wait; the newest, for
		// both resent and the reset.
		{"denial", 65900 * time.Millisecond, l, 9, map[string]int{"get": 2, "zrangebyscore": 2, "zrange": 1}},
		{"peek", 65900 * time.Millisecond, l, 0, map[string]int{"get": 2, "zrangebyscore": 1, "zrange": 1}},
		// A reservation joining its slice's record: a grant, and its id in
		// the request log (ZSCORE: not there yet; ZADD, ZREMRANGEBYSCORE,
		// PTTL, PEXPIRE: the log's expiry is never lowered).
		{"reservation joining its slice's record", 65950 * time.Millisecond, l, 1,
			map[string]int{"get": 2, "zrangebyscore": 1, "zrevrangebyscore": 1, "zadd": 2, "zrem": 1, "set": 2, "pexpire": 2, "zscore": 1, "zremrangebyscore": 1, "pttl": 1}},
		// 1 permit off its record of 2: the record is written again, the
		// value cached, the id leaves the log.
		{"release", 65950 * time.Millisecond, l, -1,
			map[string]int{"get": 2, "zrangebyscore": 1, "zscore": 1, "zrevrangebyscore": 1, "zrem": 2, "zadd": 1, "zrange": 1, "set": 2, "pexpire": 1}},
		// A stored config: its HMGET, and its TTL (PTTL), which no state key outlives.
		{"stored: first grant", 0, stored, 1, map[string]int{"hmget": 1, "get": 1, "zrangebyscore": 1, "zadd": 1, "pttl": 1, "set": 1, "pexpire": 1}},
		{"stored: grant joining its slice's record", 0, stored, 1,
			map[string]int{"hmget": 1, "get": 1, "zrangebyscore": 1, "zrevrangebyscore": 1, "zadd": 1, "zrem": 1, "pttl": 1, "set": 1, "pexpire": 1}},
	} {
		clk.Set(epoch.Add(step.at))
		require.NoError(t, admin.ConfigResetStat(ctx).Err())
		var err error
		switch {
		case strings.HasPrefix(step.what, "reservation"):
			last, err = step.l.Reserve(ctx, step.permits)
		case step.permits < 0:
			_, err = last.Release(ctx, -step.permits)
		default:
			_, err = step.l.Allow(ctx, step.permits)
		}
		require.NoError(t, err, step.what)
		assert.Equal(t, step.want, scriptCommands(t, admin), step.what)
	}

	// In a batch, a grant on a log that a grant of the same batch wrote at
	// the same time knows its state (granted): the marker's GET and SET,
	// the grant's record in place of its slice's, the value. What a batch
	// of two grants runs, less a batch of one.
	batchOf := func(grants int) map[string]int {
		name := "{" + redistest.UniqueName(t, "") + "}"
		reqs := make([]func(ctx context.Context, c *Client) (Result, error), grants)
		for i := range reqs {
			reqs[i] = func(ctx context.Context, c *Client) (Result, error) {
				return c.TokenBucket(name+"-hot").WithDefault(Per(10, 64*time.Second)).Allow(ctx, 1)
			}
		}
		require.NoError(t, admin.ConfigResetStat(ctx).Err())
		_, errs := batched(t, rdb, clk, name, reqs)
		for _, err := range errs {
			require.NoError(t, err)
		}
		return scriptCommands(t, admin)
	}
	one, two := batchOf(1), batchOf(2)
	for command, n := range one {
		if two[command] -= n; two[command] == 0 {
			delete(two, command)
		}
	}
	assert.Equal(t, map[string]int{"get": 1, "zadd": 1, "zrem": 1, "set": 2}, two, "a grant after one of its batch")
}

// scriptCommands counts the commands run since Redis's stats were reset,
// by name, but for the script calls, their loading and the clients' own.
func scriptCommands(t testing.TB, admin *redis.Client) map[string]int {
	t.Helper()
	info, err := admin.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	got := map[string]int{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		// Redis 7 names subcommands (config|resetstat); 6.2 the command only.
		command, _, _ := strings.Cut(name, "|")
		if !ok || command == "evalsha" || command == "info" || command == "hello" || command == "config" ||
			command == "script" || command == "client" {
			continue
		}
		n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		require.NoError(t, err)
		got[name] = n
	}
	return got
}

// logRecords lists l's log as 'ms after the epoch × permits', oldest first.
func logRecords(t *testing.T, rdb redis.UniversalClient, l *Limiter) []string {
	t.Helper()
	var out []string
	for _, z := range rdb.ZRangeWithScores(context.Background(), l.keys[2], 0, -1).Val() {
		m := z.Member.(string)
		require.Len(t, m, 21, "a log record: 0x10, 16 id bytes, count")
		out = append(out, fmt.Sprintf("%d×%d", int64(z.Score)-epoch.UnixMilli(), binary.LittleEndian.Uint32([]byte(m[17:]))))
	}
	return out
}

// A grant joins its slice's record whatever is newer (a record stamped
// past the slice by a client whose clock is ahead), a re-sent script finds
// its own record in the slice and counts nothing, and a grant after the
// window leaves only its own record. Slices of 1s (10 per 64s).
func TestTokenBucketGrantFindsItsSlice(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		cfg := Per(10, 64*time.Second)
		clk, ahead := newClock(), newClock()
		ahead.Add(5 * time.Second)
		name := uniqueName(t)
		l := newClient(rdb, clk).TokenBucket(name).WithDefault(cfg)
		dup, _ := resending(t, rdb)
		twice := newClient(dup, clk).TokenBucket(name).WithDefault(cfg)
		allow := func(l *Limiter, at time.Duration, permits int64) Result {
			t.Helper()
			clk.Set(epoch.Add(at))
			r, err := l.Allow(ctx, permits)
			require.NoError(t, err)
			return r
		}

		allow(l, 0, 2)
		_, err := newClient(rdb, ahead).TokenBucket(name).WithDefault(cfg).Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, []string{"0×2", "5000×1"}, logRecords(t, rdb, l))

		// The newest is past the slice [0, 1s): the grant joins the slice's
		// own record, which takes its time.
		r := allow(l, 500*time.Millisecond, 1)
		assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 6, ResetAfter: 64 * time.Second, Window: 64 * time.Second}, r)
		assert.Equal(t, []string{"500×3", "5000×1"}, logRecords(t, rdb, l))
		assertLogAgrees(t, rdb, l, 10)

		// Run twice: the second run finds its own record and counts nothing
		// (and tells when the newest record ages out).
		r = allow(twice, 700*time.Millisecond, 1)
		assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 5, ResetAfter: 68300 * time.Millisecond, Window: 64 * time.Second}, r)
		assert.Equal(t, []string{"700×4", "5000×1"}, logRecords(t, rdb, l))
		assertLogAgrees(t, rdb, l, 10)

		// A slice of its own; then run twice.
		allow(l, 2*time.Second, 1)
		assert.Equal(t, []string{"700×4", "2000×1", "5000×1"}, logRecords(t, rdb, l))
		allow(twice, 3*time.Second, 2)
		assert.Equal(t, []string{"700×4", "2000×1", "3000×2", "5000×1"}, logRecords(t, rdb, l))
		assertLogAgrees(t, rdb, l, 10)

		// Every record out of the window: only the grant's is left.
		r = allow(l, 70*time.Second, 1)
		assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: 64 * time.Second, Window: 64 * time.Second}, r)
		assert.Equal(t, []string{"70000×1"}, logRecords(t, rdb, l))
		assertLogAgrees(t, rdb, l, 10)
	})
}

// A grant that would join a record too short to hold a count is refused
// before it writes anything: the log and the value are left as they were.
func TestTokenBucketUncountableNewestRecord(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		l := newClient(rdb, clk).TokenBucket(name).WithDefault(Per(10, 64*time.Second))
		_, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		rdb.ZAdd(ctx, l.keys[2], redis.Z{Score: float64(epoch.UnixMilli() + 100), Member: "ab"})
		before := snapshot(t, rdb, name)
		clk.Add(200 * time.Millisecond)
		_, err = l.Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrCorruptState)
		assert.Equal(t, before, snapshot(t, rdb, name))
	})
}

// A decision that finds the first rate's cache wrong writes it, and gives
// nothing back to the further rates, whose usage stands.
func TestTokenBucketDenialWritesTheCacheOnly(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		l := newClient(rdb, clk).TokenBucket(uniqueName(t)).WithDefault(tenPer10s.And(PerMinute(12)))
		_, err := l.Allow(ctx, 10)
		require.NoError(t, err)
		require.NoError(t, rdb.Del(ctx, l.keys[1]).Err())
		clk.Add(time.Second)
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.Equal(t, "0", rdb.Get(ctx, l.keys[1]).Val(), "the cache, rebuilt from the log")
		assertLogAgrees(t, rdb, l, 10)
		clk.Add(10 * time.Second)
		r, err = l.Allow(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, int64(2), r.Remaining, "the minute's 10 still count")
	})
}

// A reservation's release gives back from its own record, and the newest
// record left says when the bucket is full again: the keys expire then.
func TestTokenBucketReleaseExpiresWithNewestLeft(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		l := newClient(rdb, clk).TokenBucket(uniqueName(t)).WithDefault(Per(10, 64*time.Second))
		var reserved []Reservation
		for _, at := range []time.Duration{0, time.Second, 2 * time.Second} {
			clk.Set(epoch.Add(at))
			res, err := l.Reserve(ctx, 2)
			require.NoError(t, err)
			reserved = append(reserved, res)
		}
		clk.Set(epoch.Add(3 * time.Second))
		assertExpiry := func(want time.Duration, what string) {
			t.Helper()
			for _, k := range []string{l.keys[1], l.keys[2]} {
				ttl := rdb.PTTL(ctx, k).Val()
				assert.True(t, ttl > want-time.Second && ttl <= want, "%s: %s expires in %v, want %v", what, k, ttl, want)
			}
		}
		release := func(of int, permits int64) {
			t.Helper()
			back, err := reserved[of].Release(ctx, permits)
			require.NoError(t, err)
			require.Equal(t, permits, back)
		}
		release(2, 2)
		assert.Equal(t, []string{"0×2", "1000×2"}, logRecords(t, rdb, l))
		assertExpiry(62*time.Second, "the next record, newest left")
		release(1, 2)
		release(0, 1)
		assert.Equal(t, []string{"0×1"}, logRecords(t, rdb, l))
		assertExpiry(61*time.Second, "the record partly given back")
		assertLogAgrees(t, rdb, l, 10)

		m := newClient(rdb, clk).TokenBucket(uniqueName(t)).WithDefault(Per(10, 64*time.Second))
		res, err := m.Reserve(ctx, 5)
		require.NoError(t, err)
		back, err := res.Release(ctx, 5)
		require.NoError(t, err)
		require.Equal(t, int64(5), back)
		assert.Zero(t, rdb.Exists(ctx, m.Name(), m.keys[1], m.keys[2]).Val(), "released to full: no key, no marker")
	})
}

// batched runs reqs on a Client of rdb deciding on clk in one batch, in
// order, behind two lone peeks on name-peek (as TestBatchDecidesAsAlone
// does), and returns their answers.
func batched(t *testing.T, rdb redis.UniversalClient, clk *clock, name string, reqs []func(ctx context.Context, c *Client) (Result, error)) ([]Result, []error) {
	t.Helper()
	ctx := context.Background()
	gate := newBatchGate()
	hooked := cloneClient(t, rdb)
	hooked.AddHook(gate)
	c := New(hooked, WithClock(clk.Now))
	peek := c.TokenBucket(name + "-peek").WithDefault(tenPer10s)
	got, errs := make([]Result, len(reqs)), make([]error, len(reqs))
	var wg sync.WaitGroup
	for range evalsha.BatchCalls {
		wg.Go(func() { _, _ = peek.Allow(ctx, 0) })
		<-gate.arrived
	}
	for i, req := range reqs {
		wg.Go(func() { got[i], errs[i] = req(ctx, c) })
		queued(t, c, peek.Name(), i+1)
	}
	gate.open()
	wg.Wait()
	return got, errs
}

// A batch's requests on one log at one time share what each grant left
// (the token bucket's granted): the answers, the log and the value are
// those of the same requests sent one by one, whatever comes between them
// (another key, a denial, a release, a handle of another rate or interval).
func TestTokenBucketBatchSharesWhatItGranted(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		rdb := connect()
		clk := newClock()
		clk.Add(1500 * time.Millisecond)
		name := "{" + redistest.UniqueName(t, "") + "}" // one slot: one batch on a Cluster too
		allow := func(key string, cfg Config, permits int64) func(ctx context.Context, c *Client) (Result, error) {
			return func(ctx context.Context, c *Client) (Result, error) {
				return c.TokenBucket(key).WithDefault(cfg).Allow(ctx, permits)
			}
		}
		cases := func(prefix string) []func(ctx context.Context, c *Client) (Result, error) {
			hot, other := prefix+"hot", prefix+"other"
			return []func(ctx context.Context, c *Client) (Result, error){
				allow(hot, tenPer10s, 1),
				allow(hot, tenPer10s, 2),
				allow(other, tenPer10s, 1),
				allow(hot, tenPer10s, 1),
				allow(hot, Per(5, 10*time.Second), 1), // a lower rate: the value is too high for it
				allow(hot, tenPer10s, 1),
				allow(hot, tenPer10s, 9), // denied
				allow(hot, tenPer10s, 1),
				func(ctx context.Context, c *Client) (Result, error) {
					res, err := c.TokenBucket(hot).WithDefault(tenPer10s).Reserve(ctx, 2)
					return res.Result, err
				},
				allow(hot, tenPer10s, 2),
				allow(hot, tenPer10s, 1),
				allow(hot, Per(10, 20*time.Second), 1), // keys expiring later
				allow(other, tenPer10s, 1),
			}
		}
		// Each key holds a record of an earlier slice, and one out of the window.
		for _, prefix := range []string{name + "-alone-", name + "-batched-"} {
			for _, at := range []time.Duration{-11 * time.Second, -time.Second} {
				_, err := New(rdb, WithClock(func() time.Time { return clk.Now().Add(at) })).TokenBucket(prefix+"hot").WithDefault(tenPer10s).Allow(ctx, 1)
				require.NoError(t, err)
			}
		}
		lone := New(rdb, WithClock(clk.Now), WithoutBatching())
		var want []Result
		for _, req := range cases(name + "-alone-") {
			r, err := req(ctx, lone)
			require.NoError(t, err)
			want = append(want, r)
		}
		got, errs := batched(t, rdb, clk, name, cases(name+"-batched-"))
		for i := range got {
			require.NoError(t, errs[i], "request %d", i)
		}
		assert.Equal(t, want, got)
		for _, key := range []string{"hot", "other"} {
			alone, batch := lone.TokenBucket(name+"-alone-"+key), lone.TokenBucket(name+"-batched-"+key)
			assert.Equal(t, logRecords(t, rdb, alone), logRecords(t, rdb, batch), key)
			assert.Equal(t, rdb.Get(ctx, alone.keys[1]).Val(), rdb.Get(ctx, batch.keys[1]).Val(), key)
			for i := range 2 {
				a, b := rdb.PTTL(ctx, alone.keys[1+i]).Val(), rdb.PTTL(ctx, batch.keys[1+i]).Val()
				assert.InDelta(t, a, b, float64(time.Second), "%s: %s expires in %v, batched %v", key, alone.keys[1+i], a, b)
			}
		}
	})
}
