package redlimit

// Exactness under concurrency: several OS processes (this test binary run
// again as TestConcurrencyChild) × 64 goroutines each hammer a few shared
// limiters on a real redis-server and on the Redis Cluster, deciding on Redis
// TIME. Every decision comes back with the server time it was made at, and
// the parent proves, over the whole run, both halves of exactness:
//   - no over-admission: the algorithm's guarantee held over every window
//     (breaches);
//   - no under-admission: every denial was made while the algorithm's window
//     was full, so no request was refused that the guarantee allowed
//     (unjustified). This is exact where a share of capacity used is not: a
//     share depends on how fast this machine (2 cores, shared, a VM that
//     loses its CPU for tenths of a second at times) gets requests to Redis,
//     this does not. The share is still logged.
//
// Where a decision's server time comes from. The child runs each limiter's
// EVALSHA inside MULTI / TIME / EVALSHA / TIME / EXEC (timeHook), on the node
// that owns the limiter's slot. A transaction runs without interleaving and
// the script reads TIME itself, so the moment it decided at lies in
// [first TIME, second TIME]: a bound that always holds, not an estimate,
// usually a few microseconds wide, a few ms (rarely more) when the OS stops
// redis-server mid-transaction. The reply then pins the exact microsecond for
// three algorithms (place):
//   - fixed window: ResetAfter = window end − now, for grants and denials, and
//     window ends are the multiples of Interval: the one multiple inside the
//     shifted bracket gives the window, and now = end − ResetAfter;
//   - sliding window (grants): ResetAfter = the end of the current
//     sub-window's span − now, the same way on a grid of Interval/Buckets;
//   - token bucket (grants): the grant's own record is the newest in the log,
//     so ResetAfter = (now_ms + Interval) − now_µs gives now modulo 1ms, and
//     the bracket the rest.
// Other decisions keep their bracket. Every check then places each decision
// where it is most favourable to the library (a breach only if no placement
// inside the brackets avoids it, a denial justified if any placement
// justifies it): the tolerance is the width of the brackets, logged as
// "widest bracket" (0 for decisions placed exactly). A reply that fits no
// moment of its bracket fails the test: the script did not decide as it says.
//
// Run shape, to keep the whole test near 40 s here: 3 processes × 64
// goroutines × 2 s for each algorithm and each backend, on 3 limiters (on the
// Cluster, one per primary) of 10 permits per 500ms (the funnel: burst 5;
// the sliding window: 10 buckets of 50ms), so that at every window's edge
// dozens of callers race for a few permits.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

const (
	concProcesses  = 3
	concGoroutines = 64
	concDuration   = 2 * time.Second
	concLimiters   = 3
	// concChildEnv carries a child's spec (JSON); without it TestConcurrencyChild skips.
	concChildEnv = "REDLIMIT_CONCURRENCY_CHILD"
)

// concConfig binds hard: 20 permits a second per limiter, when the children
// ask each one 500 to 1500 times a second, and still 25 when this machine
// (-race, two cores that other test runs share) is at its slowest.
func concConfig(algorithm string) Config {
	cfg := Per(10, 500*time.Millisecond)
	switch algorithm {
	case "funnel":
		cfg.Burst = 5
	case "sliding_window":
		cfg.Buckets = 10
	}
	return cfg
}

// childSpec tells a child what to hammer, where and when.
type childSpec struct {
	Algorithm  string   `json:"algorithm"`
	Addrs      []string `json:"addrs"`
	Cluster    bool     `json:"cluster"`
	Names      []string `json:"names"`
	Goroutines int      `json:"goroutines"`
	Start      int64    `json:"start"` // Unix µs: every child begins then...
	Stop       int64    `json:"stop"`  // ...and starts no call after this
}

// decision is one answer of a limiter, as a child reports it.
type decision struct {
	limiter int
	allowed bool
	before  int64 // Redis TIME just before the script, µs
	after   int64 // Redis TIME just after it
	reset   int64 // Result.ResetAfter, µs
}

// stamp receives the TIME bracket of the EVALSHA run under its context.
type stamp struct{ before, after int64 }

type stampKey struct{}

// timeHook runs each EVALSHA whose context carries a *stamp as MULTI, TIME,
// EVALSHA, TIME, EXEC on the primary owning its keys, and stores both times.
type timeHook struct {
	nodeFor func(ctx context.Context, key string) (*redis.Client, error)
}

func (timeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (timeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h timeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s, ok := ctx.Value(stampKey{}).(*stamp)
		if !ok || cmd.Name() != "evalsha" {
			return next(ctx, cmd)
		}
		key, _ := cmd.Args()[3].(string) // evalsha sha numkeys key...
		node, err := h.nodeFor(ctx, key)
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		var before, after *redis.TimeCmd
		_, _ = node.TxPipelined(ctx, func(p redis.Pipeliner) error {
			before = p.Time(ctx)
			_ = p.Process(ctx, cmd)
			after = p.Time(ctx)
			return nil
		})
		if err := cmd.Err(); err != nil {
			return err // NOSCRIPT among them: the library loads the script and calls again
		}
		if err := errors.Join(before.Err(), after.Err()); err != nil {
			cmd.SetErr(err)
			return err
		}
		s.before, s.after = before.Val().UnixMicro(), after.Val().UnixMicro()
		return nil
	}
}

func algorithmNamed(name string) (algo, bool) {
	for _, a := range algorithms {
		if a.name == name {
			return a, true
		}
	}
	return algo{}, false
}

// TestConcurrencyChild is a child process of TestExactnessUnderConcurrency.
// It prints one line per decision, "decision LIMITER ALLOWED BEFORE AFTER
// RESET", then "errors N", "error TEXT" for the first few, and how it went in
// µs: "slowest" call, how "late" it was ready (negative: early), and the
// "tail" of calls still in flight at the stop.
func TestConcurrencyChild(t *testing.T) {
	raw := os.Getenv(concChildEnv)
	if raw == "" {
		t.Skip("runs only as a child process of TestExactnessUnderConcurrency")
	}
	var spec childSpec
	require.NoError(t, json.Unmarshal([]byte(raw), &spec))
	out := bufio.NewWriter(os.Stdout)
	require.NoError(t, runChild(spec, out))
	require.NoError(t, out.Flush())
}

func runChild(spec childSpec, out *bufio.Writer) error {
	ctx := context.Background()
	a, ok := algorithmNamed(spec.Algorithm)
	if !ok {
		return fmt.Errorf("unknown algorithm %q", spec.Algorithm)
	}
	// No retries and no timeouts to speak of: a re-sent script is counted
	// once (TestFaultStall proves it) but reports its first run's grant with
	// the time of the re-run, which is not when the grant was made.
	const patient = time.Minute
	var rdb redis.Scripter
	if spec.Cluster {
		cc := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: spec.Addrs, PoolSize: spec.Goroutines, MaxRetries: -1, ReadTimeout: patient, WriteTimeout: patient,
		})
		defer cc.Close()
		cc.AddHook(timeHook{nodeFor: cc.MasterForKey})
		rdb = cc
	} else {
		c := redis.NewClient(&redis.Options{
			Addr: spec.Addrs[0], PoolSize: spec.Goroutines, MaxRetries: -1, ReadTimeout: patient, WriteTimeout: patient,
		})
		defer c.Close()
		c.AddHook(timeHook{nodeFor: func(context.Context, string) (*redis.Client, error) { return c, nil }})
		rdb = c
	}
	client := New(rdb) // no WithClock: the scripts read Redis TIME
	limiters := make([]*Limiter, len(spec.Names))
	for i, name := range spec.Names {
		limiters[i] = a.new(client, name)
		// A peek (it writes nothing) loads the script and the cluster slots.
		if _, err := limiters[i].Allow(ctx, 0); err != nil {
			return err
		}
	}
	late := -time.Until(time.UnixMicro(spec.Start))
	time.Sleep(-late)

	type tally struct {
		decisions []decision
		errs      []error
		slowest   time.Duration
	}
	tallies := make([]tally, spec.Goroutines)
	var wg sync.WaitGroup
	for g := range tallies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tl := &tallies[g]
			for n := g; time.Now().UnixMicro() < spec.Stop; n++ {
				i := n % len(limiters)
				s := new(stamp)
				began := time.Now()
				r, err := limiters[i].Allow(context.WithValue(ctx, stampKey{}, s), 1)
				tl.slowest = max(tl.slowest, time.Since(began))
				if err != nil {
					tl.errs = append(tl.errs, err)
					continue
				}
				tl.decisions = append(tl.decisions, decision{i, r.Allowed, s.before, s.after, r.ResetAfter.Microseconds()})
			}
		}()
	}
	wg.Wait()
	tail := time.Since(time.UnixMicro(spec.Stop))

	var errs []error
	var slowest time.Duration
	for _, tl := range tallies {
		for _, d := range tl.decisions {
			allowed := 0
			if d.allowed {
				allowed = 1
			}
			fmt.Fprintf(out, "decision %d %d %d %d %d\n", d.limiter, allowed, d.before, d.after, d.reset)
		}
		errs = append(errs, tl.errs...)
		slowest = max(slowest, tl.slowest)
	}
	fmt.Fprintf(out, "errors %d\n", len(errs))
	for _, err := range errs[:min(len(errs), 5)] {
		fmt.Fprintf(out, "error %q\n", err.Error())
	}
	fmt.Fprintf(out, "slowest %d\n", slowest.Microseconds())
	fmt.Fprintf(out, "late %d\n", late.Microseconds())
	fmt.Fprintf(out, "tail %d\n", tail.Microseconds())
	return nil
}

// childReport is what the children said, together.
type childReport struct {
	decisions [][]decision // per limiter
	errors    int
	first     []string      // the first errors' texts
	slowest   time.Duration // the longest call
	late      time.Duration // the latest start past Start (negative: early)
	tail      time.Duration // how long past Stop the calls in flight took
}

func (r *childReport) parse(text string) error {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "error" {
			if len(f) > 0 {
				r.first = append(r.first, line)
			}
			continue
		}
		n := make([]int64, len(f)-1)
		for i, s := range f[1:] {
			var err error
			if n[i], err = strconv.ParseInt(s, 10, 64); err != nil {
				return fmt.Errorf("line %q: %w", line, err)
			}
		}
		switch {
		case f[0] == "decision" && len(n) == 5 && n[0] >= 0 && int(n[0]) < len(r.decisions):
			r.decisions[n[0]] = append(r.decisions[n[0]], decision{int(n[0]), n[1] == 1, n[2], n[3], n[4]})
		case f[0] == "errors" && len(n) == 1:
			r.errors += int(n[0])
		case f[0] == "slowest" && len(n) == 1:
			r.slowest = max(r.slowest, time.Duration(n[0])*time.Microsecond)
		case f[0] == "late" && len(n) == 1:
			r.late = max(r.late, time.Duration(n[0])*time.Microsecond)
		case f[0] == "tail" && len(n) == 1:
			r.tail = max(r.tail, time.Duration(n[0])*time.Microsecond)
		default:
			return fmt.Errorf("unexpected line %q", line)
		}
	}
	return nil
}

func TestExactnessUnderConcurrency(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes for ~40s")
	}
	backends := []struct {
		name  string
		setup func(t *testing.T) (addrs []string, rdb redis.Scripter, tags []string)
	}{
		{"redis", func(t *testing.T) ([]string, redis.Scripter, []string) {
			s := redistest.Shared(t)
			return []string{s.Addr()}, s.Client(t), []string{"", "", ""}
		}},
		{"cluster", func(t *testing.T) ([]string, redis.Scripter, []string) {
			c := redistest.SharedCluster(t)
			// One limiter on each primary: slots 0, 8000 and 16000 belong to
			// the three primaries redis-cli --cluster create makes.
			return c.Addrs(), c.Client(t), []string{redistest.HashTagForSlot(0), redistest.HashTagForSlot(8000), redistest.HashTagForSlot(16000)}
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			addrs, rdb, tags := b.setup(t)
			for _, a := range algorithms {
				t.Run(a.name, func(t *testing.T) {
					cfg := concConfig(a.name)
					// A run proves something only if demand exceeded the limit:
					// each limiter denied at least as often as it granted. It
					// does by far, unless this machine stalls for seconds
					// mid-run; then the run is made again, at most twice. Its
					// exactness is asserted on every run all the same.
					for attempt := 1; ; attempt++ {
						names := make([]string, concLimiters)
						for i := range names {
							names[i] = fmt.Sprintf("%s%s-%d", tags[i], uniqueName(t), i)
							require.NoError(t, a.new(New(rdb), names[i]).SetRate(context.Background(), cfg))
						}
						start := time.Now().Add(time.Second) // the children's start-up, before it
						spec := childSpec{
							Algorithm: a.name, Addrs: addrs, Cluster: b.name == "cluster", Names: names,
							Goroutines: concGoroutines, Start: start.UnixMicro(), Stop: start.Add(concDuration).UnixMicro(),
						}
						began := time.Now()
						report := runChildren(t, spec)
						require.Zero(t, report.errors, "errors in the children: %v", report.first)
						t.Logf("run %d: %v; the latest child ready %v before the start, calls done %v after the stop; slowest call %v",
							attempt, time.Since(began).Round(time.Millisecond), -report.late.Round(time.Millisecond), report.tail.Round(time.Millisecond), report.slowest.Round(time.Millisecond))
						bound := true
						for i := range names {
							grants, denials := checkExactness(t, a.name, cfg, spec, report.decisions[i])
							bound = bound && denials >= grants
						}
						if bound {
							break
						}
						if attempt == 3 {
							t.Errorf("demand did not exceed the limit in %d runs: a limiter granted more often than it denied", attempt)
							break
						}
					}
				})
			}
		})
	}
}

// runChildren runs concProcesses children on spec and gathers their reports.
func runChildren(t *testing.T, spec childSpec) childReport {
	t.Helper()
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	outs := make([]string, concProcesses)
	errs := make([]error, concProcesses)
	var wg sync.WaitGroup
	for p := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestConcurrencyChild$", "-test.count=1", "-test.timeout=30s")
			cmd.Env = append(os.Environ(), concChildEnv+"="+string(raw))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			// Past the decisions, the test binary prints its verdict (PASS).
			outs[p], _, _ = strings.Cut(string(out), "PASS\n")
			if err != nil {
				errs[p] = fmt.Errorf("child %d: %w\nstdout tail: %s\nstderr: %s", p, err, tail(string(out), 2000), stderr.String())
			}
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	report := childReport{decisions: make([][]decision, len(spec.Names)), late: math.MinInt64}
	for _, out := range outs {
		require.NoError(t, report.parse(out))
	}
	return report
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// placed is a decision where the server made it: at some µs in [lo, hi];
// lo == hi when the reply pins it exactly.
type placed struct{ lo, hi int64 }

// place narrows d's TIME bracket with what the reply says of the moment it
// was made (see the top of this file).
func place(algorithm string, cfg Config, d decision) (placed, error) {
	p := placed{d.before, d.after}
	if p.lo > p.hi {
		return p, fmt.Errorf("TIME went backwards inside one transaction: %+v", d)
	}
	interval := cfg.Interval.Microseconds()
	var grid int64 // now + ResetAfter lands on a multiple of grid
	switch {
	case algorithm == "fixed_window":
		grid = interval
	case algorithm == "sliding_window" && d.allowed:
		grid = interval / int64(cfg.withDefaults().Buckets)
	case algorithm == "tokenbucket" && d.allowed:
		// ResetAfter = (now_ms + interval_ms)·1000 − now_µs.
		if d.reset <= interval-1000 || d.reset > interval {
			return p, fmt.Errorf("token bucket grant with ResetAfter %dµs: its own record is not the newest in the log", d.reset)
		}
		grid = 1000
	default:
		return p, nil
	}
	end := ceilDiv(p.lo+d.reset, grid) * grid // the first grid point not before lo + reset
	if end > p.hi+d.reset {
		return p, fmt.Errorf("%s decision %+v: ResetAfter fits no moment in its TIME bracket", algorithm, d)
	}
	if end+grid <= p.hi+d.reset {
		return p, nil // a bracket wider than the grid: keep it
	}
	return placed{end - d.reset, end - d.reset}, nil
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) == (b < 0) {
		q++
	}
	return q
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// windowOf describes a window algorithm's guarantee as cells of width µs:
// no n consecutive cells hold more than the rate. The token bucket's cells
// are the log's milliseconds, the sliding window's its sub-windows, the fixed
// window's its windows.
func windowOf(algorithm string, cfg Config) (width, n int64) {
	cfg = cfg.withDefaults()
	switch algorithm {
	case "tokenbucket":
		return 1000, cfg.Interval.Milliseconds()
	case "sliding_window":
		return cfg.Interval.Microseconds() / int64(cfg.Buckets), int64(cfg.Buckets)
	case "fixed_window":
		return cfg.Interval.Microseconds(), 1
	}
	return 0, 0
}

// breaches returns the first breaches of algorithm's guarantee among grants
// sorted by lo, each grant placed where it is most favourable to the library.
func breaches(algorithm string, cfg Config, grants []placed) []string {
	cfg = cfg.withDefaults()
	rate := int(cfg.Rate)
	interval := cfg.Interval.Microseconds()
	var out []string
	report := func(format string, args ...any) bool {
		out = append(out, fmt.Sprintf(format, args...))
		return len(out) < 5
	}
	// latest is where the run of grants[i..j] can end at the latest.
	latest := func(i, j int) int64 {
		hi := grants[i].hi
		for _, p := range grants[i : j+1] {
			hi = max(hi, p.hi)
		}
		return hi
	}
	switch algorithm {
	case "tokenbucket":
		// The log keeps grants by millisecond: rate+1 grants whose
		// milliseconds are less than the interval apart are one too many.
		intervalMS := cfg.Interval.Milliseconds()
		for i := 0; i+rate < len(grants); i++ {
			first, last := floorDiv(grants[i].lo, 1000), floorDiv(latest(i, i+rate), 1000)
			if last-first < intervalMS && !report("%d grants within %dms (< interval %dms) from %d", rate+1, last-first, intervalMS, grants[i].lo) {
				break
			}
		}
	case "sliding_window":
		// No span shorter than interval × (buckets−1)/buckets holds more than rate.
		span := interval * int64(cfg.Buckets-1) / int64(cfg.Buckets)
		for i := 0; i+rate < len(grants); i++ {
			if d := latest(i, i+rate) - grants[i].lo; d < span && !report("%d grants within %dµs (< %dµs) from %d", rate+1, d, span, grants[i].lo) {
				break
			}
		}
		// And exactly: no buckets consecutive sub-windows hold more than rate.
		width, n := windowOf(algorithm, cfg)
		counts := map[int64]int{}
		for _, p := range grants {
			if p.lo == p.hi {
				counts[floorDiv(p.lo, width)]++
			}
		}
		for c := range counts {
			total := 0
			for k := c - n + 1; k <= c; k++ {
				total += counts[k]
			}
			if total > rate && !report("%d grants in the %d sub-windows ending with sub-window %d", total, n, c) {
				break
			}
		}
	case "fixed_window":
		counts := map[int64]int{}
		for _, p := range grants {
			// A wide bracket counts in the window it may be in that holds
			// fewer: the favourable choice.
			w, v := floorDiv(p.lo, interval), floorDiv(p.hi, interval)
			if w != v && counts[v] < counts[w] {
				w = v
			}
			counts[w]++
		}
		for w, n := range counts {
			if n > rate && !report("%d grants in the window starting at %d", n, w*interval) {
				break
			}
		}
	case "funnel":
		// GCRA: any k grants span at least (k − burst) emission intervals.
		emission := interval / cfg.Rate
		for i := range grants {
			hi := grants[i].hi
			for j := i; j < len(grants); j++ {
				hi = max(hi, grants[j].hi)
				k := int64(j - i + 1)
				if (k-cfg.Burst)*emission > hi-grants[i].lo {
					if !report("%d grants within %dµs: more than burst %d + %dµs / %dµs", k, hi-grants[i].lo, cfg.Burst, hi-grants[i].lo, emission) {
						return out
					}
					break
				}
			}
		}
	}
	return out
}

// unjustified returns the first denials made while the guarantee left room
// for the request, with every decision placed where it is most favourable to
// the library: a denial is justified if any placement fills its window.
// grants are sorted by lo.
func unjustified(algorithm string, cfg Config, grants, denials []placed) []string {
	cfg = cfg.withDefaults()
	var out []string
	if algorithm == "funnel" {
		// Replay GCRA over the grants that may precede each denial, each at
		// the end of its bracket: that can only raise the TAT (it is the
		// largest over any order of t_k + E × the grants from k on), so a
		// denial it does not justify was wrong. Denied means
		// now < TAT + E − burst × E.
		emission := cfg.Interval.Microseconds() / cfg.Rate
		denials = slices.Clone(denials)
		slices.SortFunc(denials, func(a, b placed) int { return cmp.Compare(a.hi, b.hi) })
		tat, k := int64(math.MinInt64), 0
		for _, d := range denials {
			for ; k < len(grants) && grants[k].lo <= d.hi; k++ {
				tat = max(tat, grants[k].hi) + emission
			}
			if (k == 0 || tat+emission-cfg.Burst*emission <= d.lo) && len(out) < 5 {
				out = append(out, fmt.Sprintf("denied at %d, with the funnel's TAT at most %d", d.lo, tat))
			}
		}
		return out
	}
	// A window algorithm denies only when the n cells ending with the
	// current one hold rate grants.
	width, n := windowOf(algorithm, cfg)
	los, his := make([]int64, len(grants)), make([]int64, len(grants))
	for i, g := range grants {
		los[i], his[i] = floorDiv(g.lo, width), floorDiv(g.hi, width)
	}
	slices.Sort(los)
	slices.Sort(his)
	// mayHold counts the grants that may lie in the n cells ending with cell c.
	mayHold := func(c int64) int64 {
		return int64(sort.Search(len(los), func(i int) bool { return los[i] > c }) -
			sort.Search(len(his), func(i int) bool { return his[i] >= c-n+1 }))
	}
	for _, d := range denials {
		justified := false
		for c := floorDiv(d.lo, width); c <= floorDiv(d.hi, width) && !justified; c++ {
			justified = mayHold(c) >= cfg.Rate
		}
		if !justified && len(out) < 5 {
			out = append(out, fmt.Sprintf("denied at %d with %d grants in its window of %d×%dµs", d.lo, mayHold(floorDiv(d.lo, width)), n, width))
		}
	}
	return out
}

// utilization measures how much of what the guarantee allowed the limiter
// granted while demand lasted, [start, stop] in µs: the window algorithms
// over every window of theirs wholly inside the run, against rate each (so
// the run's ragged ends do not count), the funnel over the whole run,
// against burst + rate × (stop − start) / interval. For the log: it depends
// on how fast requests reach Redis, which unjustified does not.
func utilization(algorithm string, cfg Config, grants []placed, start, stop int64) (granted, most int64) {
	cfg = cfg.withDefaults()
	if algorithm == "funnel" {
		for _, p := range grants {
			if p.lo >= start && p.lo <= stop {
				granted++
			}
		}
		return granted, cfg.Burst + (stop-start)/(cfg.Interval.Microseconds()/cfg.Rate)
	}
	width, n := windowOf(algorithm, cfg)
	counts := map[int64]int64{}
	for _, p := range grants {
		counts[floorDiv(p.lo, width)]++
	}
	for last := ceilDiv(start, width) + n - 1; (last+1)*width <= stop; last++ {
		for c := last - n + 1; c <= last; c++ {
			granted += counts[c]
		}
		most += cfg.Rate
	}
	return granted, most
}

// checkExactness proves, on one limiter's decisions over a run, that it
// never granted more than its guarantee allows nor denied what it allows,
// and returns how many it granted and denied.
func checkExactness(t *testing.T, algorithm string, cfg Config, spec childSpec, decisions []decision) (granted, denied int) {
	t.Helper()
	var grants, denials []placed
	var exact int
	var widest int64
	for _, d := range decisions {
		p, err := place(algorithm, cfg, d)
		if !assert.NoError(t, err) {
			return 0, 0
		}
		if d.allowed {
			grants = append(grants, p)
		} else {
			denials = append(denials, p)
		}
		if p.lo == p.hi {
			exact++
		}
		widest = max(widest, p.hi-p.lo)
	}
	slices.SortFunc(grants, func(a, b placed) int { return cmp.Compare(a.lo, b.lo) })
	used, most := utilization(algorithm, cfg, grants, spec.Start, spec.Stop)
	t.Logf("%s: %d grants, %d denials; %.1f%% of capacity used (%d of %d); %d of %d decisions placed exactly, widest bracket %dµs",
		algorithm, len(grants), len(denials), 100*float64(used)/float64(most), used, most, exact, len(decisions), widest)
	assert.Empty(t, breaches(algorithm, cfg, grants), "over-admission: the guarantee broken")
	assert.Empty(t, unjustified(algorithm, cfg, grants, denials), "under-admission: a denial while the window had room")
	return len(grants), len(denials)
}

// The checks above can fail: fed decisions that break each guarantee by one,
// they report it, and fed the same decisions moved just enough, they do not.
func TestExactnessChecksCatchBreaches(t *testing.T) {
	ms := int64(1000)
	base := int64(1_700_000_000_000_000) // a whole second, so every grid lines up
	at := func(us ...int64) []placed {
		ps := make([]placed, len(us))
		for i, u := range us {
			ps[i] = placed{base + u, base + u}
		}
		return ps
	}
	repeat := func(n int, us int64) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = us
		}
		return out
	}
	cfg := Per(3, 100*time.Millisecond)
	sw := cfg
	sw.Buckets = 10
	fn := cfg
	fn.Burst = 2 // one per 33333µs

	// Over-admission.
	// Token bucket: 3 at 0ms and a 4th at 99ms is too many; at 100ms it is fine.
	assert.NotEmpty(t, breaches("tokenbucket", cfg, at(append(repeat(3, 0), 99*ms+999)...)))
	assert.Empty(t, breaches("tokenbucket", cfg, at(append(repeat(3, 0), 100*ms)...)))
	// Fixed window: 4 in [0, 100ms) is too many; the 4th at 100ms is in the next window.
	assert.NotEmpty(t, breaches("fixed_window", cfg, at(append(repeat(3, 0), 99*ms)...)))
	assert.Empty(t, breaches("fixed_window", cfg, at(append(repeat(3, 0), 100*ms)...)))
	// Sliding window, 10 buckets of 10ms: 3 at 0ms then a 4th at 95ms share
	// buckets 0..9; at 100ms bucket 0 has left.
	assert.NotEmpty(t, breaches("sliding_window", sw, at(append(repeat(3, 0), 95*ms)...)))
	assert.Empty(t, breaches("sliding_window", sw, at(append(repeat(3, 0), 100*ms)...)))
	// Funnel: 3 grants need 33333µs between the first and the third.
	assert.NotEmpty(t, breaches("funnel", fn, at(0, 0, 33332)))
	assert.Empty(t, breaches("funnel", fn, at(0, 0, 33333)))
	// A wide bracket is placed favourably: a 4th grant that may be at 100ms is no breach.
	assert.Empty(t, breaches("tokenbucket", cfg, append(at(repeat(3, 0)...), placed{base + 50*ms, base + 100*ms})))

	// Under-admission: a denial is justified while the window is full, not after.
	assert.Empty(t, unjustified("tokenbucket", cfg, at(repeat(3, 0)...), at(99*ms+999)))
	assert.NotEmpty(t, unjustified("tokenbucket", cfg, at(repeat(3, 0)...), at(100*ms)))
	assert.NotEmpty(t, unjustified("tokenbucket", cfg, at(repeat(2, 0)...), at(0)))
	assert.Empty(t, unjustified("fixed_window", cfg, at(repeat(3, 0)...), at(99*ms)))
	assert.NotEmpty(t, unjustified("fixed_window", cfg, at(repeat(3, 0)...), at(100*ms)))
	assert.Empty(t, unjustified("sliding_window", sw, at(repeat(3, 0)...), at(99*ms)))
	assert.NotEmpty(t, unjustified("sliding_window", sw, at(repeat(3, 0)...), at(100*ms)))
	assert.Empty(t, unjustified("funnel", fn, at(0, 0), at(33332)), "a third needs the TAT drained by one emission")
	assert.NotEmpty(t, unjustified("funnel", fn, at(0, 0), at(33333)))
	assert.NotEmpty(t, unjustified("funnel", fn, nil, at(0)), "an empty funnel denies nothing")
	// A denial whose bracket reaches back into the full window is justified.
	assert.Empty(t, unjustified("tokenbucket", cfg, at(repeat(3, 0)...), []placed{{base + 99*ms, base + 101*ms}}))

	// Placement recovers the exact moment from ResetAfter.
	now := base + 123_456
	for _, c := range []struct {
		algorithm string
		cfg       Config
		allowed   bool
		reset     int64
	}{
		{"fixed_window", cfg, true, 200_000 - 123_456},  // the window ends at 200ms
		{"fixed_window", cfg, false, 200_000 - 123_456}, // denials too
		{"tokenbucket", cfg, true, 223_000 - 123_456},   // the record at 123ms ages out at 223ms
		{"sliding_window", sw, true, 220_000 - 123_456}, // sub-window 12 leaves at 220ms
	} {
		p, err := place(c.algorithm, c.cfg, decision{allowed: c.allowed, before: now - 300, after: now + 300, reset: c.reset})
		require.NoError(t, err)
		assert.Equal(t, placed{now, now}, p, "%+v", c)
	}
	p, err := place("tokenbucket", cfg, decision{allowed: false, before: now - 300, after: now + 300, reset: 5_000})
	require.NoError(t, err)
	assert.Equal(t, placed{now - 300, now + 300}, p, "a token bucket denial keeps its bracket")
	_, err = place("fixed_window", cfg, decision{allowed: true, before: now - 300, after: now + 300, reset: 50_000})
	assert.Error(t, err, "a ResetAfter that fits no moment of the bracket")
	_, err = place("tokenbucket", cfg, decision{allowed: true, before: now, after: now, reset: 90_000})
	assert.Error(t, err, "a token bucket grant that is not the newest record")

	// Utilization counts whole windows inside the run only.
	g, m := utilization("fixed_window", cfg, at(0, 0, 150*ms, 250*ms, 250*ms, 399*ms), base+50*ms, base+400*ms)
	assert.Equal(t, [2]int64{4, 9}, [2]int64{g, m}, "windows [100,200), [200,300) and [300,400)")
	g, m = utilization("funnel", fn, at(0, 0, 33333, 66666), base, base+7*33333)
	assert.Equal(t, [2]int64{4, 2 + 7}, [2]int64{g, m})
	g, m = utilization("tokenbucket", cfg, at(0, 0, 0, 100*ms, 100*ms), base, base+101*ms)
	assert.Equal(t, [2]int64{3 + 2, 2 * 3}, [2]int64{g, m}, "spans ending at 99ms and 100ms hold 3 and 2")
}
