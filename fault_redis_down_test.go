package redlimit

// Redis down: unreachable, or killed under load (and, for the breaker,
// started again). Calls fail closed with ErrUnavailable and its cause, or
// are granted WithFailOpen; WithBreaker answers them at once while it is
// open.

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/evalsha"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRedisUnreachable(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	l := New(rdb).TokenBucket("x").WithDefault(tenPer10s)
	ok, err := l.TryAcquire(ctx, 1)
	assert.False(t, ok, "fails closed by default")
	assert.ErrorIs(t, err, ErrUnavailable)
	var netErr net.Error
	assert.True(t, errors.As(err, &netErr) || strings.Contains(err.Error(), "connection refused"), "the cause is kept: %v", err)
	_, err = l.Config(ctx)
	assert.ErrorIs(t, err, ErrUnavailable)

	var seen []error
	open := New(rdb, WithFailOpen(), WithObserver(func(d Decision) { seen = append(seen, d.Err) })).TokenBucket("x").WithDefault(tenPer10s)
	ok, err = open.TryAcquire(ctx, 1)
	assert.NoError(t, err)
	assert.True(t, ok, "fails open when asked to")
	assert.NoError(t, open.Acquire(ctx, 1))
	require.Len(t, seen, 2)
	assert.ErrorIs(t, seen[0], ErrUnavailable, "the observer still sees the outage")
	_, err = open.Allow(ctx, -1)
	assert.ErrorIs(t, err, ErrInvalidPermits, "bad input is never waved through")
}

func TestRedisDownUnderLoad(t *testing.T) {
	// Documented behaviour when Redis cannot decide: by default a call fails
	// closed (TryAcquire returns false and an error wrapping ErrUnavailable
	// and its cause); WithFailOpen grants it instead, returns no error, and
	// tells the observer. Both kinds of client share each limiter here while
	// Redis answers, then while it is gone (killed, not restarted).
	const capacity, workers = 100, 2
	b := newFaultBed(t, &redis.Options{MaxRetries: -1, DialerRetries: 1}) // fail fast once it is gone
	type outcome struct {
		open       bool
		began      time.Time
		ok         bool
		err        error
		seen       Decision // what the observer saw of this call (fail-open only)
		seenCalled bool
	}
	var mu sync.Mutex
	outcomes := map[string][]outcome{}
	var killedAt atomic.Int64 // Unix ns; 0 while Redis runs
	var stop atomic.Bool
	names := map[string]Config{}
	// One caller a goroutine: its limiter, kind and what its observer saw last.
	type caller struct {
		name   string
		open   bool
		l      *Limiter
		last   Decision
		called bool
		denied atomic.Bool // by Redis, once
	}
	var callers []*caller
	for _, a := range algorithms {
		name := uniqueName(t) + "-" + a.name
		cfg := a.counting(capacity)
		names[name] = cfg
		for _, open := range []bool{false, true} {
			for range workers {
				c := &caller{name: name, open: open}
				opts := []Option{WithObserver(func(d Decision) { c.last, c.called = d, true })}
				if open {
					opts = append(opts, WithFailOpen())
				}
				c.l = a.new(New(b.rdb, opts...), name).WithDefault(cfg)
				callers = append(callers, c)
			}
		}
	}
	wait := hammer(context.Background(), len(callers), func(g, _ int) bool {
		if stop.Load() {
			return true
		}
		c := callers[g]
		c.called = false
		o := outcome{open: c.open, began: time.Now()}
		o.ok, o.err = c.l.TryAcquire(context.Background(), 1)
		o.seen, o.seenCalled = c.last, c.called
		if o.err == nil && !o.ok {
			c.denied.Store(true)
		}
		mu.Lock()
		outcomes[c.name] = append(outcomes[c.name], o)
		mu.Unlock()
		if o.err != nil {
			time.Sleep(5 * time.Millisecond)
		}
		return false
	})
	// count returns, per limiter, the calls of one kind matching f.
	count := func(name string, f func(o outcome) bool) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, o := range outcomes[name] {
			if f(o) {
				n++
			}
		}
		return n
	}
	// Until every caller, of both kinds, has been denied: each limiter's
	// capacity is used up, and no grant is on its way back to a caller (a
	// caller's calls are in turn), whose reply the kill could lose. (Waiting
	// for one denial of each kind per limiter let a slow caller's grant,
	// unread, die with the connection: 98 of 100 counted, on a busy machine.)
	require.Eventually(t, func() bool {
		for _, c := range callers {
			if !c.denied.Load() {
				return false
			}
		}
		return true
	}, faultTimeout, time.Millisecond)
	require.NoError(t, b.srv.Kill())
	killedAt.Store(time.Now().UnixNano())
	afterKill := func(open bool) func(o outcome) bool {
		return func(o outcome) bool { return o.open == open && o.began.UnixNano() > killedAt.Load() }
	}
	require.Eventually(t, func() bool {
		for name := range names {
			if count(name, afterKill(false)) < 3*workers || count(name, afterKill(true)) < 3*workers {
				return false
			}
		}
		return true
	}, faultTimeout, time.Millisecond)
	stop.Store(true)
	wait()

	for name := range names {
		var grants, closedDown, openDown int
		for _, o := range outcomes[name] {
			down := o.began.UnixNano() > killedAt.Load()
			switch {
			case !o.open && o.err != nil:
				assert.False(t, o.ok, "fail closed: denied")
				assert.ErrorIs(t, o.err, ErrUnavailable)
				assert.True(t, keepsCause(o.err), "the cause is kept: %v", o.err)
				if down {
					closedDown++
				}
			case !o.open:
				assert.False(t, down, "no answer from a Redis that is gone")
				if o.ok {
					grants++
				}
			default:
				require.True(t, o.seenCalled, "the observer sees every call")
				assert.NoError(t, o.err, "fail open: no error")
				if o.seen.Err != nil {
					assert.True(t, o.ok, "fail open: granted")
					assert.ErrorIs(t, o.seen.Err, ErrUnavailable, "the observer sees the outage")
					assert.True(t, keepsCause(o.seen.Err), "the cause is kept: %v", o.seen.Err)
					assert.True(t, o.seen.Result.Allowed)
					if down {
						openDown++
					}
					continue
				}
				assert.False(t, down, "no answer from a Redis that is gone")
				assert.Equal(t, o.seen.Result.Allowed, o.ok, "while Redis answers, fail open changes nothing")
				if o.ok {
					grants++
				}
			}
		}
		t.Logf("%s: %d grants decided by Redis; once it was gone, %d calls failed closed and %d opened", name, grants, closedDown, openDown)
		assert.Equal(t, capacity, grants, "%s: Redis granted its capacity, no more", name)
		assert.Equal(t, count(name, afterKill(false)), closedDown, "every fail-closed call after the kill failed")
		assert.Equal(t, count(name, afterKill(true)), openDown, "every fail-open call after the kill was granted")
	}
}

// outageHook fails every command while down is set, as an unreachable Redis
// does, and counts the commands that reached it.
type outageHook struct {
	passHook
	down    atomic.Bool
	reached atomic.Int64
}

func (h *outageHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.reached.Add(1)
		if h.down.Load() {
			err := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// The breaker's states, step by step on a controlled clock.
func TestRedisDownBreakerSteps(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Miniredis(t)
	hook := &outageHook{}
	rdb.AddHook(hook)
	clk := newClock()
	c := newClient(rdb, clk, WithBreaker(3, time.Second))
	c.breaker.SetClock(clk.Now)
	l := c.FixedWindow(uniqueName(t)).WithDefault(Per(1000, time.Hour))

	// call makes one TryAcquire and reports whether it reached Redis.
	call := func() (reached bool, err error) {
		before := hook.reached.Load()
		_, err = l.TryAcquire(ctx, 1)
		return hook.reached.Load() > before, err
	}
	wait := func(err error) time.Duration {
		wait, ok := evalsha.OpenFor(err)
		require.True(t, ok, "%v", err)
		return wait
	}
	reached, err := call()
	require.NoError(t, err)
	require.True(t, reached)

	hook.down.Store(true)
	for i := range 3 { // three failures in a row open it
		reached, err := call()
		assert.True(t, reached, "failure %d went to Redis", i+1)
		assert.ErrorIs(t, err, ErrUnavailable)
		assert.NotErrorIs(t, err, ErrBreakerOpen)
	}
	reached, err = call()
	assert.False(t, reached, "open: answered at once")
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.ErrorIs(t, err, ErrBreakerOpen)
	var netErr net.Error
	assert.ErrorAs(t, err, &netErr, "the last failure is kept")
	assert.Equal(t, time.Second, wait(err))
	assert.EqualError(t, err, "redlimit: redis unavailable: breaker open for 1s more; last failure: dial tcp: connection refused")
	clk.Add(999 * time.Millisecond)
	_, err = call()
	assert.Equal(t, time.Millisecond, wait(err))

	clk.Add(time.Millisecond) // cool-down over: one probe, which fails
	reached, err = call()
	assert.True(t, reached, "the probe went to Redis")
	assert.NotErrorIs(t, err, ErrBreakerOpen)
	reached, err = call()
	assert.False(t, reached, "open again")
	assert.Equal(t, time.Second, wait(err), "for a whole cool-down from the failed probe")

	hook.down.Store(false)
	clk.Add(time.Second) // the next probe finds Redis back
	reached, err = call()
	assert.True(t, reached)
	assert.NoError(t, err)
	for range 3 {
		reached, err = call()
		assert.True(t, reached, "closed")
		assert.NoError(t, err)
	}

	// Failures must be consecutive: a success in between starts the count again.
	hook.down.Store(true)
	for range 2 {
		_, err = call()
		assert.NotErrorIs(t, err, ErrBreakerOpen)
	}
	hook.down.Store(false)
	_, err = call()
	require.NoError(t, err)
	hook.down.Store(true)
	for range 2 {
		reached, err = call()
		assert.True(t, reached, "two failures since the last success: still closed")
		assert.ErrorIs(t, err, ErrUnavailable)
		assert.NotErrorIs(t, err, ErrBreakerOpen)
	}
	reached, err = call()
	assert.True(t, reached, "the third opens it")
	assert.NotErrorIs(t, err, ErrBreakerOpen, "the third failed at Redis")
	reached, err = call()
	assert.False(t, reached)
	assert.ErrorIs(t, err, ErrBreakerOpen)

	// A cancelled probe tells nothing of Redis: the next call probes.
	clk.Add(time.Second)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	pass, err := c.breaker.Enter()
	require.NoError(t, err)
	require.True(t, pass.Probe())
	c.breaker.Leave(pass, evalsha.Classify(cancelled, context.Canceled, nil), 1)
	reached, _ = call()
	assert.True(t, reached, "the next call is the probe")
}

// A real redis-server stopped and started under load, with go-redis's
// default options (a dead server costs each call its dial retries, about
// 1.7 s). With the breaker, calls during the outage are answered in
// microseconds, fail-open ones granted; once the server is back, the first
// probe that finds it brings every caller back.
//
// Batched, only evalsha.BatchCalls calls of a Client are in flight: the callers
// queued behind them wait, and go to the dead server in one batch, whose
// failure counts each of its decisions; the breaker opens once that batch
// fails, and the outage lasts long enough for it.
func TestRedisDownBreakerUnderLoad(t *testing.T) {
	t.Run("alone", func(t *testing.T) { redisDownBreaker(t, false, 2500*time.Millisecond) })
	t.Run("batched", func(t *testing.T) { redisDownBreaker(t, true, 5*time.Second) })
}

func redisDownBreaker(t *testing.T, batching bool, outage time.Duration) {
	const coolDown, callers, failures = 300 * time.Millisecond, 16, 5
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	start := time.Now()
	// What each Client's observer saw: every decision, when it ended, how
	// long it took and its error (fail-open ones too).
	var mu sync.Mutex
	seen := map[bool][]outageCall{}
	observe := func(open bool) Option {
		return WithObserver(func(d Decision) {
			mu.Lock()
			seen[open] = append(seen[open], outageCall{end: time.Since(start), took: d.Latency, err: d.Err})
			mu.Unlock()
		})
	}
	opts := []Option{WithBreaker(failures, coolDown)}
	if !batching {
		opts = append(opts, WithoutBatching())
	}
	closedClient := New(rdb, append(opts, observe(false))...)
	openClient := New(rdb, append(opts, WithFailOpen(), observe(true))...)
	var limiters []*Limiter
	for _, a := range algorithms {
		name := uniqueName(t) + "-" + a.name
		for _, c := range []*Client{closedClient, openClient} {
			limiters = append(limiters, a.new(c, name).WithDefault(Per(1_000_000, time.Hour)))
		}
	}
	var openDenied, openErrs atomic.Int64 // fail-open callers must see neither
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			l := limiters[i%len(limiters)]
			for !stop.Load() {
				ok, err := l.TryAcquire(ctx, 1)
				if l.client == openClient && err != nil {
					openErrs.Add(1)
				}
				if l.client == openClient && !ok {
					openDenied.Add(1)
				}
				time.Sleep(100 * time.Microsecond) // callers that do not spin, even when answered at once
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, srv.Kill())
	killed := time.Since(start)
	time.Sleep(outage) // go-redis's retries of the first calls, then the breaker
	restarting := time.Since(start)
	srv.Restart(t)
	restarted := time.Since(start)
	// Back within a second or so: a probe must find the server, and go-redis's
	// pool, after failing every dial, tries again once a second; then a
	// second more for every caller to follow, and time to see them settled
	// (2 s in all flaked in CI when the first call came back after 882 ms).
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()

	assert.Zero(t, openErrs.Load(), "fail-open callers never see an error")
	assert.Zero(t, openDenied.Load(), "nor a denial: the limit is far away")
	for _, open := range []bool{false, true} {
		var before, dead, fast []outageCall
		back := time.Duration(-1) // when the first call after the restart succeeded
		for _, c := range seen[open] {
			began := c.end - c.took
			switch {
			case c.end < killed:
				before = append(before, c)
			case began >= killed && began < restarted && errors.Is(c.err, ErrBreakerOpen):
				fast = append(fast, c)
			case began >= killed && began < restarted: // to the dead server, or through the restart
				dead = append(dead, c)
			case c.err == nil && c.end > restarted && back < 0:
				back = c.end
			}
		}
		for _, c := range before {
			require.NoError(t, c.err, "Redis was up")
		}
		require.NotEmpty(t, before)
		require.NotEmpty(t, fast)
		require.Positive(t, back, "callers came back")
		// Once a call found Redis back, the others follow within a second:
		// go-redis's pool, after failing every dial, answers with its last
		// dial error until its own retry (once a second) gets through.
		var after, settled int
		for _, c := range seen[open] {
			if began := c.end - c.took; began > back {
				after++
				if began > back+1100*time.Millisecond {
					settled++
					require.NoError(t, c.err, "a second after a call found Redis back, every call does")
				} else if c.err != nil {
					require.ErrorIs(t, c.err, ErrUnavailable)
				}
			}
		}
		require.Positive(t, settled, "calls a second after Redis was back")
		// Until the breaker opens (failures in a row) each of this Client's
		// callers may be in a call to the dead server, and then each
		// cool-down lets one probe through.
		probes := int((restarted-killed)/coolDown) + 1
		bound := failures + callers/2 + probes
		if batching {
			// Each of the evalsha.BatchCalls calls in flight, and each probe, may
			// carry a decision of every one of the Client's callers.
			bound = failures + (evalsha.BatchCalls+probes)*callers/2
		}
		assert.LessOrEqual(t, len(dead), bound, "calls that went to the dead server")
		for _, c := range dead {
			if c.end < restarting { // else it may have found the server back
				assert.ErrorIs(t, c.err, ErrUnavailable)
			}
		}
		took := spread(fast)
		t.Logf("fail-open %v: outage of %v: %d calls answered by the breaker in %v / %v / %v (median, p99, max), %d went to the dead server; back %v after the restart; %d calls before, %d after",
			open, (restarted - killed).Round(time.Millisecond), len(fast), took[0], took[1], took[2], len(dead), (back - restarted).Round(time.Millisecond), len(before), after)
		assert.Less(t, took[0], 100*time.Microsecond, "failing fast")
	}
}

// outageCall is one decision of TestRedisDownBreakerUnderLoad.
type outageCall struct {
	end, took time.Duration // end: since the test's start
	err       error
}

// spread returns the median, 99th percentile and maximum of the calls' durations.
func spread(calls []outageCall) [3]time.Duration {
	if len(calls) == 0 {
		return [3]time.Duration{}
	}
	d := make([]time.Duration, len(calls))
	for i, c := range calls {
		d[i] = c.took
	}
	slices.Sort(d)
	return [3]time.Duration{d[len(d)/2], d[len(d)*99/100], d[len(d)-1]}
}
