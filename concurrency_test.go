package redlimit

// Exactness under concurrency: several OS processes (this test binary run
// again as a "concurrency" child: startChild) × 64 goroutines each hammer a few shared
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
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/evalsha"
	"github.com/redlimit/redlimit/internal/redistest"
)

const (
	concProcesses  = 3
	concGoroutines = 64
	concDuration   = 2 * time.Second
	concLimiters   = 3
)

// concConfig binds hard: 20 permits a second per limiter, when the children
// ask each one 500 to 1500 times a second, and still 25 when this machine
// (-race, two cores that other test runs share) is at its slowest.
func concConfig(a algo) Config { return a.tune(Per(10, 500*time.Millisecond), 5, 10) }

// concSpec tells a child what to hammer, where and when.
type concSpec struct {
	Algorithm  string   `json:"algorithm"`
	Algorithms []string `json:"algorithms,omitempty"` // each limiter's, in place of Algorithm
	Addrs      []string `json:"addrs"`
	Cluster    bool     `json:"cluster"`
	Names      []string `json:"names"`
	Goroutines int      `json:"goroutines"`
	// Defaults: the limiters have no stored config, and each child's
	// handles use multiConcConfig as their default (WithDefault).
	Defaults bool  `json:"defaults,omitempty"`
	Start    int64 `json:"start"` // Unix µs: every child begins then...
	Stop     int64 `json:"stop"`  // ...and starts no call after this
}

// decision is one answer of a limiter, as a child reports it.
type decision struct {
	Limiter int   `json:"l"`
	Allowed bool  `json:"a"`
	Before  int64 `json:"b"` // Redis TIME just before the script, µs
	After   int64 `json:"f"` // Redis TIME just after it
	Reset   int64 `json:"r"` // Result.ResetAfter, µs
	Bound   int   `json:"n"` // Result.Bound: which of several rates bound it
}

// stamp receives the TIME bracket of the EVALSHA run under its context.
type stamp struct{ before, after int64 }

type stampKey struct{}

// timeHook runs each EVALSHA whose context carries a *stamp as MULTI, TIME,
// EVALSHA, TIME, EXEC on the primary owning its keys, and stores both times.
type timeHook struct {
	passHook
	nodeFor func(ctx context.Context, key string) (*redis.Client, error)
}

func (h timeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// A batch's call stamps each of its callers.
		var stamps []*stamp
		for _, member := range append(evalsha.MembersOf(ctx), ctx) {
			if s, ok := member.Value(stampKey{}).(*stamp); ok {
				stamps = append(stamps, s)
			}
		}
		if len(stamps) == 0 || cmd.Name() != "evalsha" {
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
		for _, s := range stamps {
			s.before, s.after = before.Val().UnixMicro(), after.Val().UnixMicro()
		}
		return nil
	}
}

// concurrencyChild is a child of TestExactnessUnderConcurrency and
// TestMultiRateExactUnderConcurrency: it hammers the limiters its concSpec
// names and reports a concReport.
func concurrencyChild(t *testing.T, raw []byte) any {
	var spec concSpec
	decodeSpec(t, raw, &spec)
	report, err := runConcChild(spec)
	require.NoError(t, err)
	return report
}

func runConcChild(spec concSpec) (*concReport, error) {
	ctx := context.Background()
	algs := make([]algo, len(spec.Names))
	for i := range algs {
		name := spec.Algorithm
		if len(spec.Algorithms) > 0 {
			name = spec.Algorithms[i]
		}
		var ok bool
		if algs[i], ok = algorithmNamed(name); !ok {
			return nil, fmt.Errorf("unknown algorithm %q", name)
		}
	}
	// No retries and no timeouts to speak of: a re-sent script is counted
	// once (TestHangStallUnderLoad proves it) but reports its first run's grant with
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
		limiters[i] = algs[i].new(client, name)
		if spec.Defaults {
			cfg, _ := multiConcConfig(algs[i])
			limiters[i] = limiters[i].WithDefault(cfg)
		}
		// A peek (it writes nothing) loads the script and the cluster slots.
		if _, err := limiters[i].Allow(ctx, 0); err != nil {
			return nil, err
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
	hammer(ctx, spec.Goroutines, func(g, n int) bool {
		if time.Now().UnixMicro() >= spec.Stop {
			return true
		}
		tl := &tallies[g]
		i := (g + n) % len(limiters)
		s := new(stamp)
		began := time.Now()
		r, err := limiters[i].Allow(context.WithValue(ctx, stampKey{}, s), 1)
		tl.slowest = max(tl.slowest, time.Since(began))
		if err != nil {
			tl.errs = append(tl.errs, err)
			return false
		}
		tl.decisions = append(tl.decisions, decision{i, r.Allowed, s.before, s.after, r.ResetAfter.Microseconds(), r.Bound})
		return false
	})()
	tail := time.Since(time.UnixMicro(spec.Stop))

	report := &concReport{Late: late, Tail: tail}
	report.Batches, report.Batched = client.transport.BatchStats()
	for _, tl := range tallies {
		report.Decisions = append(report.Decisions, tl.decisions...)
		for _, err := range tl.errs {
			if report.Errors++; len(report.First) < 5 {
				report.First = append(report.First, err.Error())
			}
		}
		report.Slowest = max(report.Slowest, tl.slowest)
	}
	return report, nil
}

// concReport is what a child says of its run, and what the children said
// together.
type concReport struct {
	Decisions []decision
	Errors    int
	First     []string      // the first errors' texts
	Slowest   time.Duration // the longest call
	Late      time.Duration // the latest start past Start (negative: early)
	Tail      time.Duration // how long past Stop the calls in flight took
	// Batches sent, and the decisions they held (the others went alone).
	Batches, Batched int64
}

// batchesFormed logs the batches the children sent and requires that some
// formed, so that the exactness checked covers batched decisions.
func batchesFormed(t *testing.T, r concReport) {
	t.Helper()
	require.NotZero(t, r.Batches, "no batch formed")
	t.Logf("%d of %d decisions in %d batches, %.1f each", r.Batched, len(r.Decisions), r.Batches, float64(r.Batched)/float64(r.Batches))
}

// add merges a child's report into r.
func (r *concReport) add(child concReport) {
	r.Decisions = append(r.Decisions, child.Decisions...)
	r.Errors += child.Errors
	r.First = append(r.First, child.First...)
	r.Slowest = max(r.Slowest, child.Slowest)
	r.Late = max(r.Late, child.Late)
	r.Tail = max(r.Tail, child.Tail)
	r.Batches += child.Batches
	r.Batched += child.Batched
}

// of returns the decisions of limiter i.
func (r *concReport) of(i int) []decision {
	var out []decision
	for _, d := range r.Decisions {
		if d.Limiter == i {
			out = append(out, d)
		}
	}
	return out
}

// concBackends are the servers the children hammer: the test binary's real
// redis-server, and its Cluster with one limiter on each primary. setup
// returns their addresses, a client, and the hash tags that place
// concLimiters limiters.
type concBackend struct {
	name  string
	setup func(t *testing.T) (addrs []string, rdb redis.Scripter, tags []string)
}

var concBackends = []concBackend{
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

func TestExactnessUnderConcurrency(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes for ~40s")
	}
	for _, b := range concBackends {
		t.Run(b.name, func(t *testing.T) {
			addrs, rdb, tags := b.setup(t)
			for _, a := range algorithms {
				t.Run(a.name, func(t *testing.T) {
					cfg := concConfig(a)
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
						spec := concSpec{
							Algorithm: a.name, Addrs: addrs, Cluster: b.name == "cluster", Names: names,
							Goroutines: concGoroutines, Start: start.UnixMicro(), Stop: start.Add(concDuration).UnixMicro(),
						}
						began := time.Now()
						report := concChildren(t, spec)
						require.Zero(t, report.Errors, "errors in the children: %v", report.First)
						t.Logf("run %d: %v; the latest child ready %v before the start, calls done %v after the stop; slowest call %v",
							attempt, time.Since(began).Round(time.Millisecond), -report.Late.Round(time.Millisecond), report.Tail.Round(time.Millisecond), report.Slowest.Round(time.Millisecond))
						batchesFormed(t, report)
						bound := true
						for i := range names {
							grants, denials := checkExactness(t, a, cfg, spec, report.of(i))
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

// concChildren runs concProcesses children on spec and gathers their reports.
func concChildren(t *testing.T, spec concSpec) concReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	specs := make([]any, concProcesses)
	for p := range specs {
		specs[p] = spec
	}
	report := concReport{Late: math.MinInt64}
	for _, child := range runChildren[concReport](ctx, t, "concurrency", specs, nil) {
		report.add(child)
	}
	return report
}

// placed is a decision where the server made it: at some µs in [lo, hi];
// lo == hi when the reply pins it exactly.
type placed struct{ lo, hi int64 }

// place narrows d's TIME bracket with what the reply says of the moment it
// was made (see the top of this file).
func place(a algo, cfg Config, d decision) (placed, error) {
	p := placed{d.Before, d.After}
	if p.lo > p.hi {
		return p, fmt.Errorf("TIME went backwards inside one transaction: %+v", d)
	}
	grid, err := a.grid(cfg.withDefaults(), d) // now + ResetAfter lands on a multiple of grid
	if err != nil || grid == 0 {
		return p, err
	}
	end := ceilDiv(p.lo+d.Reset, grid) * grid // the first grid point not before lo + reset
	if end > p.hi+d.Reset {
		return p, fmt.Errorf("%s decision %+v: ResetAfter fits no moment in its TIME bracket", a.name, d)
	}
	if end+grid <= p.hi+d.Reset {
		return p, nil // a bracket wider than the grid: keep it
	}
	return placed{end - d.Reset, end - d.Reset}, nil
}

// breaches returns the first breaches of algorithm's guarantee among grants
// sorted by lo, each grant placed where it is most favourable to the library.
func breaches(a algo, cfg Config, grants []placed) []string {
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
	a.breaches(cfg.withDefaults(), grants, latest, report)
	return out
}

// unjustified returns the first denials made while the guarantee left room
// for the request, with every decision placed where it is most favourable to
// the library: a denial is justified if any placement fills its window.
// grants are sorted by lo.
func unjustified(a algo, cfg Config, grants, denials []placed) []string {
	cfg = cfg.withDefaults()
	var out []string
	if a.cells == nil {
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
	if a.name == tokenBucketAlgo.name {
		grants = coalesced(cfg, grants)
	}
	width, n := a.cells(cfg)
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

// coalesced gives each token-bucket grant the latest time at which a grant
// sharing its record may have been made: grants of one slice of Interval /
// 64 (whole ms, rounded up) share one, which leaves the window with the
// latest of them (scripts/tokenbucket.lua). Placed favourably: any grant
// whose bracket meets the slice may share it.
func coalesced(cfg Config, grants []placed) []placed {
	q := ceilDiv(cfg.Interval.Milliseconds(), 64) * 1000
	out := slices.Clone(grants)
	for i, g := range grants {
		first, last := floorDiv(g.lo, q)*q, (floorDiv(g.hi, q)+1)*q-1
		for _, h := range grants {
			if h.lo <= last && h.hi >= first {
				out[i].hi = max(out[i].hi, min(h.hi, last))
			}
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
func utilization(a algo, cfg Config, grants []placed, start, stop int64) (granted, most int64) {
	cfg = cfg.withDefaults()
	if a.cells == nil {
		for _, p := range grants {
			if p.lo >= start && p.lo <= stop {
				granted++
			}
		}
		return granted, cfg.Burst + (stop-start)/(cfg.Interval.Microseconds()/cfg.Rate)
	}
	width, n := a.cells(cfg)
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
func checkExactness(t *testing.T, a algo, cfg Config, spec concSpec, decisions []decision) (granted, denied int) {
	t.Helper()
	var grants, denials []placed
	var exact int
	var widest int64
	for _, d := range decisions {
		p, err := place(a, cfg, d)
		if !assert.NoError(t, err) {
			return 0, 0
		}
		if d.Allowed {
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
	used, most := utilization(a, cfg, grants, spec.Start, spec.Stop)
	t.Logf("%s: %d grants, %d denials; %.1f%% of capacity used (%d of %d); %d of %d decisions placed exactly, widest bracket %dµs",
		a.name, len(grants), len(denials), 100*float64(used)/float64(most), used, most, exact, len(decisions), widest)
	assert.Empty(t, breaches(a, cfg, grants), "over-admission: the guarantee broken")
	assert.Empty(t, unjustified(a, cfg, grants, denials), "under-admission: a denial while the window had room")
	return len(grants), len(denials)
}

// multiConcConfig is a limiter of two rates for TestMultiRateExactUnderConcurrency:
// 10 permits per 100ms (the funnel: a burst of 5; the sliding window: 10
// buckets of 10ms), which denies many of the children's calls (they ask
// each limiter 200 to 1500 times a second), and 100 in ten years (the
// funnel: a burst of 80), which no run lasts and no window edge ends before
// 2029. The second binds over the run: bound is what it grants, well under
// what the first would (150 in 1.5s and more).
func multiConcConfig(a algo) (cfg Config, bound int64) {
	cfg = a.tune(Per(10, 100*time.Millisecond), 5, 10).And(a.tune(Per(100, maxInterval), 80, 10))
	return cfg, quotaOf(ratesOf(cfg)[1]).Limit
}

const multiConcDuration = 1500 * time.Millisecond

// Several rates, decided under the same load as TestExactnessUnderConcurrency
// (concProcesses × concGoroutines), on one limiter of each algorithm at once
// (on the Cluster, spread over the primaries), stored and as every
// handle's default (the funnel's and the windows' state is then flat): the
// grants over the run are
// exactly the tightest bound, the further rate's; every denial is justified
// by the rate it names as Bound (the first: its window was full; the
// further one: all of its permits may have been granted before it); the
// first rate's guarantee holds throughout; and a peek afterwards finds
// exactly what is left. A run proves exactness only if demand took every
// permit and outran the first rate at times: it is made again, at most
// twice, if not.
func TestMultiRateExactUnderConcurrency(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes for ~10s")
	}
	for _, b := range concBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Run("stored", func(t *testing.T) { multiRateRuns(t, b, false) })
			t.Run("default", func(t *testing.T) { multiRateRuns(t, b, true) })
		})
	}
}

// multiRateRuns runs TestMultiRateExactUnderConcurrency on one backend: up
// to three runs, until one proves exactness.
func multiRateRuns(t *testing.T, b concBackend, defaults bool) {
	ctx := context.Background()
	addrs, rdb, tags := b.setup(t)
	handle := func(a algo, name string) *Limiter {
		l := a.new(New(rdb), name)
		if cfg, _ := multiConcConfig(a); defaults {
			return l.WithDefault(cfg)
		}
		return l
	}
	for attempt := 1; ; attempt++ {
		names, algs := make([]string, len(algorithms)), make([]string, len(algorithms))
		for i, a := range algorithms {
			cfg, _ := multiConcConfig(a)
			names[i], algs[i] = fmt.Sprintf("%s%s-%s", tags[i%len(tags)], uniqueName(t), a.name), a.name
			if !defaults {
				require.NoError(t, a.new(New(rdb), names[i]).SetRate(ctx, cfg))
			}
		}
		start := time.Now().Add(time.Second) // the children's start-up, before it
		spec := concSpec{
			Algorithms: algs, Addrs: addrs, Cluster: b.name == "cluster", Names: names, Defaults: defaults,
			Goroutines: concGoroutines, Start: start.UnixMicro(), Stop: start.Add(multiConcDuration).UnixMicro(),
		}
		began := time.Now()
		report := concChildren(t, spec)
		require.Zero(t, report.Errors, "errors in the children: %v", report.First)
		t.Logf("run %d: %v; slowest call %v", attempt, time.Since(began).Round(time.Millisecond), report.Slowest.Round(time.Millisecond))
		batchesFormed(t, report)
		time.Sleep(200 * time.Millisecond) // every first rate is full again
		proved := true
		for i, a := range algorithms {
			proved = checkMultiRateRun(t, a, handle(a, names[i]), report.of(i)) && proved
			if defaults && a.namesItself {
				assert.Equal(t, "string", rdb.(redis.Cmdable).Type(ctx, names[i]).Val(), "%s: a default's state is flat", a.name)
			}
		}
		if proved {
			break
		}
		if attempt == 3 {
			t.Errorf("demand did not take every permit, or never outran the first rate, in %d runs", attempt)
			break
		}
	}
}

// checkMultiRateRun checks the decisions of l, a limiter of multiConcConfig,
// over a run (see TestMultiRateExactUnderConcurrency), and reports whether
// the run proved exactness: every permit of the further rate granted, and
// some requests denied by the first. Decisions are placed as the further
// rate's ResetAfter says (place): with ten years to go, it is the Result's.
func checkMultiRateRun(t *testing.T, a algo, l *Limiter, decisions []decision) bool {
	t.Helper()
	cfg, bound := multiConcConfig(a)
	first, further := ratesOf(cfg)[0], ratesOf(cfg)[1]
	var grants, byFirst, byFurther []placed
	for _, d := range decisions {
		p := placed{d.Before, d.After}
		if d.Reset > 0 { // 0: before any grant, nothing counts yet
			var err error
			p, err = place(a, further, d)
			require.NoError(t, err, a.name)
		}
		switch {
		case d.Allowed:
			grants = append(grants, p)
		case d.Bound == 0:
			byFirst = append(byFirst, p)
		default:
			byFurther = append(byFurther, p)
		}
	}
	slices.SortFunc(grants, func(a, b placed) int { return cmp.Compare(a.lo, b.lo) })
	granted := int64(len(grants))
	t.Logf("%s: %d grants of %d; %d denials by the first rate, %d by the further one", a.name, granted, bound, len(byFirst), len(byFurther))
	assert.LessOrEqual(t, granted, bound, "%s: over-admission: more than the further rate's %d", a.name, bound)
	assert.Empty(t, breaches(a, first, grants), "%s: over-admission: the first rate's guarantee broken", a.name)
	assert.Empty(t, unjustified(a, first, grants, byFirst), "%s: a denial the first rate named while its window had room", a.name)
	for _, d := range byFurther {
		before := int64(sort.Search(len(grants), func(i int) bool { return grants[i].lo > d.hi }))
		if !assert.GreaterOrEqual(t, before, bound, "%s: a denial the further rate named, at %d, before its permits were all granted", a.name, d.lo) {
			break
		}
	}
	r, err := l.Allow(context.Background(), 0)
	require.NoError(t, err)
	left, firstLimit := bound-granted, quotaOf(first).Limit
	wantBound := 0
	if left < firstLimit {
		wantBound = 1
	}
	assert.Equal(t, [2]any{min(left, firstLimit), wantBound}, [2]any{r.Remaining, r.Bound}, "%s: the state holds the grants, no more, no fewer", a.name)
	return granted == bound && len(byFirst) > 0
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
	assert.NotEmpty(t, breaches(tokenBucketAlgo, cfg, at(append(repeat(3, 0), 99*ms+999)...)))
	assert.Empty(t, breaches(tokenBucketAlgo, cfg, at(append(repeat(3, 0), 100*ms)...)))
	// Fixed window: 4 in [0, 100ms) is too many; the 4th at 100ms is in the next window.
	assert.NotEmpty(t, breaches(fixedWindowAlgo, cfg, at(append(repeat(3, 0), 99*ms)...)))
	assert.Empty(t, breaches(fixedWindowAlgo, cfg, at(append(repeat(3, 0), 100*ms)...)))
	// Sliding window, 10 buckets of 10ms: 3 at 0ms then a 4th at 95ms share
	// buckets 0..9; at 100ms bucket 0 has left.
	assert.NotEmpty(t, breaches(slidingWindowAlgo, sw, at(append(repeat(3, 0), 95*ms)...)))
	assert.Empty(t, breaches(slidingWindowAlgo, sw, at(append(repeat(3, 0), 100*ms)...)))
	// Funnel: 3 grants need 33333µs between the first and the third.
	assert.NotEmpty(t, breaches(funnelAlgo, fn, at(0, 0, 33332)))
	assert.Empty(t, breaches(funnelAlgo, fn, at(0, 0, 33333)))
	// A wide bracket is placed favourably: a 4th grant that may be at 100ms is no breach.
	assert.Empty(t, breaches(tokenBucketAlgo, cfg, append(at(repeat(3, 0)...), placed{base + 50*ms, base + 100*ms})))

	// Under-admission: a denial is justified while the window is full, not after.
	assert.Empty(t, unjustified(tokenBucketAlgo, cfg, at(repeat(3, 0)...), at(99*ms+999)))
	assert.NotEmpty(t, unjustified(tokenBucketAlgo, cfg, at(repeat(3, 0)...), at(100*ms)))
	assert.NotEmpty(t, unjustified(tokenBucketAlgo, cfg, at(repeat(2, 0)...), at(0)))
	// Token-bucket grants of one slice (2ms here) share a record, which
	// leaves with the latest of them: until then a denial is justified.
	assert.Empty(t, unjustified(tokenBucketAlgo, cfg, at(0, 0, 1*ms), at(100*ms+999)))
	assert.NotEmpty(t, unjustified(tokenBucketAlgo, cfg, at(0, 0, 1*ms), at(101*ms)))
	assert.NotEmpty(t, unjustified(tokenBucketAlgo, cfg, at(0, 0, 2*ms), at(100*ms)), "2ms is the next slice")
	assert.Empty(t, unjustified(fixedWindowAlgo, cfg, at(repeat(3, 0)...), at(99*ms)))
	assert.NotEmpty(t, unjustified(fixedWindowAlgo, cfg, at(repeat(3, 0)...), at(100*ms)))
	assert.Empty(t, unjustified(slidingWindowAlgo, sw, at(repeat(3, 0)...), at(99*ms)))
	assert.NotEmpty(t, unjustified(slidingWindowAlgo, sw, at(repeat(3, 0)...), at(100*ms)))
	assert.Empty(t, unjustified(funnelAlgo, fn, at(0, 0), at(33332)), "a third needs the TAT drained by one emission")
	assert.NotEmpty(t, unjustified(funnelAlgo, fn, at(0, 0), at(33333)))
	assert.NotEmpty(t, unjustified(funnelAlgo, fn, nil, at(0)), "an empty funnel denies nothing")
	// A denial whose bracket reaches back into the full window is justified.
	assert.Empty(t, unjustified(tokenBucketAlgo, cfg, at(repeat(3, 0)...), []placed{{base + 99*ms, base + 101*ms}}))

	// Placement recovers the exact moment from ResetAfter.
	now := base + 123_456
	for _, c := range []struct {
		a       algo
		cfg     Config
		allowed bool
		reset   int64
	}{
		{fixedWindowAlgo, cfg, true, 200_000 - 123_456},  // the window ends at 200ms
		{fixedWindowAlgo, cfg, false, 200_000 - 123_456}, // denials too
		{tokenBucketAlgo, cfg, true, 223_000 - 123_456},  // the record at 123ms ages out at 223ms
		{slidingWindowAlgo, sw, true, 220_000 - 123_456}, // sub-window 12 leaves at 220ms
	} {
		p, err := place(c.a, c.cfg, decision{Allowed: c.allowed, Before: now - 300, After: now + 300, Reset: c.reset})
		require.NoError(t, err)
		assert.Equal(t, placed{now, now}, p, "%+v", c)
	}
	p, err := place(tokenBucketAlgo, cfg, decision{Allowed: false, Before: now - 300, After: now + 300, Reset: 5_000})
	require.NoError(t, err)
	assert.Equal(t, placed{now - 300, now + 300}, p, "a token bucket denial keeps its bracket")
	_, err = place(fixedWindowAlgo, cfg, decision{Allowed: true, Before: now - 300, After: now + 300, Reset: 50_000})
	assert.Error(t, err, "a ResetAfter that fits no moment of the bracket")
	_, err = place(tokenBucketAlgo, cfg, decision{Allowed: true, Before: now, After: now, Reset: 90_000})
	assert.Error(t, err, "a token bucket grant that is not the newest record")

	// Utilization counts whole windows inside the run only.
	g, m := utilization(fixedWindowAlgo, cfg, at(0, 0, 150*ms, 250*ms, 250*ms, 399*ms), base+50*ms, base+400*ms)
	assert.Equal(t, [2]int64{4, 9}, [2]int64{g, m}, "windows [100,200), [200,300) and [300,400)")
	g, m = utilization(funnelAlgo, fn, at(0, 0, 33333, 66666), base, base+7*33333)
	assert.Equal(t, [2]int64{4, 2 + 7}, [2]int64{g, m})
	g, m = utilization(tokenBucketAlgo, cfg, at(0, 0, 0, 100*ms, 100*ms), base, base+101*ms)
	assert.Equal(t, [2]int64{3 + 2, 2 * 3}, [2]int64{g, m}, "spans ending at 99ms and 100ms hold 3 and 2")
}
