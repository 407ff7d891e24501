package redlimit

// The faults' test bed, which the fault_*_test.go files share (one file per
// fault injected: fault_redis_down, fault_restart, fault_script_flush,
// fault_reply_lost, fault_hang, fault_cancel, fault_failover,
// fault_memory_full, fault_misconfigured). Most tests break a redis-server
// of their own (redistest.Start) while goroutines acquire, and end by
// counting: the grants the clients saw against the limit, and against what
// Redis itself counted.
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
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// keepsCause reports whether err carries the network failure behind it.
func keepsCause(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// causeOf names the network failure behind err, for the figures.
func causeOf(err error) string {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		return "timeout"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected EOF"
	case errors.Is(err, io.EOF):
		return "EOF"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.As(err, &netErr):
		return "network error"
	}
	return "other"
}

// hammerUntil runs callers goroutines acquiring one permit at a time from
// every limiter until stop is closed, and returns the grants and every error
// seen.
func hammerUntil(ctx context.Context, limiters []*Limiter, callers int, stop <-chan struct{}) (granted *atomic.Int64, errs func() []error) {
	granted = &atomic.Int64{}
	var mu sync.Mutex
	var seen []error
	wait := hammer(ctx, callers, func(g, _ int) bool {
		select {
		case <-stop:
			return true
		default:
		}
		ok, err := limiters[g%len(limiters)].TryAcquire(ctx, 1)
		if err != nil {
			mu.Lock()
			seen = append(seen, err)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return false
		}
		if ok {
			granted.Add(1)
		}
		return false
	})
	return granted, func() []error {
		wait()
		return seen
	}
}

// The faults child: several processes acquiring at once, for the faults
// that need load from more than one (TestReplyLostAcrossProcesses,
// TestRestartOverAdmission).

const (
	fiCapacity   = 200 // grants per limiter: the limit of the window the run lies in
	fiProcesses  = 3
	fiGoroutines = 16 // per process, a quarter on each algorithm's limiter
	fiChildTime  = 30 * time.Second
)

// fiProfiles are the ways the three children talk to Redis, by process.
var fiProfiles = []struct {
	name        string
	maxRetries  int // go-redis's MaxRetries; 0 is its default, 3
	retryWindow bool
}{
	{"MaxRetries 3 + WithRetryWindow", 0, true},
	{"MaxRetries 3", 0, false},
	{"no retries", -1, false},
}

// fiSpec tells a child what to acquire from, and how.
type fiSpec struct {
	Addr        string        `json:"addr"`
	Names       []string      `json:"names"` // a limiter per algorithm, in the order of algorithms
	Capacity    int64         `json:"capacity"`
	Profile     int           `json:"profile"`      // an index into fiProfiles
	ReadTimeout time.Duration `json:"read_timeout"` // 0: go-redis's default, 3s
	Goroutines  int           `json:"goroutines"`
	// UntilEOF: the goroutines call until the child's stdin closes (the
	// restart test). Otherwise each stops at its first denial: the limiter's
	// capacity is used up, and no permit comes back.
	UntilEOF bool `json:"until_eof"`
}

// fiTally is what the callers of one limiter saw.
type fiTally struct {
	Grants [][2]int64     `json:"grants"` // each granted call's start and end, Unix ns
	Denied int            `json:"denied"`
	Errors map[string]int `json:"errors"` // by cause (causeOf)
	// Wrong are errors that are not ErrUnavailable wrapping a network cause.
	Wrong []string `json:"wrong"`
}

func (t *fiTally) add(o fiTally) {
	t.Grants = append(t.Grants, o.Grants...)
	t.Denied += o.Denied
	for cause, n := range o.Errors {
		if t.Errors == nil {
			t.Errors = map[string]int{}
		}
		t.Errors[cause] += n
	}
	t.Wrong = append(t.Wrong, o.Wrong...)
}

func (t *fiTally) errors() int {
	n := 0
	for _, c := range t.Errors {
		n += c
	}
	return n
}

// faultChild is a child of TestReplyLostAcrossProcesses and TestRestartOverAdmission:
// it acquires as its fiSpec says and reports a fiTally per limiter.
func faultChild(t *testing.T, raw []byte) any {
	var spec fiSpec
	decodeSpec(t, raw, &spec)
	return runFaultChild(spec)
}

func runFaultChild(spec fiSpec) []fiTally {
	profile := fiProfiles[spec.Profile]
	rdb := redis.NewClient(&redis.Options{
		Addr: spec.Addr, PoolSize: spec.Goroutines, MaxRetries: profile.maxRetries, ReadTimeout: spec.ReadTimeout,
	})
	defer rdb.Close()
	var opts []Option
	if profile.retryWindow {
		opts = append(opts, WithRetryWindow(15*time.Second)) // above ReadTimeout × (MaxRetries+1)
	}
	client := New(rdb, opts...)
	limiters := make([]*Limiter, len(spec.Names))
	for i, name := range spec.Names {
		limiters[i] = algorithms[i].new(client, name).WithDefault(algorithms[i].counting(spec.Capacity))
	}
	var stopped atomic.Bool
	if spec.UntilEOF {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			stopped.Store(true)
		}()
	}
	deadline := time.Now().Add(fiChildTime)
	tallies := make([]fiTally, spec.Goroutines)
	var wg sync.WaitGroup
	for g := range tallies {
		wg.Go(func() {
			l, tl := limiters[g%len(limiters)], &tallies[g]
			for !stopped.Load() && time.Now().Before(deadline) {
				began := time.Now()
				// Never a context that ends: the faults are the network's.
				ok, err := l.TryAcquire(context.Background(), 1)
				switch {
				case err != nil:
					if tl.Errors == nil {
						tl.Errors = map[string]int{}
					}
					tl.Errors[causeOf(err)]++
					if (!errors.Is(err, ErrUnavailable) || !keepsCause(err)) && len(tl.Wrong) < 5 {
						tl.Wrong = append(tl.Wrong, err.Error())
					}
					time.Sleep(5 * time.Millisecond) // an outage: do not spin
				case ok:
					tl.Grants = append(tl.Grants, [2]int64{began.UnixNano(), time.Now().UnixNano()})
				default:
					tl.Denied++
					if !spec.UntilEOF {
						return
					}
					time.Sleep(time.Millisecond) // held load, with CPU left for Redis on two cores
				}
			}
		})
	}
	wg.Wait()
	out := make([]fiTally, len(limiters))
	for g, tl := range tallies {
		out[g%len(limiters)].add(tl)
	}
	return out
}

// runFaultChildren runs fiProcesses children on spec, child p with profile
// p; calls during (if not nil) while they run, then closes their stdin; and
// returns each limiter's tally over all children, and how long they ran.
func runFaultChildren(t *testing.T, spec fiSpec, during func()) ([]fiTally, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), fiChildTime+10*time.Second)
	defer cancel()
	began := time.Now()
	specs := make([]any, fiProcesses)
	for p := range specs {
		s := spec
		s.Profile = p
		specs[p] = s
	}
	children := runChildren[[]fiTally](ctx, t, "faults", specs, during)
	took := time.Since(began)
	total := make([]fiTally, len(spec.Names))
	for p, child := range children {
		require.Len(t, child, len(total), "child %d", p)
		for i := range total {
			total[i].add(child[i])
		}
	}
	return total, took
}

// fiNames returns a limiter name per algorithm, in the order of algorithms.
func fiNames(t *testing.T) []string {
	names := make([]string, len(algorithms))
	for i, a := range algorithms {
		names[i] = uniqueName(t) + "-" + a.name
	}
	return names
}
