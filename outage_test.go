package redlimit

import (
	"context"
	"errors"
	"net"
	"slices"
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

// A hung Redis under a caller's deadline is an outage, not "no permit in
// time": the error is both ErrUnavailable and the context's, and WithFailOpen
// grants. ContextTimeoutEnabled makes go-redis give up at the deadline; without
// it the call waits out ReadTimeout and its retries (see docs/operations.md).
func TestOutageContextDeadline(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	var mu sync.Mutex
	var observed []error
	closed := New(rdb)
	open := New(rdb, WithFailOpen(), WithObserver(func(d Decision) {
		mu.Lock()
		observed = append(observed, d.Err)
		mu.Unlock()
	}))
	type handles struct{ closed, open *Limiter }
	var limiters []handles
	for _, a := range algorithms {
		name := uniqueName(t) + "-" + a.name
		h := handles{a.new(closed, name).WithDefault(tenPer10s), a.new(open, name).WithDefault(tenPer10s)}
		for _, l := range []*Limiter{h.closed, h.open} {
			ok, err := l.TryAcquire(ctx, 1) // scripts loaded, connections made: the pause is all that is left
			require.NoError(t, err)
			require.True(t, ok)
		}
		limiters = append(limiters, h)
	}
	mu.Lock()
	observed = nil
	mu.Unlock()
	// The pause outlives the test: the server is killed at cleanup.
	require.NoError(t, srv.Client(t).Do(ctx, "CLIENT", "PAUSE", "6000", "ALL").Err())

	const deadline = 200 * time.Millisecond
	var wg sync.WaitGroup
	for _, h := range limiters {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			began := time.Now()
			ok, err := h.closed.TryAcquire(ctx, 1)
			took := time.Since(began)
			assert.False(t, ok, "%s: fails closed", h.closed.Name())
			assert.ErrorIs(t, err, ErrUnavailable, "%s: Redis could not decide", h.closed.Name())
			assert.ErrorIs(t, err, context.DeadlineExceeded, "%s: because the deadline came first", h.closed.Name())
			assert.GreaterOrEqual(t, took, deadline)
			assert.Less(t, took, deadline+time.Second, "%s: go-redis gave up at the deadline", h.closed.Name())
		})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			ok, err := h.open.TryAcquire(ctx, 1)
			assert.NoError(t, err)
			assert.True(t, ok, "%s: fails open", h.open.Name())
		})
	}
	wg.Wait()
	require.Len(t, observed, len(algorithms), "the observer is told of each fail-open")
	for _, err := range observed {
		assert.ErrorIs(t, err, ErrUnavailable)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	}
}

// Refusals only an operator can fix are ErrMisconfigured, not outages: they
// are never failed open, and they do not open a breaker.
func TestOutageMisconfigured(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	// A user limited to other keys than the limiters': whatever the key
	// layout, names outside svc:* give keys outside it. (REFERENCE.md §6: a
	// name inside it is not enough either, as the hash-tagged state keys
	// "{svc:…}:…" do not start with "svc:".)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "svc", "on", ">pw", "~svc:*", "+@all").Err())
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+@all", "-@scripting").Err())
	for _, tc := range []struct {
		name, user, password, refusal string
	}{
		{"key pattern", "svc", "pw", "NOPERM"},
		{"no scripting", "noscripts", "pw", "NOPERM"},
		{"wrong password", "svc", "wrong", "WRONGPASS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: tc.user, Password: tc.password})
			t.Cleanup(func() { rdb.Close() })
			var observed []error
			log := &commandLog{}
			rdb.AddHook(log)
			c := New(rdb, WithFailOpen(), WithBreaker(1, time.Hour), WithObserver(func(d Decision) { observed = append(observed, d.Err) }))
			for _, a := range algorithms {
				l := a.new(c, uniqueName(t)).WithDefault(tenPer10s)
				for range 2 {
					r, err := l.Allow(ctx, 1)
					assert.ErrorIs(t, err, ErrMisconfigured, a.name)
					assert.NotErrorIs(t, err, ErrUnavailable, "%s: not an outage", a.name)
					assert.ErrorContains(t, err, tc.refusal)
					assert.False(t, r.Allowed, "%s: never failed open", a.name)
				}
				_, err := l.Config(ctx)
				assert.ErrorIs(t, err, ErrMisconfigured, a.name)
			}
			assert.Len(t, observed, 2*len(algorithms))
			for _, err := range observed {
				assert.ErrorIs(t, err, ErrMisconfigured)
			}
			// A breaker that opens at the first failure stayed closed: every
			// call went to Redis. (A wrong password fails in the handshake,
			// before EVALSHA is sent.)
			if tc.refusal != "WRONGPASS" {
				assert.Equal(t, 3*len(algorithms), log.count("evalsha"), "every call reached Redis")
			}
		})
	}
}

// fakeRefusal is a reply from Redis, for scriptError's table.
type fakeRefusal string

func (e fakeRefusal) Error() string { return string(e) }
func (fakeRefusal) RedisError()     {}

// Which replies are misconfiguration, which are outages.
func TestScriptErrorKinds(t *testing.T) {
	background := context.Background()
	canceled, cancel := context.WithCancel(background)
	cancel()
	expired, cancelExpired := context.WithDeadline(background, time.Now().Add(-time.Second))
	defer cancelExpired()
	type reply struct {
		ctx context.Context
		err error
	}
	refusals := func(texts ...string) (replies []reply) {
		for _, text := range texts {
			replies = append(replies, reply{background, fakeRefusal(text)})
		}
		return replies
	}
	for _, kind := range []struct {
		want    []error
		replies []reply
	}{
		{[]error{ErrMisconfigured}, refusals(
			"NOPERM this user has no permissions to access one of the keys used as arguments",
			"NOPERM this user has no permissions to run the 'evalsha' command",
			"NOAUTH Authentication required.",
			"WRONGPASS invalid username-password pair or user is disabled.",
			"ERR unknown command 'EVALSHA', with args beginning with: ",
			"ERR unknown subcommand 'LOAD'. Try SCRIPT HELP.",
			"ERR DB index is out of range",
			"ERR The user executing the script can't access at least one of the keys mentioned in the command arguments script: 3b0b, on @user_script:1.",
		)},
		{[]error{ErrUnavailable}, append(refusals(
			"LOADING Redis is loading the dataset in memory",
			"OOM command not allowed when used memory > 'maxmemory'.",
			"READONLY You can't write against a read only replica.",
			"BUSY Redis is busy running a script.",
		), reply{background, &net.OpError{Op: "dial", Err: errors.New("connection refused")}})},
		{[]error{ErrNotInitialized}, refusals("ERR REDLIMIT not initialized x")},
		// The caller's own cancellation is not an outage: WithFailOpen
		// must not grant a caller that is gone.
		{[]error{context.Canceled}, []reply{
			{canceled, context.Canceled},
			{canceled, &net.OpError{Op: "read", Err: errors.New("i/o timeout")}},
		}},
		// A deadline that passed while Redis hung is one.
		{[]error{ErrUnavailable, context.DeadlineExceeded}, []reply{
			{expired, context.DeadlineExceeded},
			{expired, &net.OpError{Op: "read", Err: errors.New("i/o timeout")}},
		}},
	} {
		for _, r := range kind.replies {
			err := evalsha.Classify(r.ctx, r.err, nil)
			for _, want := range kind.want {
				assert.ErrorIs(t, err, want, "%v", r.err)
			}
			for _, other := range []error{ErrMisconfigured, ErrUnavailable, ErrNotInitialized, context.Canceled, context.DeadlineExceeded} {
				if !slices.Contains(kind.want, other) {
					assert.NotErrorIs(t, err, other, "%v", r.err)
				}
			}
			if !slices.Contains(kind.want, ErrNotInitialized) { // the scripts' own errors keep their detail only
				assert.ErrorIs(t, err, r.err, "the cause is kept")
			}
		}
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
func TestBreakerSteps(t *testing.T) {
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
func TestBreakerOutage(t *testing.T) {
	t.Run("alone", func(t *testing.T) { breakerOutage(t, false, 2500*time.Millisecond) })
	t.Run("batched", func(t *testing.T) { breakerOutage(t, true, 5*time.Second) })
}

func breakerOutage(t *testing.T, batching bool, outage time.Duration) {
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

// outageCall is one decision of TestBreakerOutage.
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
