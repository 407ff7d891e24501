package redlimit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// Degraded mode's bound across real processes: three processes, each a
// Client in degraded mode, hammer one fixed window of 31 per second on a
// real redis-server, which is killed under the load and restarted 3 s
// later (with no data: it does not persist). Every decision is placed in
// its window exactly, on the machine's one clock that Redis TIME reads too:
// a fixed window's ResetAfter is its end minus the decision's now, which
// lies between the call's start and end, and only one window end fits in a
// span shorter than the window. Counted per window and per side, the grants
// must keep the bound degraded.go states, and its exact figures:
//
//   - Redis grants at most L = 31 in any window, exactly 31 in a window
//     wholly decided in Redis where demand exceeded it;
//   - each instance grants locally at most its share, ⌈31 / 3⌉ = 11, in
//     any window, and exactly 11 in a window where it denied one locally;
//     so at most L + N − 1 = 33 locally, exactly 33 in the windows wholly
//     inside the outage, and at most 2L + N − 1 = 64 in all in a window
//     that holds a switch;
//   - each instance goes back to Redis once it answers again.

const degradedChildEnv = "REDLIMIT_DEGRADED_CHILD"

// The process test's limit, instances and window.
const (
	procLimit     = 31
	procInstances = 3
	procShare     = (procLimit + procInstances - 1) / procInstances
	procWindow    = int64(time.Second / time.Microsecond)
)

type degradedSpec struct {
	Addr, Prefix, Name string
	Heartbeat          time.Duration
}

// windowCount is what one child's decisions did in one window.
type windowCount struct {
	RedisGrants, RedisDenials, LocalGrants, LocalDenials int
}

// degradedReport is what a child says.
type degradedReport struct {
	Instances   int                    // the share's divisor when the load began
	Windows     map[int64]*windowCount // by window: its start, in windows since the epoch
	LocalLimits map[int64]int          // the Limit local decisions reported, and how many did
	Decided     int
	Unplaced    int      // decisions no window could be found for (none expected)
	Errors      []string // the first few errors (none expected)
	LastLocal   int64    // wall µs: when the last local decision returned
}

// placeWindow finds the window of a fixed window's decision made between
// before and after (wall µs) that reports reset µs until its end: the one
// whose end lies in [before + reset, after + reset]. ok is false when none
// or two do.
func placeWindow(before, after, reset int64) (int64, bool) {
	lo, hi := before+reset, after+reset
	end := (lo + procWindow - 1) / procWindow * procWindow
	return end/procWindow - 1, end <= hi && end+procWindow > hi
}

func TestDegradedChild(t *testing.T) {
	raw := os.Getenv(degradedChildEnv)
	if raw == "" {
		t.Skip("runs only as a child process of TestDegradedAcrossProcesses")
	}
	var spec degradedSpec
	require.NoError(t, json.Unmarshal([]byte(raw), &spec))
	// go-redis dials 5 times, 100 ms apart, by default: a call in flight
	// when Redis died would take over a second, longer than a window, and
	// so could not be placed in one. The breaker answers the others.
	rdb := redis.NewClient(&redis.Options{Addr: spec.Addr, PoolSize: 8, DialerRetries: 1})
	defer rdb.Close()
	ctx := context.Background()
	c := New(rdb, WithPrefix(spec.Prefix), WithDegraded(Degraded{Heartbeat: spec.Heartbeat}), WithBreaker(3, 100*time.Millisecond))
	l := c.FixedWindow(spec.Name).WithDefault(Per(procLimit, time.Second))
	_, err := l.Allow(ctx, 0) // loads the script; the config seen
	require.NoError(t, err)
	for deadline := time.Now().Add(time.Minute); c.DegradedState().Instances < procInstances; {
		require.True(t, time.Now().Before(deadline), "the others never counted")
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("ready")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	require.NoError(t, err)
	var start, stop int64
	_, err = fmt.Sscan(line, &start, &stop)
	require.NoError(t, err)
	report := degradedReport{Instances: c.DegradedState().Instances, Windows: map[int64]*windowCount{}, LocalLimits: map[int64]int{}}
	time.Sleep(time.Until(time.UnixMicro(start)))
	var mu sync.Mutex
	hammer(ctx, 4, func(g, n int) bool {
		before := time.Now().UnixMicro()
		if before >= stop {
			return true
		}
		r, err := l.Allow(ctx, 1)
		after := time.Now().UnixMicro()
		mu.Lock()
		defer mu.Unlock()
		report.Decided++
		if err != nil {
			if len(report.Errors) < 5 {
				report.Errors = append(report.Errors, err.Error())
			}
			return false
		}
		k, ok := placeWindow(before, after, r.ResetAfter.Microseconds())
		if !ok {
			report.Unplaced++
			return false
		}
		w := report.Windows[k]
		if w == nil {
			w = &windowCount{}
			report.Windows[k] = w
		}
		switch {
		case r.Reason == ReasonDegraded && r.Allowed:
			w.LocalGrants++
		case r.Reason == ReasonDegraded:
			w.LocalDenials++
		case r.Allowed:
			w.RedisGrants++
		default:
			w.RedisDenials++
		}
		if r.Reason == ReasonDegraded {
			report.LocalLimits[r.Limit]++
			report.LastLocal = max(report.LastLocal, after)
		}
		time.Sleep(time.Millisecond) // ~1,000 calls a second a goroutine at most: demand far above 31
		return false
	})()
	require.NoError(t, json.NewEncoder(os.Stdout).Encode(report))
}

func TestDegradedAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t) // its own: killed and restarted
	spec := degradedSpec{Addr: srv.Addr(), Prefix: redistest.UniqueName(t, "deg"), Name: "api", Heartbeat: 200 * time.Millisecond}
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type child struct {
		cmd   *exec.Cmd
		out   *childOutput
		stdin io.WriteCloser
	}
	var children []child
	for range procInstances {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDegradedChild$", "-test.count=1", "-test.timeout=3m")
		cmd.Env = append(os.Environ(), degradedChildEnv+"="+string(raw))
		out := &childOutput{}
		cmd.Stdout, cmd.Stderr = out, out
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		children = append(children, child{cmd, out, stdin})
	}
	for i, ch := range children {
		deadline := time.Now().Add(90 * time.Second)
		for !strings.Contains(ch.out.String(), "ready") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		require.Contains(t, ch.out.String(), "ready", "child %d: %s", i, tail(ch.out.String(), 2000))
	}
	// The run: Redis for 1.5 s, none for 3.5 s, Redis again for 4.5 s.
	start := time.Now().Add(300 * time.Millisecond)
	stop := start.Add(9500 * time.Millisecond)
	for _, ch := range children {
		_, err := fmt.Fprintf(ch.stdin, "%d %d\n", start.UnixMicro(), stop.UnixMicro())
		require.NoError(t, err)
		require.NoError(t, ch.stdin.Close())
	}
	time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
	require.NoError(t, srv.Kill())
	killed := time.Now().UnixMicro() // it died before
	time.Sleep(time.Until(start.Add(5000 * time.Millisecond)))
	restarting := time.Now().UnixMicro() // it answers after
	srv.Restart(t)
	restarted := time.Now().UnixMicro()
	t.Logf("killed at +%v, restarted from +%v to +%v", time.Duration(killed-start.UnixMicro())*time.Microsecond,
		time.Duration(restarting-start.UnixMicro())*time.Microsecond, time.Duration(restarted-start.UnixMicro())*time.Microsecond)

	var reports []degradedReport
	var errs []error
	for i, ch := range children {
		if err := ch.cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("child %d: %w\n%s", i, err, tail(ch.out.String(), 2000)))
			continue
		}
		// The report is the child's last line of JSON.
		lines := strings.Split(ch.out.String(), "\n")
		out := ""
		for _, line := range lines {
			if strings.HasPrefix(line, "{") {
				out = line
			}
		}
		var r degradedReport
		require.NoError(t, json.Unmarshal([]byte(out), &r), "child %d: %s", i, tail(out, 500))
		reports = append(reports, r)
	}
	require.NoError(t, errors.Join(errs...))

	for i, r := range reports {
		assert.Empty(t, r.Errors, "child %d", i)
		assert.Zero(t, r.Unplaced, "child %d", i)
		assert.Equal(t, procInstances, r.Instances, "child %d counted the three", i)
		assert.Equal(t, []int64{procShare}, keys(r.LocalLimits), "child %d: every local decision on the share", i)
	}
	// Per window, the children together.
	var all []int64
	for _, r := range reports {
		for k := range r.Windows {
			all = append(all, k)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	var inOutage, inRedis int
	var last int64 = -1
	for _, k := range all {
		if k == last {
			continue
		}
		last = k
		var sum windowCount
		saturated := false
		for i, r := range reports {
			w := r.Windows[k]
			if w == nil {
				continue
			}
			sum.RedisGrants += w.RedisGrants
			sum.RedisDenials += w.RedisDenials
			sum.LocalGrants += w.LocalGrants
			sum.LocalDenials += w.LocalDenials
			assert.LessOrEqual(t, w.LocalGrants, procShare, "window %d, child %d: its share at most", k, i)
			if w.LocalDenials > 0 {
				assert.Equal(t, procShare, w.LocalGrants, "window %d, child %d: denied locally, so its share granted, exactly", k, i)
			}
			saturated = saturated || w.RedisDenials > 0
		}
		from, to := k*procWindow, (k+1)*procWindow
		t.Logf("window %+d ms: Redis %2d granted, %4d denied; local %2d granted, %4d denied", (from-start.UnixMicro())/1000,
			sum.RedisGrants, sum.RedisDenials, sum.LocalGrants, sum.LocalDenials)
		assert.LessOrEqual(t, sum.RedisGrants, procLimit, "window %d: Redis's limit", k)
		assert.LessOrEqual(t, sum.LocalGrants, procLimit+procInstances-1, "window %d: L + N − 1 locally", k)
		assert.LessOrEqual(t, sum.RedisGrants+sum.LocalGrants, 2*procLimit+procInstances-1, "window %d: a switch's window", k)
		switch {
		case from > killed && to <= restarting: // wholly in the outage
			inOutage++
			assert.Zero(t, sum.RedisGrants+sum.RedisDenials, "window %d: Redis was down", k)
			assert.Equal(t, procInstances*procShare, sum.LocalGrants, "window %d: every share, exactly", k)
		case sum.LocalGrants+sum.LocalDenials == 0 && saturated && !(from <= killed && killed < to):
			// Wholly in Redis, demand above the limit, and no grant Redis
			// counted but the kill kept from its caller.
			inRedis++
			assert.Equal(t, procLimit, sum.RedisGrants, "window %d: Redis's limit, exactly", k)
		}
		if from > restarted+1_500_000 {
			assert.Zero(t, sum.LocalGrants+sum.LocalDenials, "window %d: back to Redis", k)
		}
	}
	assert.GreaterOrEqual(t, inOutage, 2, "windows wholly in the outage")
	assert.GreaterOrEqual(t, inRedis, 3, "windows wholly in Redis")
	for i, r := range reports {
		t.Logf("child %d: %d decisions; back to Redis %v after the restart", i, r.Decided, time.Duration(r.LastLocal-restarted)*time.Microsecond)
		assert.Less(t, r.LastLocal, restarted+1_500_000, "child %d went back to Redis", i)
		assert.Greater(t, r.LastLocal, killed, "child %d decided locally", i)
	}
}

// keys lists m's keys in order.
func keys[V any](m map[int64]V) []int64 {
	var ks []int64
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}
