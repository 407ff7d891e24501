package redlimit

// A reply lost: Redis ran a script, and its reply never reached the caller
// (a connection killed, held past the read timeout, cut before the reply or
// mid-reply); go-redis re-sends the script (MaxRetries), which counts once
// with WithRetryWindow; without it a re-sent grant may count twice, which
// only denies sooner.
//
// TestReplyLostAcrossProcesses: a TCP proxy (internal/faultproxy) between
// go-redis and a real redis-server of the test's own breaks the replies to
// the scripts (EVALSHA) while three processes (this test binary run again as
// "faults" children: faultChild) of 16 goroutines each acquire from one
// limiter per algorithm. The faults: a reply held past the clients' read
// timeout (on top of a millisecond of latency each way on everything), a
// connection closed after the request reached Redis and before its reply
// came back, a reply cut in half. Redis runs every script it receives, so
// each fault loses the reply of a decision Redis made, and go-redis then
// re-sends it (MaxRetries).
//
// The three processes talk to Redis three ways, the ways users configure it:
// go-redis's defaults (MaxRetries 3) with WithRetryWindow, go-redis's
// defaults alone (a re-sent script may count twice: it only denies sooner),
// and no retries at all (every fault reaches a caller).
//
// Each limiter has a counting config (algo.counting): a window of ten years,
// a funnel that drains one permit an hour, so its capacity is exactly the
// limit of the one window the run lies in, for every algorithm's guarantee.
// The callers hammer until each is denied, and the run proves:
//   - never above the limit: the grants all callers saw add up to at most the
//     capacity, and Redis counted exactly the capacity (a grant a caller never
//     saw is a reply a fault lost, or a re-sent script counted twice);
//   - every error a caller saw is ErrUnavailable and wraps its network cause
//     (keepsCause: a timeout, EOF, a reset...).
//
// The children are never cancelled: a caller's own cancellation is not an
// outage, and is not what this suite is about.

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/faultproxy"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// resending is a client to rdb's server(s) that runs every script twice, as
// go-redis does when it re-sends one after a read timeout, and its log.
func resending(t *testing.T, rdb redis.UniversalClient) (redis.UniversalClient, *commandLog) {
	log := &commandLog{twice: true}
	return recorded(t, rdb, log), log
}

// With WithRetryWindow, a script go-redis re-sends counts once: each
// limiter logs the ids of its grants and releases in one key, printable,
// which Delete removes.
func TestResentScriptCountsOnce(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		dup, log := resending(t, rdb)
		clk := newClock()
		l := a.new(newClient(dup, clk, WithRetryWindow(15*time.Second)), name).WithDefault(tenPer10s)
		for i := range 7 {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			assert.True(t, ok, "grant %d", i)
		}
		res, err := l.Reserve(ctx, 3)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		require.Equal(t, int64(3), res.Taken, "a re-sent reservation takes once")
		ok, err := l.TryAcquire(ctx, 1)
		require.NoError(t, err)
		assert.False(t, ok, "the 11th is denied: each grant was counted once")
		assert.Positive(t, log.count("evalsha"))

		// The re-sent copy reports what it gave back itself: nothing.
		_, err = res.Release(ctx, 3)
		require.NoError(t, err)
		assertAvailable(t, l, 3, "a re-sent release gives back once")

		requests := wire.KeyOf(l.Name(), "requests")
		ids := rdb.ZRange(ctx, requests, 0, -1).Val()
		assert.NotEmpty(t, ids)
		for _, id := range ids {
			assert.Regexp(t, "^[0-9a-f]{16}$", id, "request ids are printable")
		}
		ttl := rdb.PTTL(ctx, requests).Val()
		assert.True(t, ttl > 0 && ttl <= 15*time.Second, "the log expires: %v", ttl)
		_, err = l.Delete(ctx)
		require.NoError(t, err)
		assert.Zero(t, rdb.Exists(ctx, requests).Val(), "Delete removes the request log")
	})
}

// Without WithRetryWindow, nothing but the limiter's own state is written:
// a re-sent grant counts twice, so the limiter denies sooner and never
// admits more. The token bucket tells a re-sent grant by its record anyway.
func TestResentScriptWithoutRetryWindow(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		dup, log := resending(t, rdb)
		l := a.new(newClient(dup, newClock()), name).WithDefault(tenPer10s)
		granted := 0
		for range 10 {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			if ok {
				granted++
			}
		}
		assert.Equal(t, a.grantedTwice, granted, "each grant ran twice")
		assert.GreaterOrEqual(t, log.count("evalsha"), 10, "every script ran twice")
		assert.ElementsMatch(t, a.stateKeys(l.Name()), limiterKeys(t, rdb, name), "no key per grant")
	})
}

// The re-sent scripts of killed connections and stalls count once with
// WithRetryWindow; without it they would only count twice (deny sooner).
func TestReplyLostClientKill(t *testing.T) {
	b := newFaultBed(t, &redis.Options{})
	ctx := context.Background()
	runs := countingRuns(t, New(b.rdb, WithRetryWindow(15*time.Second)))
	b.warm(t, runs)
	wait := faultHammer(t, runs, faultWorkers, untilDenied)
	var killed int64
	for _, at := range []int64{faultCapacity / 5, faultCapacity / 3, faultCapacity / 2} {
		waitProgress(t, runs, at)
		n, err := b.admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Result()
		require.NoError(t, err)
		killed += n
	}
	wait()

	assert.Positive(t, killed, "connections were killed")
	assertExact(t, b.admin, runs)
	asked, written, ran := b.evalshas(t)
	t.Logf("%d connections killed; EVALSHA: %d asked, %d written (%d re-sent), %d run by the server (%d more than asked)",
		killed, asked, written, written-asked, ran, ran-asked)
	assert.Positive(t, written-asked, "go-redis re-sent the commands of killed connections")
}

func TestReplyLostAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes for ~15s")
	}
	srv := redistest.Start(t)
	admin := srv.Client(t) // straight to Redis, past the proxy: for reading what it counted
	t.Logf("redis-server %s", srv.Version())
	proxy, err := faultproxy.Start(srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	evalsha := []byte("$7\r\nevalsha\r\n") // how go-redis writes the command's name
	for _, fc := range []struct {
		name        string
		faults      faultproxy.Faults
		readTimeout time.Duration
	}{
		// A held reply outlasts the read timeout: go-redis gives up on it
		// (a timeout) and re-sends the script on another connection. The
		// timeout is long enough that only held replies meet it, even
		// under -race on two busy cores.
		{"latency", faultproxy.Faults{Latency: time.Millisecond, Kind: faultproxy.Hold, Every: 6, Hold: 2 * time.Second, Match: evalsha}, time.Second},
		{"cut before the reply", faultproxy.Faults{Kind: faultproxy.Drop, Every: 3, Match: evalsha}, 0},
		{"reply cut in half", faultproxy.Faults{Kind: faultproxy.Truncate, Every: 3, Match: evalsha}, 0},
	} {
		t.Run(fc.name, func(t *testing.T) {
			names := fiNames(t)
			proxy.Set(fc.faults)
			injected := proxy.Injected()
			tallies, took := runFaultChildren(t, fiSpec{
				Addr: proxy.Addr(), Names: names, Capacity: fiCapacity, ReadTimeout: fc.readTimeout, Goroutines: fiGoroutines,
			}, nil)
			proxy.Set(faultproxy.Faults{})
			injected = proxy.Injected() - injected

			var calls, errs int
			for i, a := range algorithms {
				tl := tallies[i]
				granted := int64(len(tl.Grants))
				l := a.new(New(admin), names[i])
				counted := a.counted(t, admin, l, a.counting(fiCapacity))
				calls += len(tl.Grants) + tl.Denied + tl.errors()
				errs += tl.errors()
				t.Logf("%s: %d grants seen of %d, Redis counted %d (%d lost or counted twice); %d denials; %d errors %v",
					a.name, granted, fiCapacity, counted, counted-granted, tl.Denied, tl.errors(), tl.Errors)
				assert.LessOrEqual(t, granted, int64(fiCapacity), "%s: over-admission: the callers saw more grants than the limit", a.name)
				assert.Equal(t, int64(fiCapacity), counted, "%s: Redis counted its whole capacity, no more", a.name)
				assert.Empty(t, tl.Wrong, "%s: errors that are not ErrUnavailable with their network cause", a.name)
				assert.NotContains(t, tl.Errors, "other", "%s: an error without a network cause", a.name)
			}
			t.Logf("load: %d processes × %d goroutines, %d calls in %v (%.0f/s); %d replies broken, %d errors reached callers",
				fiProcesses, fiGoroutines, calls, took.Round(time.Millisecond), float64(calls)/took.Seconds(), injected, errs)
			assert.Positive(t, injected, "the proxy broke replies")
			assert.Positive(t, errs, "some faults reached callers (those without retries)")
			assert.False(t, slices.ContainsFunc(tallies, func(tl fiTally) bool { return tl.Denied == 0 }), "every limiter was used up")
		})
	}
}
