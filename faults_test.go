package redlimit

// Faults: each test breaks a redis-server of its own (redistest.Start) while
// goroutines acquire, and ends by counting: the grants the clients saw
// against the limit, and against what Redis itself counted.
//
// The counting tests use limits that cannot refill during the test (a window
// of ten years; a funnel that drains one permit an hour), so a limiter grants
// exactly its capacity and then only denies: the workers hammer each limiter
// until it denies them, and exactly capacity grants, no more and no fewer, is
// the proof that a fault neither over-admitted nor lost or double-counted a
// grant.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

const (
	faultCapacity = 400 // grants per limiter in a counting test
	faultWorkers  = 8   // goroutines per limiter
	faultTimeout  = 20 * time.Second
)

// wireCounter counts commands twice: as the library asks for them (its
// commandLog, which sees a whole call, go-redis's retries included) and as
// they are written to a socket (DialHook), where a command go-redis re-sends
// after a read timeout or a broken connection shows up again.
type wireCounter struct {
	*commandLog
	mu      sync.Mutex
	written map[string]int // "evalsha", "evalsha <sha>", "eval"
}

func newWireCounter() *wireCounter {
	return &wireCounter{commandLog: &commandLog{}, written: map[string]int{}}
}

// write counts a command written, by name and, for EVALSHA, by script.
func (w *wireCounter) write(name, script string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.written[name]++
	if script != "" {
		w.written[script]++
	}
}

// wrote returns how many commands called name (or running the script name
// says) were written.
func (w *wireCounter) wrote(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written[name]
}

func (w *wireCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn, w: w}, nil
	}
}

var (
	respEvalSha = []byte("$7\r\nevalsha\r\n$40\r\n")
	respEval    = []byte("$4\r\neval\r\n")
)

// countingConn counts the EVALSHA (by script) and EVAL commands written to
// it. go-redis writes each command, or pipeline, in one Write.
type countingConn struct {
	net.Conn
	w *wireCounter
}

func (c *countingConn) Write(p []byte) (int, error) {
	for rest := p; ; {
		i := bytes.Index(rest, respEvalSha)
		if i < 0 || len(rest) < i+len(respEvalSha)+40 {
			break
		}
		rest = rest[i+len(respEvalSha):]
		sha := string(rest[:40])
		c.w.write("evalsha", "evalsha "+sha)
		// The requests it carries, by algorithm (commandLog's "requests …").
		if sha == scripts.Decide.SHA {
			command := rest
			if end := bytes.Index(rest, respEvalSha); end >= 0 {
				command = rest[:end]
			}
			for _, a := range algorithms {
				for range bytes.Count(command, []byte(fmt.Sprintf("$%d\r\n%s\r\n", len(a.name), a.name))) {
					c.w.write("requests "+a.name, "")
				}
			}
		}
	}
	for range bytes.Count(p, respEval) {
		c.w.write("eval", "")
	}
	return c.Conn.Write(p)
}

// faultBed is a redis-server of the test's own, a client to it with the wire
// counters, and an admin connection for the faults and for reading state.
type faultBed struct {
	srv   *redistest.Server
	rdb   *redis.Client
	admin *redis.Client
	wire  *wireCounter
	// EVALSHA counts when warm reset the server's (see evalshas)
	asked0, written0 int
}

func newFaultBed(t *testing.T, opts *redis.Options) *faultBed {
	srv := redistest.Start(t)
	opts.Addr = srv.Addr()
	b := &faultBed{srv: srv, rdb: redis.NewClient(opts), wire: newWireCounter()}
	b.rdb.AddHook(b.wire)
	b.admin = redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 5 * time.Second, MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() {
		b.rdb.Close()
		b.admin.Close()
	})
	return b
}

// faultRun is one limiter under fire, and what its callers saw.
type faultRun struct {
	algo    algo
	limiter *Limiter
	cfg     Config
	granted atomic.Int64
	denied  atomic.Int64
	mu      sync.Mutex
	errs    []error
}

func (r *faultRun) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *faultRun) errors() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

// countingRuns makes one limiter per algorithm on c, with a counting config
// as the handle's default (stored nowhere, so it survives a restart).
func countingRuns(t *testing.T, c *Client) []*faultRun {
	var runs []*faultRun
	for _, a := range algorithms {
		cfg := a.counting(faultCapacity)
		runs = append(runs, &faultRun{algo: a, cfg: cfg, limiter: a.new(c, uniqueName(t)+"-"+a.name).WithDefault(cfg)})
	}
	return runs
}

// faultHammer starts workers goroutines per run, each calling TryAcquire(1)
// until done says to stop (done sees the call's outcome), or faultTimeout
// passes. It returns a wait for them all.
func faultHammer(t *testing.T, runs []*faultRun, workers int, done func(r *faultRun, began, ended time.Time, ok bool, err error) bool) func() {
	ctx, cancel := context.WithTimeout(context.Background(), faultTimeout)
	wait := hammer(ctx, len(runs)*workers, func(g, _ int) bool {
		r := runs[g/workers]
		if ahead(runs, r) {
			// Runs keep pace, so that a fault injected at a share of the
			// capacity (waitProgress) finds every run still acquiring: on
			// two busy cores one limiter's workers can get the CPU long
			// enough to use up their capacity while another's wait.
			time.Sleep(time.Millisecond)
			return false
		}
		began := time.Now()
		ok, err := r.limiter.TryAcquire(ctx, 1)
		switch {
		case err != nil:
			r.fail(err)
			time.Sleep(5 * time.Millisecond) // an outage: do not spin
		case ok:
			r.granted.Add(1)
		default:
			r.denied.Add(1)
		}
		return done(r, began, time.Now(), ok, err)
	})
	return func() {
		t.Helper()
		wait()
		defer cancel()
		require.NoError(t, ctx.Err(), "the workers did not finish in %v", faultTimeout)
	}
}

// ahead reports whether r is more than a tenth of the capacity ahead of the
// slowest run that has not finished.
func ahead(runs []*faultRun, r *faultRun) bool {
	granted := r.granted.Load()
	for _, other := range runs {
		if n := other.granted.Load(); n < faultCapacity && granted > n+faultCapacity/10 {
			return true
		}
	}
	return false
}

// untilDenied stops a worker at its first denial: with a counting config,
// the limiter's capacity is used up.
func untilDenied(_ *faultRun, _, _ time.Time, ok bool, err error) bool { return err == nil && !ok }

// waitProgress waits until every run has granted at least n, and checks none
// has used up its capacity yet: a fault injected now hits clients acquiring.
func waitProgress(t *testing.T, runs []*faultRun, n int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, r := range runs {
			if r.granted.Load() < n {
				return false
			}
		}
		return true
	}, faultTimeout, time.Millisecond)
	for _, r := range runs {
		require.Less(t, r.granted.Load(), int64(faultCapacity), "%s used up its capacity before the fault", r.algo.name)
	}
}

// assertExact checks each run granted exactly its capacity, that Redis
// counted as much, and that no call failed.
func assertExact(t *testing.T, admin *redis.Client, runs []*faultRun) {
	t.Helper()
	for _, r := range runs {
		assert.Empty(t, r.errors(), "%s: errors", r.algo.name)
		assert.Equal(t, int64(faultCapacity), r.granted.Load(), "%s: grants the clients saw", r.algo.name)
		assert.Equal(t, int64(faultCapacity), r.algo.counted(t, admin, r.limiter, r.cfg), "%s: grants Redis counted", r.algo.name)
	}
}

// warm loads every script, then starts counting EVALSHA afresh (evalshas).
func (b *faultBed) warm(t *testing.T, runs []*faultRun) {
	t.Helper()
	ctx := context.Background()
	for _, r := range runs {
		_, err := r.limiter.Allow(ctx, 0)
		require.NoError(t, err)
	}
	require.NoError(t, b.admin.ConfigResetStat(ctx).Err())
	b.asked0, b.written0 = b.wire.count("evalsha"), b.wire.wrote("evalsha")
}

// evalshas counts the EVALSHA since warm: asked for by the library, written
// to sockets by go-redis, and run by the server (INFO commandstats).
func (b *faultBed) evalshas(t *testing.T) (asked, written, ran int) {
	t.Helper()
	info, err := b.admin.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			ran, err = strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			require.NoError(t, err)
		}
	}
	return b.wire.count("evalsha") - b.asked0, b.wire.wrote("evalsha") - b.written0, ran
}

func TestFaultScriptFlush(t *testing.T) {
	t.Run("alone", func(t *testing.T) { faultScriptFlush(t, false) })
	t.Run("batched", func(t *testing.T) { faultScriptFlush(t, true) })
}

func faultScriptFlush(t *testing.T, batching bool) {
	b := newFaultBed(t, &redis.Options{})
	ctx := context.Background()
	var opts []Option
	if !batching {
		opts = append(opts, WithoutBatching())
	}
	runs := countingRuns(t, New(b.rdb, opts...))
	wait := faultHammer(t, runs, faultWorkers, untilDenied)
	flushes := 0
	for _, at := range []int64{faultCapacity / 5, faultCapacity / 2} {
		waitProgress(t, runs, at)
		require.NoError(t, b.admin.ScriptFlush(ctx).Err())
		flushes++
	}
	wait()

	assertExact(t, b.admin, runs)
	for _, r := range runs {
		t.Logf("%s: %d grants, %d denials", r.algo.name, r.granted.Load(), r.denied.Load())
	}
	// One load on the fresh server, then one per flush: callers that met
	// NOSCRIPT together share one (Transport.reload), whatever the
	// algorithm: every decision, lone or batched, runs the one script.
	loads := b.wire.count("script load " + scripts.Decide.SHA)
	t.Logf("%d SCRIPT LOAD", loads)
	assert.Equal(t, 1+flushes, loads, "reloaded once after each flush")
	assert.Zero(t, b.wire.count("eval"), "the library never asks for EVAL")
	assert.Zero(t, b.wire.wrote("eval"), "no EVAL was written to a socket")
}

// The re-sent scripts of killed connections and stalls count once with
// WithRetryWindow; without it they would only count twice (deny sooner).
func TestFaultClientKill(t *testing.T) {
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

func TestFaultStall(t *testing.T) {
	t.Run("alone", func(t *testing.T) { faultStall(t, false) })
	t.Run("batched", func(t *testing.T) { faultStall(t, true) })
}

func faultStall(t *testing.T, batching bool) {
	// go-redis gives up reading after ReadTimeout, closes the connection and
	// sends the script again on another (MaxRetries): the server, stalled in
	// DEBUG SLEEP, may run both copies, or have run the first and held its
	// reply. A retry needs an idle connection: a new one starts with HELLO,
	// which the stalled server cannot answer in time either, and go-redis
	// does not retry a handshake that timed out (the call fails with "i/o
	// timeout"). So the pool is first filled with idle connections, eight for
	// each call in flight, far more than the three tries that span the stall,
	// as this machine's hiccups can stretch it. Four workers per limiter: a
	// herd of retries much larger, under -race on two cores, keeps timing out
	// at 200ms well after the stall.
	const workers = 4
	inFlight := len(algorithms) * workers
	b := newFaultBed(t, &redis.Options{ReadTimeout: 200 * time.Millisecond, MaxRetries: 8, PoolSize: 10 * inFlight})
	ctx := context.Background()
	opts := []Option{WithRetryWindow(15 * time.Second)}
	if !batching {
		opts = append(opts, WithoutBatching())
	}
	runs := countingRuns(t, New(b.rdb, opts...))
	b.warm(t, runs)
	var conns []*redis.Conn // each holds a connection of the pool until Close
	for tries := 0; len(conns) < 8*inFlight && tries < 16*inFlight; tries++ {
		c := b.rdb.Conn()
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close() // a handshake that outlasted 200ms on this busy machine
			continue
		}
		conns = append(conns, c)
	}
	require.Len(t, conns, 8*inFlight)
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	wait := faultHammer(t, runs, workers, untilDenied)
	waitProgress(t, runs, faultCapacity/4)
	require.GreaterOrEqual(t, b.rdb.PoolStats().IdleConns, uint32(6*inFlight))
	stalled := time.Now()
	require.NoError(t, b.admin.Do(ctx, "DEBUG", "SLEEP", "0.5").Err())
	require.GreaterOrEqual(t, time.Since(stalled), 500*time.Millisecond)
	wait()

	assertExact(t, b.admin, runs)
	asked, written, ran := b.evalshas(t)
	t.Logf("EVALSHA: %d asked, %d written (%d re-sent), %d run by the server (%d more than asked)", asked, written, written-asked, ran, ran-asked)
	total := 0
	for _, r := range runs {
		// Its requests, alone or in batches: a batch re-sent re-sends each.
		key := "requests " + r.algo.name
		resent := b.wire.wrote(key) - b.wire.count(key)
		total += resent
		t.Logf("%s: %d grants, %d denials, %d requests re-sent", r.algo.name, r.granted.Load(), r.denied.Load(), resent)
		if !batching {
			assert.Positive(t, resent, "%s: go-redis re-sent scripts whose reply it did not read", r.algo.name)
		}
	}
	// Batched, the few calls in flight during the stall hold whichever
	// requests came: some are re-sent, not always of every algorithm.
	assert.Positive(t, total, "go-redis re-sent scripts whose reply it did not read")
	assert.Greater(t, ran, asked, "the server ran some requests more than once: the counts above prove each counted once")
}

// keepsCause reports whether err carries the network failure behind it.
func keepsCause(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

func TestFaultRestart(t *testing.T) {
	// Restart is kill -9 and a new redis-server on the same port, with no
	// persistence: every limiter's state, and the script cache, is lost with
	// it. That is what a Redis without persistence does; the handles here
	// keep their config as a default (WithDefault), so they go on after it
	// with fresh state, each granting its capacity once more. go-redis's
	// retries (MaxRetries) would bridge an outage this short: without them,
	// the callers see it.
	t.Run("alone", func(t *testing.T) { faultRestart(t, false) })
	t.Run("batched", func(t *testing.T) { faultRestart(t, true) })
}

func faultRestart(t *testing.T, batching bool) {
	b := newFaultBed(t, &redis.Options{MaxRetries: -1, DialerRetries: 1})
	ctx := context.Background()
	var opts []Option
	if !batching {
		opts = append(opts, WithoutBatching())
	}
	runs := countingRuns(t, New(b.rdb, opts...))
	// Each grant is filed by when its call ran: wholly before the restart,
	// wholly after it, or across it (then it may belong to either life).
	var began, ended atomic.Int64 // of the restart, Unix ns; 0 until then
	type phases struct{ before, across, after atomic.Int64 }
	phase := map[*faultRun]*phases{}
	for _, r := range runs {
		phase[r] = &phases{}
	}
	wait := faultHammer(t, runs, faultWorkers, func(r *faultRun, start, end time.Time, ok bool, err error) bool {
		restartEnded := ended.Load()
		if ok {
			switch p := phase[r]; {
			case began.Load() == 0 || end.UnixNano() < began.Load():
				p.before.Add(1)
			case restartEnded != 0 && start.UnixNano() > restartEnded:
				p.after.Add(1)
			default:
				p.across.Add(1)
			}
		}
		return restartEnded != 0 && err == nil && !ok
	})
	waitProgress(t, runs, faultCapacity/4)
	began.Store(time.Now().UnixNano())
	b.srv.Restart(t)
	ended.Store(time.Now().UnixNano())
	wait()

	for _, r := range runs {
		p := phase[r]
		before, across, after := p.before.Load(), p.across.Load(), p.after.Load()
		errs := r.errors()
		t.Logf("%s: %d grants before the restart, %d across it, %d after; %d denials; %d errors, the first %v",
			r.algo.name, before, across, after, r.denied.Load(), len(errs), errs[:min(1, len(errs))])
		require.Equal(t, r.granted.Load(), before+across+after)
		require.NotEmpty(t, errs, "%s: the outage was seen", r.algo.name)
		for _, err := range errs {
			assert.ErrorIs(t, err, ErrUnavailable)
			assert.True(t, keepsCause(err), "the cause is kept: %v", err)
		}
		// The second life counted exactly its capacity: every grant after
		// the restart, and some made across it.
		assert.Equal(t, int64(faultCapacity), r.algo.counted(t, b.admin, r.limiter, r.cfg), "%s: grants Redis counted after the restart", r.algo.name)
		assert.LessOrEqual(t, after, int64(faultCapacity), "%s", r.algo.name)
		assert.GreaterOrEqual(t, after+across, int64(faultCapacity), "%s", r.algo.name)
		// And the first life at most its capacity.
		assert.LessOrEqual(t, before+across+after, int64(2*faultCapacity), "%s: at most the capacity in each life", r.algo.name)
	}
	// The decisions' script was loaded again.
	ok, err := b.admin.ScriptExists(ctx, scripts.Decide.SHA).Result()
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, ok, "the decision script was loaded again")
	assert.Zero(t, b.wire.wrote("eval"))
}

func TestFaultUnreachable(t *testing.T) {
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
	deniedBy := func(open bool) func(o outcome) bool {
		return func(o outcome) bool { return o.open == open && o.err == nil && !o.ok }
	}
	// Until both kinds of client are denied on every limiter: its capacity is used up.
	require.Eventually(t, func() bool {
		for name := range names {
			if count(name, deniedBy(false)) == 0 || count(name, deniedBy(true)) == 0 {
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

func TestFaultMemory(t *testing.T) {
	// Every key a limiter writes expires on its own: after the limiters go
	// idle and their windows pass, a server that held nothing but them holds
	// nothing at all. Real time, an interval of 300ms, for every algorithm,
	// Overall and PerClient, with the config as a default (no config key)
	// and stored with a keep-alive of 1s (the config key expires too),
	// through two clients whose request logs keep ids 300ms
	// (WithRetryWindow). While they run, no key is ever due to live more than
	// 300ms on (a config, 1s).
	//
	// Calls on the stored configs' names fall back to the same config as a
	// default: this machine's hiccups can outlast the keep-alive, and a
	// config left idle that long rightly expires.
	const interval, keepAlive = 300 * time.Millisecond, time.Second
	b := newFaultBed(t, &redis.Options{})
	ctx := context.Background()
	clients := []*Client{
		New(b.rdb, WithRetryWindow(interval), WithClientID("first")),
		New(b.rdb, WithRetryWindow(interval), WithClientID("second")),
	}
	var limiters []*Limiter
	for _, a := range algorithms {
		for _, typ := range []RateType{Overall, PerClient} {
			cfg := Config{Type: typ, Rate: 20, Interval: interval}
			name := fmt.Sprintf("%s-%s-%v", uniqueName(t), a.name, typ)
			kept := cfg
			kept.KeepAlive = keepAlive
			require.NoError(t, a.new(clients[0], name+"-stored").SetRate(ctx, kept))
			for _, c := range clients {
				limiters = append(limiters, a.new(c, name+"-default").WithDefault(cfg), a.new(c, name+"-stored").WithDefault(cfg))
			}
		}
	}

	// seen is the most keys of each kind seen at once.
	seen := map[string]int{}
	inspect := func() {
		keys, err := b.admin.Keys(ctx, "*").Result()
		require.NoError(t, err)
		ttls := make([]*redis.DurationCmd, len(keys))
		_, err = b.admin.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				ttls[i] = p.PTTL(ctx, k)
			}
			return nil
		})
		require.NoError(t, err)
		kinds := map[string]int{}
		for i, k := range keys {
			kinds[keyKind(k)]++
			// -2: it expired since KEYS; 0: it expires within the millisecond.
			ttl, within := ttls[i].Val(), interval
			if keyKind(k) == "configs" {
				within = keepAlive
			}
			assert.True(t, ttl == -2 || (ttl >= 0 && ttl <= within), "%s expires within %v: %v", k, within, ttl)
		}
		for kind, n := range kinds {
			seen[kind] = max(seen[kind], n)
		}
	}
	inspect()

	var grants atomic.Int64
	var wg sync.WaitGroup
	until := time.Now().Add(3 * interval)
	for _, l := range limiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(until) {
				ok, err := l.TryAcquire(ctx, 1)
				if !assert.NoError(t, err) {
					return
				}
				if ok {
					grants.Add(1)
				}
			}
		}()
	}
	for time.Now().Before(until) {
		time.Sleep(interval / 3)
		inspect()
	}
	wg.Wait()
	idle := time.Now()
	inspect()
	t.Logf("%d grants; keys of each kind, at most: %v", grants.Load(), seen)
	for _, kind := range []string{"request logs", "client registries", "per-client state", "configs", "shared state"} {
		assert.Positive(t, seen[kind], "the limiters wrote %s", kind)
	}

	// A key is gone once it expired (SCAN and KEYS skip it) and once Redis
	// reclaimed it (DBSIZE): lazily, or by its expiry cycle, ten times a second.
	require.Eventually(t, func() bool {
		keys, err := b.admin.Keys(ctx, "*").Result()
		return err == nil && len(keys) == 0
	}, keepAlive+2*time.Second, 10*time.Millisecond, "every key expired")
	expired := time.Since(idle)
	require.Eventually(t, func() bool {
		n, err := b.admin.DBSize(ctx).Result()
		return err == nil && n == 0
	}, 2*time.Second, 10*time.Millisecond, "and was reclaimed")
	t.Logf("all keys expired %v after the last call, reclaimed after %v", expired.Round(time.Millisecond), time.Since(idle).Round(time.Millisecond))
	assert.Less(t, expired, keepAlive+time.Second)
}

// keyKind names what a limiter's key holds, by its name.
func keyKind(key string) string {
	switch {
	case strings.HasSuffix(key, ":requests"):
		return "request logs"
	case strings.HasSuffix(key, ":clients"):
		return "client registries"
	case strings.HasSuffix(key, ":first") || strings.HasSuffix(key, ":second"):
		return "per-client state"
	case !strings.Contains(key, "}:"):
		return "configs"
	}
	return "shared state"
}

// A stored config's keep-alive is an idle TTL "refreshed on every acquire"
// (Config.KeepAlive), as Redisson's keepAliveTime is: its tryAcquire
// refreshes it whether it grants or not. A limiter kept saturated by steady
// traffic is busy, not idle: were only grants to refresh it, its config would
// expire one keep-alive after the last grant, and every call then fail with
// ErrNotInitialized.
//
// The limiters decide on a clock that stands still (newClient), so after its
// one grant each denies every request, whatever the algorithm; the keep-alive
// is a Redis TTL and runs in real time.
func TestKeepAliveWhileDenied(t *testing.T) {
	rdb := redistest.Shared(t).Client(t)
	ctx := context.Background()
	for _, a := range algorithms {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			l := a.limiter(t, rdb)
			require.NoError(t, l.SetRate(ctx, Config{Rate: 1, Interval: time.Minute, KeepAlive: time.Minute}))
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok)
			time.Sleep(time.Second)
			ok, err = l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.False(t, ok)
			ttl, err := l.RemainTimeToLive(ctx)
			require.NoError(t, err)
			assert.Greater(t, ttl, time.Minute-500*time.Millisecond, "a denied acquire refreshes the keep-alive, as a grant does")
		})
		// Asked every 20ms and nearly always denied, the limiter is never
		// idle: its config, kept alive 2s, must outlive 3s of asking. (2s, not
		// less: a -race run on a loaded machine can stall a goroutine ~1s.)
		t.Run(a.name+"/saturated", func(t *testing.T) {
			t.Parallel()
			l := a.limiter(t, rdb)
			require.NoError(t, l.SetRate(ctx, Config{Rate: 1, Interval: 100 * time.Millisecond, KeepAlive: 2 * time.Second}))
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				_, err := l.TryAcquire(ctx, 1)
				require.NoError(t, err, "asked every 20ms, the limiter is not idle")
			}
		})
	}
}
