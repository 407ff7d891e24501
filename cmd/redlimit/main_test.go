package main

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// runCommand runs the program in-process, as `redlimit args…` would.
func runCommand(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		inOutput string // stdout and stderr together
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"-h"}, exitOK, "redlimit demo"},
		{[]string{"-h"}, exitOK, "redlimit set NAME --limit N --ttl D  store an in-flight limit (SetLimit)"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"demo", "-h"}, exitOK, "-instances"},
		{[]string{"demo", "-instances", "0"}, exitUsage, "-instances 0: want 1 to 64"},
		{[]string{"demo", "-algorithm", "leaky"}, exitUsage, `unknown algorithm "leaky"`},
		{[]string{"demo", "-nosuchflag"}, exitUsage, "flag provided but not defined"},
		// A bad command line exits 2 (as the README says) whether the flag
		// parser, the command or the library finds the mistake.
		{[]string{"demo", "--redis", "redis://x", "--cluster", "y:1"}, exitUsage, "cannot be used together"},
		{[]string{"demo", "--redis", "http://x"}, exitUsage, `--redis "http://x": `},
		// host:port is a Redis too (below); a host alone is not.
		{[]string{"demo", "--redis", "127.0.0.1"}, exitUsage, `--redis "127.0.0.1": want host:port or redis://host:port`},
		{[]string{"throttle", "--redis", "127.0.0.1", "k", "4", "1", "1"}, exitUsage, `--redis "127.0.0.1": `},
		{[]string{"compare", "--redis", "127.0.0.1"}, exitUsage, `--redis "127.0.0.1": `},
		{[]string{"demo", "--cluster", "redis://127.0.0.1:1?addr=x"}, exitUsage, `--cluster "redis://127.0.0.1:1?addr=x": `},
		{[]string{"demo", "--sentinel", "redis://127.0.0.1:1"}, exitUsage, "--sentinel needs the primary's name"},
		{[]string{"demo", "--master", "m"}, exitUsage, "--master goes with --sentinel"},
		{[]string{"demo", "--cluster", "127.0.0.1"}, exitUsage, `--cluster "127.0.0.1": `},
		// The command line is fine; Redis is not there (port 1 refuses on
		// loopback).
		{[]string{"throttle", "--redis", "redis://127.0.0.1:1", "k", "4", "1", "1"}, exitFail, "cannot reach"},
		{[]string{"throttle", "--redis", "127.0.0.1:1", "k", "4", "1", "1"}, exitFail, "cannot reach Redis at 127.0.0.1:1"},
		{[]string{"throttle", "--cluster", "redis://127.0.0.1:1?addr=127.0.0.1:2", "k", "4", "1", "1"}, exitFail, "cannot reach the Redis Cluster"},
		{[]string{"throttle", "-h"}, exitOK, "CL.THROTTLE"},
		{[]string{"throttle", "k", "4", "1"}, exitUsage, "want 4 or 5 arguments, got 3"},
		{[]string{"throttle", "k", "four", "1", "1"}, exitUsage, `MAX_BURST "four" is not an integer`},
		{[]string{"throttle", "k", "4", "1", "soon"}, exitUsage, `PERIOD "soon"`},
		{[]string{"throttle", "k", "4", "0", "1"}, exitUsage, "invalid config"},
		{[]string{"throttle", "k", "-1", "1", "1"}, exitUsage, "invalid config"},
		{[]string{"throttle", "k", "4", "1", "1", "-1"}, exitUsage, "invalid permits"},
		{[]string{"compare", "-h"}, exitOK, "-pattern"},
		{[]string{"compare", "-pattern", "sine"}, exitUsage, `unknown pattern "sine": want one of edge, ramp, steady`},
		{[]string{"compare", "-out", "chart.jpg"}, exitUsage, "want a .png or .svg file"},
		{[]string{"compare", "-and", "5/5s"}, exitUsage, "5 per 5s grants no more than 10 per 1s"},
		{[]string{"compare", "-and", "50/5s,burst=60"}, exitUsage, `"50/5s,burst=60" has options`},
		{[]string{"compare", "-h"}, exitOK, "-lease"},
		{[]string{"compare", "-instances", "0"}, exitUsage, "-instances 0: want 1 to 16"},
		{[]string{"compare", "-instances", "17"}, exitUsage, "-instances 17: want 1 to 16"},
		{[]string{"compare", "-lease", "-1ms"}, exitUsage, "-lease -1ms: want 0 (no leases) or less than the interval, 1s"},
		{[]string{"compare", "-lease", "1s"}, exitUsage, "-lease 1s: want 0 (no leases) or less than the interval, 1s"},
		{[]string{"compare", "-interval", "500ms", "-lease", "700ms"}, exitUsage, "-lease 700ms: want 0 (no leases) or less than the interval, 500ms"},
		{[]string{"compare", "-lease", "soon"}, exitUsage, `invalid value "soon" for flag -lease`},
		{[]string{"demo", "-and", "50/2500ms"}, exitUsage, "-and 50 per 2.5s: want a PERIOD of whole seconds, at least 2s"},
		{[]string{"demo", "-and", "15/2s"}, exitUsage, "15 per 2s grants no more than 20 per 1s"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCommand(t, tt.args...)
			if code != tt.code || !strings.Contains(stdout+stderr, tt.inOutput) {
				t.Errorf("exit %d, want %d; output should contain %q:\n%s%s", code, tt.code, tt.inOutput, stdout, stderr)
			}
		})
	}
}

// TestThrottle: redis-cell's worked example, max_burst 4 and 1 per second,
// sent seven times within a second: five grants, then limited.
func TestThrottle(t *testing.T) {
	code, stdout, stderr := runCommand(t, "throttle", "-r", "7", "user123", "4", "1", "1")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var want strings.Builder
	for _, reply := range [][5]int{{0, 5, 4, -1, 1}, {0, 5, 3, -1, 2}, {0, 5, 2, -1, 3}, {0, 5, 1, -1, 4}, {0, 5, 0, -1, 5}, {1, 5, 0, 1, 5}, {1, 5, 0, 1, 5}} {
		for i, v := range reply {
			fmt.Fprintf(&want, "%d) (integer) %d\n", i+1, v)
		}
	}
	if stdout != want.String() {
		t.Errorf("got\n%s\nwant\n%s", stdout, want.String())
	}
}

// TestSimulate checks what the chart shows, exactly: the controlled clock
// makes every run the same.
func TestSimulate(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	type counts struct{ total, busiest int }
	tests := []struct {
		pattern string
		want    map[string]counts
	}{
		// The fixed window passes 2× across the edge; the funnel takes its
		// burst of 10 and drains 1 per 100ms through the rest of the burst.
		{"edge", map[string]counts{"fixed_window": {40, 20}, "sliding_window": {20, 10}, "tokenbucket": {20, 10}, "funnel": {30, 15}}},
		// Offered twice the limit: 10 a second pass; the funnel fills up over
		// the first 0.95s (19 grants), then passes one every 100ms.
		{"steady", map[string]counts{"fixed_window": {40, 10}, "sliding_window": {40, 10}, "tokenbucket": {40, 10}, "funnel": {49, 19}}},
	}
	for _, tt := range tests {
		t.Run(tt.pattern, func(t *testing.T) {
			c, err := simulate(context.Background(), rdb, scenario{pattern: tt.pattern, cfg: redlimit.PerSecond(10), length: 4 * time.Second, instances: 1})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range c.results {
				if got := (counts{r.total, r.busiest[0]}); len(r.busiest) != 1 || got != tt.want[r.name] {
					t.Errorf("%s: %+v, want %+v", r.name, got, tt.want[r.name])
				}
				if len(r.granted) != 40 || len(r.rolling) != 40 {
					t.Errorf("%s: %d ticks, want 40", r.name, len(r.granted))
				}
			}
			// No key is left behind: a decision writes no key per request.
			for _, key := range m.Keys() {
				t.Errorf("key left behind: %s", key)
			}
		})
	}
}

// TestSimulateSeveralRates: with a further rate of 25 per 4s, each
// algorithm keeps to both rates as it keeps to one, on miniredis and a real
// Redis: the windows and the token bucket pass at most 25 in 4s; the
// funnel, whose rates each take a burst, up to 25 + 25.
func TestSimulateSeveralRates(t *testing.T) {
	type counts struct{ total, perSecond, per4s int }
	tests := []struct {
		pattern string
		want    map[string]counts
	}{
		// Bursts across the edges at 1s, 3s, 5s and 7s. The fixed window
		// passes 20 across an edge, and the 4s windows cut the second burst
		// of each to 5. The token bucket's grants of the first burst are back
		// for the third (at 4.7s): 10 a burst, 20 in any 4s.
		{"edge", map[string]counts{"fixed_window": {50, 20, 25}, "sliding_window": {40, 10, 20}, "tokenbucket": {40, 10, 20}, "funnel": {60, 15, 30}}},
		// Twice the per-second rate: 10 in each of two seconds, then 5,
		// then nothing until the 4s window moves on.
		{"steady", map[string]counts{"fixed_window": {50, 10, 25}, "sliding_window": {50, 10, 25}, "tokenbucket": {50, 10, 25}, "funnel": {74, 19, 49}}},
	}
	cfg := redlimit.PerSecond(10).And(redlimit.Per(25, 4*time.Second))
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		rdb := newRDB()
		for _, tt := range tests {
			t.Run(tt.pattern, func(t *testing.T) {
				c, err := simulate(context.Background(), rdb, scenario{pattern: tt.pattern, cfg: cfg, length: 8 * time.Second, instances: 1})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range c.results {
					if len(r.busiest) != 2 {
						t.Fatalf("%s: busiest %v, want one per rate", r.name, r.busiest)
					}
					if got := (counts{r.total, r.busiest[0], r.busiest[1]}); got != tt.want[r.name] {
						t.Errorf("%s: %+v, want %+v", r.name, got, tt.want[r.name])
					}
				}
				if r := c.results[0]; c.measured(r) != "50 granted; at most "+map[string]string{"edge": "20", "steady": "10"}[tt.pattern]+" in any 1s (limit 10), 25 in any 4s (limit 25)" {
					t.Errorf("measured: %q", c.measured(r))
				}
			})
		}
	})
}

// TestCompareLeases: the leased run of `compare -pattern steady -instances
// 3 -lease 100ms`, by hand. 20 requests a second, in turn to 3 instances,
// on 10 per second: a block is at most a tenth of the limit, one permit, so
// the leased run grants what the run without does, and its calls are the
// grants plus the takes refused. An instance remembers a refusal for at
// most the lease time (a rate raised elsewhere reaches it within that),
// 100ms, and asks again only 150ms later: a call per request, 120, for
// every algorithm. The funnel's bound over 1s is its burst, 10, plus the
// 1s + 100ms of drip, 11.
func TestCompareLeases(t *testing.T) {
	args := []string{"compare", "-pattern", "steady", "-instances", "3", "-lease", "100ms"}
	code, stdout, stderr := runCommand(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"Limit: 10 per 1s for every algorithm, shared by 3 instances taking the requests in turn.\n",
		"fixed window: counts per window, so bursts either side of an edge pass up to 2× the limit\n" +
			"without leases: 60 granted; at most 10 in any 1s (limit 10):\n",
		"with leases of 100ms: 60 granted; at most 10 in one window, within the lease bound of 10\n" +
			"leases: 120 calls, 60 permits taken, 60 used, 0 given back:\n",
		"with leases of 100ms: 60 granted; at most 10 in any 800ms, within the lease bound of 10\n" +
			"leases: 120 calls, 60 permits taken, 60 used, 0 given back:\n",
		"with leases of 100ms: 60 granted; at most 10 in any 900ms, within the lease bound of 10\n" +
			"leases: 120 calls, 60 permits taken, 60 used, 0 given back:\n",
		"without leases: 69 granted; at most 19 in any 1s (limit 10):\n",
		"with leases of 100ms: 69 granted; at most 19 in any 1s, within the lease bound of 21\n" +
			"leases: 120 calls, 69 permits taken, 69 used, 0 given back:\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	if n := strings.Count(stdout, "with leases of 100ms: "); n != 4 {
		t.Errorf("%d leased runs, want 4:\n%s", n, stdout)
	}
	if _, again, _ := runCommand(t, args...); again != stdout {
		t.Errorf("a second run differs:\n%s\nthe first:\n%s", again, stdout)
	}
}

// TestSimulateLeases: leases of blocks larger than one permit, on 100 per
// second, twice that offered to 3 instances, on miniredis and a real Redis.
// Each instance gets 6.7 requests per 100ms lease and takes blocks of up to
// 10 (a tenth of the limit), so blocks end with permits unused, given back
// before the next block is taken:
//   - fixed window: demand twice the limit empties every block before its
//     window ends, so what goes back goes back within its window and is all
//     taken back: every window grants its 100, 600 as without leases;
//   - sliding window: all that goes back is taken back too: 600;
//   - token bucket: nothing could go back (its records cannot take a permit
//     back), so its blocks are sized to the pace of the last one alone, and
//     every permit taken is used: 600;
//   - funnel: a block's grant drains out of the funnel within about the
//     lease (10 permits at one per 10ms, behind those before it), so what
//     goes back is what had not drained yet: 67 of the 765 taken, and 696
//     granted of the 699 granted without leases.
//
// Every run keeps to the bound lease.go states, and -instances alone
// changes nothing: every decision is Redis's.
func TestSimulateLeases(t *testing.T) {
	type figures struct {
		total, busiest, bound int
		stats                 redlimit.LeaseStats
	}
	want := map[string]figures{
		"fixed_window":   {600, 100, 100, redlimit.LeaseStats{Calls: 270, Taken: 816, Used: 600, Returned: 216}},
		"sliding_window": {600, 100, 100, redlimit.LeaseStats{Calls: 286, Taken: 755, Used: 600, Returned: 155}},
		"tokenbucket":    {600, 100, 100, redlimit.LeaseStats{Calls: 280, Taken: 738, Used: 600, Returned: 138}},
		// 100 + 100 × (1s + 100ms) / 1s
		"funnel": {696, 197, 210, redlimit.LeaseStats{Calls: 490, Taken: 765, Used: 696, Returned: 67}},
	}
	unleased := map[string]int{"fixed_window": 600, "sliding_window": 600, "tokenbucket": 600, "funnel": 699}
	s := scenario{pattern: "steady", cfg: redlimit.PerSecond(100), length: 6 * time.Second, instances: 3, lease: 100 * time.Millisecond}
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		c, err := simulate(context.Background(), newRDB(), s)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.results) != 4 || len(c.leased) != 4 {
			t.Fatalf("%d results, %d leased: want 4 of each", len(c.results), len(c.leased))
		}
		for i, r := range c.leased {
			got := figures{r.total, r.bound.most, int(r.bound.limit), r.stats}
			if r.name != c.results[i].name || got != want[r.name] {
				t.Errorf("%s: %+v, want %+v", r.name, got, want[r.name])
			}
			if got := c.results[i].total; got != unleased[r.name] && !stateExpiredEarly(t, r.name, got, unleased[r.name]) {
				t.Errorf("%s without leases: %d granted, want %d", r.name, got, unleased[r.name])
			}
			if len(r.granted) != 60 || len(r.rolling) != 60 || slicesSum(r.granted) != r.total {
				t.Errorf("%s: %d ticks granting %d, want 60 granting %d", r.name, len(r.granted), slicesSum(r.granted), r.total)
			}
		}
		alone, err := simulate(context.Background(), newRDB(), scenario{pattern: "steady", cfg: s.cfg, length: s.length, instances: 1})
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range alone.results {
			three := c.results[i]
			sameTotal := r.total == three.total || stateExpiredEarly(t, r.name, max(r.total, three.total), min(r.total, three.total))
			if !sameTotal || r.busiest[0] != three.busiest[0] && !stateExpiredEarly(t, r.name, max(r.busiest[0], three.busiest[0]), min(r.busiest[0], three.busiest[0])) {
				t.Errorf("%s: one instance granted %d (%d in 1s), three %d (%d)", r.name, r.total, r.busiest[0], c.results[i].total, c.results[i].busiest[0])
			}
		}
	})
}

// stateExpiredEarly reports whether granted, where want was expected, is
// the one grant more that a funnel's state lost early gives on a real Redis:
// its expiry (when the funnel is empty, on the simulated clock) runs in
// Redis's real time, and a run the machine slows below real time reaches
// the key after Redis has dropped it, an empty funnel again. miniredis
// expires nothing on its own: there the figures are exact.
func stateExpiredEarly(t *testing.T, algorithm string, granted, want int) bool {
	return algorithm == "funnel" && granted == want+1 && !strings.Contains(t.Name(), "/miniredis")
}

// TestLeaseBoundMeasured: measured says when a run passes the bound, and
// when the lease is too long for the bound to cover any span.
func TestLeaseBoundMeasured(t *testing.T) {
	c := comparison{scenario: scenario{cfg: redlimit.PerSecond(10)}}
	r := algorithmResult{total: 12, lease: 100 * time.Millisecond, bound: leaseBound{span: 900 * time.Millisecond, limit: 10, most: 11},
		stats: redlimit.LeaseStats{Calls: 5, Taken: 14, Used: 12, Returned: 2}}
	if got, want := c.measured(r), "12 granted; at most 11 in any 900ms, ABOVE the lease bound of 10\nleases: 5 calls, 14 permits taken, 12 used, 2 given back"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	r.lease = 950 * time.Millisecond
	r.bound = algorithms[1].bound(c.cfg, r.lease) // the sliding window's: none over 900ms − 950ms
	if got, want := c.measured(r), "12 granted; the lease bound covers no span with leases of 950ms\nleases: 5 calls, 14 permits taken, 12 used, 2 given back"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

func slicesSum(counts []int) int {
	sum := 0
	for _, n := range counts {
		sum += n
	}
	return sum
}

func TestCompareDrawsCharts(t *testing.T) {
	dir := t.TempDir()
	for _, file := range []string{"chart.png", "chart.svg"} {
		path := filepath.Join(dir, file)
		code, stdout, stderr := runCommand(t, "compare", "-pattern", "edge", "-windows", "2", "-out", path)
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		for _, want := range []string{
			"fixed window: counts per window",
			"20 granted; at most 20 in any 1s (limit 10)",
			"Chart written to " + path,
		} {
			if !strings.Contains(stdout, want) {
				t.Errorf("output lacks %q:\n%s", want, stdout)
			}
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if file == "chart.png" {
			cfg, err := png.DecodeConfig(f)
			if err != nil || cfg.Width < 600 || cfg.Height < 1000 {
				t.Errorf("PNG %dx%d, %v", cfg.Width, cfg.Height, err)
			}
		} else if b, _ := os.ReadFile(path); !bytes.Contains(b, []byte("<svg")) {
			t.Errorf("%s is not an SVG", path)
		}
	}
}

func TestDemo(t *testing.T) {
	for _, algorithm := range []string{"tokenbucket", "funnel", "fixed_window", "sliding_window"} {
		t.Run(algorithm, func(t *testing.T) {
			t.Parallel() // mostly waiting: the instances pause between bursts
			code, stdout, stderr := runCommand(t, "demo", "-instances", "3", "-duration", "2s", "-algorithm", algorithm)
			checkDemo(t, code, stdout, stderr)
		})
	}
}

// TestDemoSeveralRates: with a further rate, which the SetRate keeps, the
// demo checks that rate's windows too.
func TestDemoSeveralRates(t *testing.T) {
	for _, algorithm := range []string{"tokenbucket", "funnel", "fixed_window", "sliding_window"} {
		t.Run(algorithm, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runCommand(t, "demo", "-instances", "3", "-duration", "3s", "-algorithm", algorithm, "-and", "25/2s")
			checkDemo(t, code, stdout, stderr)
			for _, want := range []string{
				"limit of 20 per second and 25 per 2s on",
				"sets it to 10 per second (keeping the further rates)",
				"Per 2s (the 25 per 2s rate's windows; the first and last are partial):",
			} {
				if !strings.Contains(stdout, want) {
					t.Errorf("output lacks %q:\n%s", want, stdout)
				}
			}
		})
	}
}

func TestDemoOnRedis(t *testing.T) {
	s := redistest.Shared(t)
	code, stdout, stderr := runCommand(t, "demo", "--redis", "redis://"+s.Addr(), "-instances", "2", "-duration", "2s")
	checkDemo(t, code, stdout, stderr)
	code, stdout, stderr = runCommand(t, "demo", "--redis", "redis://"+s.Addr(), "-instances", "2", "-duration", "3s", "-and", "25/2s")
	checkDemo(t, code, stdout, stderr)
}

func TestDemoOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	c := redistest.SharedCluster(t)
	code, stdout, stderr := runCommand(t, "demo", "--cluster", strings.Join(c.Addrs(), ","), "-instances", "2", "-duration", "2s")
	checkDemo(t, code, stdout, stderr)
}

func checkDemo(t *testing.T, code int, stdout, stderr string) {
	t.Helper()
	if code != exitOK || !strings.Contains(stdout, "The shared limit held") {
		t.Errorf("exit %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{"instance-1: SetRate(10 per second)", "← SetRate"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

// TestDemoCheckFails: the check is real, not assumed. A window with more
// grants than the limit in force, or an instance still deciding under the old
// rate after the change, fails the demo.
func TestDemoCheckFails(t *testing.T) {
	second := time.Unix(1_800_000_000, 0)
	changedAt := second.Add(500 * time.Millisecond)
	settings := demoSettings{instances: 2, algorithm: "fixed_window", rate: 20, newRate: 10}
	decide := func(r *instanceResult, at time.Time, allowed bool, limit int64) {
		r.record(at, redlimit.Result{Allowed: allowed, Limit: limit}, &changedAt, settings.rate, settings.newRate)
	}
	newInstance := func(id string) instanceResult {
		return instanceResult{id: id, windows: map[int64]*tally{}, followed: -1}
	}

	t.Run("too many grants", func(t *testing.T) {
		a, b := newInstance("instance-1"), newInstance("instance-2")
		for range 8 {
			decide(&a, second.Add(time.Second+100*time.Millisecond), true, 10)
			decide(&b, second.Add(time.Second+200*time.Millisecond), true, 10)
		}
		var out bytes.Buffer
		if (demoResult{settings: settings, changedAt: changedAt, instances: []instanceResult{a, b}}).report(&out) {
			t.Errorf("16 grants against a limit of 10 held:\n%s", out.String())
		}
		if !strings.Contains(out.String(), "FAILED: the shared limit did not hold in 1 of 1 windows") {
			t.Errorf("no failure reported:\n%s", out.String())
		}
	})
	t.Run("too many grants in a further rate's window", func(t *testing.T) {
		settings := settings
		settings.more = []redlimit.Config{redlimit.Per(25, 2*time.Second)}
		a, b := newInstance("instance-1"), newInstance("instance-2")
		// 20 in the first second, 10 in the next, after the change: each
		// within its second's limit, 30 in one 2s window (second is even).
		for i := range 20 {
			decide(&a, second.Add(time.Duration(i)*time.Millisecond), true, 20)
		}
		for i := range 10 {
			decide(&b, second.Add(time.Second+time.Duration(i)*time.Millisecond), true, 10)
		}
		var out bytes.Buffer
		if (demoResult{settings: settings, changedAt: changedAt, instances: []instanceResult{a, b}}).report(&out) {
			t.Errorf("30 grants against 25 per 2s held:\n%s", out.String())
		}
		for _, want := range []string{
			"Per 2s (the 25 per 2s rate's windows; the first and last are partial):\nfrom      at most  granted  held\n" + second.Format("15:04:05") + "  25       30       NO\n",
			"FAILED: the shared limit did not hold in 1 of 3 windows.",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
	})
	t.Run("old rate after the change", func(t *testing.T) {
		a, b := newInstance("instance-1"), newInstance("instance-2")
		decide(&a, second.Add(600*time.Millisecond), true, 10)
		decide(&b, second.Add(400*time.Millisecond), true, 20) // before the change: fine
		decide(&b, second.Add(700*time.Millisecond), true, 20) // after it: not fine
		var out bytes.Buffer
		if (demoResult{settings: settings, changedAt: changedAt, instances: []instanceResult{a, b}}).report(&out) {
			t.Errorf("an instance ignoring the change held:\n%s", out.String())
		}
		if !strings.Contains(out.String(), "then 1 decisions still under the old rate") {
			t.Errorf("no failure reported:\n%s", out.String())
		}
	})
}

// TestDemoLimitColumn: the window of a change shows the limit before it,
// then the one after (20→10), whichever instance saw which. Here
// instance-1, listed first, saw only the new limit, and the old one came
// from instance-2: merged in the instances' order, this read "10/20".
func TestDemoLimitColumn(t *testing.T) {
	second := time.Unix(1_800_000_000, 0)
	changedAt := second.Add(500 * time.Millisecond)
	settings := demoSettings{instances: 2, algorithm: "fixed_window", rate: 20, newRate: 10}
	a := instanceResult{id: "instance-1", windows: map[int64]*tally{}, followed: -1}
	b := instanceResult{id: "instance-2", windows: map[int64]*tally{}, followed: -1}
	decide := func(r *instanceResult, after time.Duration, limit int64) {
		r.record(second.Add(after), redlimit.Result{Allowed: true, Limit: limit}, &changedAt, settings.rate, settings.newRate)
	}
	decide(&a, 600*time.Millisecond, 10)
	decide(&b, 400*time.Millisecond, 20)
	decide(&b, 1100*time.Millisecond, 10)
	var out bytes.Buffer
	if !(demoResult{settings: settings, changedAt: changedAt, instances: []instanceResult{a, b}}).report(&out) {
		t.Errorf("the limit did not hold:\n%s", out.String())
	}
	for _, want := range []string{
		"second    limit  at most  granted  denied  instance-1  instance-2  held\n",
		second.Format("15:04:05") + "  20→10  20       2        0       1           1           yes   ← SetRate\n",
		second.Add(time.Second).Format("15:04:05") + "  10     10       1        0       0           1           yes\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestErrorsAreShort: a refused value is one line; a malformed command line
// adds the synopsis and where the flags are, never the whole usage (which
// buried the one line that mattered).
func TestErrorsAreShort(t *testing.T) {
	m := miniredis.RunT(t)
	tests := []struct {
		args   []string
		stderr string
	}{
		{[]string{"demo", "-instances", "0"}, "redlimit demo: -instances 0: want 1 to 64\n"},
		{[]string{"set", "--redis", m.Addr(), "api", "--rate", "1", "--per", "1s", "--algorithm", "leaky"},
			"redlimit set: unknown algorithm \"leaky\": want one of fixed_window, sliding_window, tokenbucket, funnel, inflight\n"},
		{[]string{"set", "--redis", m.Addr(), "api", "--rate", "1"},
			"redlimit set: --per is required with --rate\nUsage: redlimit set NAME (--rate N --per DURATION | --limit N --ttl DURATION) [flags]\nRun 'redlimit set -h' for its flags.\n"},
		{[]string{"set", "--redis", m.Addr(), "jobs", "--limit", "1", "--ttl", "1s", "--rate", "1"},
			"redlimit set: --limit is an in-flight limit's, --rate a rate limiter's: give one or the other\nUsage: redlimit set NAME (--rate N --per DURATION | --limit N --ttl DURATION) [flags]\nRun 'redlimit set -h' for its flags.\n"},
		{[]string{"set", "--redis", m.Addr(), "jobs", "--limit", "0", "--ttl", "1s"},
			"redlimit set: invalid config: limit 0 is outside 1..100000\n"},
		{[]string{"demo", "-nosuchflag"},
			"flag provided but not defined: -nosuchflag\nUsage: redlimit demo [flags]\nRun 'redlimit demo -h' for its flags.\n"},
		{[]string{"ls", "--redis", m.Addr(), "a", "b"},
			"redlimit ls: want at most one PATTERN, got 2 arguments\nUsage: redlimit ls [flags] [PATTERN]\nRun 'redlimit ls -h' for its flags.\n"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCommand(t, tt.args...)
		if code != exitUsage || stdout != "" || stderr != tt.stderr {
			t.Errorf("%v: exit %d, stdout %q\nstderr %q\nwant   %q", tt.args, code, stdout, stderr, tt.stderr)
		}
	}
	if _, _, stderr := runCommand(t, "set", "-h"); !strings.Contains(stderr, "Flags:\n") || !strings.Contains(stderr, "-if-absent") {
		t.Errorf("set -h: the whole usage, with every flag:\n%s", stderr)
	}
}

// TestRedisLogsSilenced: an unreachable Redis is reported once, by the
// command; go-redis's own logger printed four lines before it.
func TestRedisLogsSilenced(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	logging.Enable() // go-redis's default logger, writing to os.Stderr as it is now
	code, _, stderr := runCommand(t, "get", "--redis", "127.0.0.1:1", "api")
	os.Stderr = saved
	w.Close()
	logged, _ := io.ReadAll(r)
	if code != exitFail || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "cannot reach Redis at 127.0.0.1:1") || len(logged) != 0 {
		t.Errorf("exit %d, the command's stderr %q; go-redis logged %q", code, stderr, logged)
	}
}
