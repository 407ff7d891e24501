package main

import (
	"context"
	"fmt"
	"io"
	"math"
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

	redlimit compare -pattern edge -out compare.png
	redlimit compare -pattern steady -and 25/5s
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

	c, err := simulate(ctx, rdb, *pattern, cfg, time.Duration(*windows)*cfg.Interval)
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
}{
	{"fixed_window", (*redlimit.Client).FixedWindow, func(redlimit.Config) string {
		return "fixed window: counts per window, so bursts either side of an edge pass up to 2× the limit"
	}},
	{"sliding_window", (*redlimit.Client).SlidingWindow, func(cfg redlimit.Config) string {
		return fmt.Sprintf("sliding window: sums 10 sub-windows, so the limit holds over any %v", cfg.Interval*9/10)
	}},
	{"tokenbucket", (*redlimit.Client).TokenBucket, func(cfg redlimit.Config) string {
		return fmt.Sprintf("token bucket: a full bucket grants all %d at once; each permit returns %v later", cfg.Rate, cfg.Interval)
	}},
	{"funnel", (*redlimit.Client).Funnel, func(cfg redlimit.Config) string {
		return fmt.Sprintf("funnel: takes a burst of %d, then drains smoothly, one permit every %v", cfg.Rate, cfg.Interval/time.Duration(cfg.Rate))
	}},
}

// comparison is what simulate saw, counted per tick (a tenth of the interval).
type comparison struct {
	pattern string
	cfg     redlimit.Config
	tick    time.Duration
	offered []int
	results []algorithmResult
}

type algorithmResult struct {
	name, about string
	granted     []int // per tick
	rolling     []int // granted in the interval that ends with each tick
	total       int
	// busiest is the most grants in any span of one interval, from the
	// exact grant times; one per rate, the config's first.
	busiest []int
}

// simulate offers the pattern's requests to one limiter of each algorithm,
// all with cfg, on a controlled clock that starts on a window edge.
func simulate(ctx context.Context, rdb redis.Scripter, patternName string, cfg redlimit.Config, length time.Duration) (comparison, error) {
	base := time.Unix(1_800_000_000, 0)
	start := base.Add(-time.Duration(base.UnixNano() % int64(cfg.Interval))) // epoch-aligned, as fixed windows are
	now := start
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	name := uniqueName("redlimit-compare:")

	c := comparison{pattern: patternName, cfg: cfg, tick: cfg.Interval / 10}
	ticks := int(length / c.tick)
	c.offered = make([]int, ticks)
	limiters := make([]*redlimit.Limiter, len(algorithms))
	grants := make([][]time.Duration, len(algorithms))
	for i, a := range algorithms {
		limiters[i] = a.limiter(client, name+":"+a.name).WithDefault(cfg)
		c.results = append(c.results, algorithmResult{name: a.name, about: a.about(cfg), granted: make([]int, ticks)})
	}
	for _, at := range patterns[patternName].arrivals(cfg.Rate, cfg.Interval, length) {
		now = start.Add(at)
		tick := int(at / c.tick)
		c.offered[tick]++
		for i, l := range limiters {
			ok, err := l.TryAcquire(ctx, 1)
			if err != nil {
				return comparison{}, fmt.Errorf("%s: %w", algorithms[i].name, err)
			}
			if ok {
				c.results[i].granted[tick]++
				grants[i] = append(grants[i], at)
			}
		}
	}
	for i, l := range limiters {
		if _, err := l.Delete(ctx); err != nil {
			return comparison{}, err
		}
		r := &c.results[i]
		r.rolling = make([]int, ticks)
		for t := range ticks {
			for back := t; back > t-10 && back >= 0; back-- {
				r.rolling[t] += r.granted[back]
			}
		}
		r.total = len(grants[i])
		r.busiest = append(r.busiest, busiest(grants[i], cfg.Interval))
		for _, more := range cfg.More {
			r.busiest = append(r.busiest, busiest(grants[i], more.Interval))
		}
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

// measured is what an algorithm's chart shows, in numbers.
func (c comparison) measured(r algorithmResult) string {
	s := fmt.Sprintf("%d granted; at most %d in any %v (limit %d)", r.total, r.busiest[0], c.cfg.Interval, c.cfg.Rate)
	for i, more := range c.cfg.More {
		s += fmt.Sprintf(", %d in any %v (limit %d)", r.busiest[i+1], more.Interval, more.Rate)
	}
	return s
}
