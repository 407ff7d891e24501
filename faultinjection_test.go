package redlimit

// Fault injection: a TCP proxy (internal/faultproxy) between go-redis and a
// real redis-server of the test's own breaks the replies to the scripts
// (EVALSHA) while three processes (this test binary run again as
// TestFaultInjectionChild) of 16 goroutines each acquire from one limiter per
// algorithm. The faults: a reply held past the clients' read timeout (on top
// of a millisecond of latency each way on everything), a connection closed
// after the request reached Redis and before its reply came back, a reply cut
// in half. Redis runs every script it receives, so each fault loses the reply
// of a decision Redis made, and go-redis then re-sends it (MaxRetries).
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
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/faultproxy"
	"github.com/redlimit/redlimit/internal/redistest"
)

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

// faultChild is a child of TestFaultInjection and TestRestartOverAdmission:
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

func TestFaultInjection(t *testing.T) {
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
