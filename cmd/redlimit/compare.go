package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"math/bits"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// compare runs one traffic pattern through the four algorithms on a clock it
// moves itself, so the run takes no time and its result is the same every
// time, and charts what each granted.
func compare(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("compare", "compare [flags]", `Sends one traffic pattern through a limiter of each algorithm, all with the
same rate, on a simulated clock (the run takes no time and is the same every
time), and charts what each granted: per tick, and in the last interval against
the limit. With -and, every limiter has a further rate too (Config.And), and
each panel says how close each rate came to its limit.

With -instances, the requests go in turn to that many instances, each with its
own Client on the one limit. With -lease, every algorithm runs again on the
same requests with each instance's handle leased (WithLease), charted beside
the run without, with the busiest span of those the lease bound covers.

	redlimit compare -pattern edge -out compare.png
	redlimit compare -pattern steady -and 25/5s
	redlimit compare -pattern steady -rate 100 -instances 3 -lease 100ms
`, stderr)
	var be backend
	be.addFlags(fs)
	pattern := fs.String("pattern", "edge", "the traffic: "+strings.Join(patternNames(), ", "))
	rate := fs.Int64("rate", 10, "permits per interval, the same for every algorithm")
	interval := fs.Duration("interval", time.Second, "the limit's interval")
	windows := fs.Int("windows", 6, "how many intervals to simulate")
	out := fs.String("out", "", "also draw the chart to this file: .png or .svg")
	var and moreRates
	fs.Var(&and, "and", "a further rate for every algorithm, N/PERIOD such as 25/5s; repeat for more")
	instances := fs.Int("instances", 1, "how many instances share each limit, taking the requests in turn")
	lease := fs.Duration("lease", 0, "also run every algorithm with leases of this time (WithLease); 0: none")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	switch {
	case fs.NArg() > 0:
		return usageError(fs, "unexpected argument %q", fs.Arg(0))
	case patterns[*pattern].arrivals == nil:
		return invalid(fs, "unknown pattern %q: want one of %s", *pattern, strings.Join(patternNames(), ", "))
	case *windows < 1 || *windows > 100:
		return invalid(fs, "-windows %d: want 1 to 100", *windows)
	case *out != "" && !strings.EqualFold(filepath.Ext(*out), ".png") && !strings.EqualFold(filepath.Ext(*out), ".svg"):
		return invalid(fs, "-out %q: want a .png or .svg file", *out)
	case *rate < 1 || *rate > 1000:
		return invalid(fs, "-rate %d: want 1 to 1000", *rate)
	case *interval < 10*time.Millisecond:
		return invalid(fs, "-interval %v: want at least 10ms", *interval)
	case *instances < 1 || *instances > maxInstances:
		return invalid(fs, "-instances %d: want 1 to %d", *instances, maxInstances)
	case *lease < 0 || *lease >= *interval:
		// A block used for a whole interval would leave the bound nothing.
		return invalid(fs, "-lease %v: want 0 (no leases) or less than the interval, %v", *lease, *interval)
	}
	cfg := redlimit.Per(*rate, *interval).And(and.rates...)
	if err := redlimit.New(nil).FixedWindow("compare").Validate(cfg); err != nil {
		return invalid(fs, "%v", err)
	}

	if code, ok := be.start(ctx, fs); !ok {
		return code
	}
	defer be.close()
	rdb := be.newClient()
	defer rdb.Close()

	c, err := simulate(ctx, rdb, scenario{pattern: *pattern, cfg: cfg, length: time.Duration(*windows) * cfg.Interval,
		instances: *instances, lease: *lease})
	if err != nil {
		fmt.Fprintf(stderr, "redlimit compare: %v\n", err)
		return exitFail
	}
	fmt.Fprint(stdout, c.terminalChart(isTerminal(stdout)))
	if *out != "" {
		if err := c.saveImage(*out); err != nil {
			fmt.Fprintf(stderr, "redlimit compare: %v\n", err)
			return exitFail
		}
		fmt.Fprintf(stdout, "\nChart written to %s\n", *out)
	}
	return exitOK
}

// A pattern lists when requests arrive, as offsets from the start, given the
// limit (rate per interval) and how long the run is.
type pattern struct {
	about    string
	arrivals func(rate int64, interval, length time.Duration) []time.Duration
}

var patterns = map[string]pattern{
	"steady": {"twice the limit, evenly spaced", func(rate int64, interval, length time.Duration) []time.Duration {
		return every(interval/time.Duration(2*rate), 0, length)
	}},
	// Bursts straddle a window edge and are far above the rate: the case that
	// lets a fixed window pass twice its limit.
	"edge": {"bursts of 10× the limit across every other window edge", func(rate int64, interval, length time.Duration) []time.Duration {
		var at []time.Duration
		for edge := interval; edge < length; edge += 2 * interval {
			at = append(at, every(interval/time.Duration(10*rate), edge-3*interval/10, edge+3*interval/10)...)
		}
		return at
	}},
	// The offered rate grows linearly from 0 to 3× the limit: the k-th
	// request arrives when the cumulative load, 3·rate·t²/(2·interval·length), reaches k.
	"ramp": {"from nothing up to 3× the limit", func(rate int64, interval, length time.Duration) []time.Duration {
		var at []time.Duration
		for k := 1.0; ; k++ {
			t := time.Duration(math.Sqrt(2 * k * float64(interval) * float64(length) / (3 * float64(rate))))
			if t >= length {
				return at
			}
			at = append(at, t)
		}
	}},
}

func patternNames() []string {
	names := make([]string, 0, len(patterns))
	for name := range patterns {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// every returns from, from+step, … up to before until.
func every(step, from, until time.Duration) []time.Duration {
	var at []time.Duration
	for t := from; t < until; t += step {
		at = append(at, t)
	}
	return at
}

// The algorithms in the order they are charted, with what to look for.
var algorithms = []struct {
	name    string
	limiter func(*redlimit.Client, string) *redlimit.Limiter
	about   func(cfg redlimit.Config) string
	// bound is what lease.go promises of the algorithm's grants with leases
	// of d, for cfg's own rate.
	bound func(cfg redlimit.Config, d time.Duration) leaseBound
}{
	{"fixed_window", (*redlimit.Client).FixedWindow, func(redlimit.Config) string {
		return "fixed window: counts per window, so bursts either side of an edge pass up to 2× the limit"
	}, func(cfg redlimit.Config, _ time.Duration) leaseBound {
		return leaseBound{limit: cfg.Rate} // a block is never used past its window
	}},
	{"sliding_window", (*redlimit.Client).SlidingWindow, func(cfg redlimit.Config) string {
		return fmt.Sprintf("sliding window: sums 10 sub-windows, so the limit holds over any %v", cfg.Interval*9/10)
	}, func(cfg redlimit.Config, d time.Duration) leaseBound {
		buckets := time.Duration(cmp.Or(cfg.Buckets, 10))
		return leaseBound{span: cfg.Interval*(buckets-1)/buckets - d, limit: cfg.Rate}
	}},
	{"tokenbucket", (*redlimit.Client).TokenBucket, func(cfg redlimit.Config) string {
		return fmt.Sprintf("token bucket: a full bucket grants all %d at once; each permit returns %v later", cfg.Rate, cfg.Interval)
	}, func(cfg redlimit.Config, d time.Duration) leaseBound {
		return leaseBound{span: cfg.Interval - d, limit: cfg.Rate}
	}},
	{"funnel", (*redlimit.Client).Funnel, func(cfg redlimit.Config) string {
		return fmt.Sprintf("funnel: takes a burst of %d, then drains smoothly, one permit every %v", cfg.Rate, cfg.Interval/time.Duration(cfg.Rate))
	}, func(cfg redlimit.Config, d time.Duration) leaseBound {
		// Burst + Rate × (t + d) / Interval, taken at t = Interval: the span
		// the chart's line counts over.
		hi, lo := bits.Mul64(uint64(cfg.Rate), uint64(d))
		inLease, _ := bits.Div64(hi, lo, uint64(cfg.Interval)) // d < Interval: cannot overflow
		return leaseBound{span: cfg.Interval, limit: cmp.Or(cfg.Burst, cfg.Rate) + cfg.Rate + int64(inLease)}
	}},
}

// maxInstances bounds -instances: enough to show the blocks leases hold
// across a fleet, few enough to chart.
const maxInstances = 16

// A scenario is what compare simulates.
type scenario struct {
	pattern   string
	cfg       redlimit.Config
	length    time.Duration
	instances int           // the requests go to them in turn
	lease     time.Duration // > 0: every algorithm runs again, leased
}

// comparison is what simulate saw, counted per tick (a tenth of the interval).
type comparison struct {
	scenario
	tick    time.Duration
	offered []int
	results []algorithmResult // in algorithms' order
	leased  []algorithmResult // the same with leases; nil without
}

type algorithmResult struct {
	name, about string
	granted     []int // per tick
	rolling     []int // granted in the interval that ends with each tick
	total       int
	// busiest is the most grants in any span of one interval, from the
	// exact grant times; one per rate, the config's first.
	busiest []int
	// With leases only: the lease time, the bound lease.go states for it
	// with what the run came to, and what the instances' leases did, summed.
	lease time.Duration
	bound leaseBound
	stats redlimit.LeaseStats
}

// leaseBound is lease.go's bound for one algorithm and lease time: no span
// of span grants more than limit; span 0 is one of the limiter's own
// windows (the fixed window's), and a span below 0 is no bound at all.
type leaseBound struct {
	span  time.Duration
	limit int64
	most  int // the most one such span granted
}

// A trial is one limiter per algorithm, seen through each instance's
// handle: the run without leases, or the one with.
type trial struct {
	handles [][]*redlimit.Limiter // [algorithm][instance]
	grants  [][]time.Duration     // [algorithm]: when each grant was made
	results []algorithmResult
}

// simulate offers the pattern's requests, in turn to each instance, to one
// limiter of each algorithm, all with cfg, on a controlled clock that starts
// on a window edge; then, with a lease time, to one more per algorithm, each
// instance's handle leased.
func simulate(ctx context.Context, rdb redis.Scripter, s scenario) (comparison, error) {
	base := time.Unix(1_800_000_000, 0)
	start := base.Add(-time.Duration(base.UnixNano() % int64(s.cfg.Interval))) // epoch-aligned, as fixed windows are
	// On a clock of its own, a leased handle gives a block back within the
	// request that drops it (lease.go), so every run is the same.
	now := start
	clock := redlimit.WithClock(func() time.Time { return now })
	clients := make([]*redlimit.Client, max(s.instances, 1))
	for i := range clients {
		clients[i] = redlimit.New(rdb, clock)
	}
	name := uniqueName("redlimit-compare:")

	c := comparison{scenario: s, tick: s.cfg.Interval / 10}
	ticks := int(s.length / c.tick)
	c.offered = make([]int, ticks)
	newTrial := func(name string, lease time.Duration) *trial {
		r := &trial{grants: make([][]time.Duration, len(algorithms))}
		for _, a := range algorithms {
			var handles []*redlimit.Limiter
			for _, client := range clients {
				l := a.limiter(client, name+":"+a.name).WithDefault(s.cfg)
				if lease > 0 {
					l = l.WithLease(redlimit.Lease{Time: lease})
				}
				handles = append(handles, l)
			}
			r.handles = append(r.handles, handles)
			r.results = append(r.results, algorithmResult{name: a.name, about: a.about(s.cfg), granted: make([]int, ticks), lease: lease})
		}
		return r
	}
	trials := []*trial{newTrial(name, 0)}
	if s.lease > 0 {
		trials = append(trials, newTrial(name+":leased", s.lease))
	}

	for k, at := range patterns[s.pattern].arrivals(s.cfg.Rate, s.cfg.Interval, s.length) {
		now = start.Add(at)
		tick := int(at / c.tick)
		c.offered[tick]++
		for _, r := range trials {
			for i, handles := range r.handles {
				ok, err := handles[k%len(handles)].TryAcquire(ctx, 1)
				if err != nil {
					return comparison{}, fmt.Errorf("%s: %w", algorithms[i].name, err)
				}
				if ok {
					r.results[i].granted[tick]++
					r.grants[i] = append(r.grants[i], at)
				}
			}
		}
	}

	for _, r := range trials {
		for i, handles := range r.handles {
			res := &r.results[i]
			for _, h := range handles {
				// A leased handle gives its unused permits back.
				if err := h.Close(ctx); err != nil {
					return comparison{}, fmt.Errorf("%s: %w", algorithms[i].name, err)
				}
				st := h.LeaseStats()
				res.stats.Calls += st.Calls
				res.stats.Taken += st.Taken
				res.stats.Used += st.Used
				res.stats.Returned += st.Returned
			}
			if _, err := handles[0].Delete(ctx); err != nil {
				return comparison{}, err
			}
			res.rolling = make([]int, ticks)
			for t := range ticks {
				for back := t; back > t-10 && back >= 0; back-- {
					res.rolling[t] += res.granted[back]
				}
			}
			grants := r.grants[i]
			res.total = len(grants)
			res.busiest = append(res.busiest, busiest(grants, s.cfg.Interval))
			for _, more := range s.cfg.More {
				res.busiest = append(res.busiest, busiest(grants, more.Interval))
			}
			if res.lease > 0 {
				res.bound = algorithms[i].bound(s.cfg, res.lease)
				switch {
				case res.bound.span == 0:
					res.bound.most = busiestWindow(grants, s.cfg.Interval)
				case res.bound.span > 0:
					res.bound.most = busiest(grants, res.bound.span)
				}
			}
		}
	}
	c.results = trials[0].results
	if len(trials) > 1 {
		c.leased = trials[1].results
	}
	return c, nil
}

// busiest returns the most of the sorted times that fit in [t, t+span) for any t.
func busiest(times []time.Duration, span time.Duration) int {
	most, first := 0, 0
	for last := range times {
		for times[last]-times[first] >= span {
			first++
		}
		most = max(most, last-first+1)
	}
	return most
}

// busiestWindow returns the most of the sorted times in one window of
// interval; the run starts on a window's edge.
func busiestWindow(times []time.Duration, interval time.Duration) int {
	most, first := 0, 0
	for last := range times {
		for times[first]/interval != times[last]/interval {
			first++
		}
		most = max(most, last-first+1)
	}
	return most
}

// measured is what an algorithm's chart shows, in numbers; for a leased run,
// the busiest span of those the lease bound covers, and the leases' figures.
func (c comparison) measured(r algorithmResult) string {
	if r.lease > 0 {
		return c.measuredLeased(r)
	}
	s := fmt.Sprintf("%d granted; at most %d in any %v (limit %d)", r.total, r.busiest[0], c.cfg.Interval, c.cfg.Rate)
	for i, more := range c.cfg.More {
		s += fmt.Sprintf(", %d in any %v (limit %d)", r.busiest[i+1], more.Interval, more.Rate)
	}
	return s
}

func (c comparison) measuredLeased(r algorithmResult) string {
	b := r.bound
	s := fmt.Sprintf("%d granted; ", r.total)
	if b.span < 0 {
		s += fmt.Sprintf("the lease bound covers no span with leases of %v", r.lease)
	} else {
		span := "one window"
		if b.span > 0 {
			span = "any " + b.span.String()
		}
		held := "within"
		if int64(b.most) > b.limit {
			held = "ABOVE"
		}
		s += fmt.Sprintf("at most %d in %s, %s the lease bound of %d", b.most, span, held, b.limit)
	}
	return s + fmt.Sprintf("\nleases: %d calls, %d permits taken, %d used, %d given back",
		r.stats.Calls, r.stats.Taken, r.stats.Used, r.stats.Returned)
}
