package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// report is what BENCHMARKS.md shows: the machine, the throughput rounds,
// the checks' sections and the targets of issue 9, judged.
type report struct {
	options
	started   time.Time
	machine   string // the rows of the machine table known before the run
	scenarios []*scenario
	sections  []*section
	verdicts  map[string]verdict // by target
}

func newReport(ctx context.Context, e *env, o options) (*report, error) {
	cpu := "unknown CPU"
	b, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.Lines(string(b)) {
		if name, value, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "model name" {
			cpu = strings.TrimSpace(value)
			break
		}
	}
	version, err := infoField(ctx, e.admin, "server", "redis_version")
	if v, _ := infoField(ctx, e.admin, "server", "valkey_version"); v != "" {
		version = fmt.Sprintf("Valkey %s (redis_version %s)", v, version)
	}
	m := fmt.Sprintf("| CPU | %s, %d cores (shared by the Go client and redis-server) |\n", cpu, runtime.NumCPU()) +
		fmt.Sprintf("| Go | %s, GOMAXPROCS %d |\n", runtime.Version(), runtime.GOMAXPROCS(0)) +
		fmt.Sprintf("| go-redis | %s, default options (pool of %d connections, RESP3); AutoPipeliner: `rdb.AutoPipeline()` defaults |\n",
			redis.Version(), e.rdb.Options().PoolSize) +
		fmt.Sprintf("| Redis | %s, no persistence, 127.0.0.1 |\n", version) +
		fmt.Sprintf("| flags | `-rounds %d -duration %v -warmup %v -callers %s -keys %d` |\n", o.rounds, o.duration, o.warmup, o.callersFlag, o.keys) +
		fmt.Sprintf("| load average | %s before the run, ", loadAverage())
	log("machine: %s, %d cores, %s, Redis %s", cpu, runtime.NumCPU(), runtime.Version(), version)
	return &report{options: o, started: time.Now(), machine: m, verdicts: map[string]verdict{}}, err
}

// loadAverage returns the 1, 5 and 15 minute load averages, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// section is a part of the report a check writes: a heading ("" to go on
// under the previous one), what was done, and a table.
type section struct {
	title, about, header string // header: the header and alignment rows
	rows                 []string
}

func (rep *report) section(title, about, header string) *section {
	s := &section{title: title, about: about, header: header}
	rep.sections = append(rep.sections, s)
	return s
}

// row adds a row of cells, floats with two decimals.
func (s *section) row(cells ...any) {
	var b strings.Builder
	for _, c := range cells {
		if f, ok := c.(float64); ok {
			c = fmt.Sprintf("%.2f", f)
		}
		fmt.Fprintf(&b, "| %v ", c)
	}
	s.rows = append(s.rows, b.String()+"|")
}

// med is the median over the rounds of one figure of c's samples.
func (c *contender) med(figure func(sample) float64) float64 {
	var xs []float64
	for _, s := range c.samples {
		xs = append(xs, figure(s))
	}
	return median(xs)
}

func rate(s sample) float64   { return s.rate }
func usec(s sample) float64   { return s.usec }
func allocs(s sample) float64 { return s.allocs }
func p50(s sample) float64    { return float64(s.p50) }
func p99(s sample) float64    { return float64(s.p99) }

// pairedRatio is the median over rounds of a's figure over b's in the same
// round: the two were measured minutes apart at most, so a slower machine
// slows both.
func pairedRatio(a, b *contender, figure func(sample) float64) float64 {
	var xs []float64
	for i := range min(len(a.samples), len(b.samples)) {
		if y := figure(b.samples[i]); y > 0 {
			xs = append(xs, figure(a.samples[i])/y)
		}
	}
	return median(xs)
}

// spread is (highest − lowest) ÷ median decisions/s over the rounds.
func (c *contender) spread() string {
	if len(c.samples) < 2 || c.med(rate) == 0 {
		return "–"
	}
	cmpRate := func(a, b sample) int { return cmp.Compare(a.rate, b.rate) }
	return fmt.Sprintf("%.0f%%", 100*(slices.MaxFunc(c.samples, cmpRate).rate-slices.MinFunc(c.samples, cmpRate).rate)/c.med(rate))
}

func (rep *report) markdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# Benchmarks\n\n")
	w("Decisions per second of redlimit's limiters against the one-round-trip ceiling (a trivial\n")
	w("`EVALSHA` of `return 1`) and against [redis_rate](https://github.com/go-redis/redis_rate) v10,\n")
	w("on a redis-server the program starts for itself (the first on PATH). Reproduce from the\n")
	w("repository root with `go run ./bench` and the flags below (`-duration 200ms -rounds 1 -out ''`\n")
	w("for a quick look). Figures are medians over the rounds; within a round the contenders take\n")
	w("turns, each on an emptied database, and ratios are medians of ratios taken within a round.\n\n")
	w("## Machine and run\n\n| | |\n|---|---|\n%s%s after (1, 5, 15 min; the machine is shared, so figures move between runs) |\n",
		rep.machine, loadAverage())
	w("| date | %s (run took %v) |\n\n", rep.started.UTC().Format("2006-01-02 15:04 MST"), time.Since(rep.started).Round(time.Second))

	w("## Throughput\n\n")
	w("Limits: redlimit `PerSecond(%d)` through `WithDefault` (nothing stored) unless the row says\n", bigRate)
	w("\"stored config\" (`SetRate` before the run); redis_rate `PerSecond(%d)` (burst %d). The limits\n", bigRate, bigRate)
	w("are far above what this machine decides, so every request is granted and all do the same work.\n\n")
	w("Columns: decisions/s; spread: (highest − lowest) ÷ median of the rounds' decisions/s, how much\n")
	w("the machine moved the figure; × trivial: ratio to the trivial EVALSHA's decisions/s in the same round;\n")
	w("Redis µs: `usec_per_call` of `cmdstat_evalsha` (INFO commandstats, reset before each slice):\n")
	w("the script's time on the server alone; p50/p99: latency of one decision seen by the caller;\n")
	w("allocs: Go heap allocations per decision, whole process (runtime.MemStats.Mallocs).\n\n")
	var stored []string
	for _, sc := range rep.scenarios {
		w("### %s\n\n", sc.name)
		if sc.flood {
			w("Every caller hammers one key limited to %d/s, so about 99%% or more of the requests are denied.\n", floodRate)
			w("Round trips: EVALSHA calls Redis ran per decision. With the local deny cache\n")
			w("(`redlimit.WithLocalCache`) the Go side takes both cores, so the few scripts that still run wait\n")
			w("for the CPU, which shows in their Redis µs.\n\n")
			w("| contender | decisions/s | × uncached | denied | round trips | Redis µs | p50 | p99 | allocs | errors |\n")
			w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		} else {
			if sc.parts > 1 {
				w("One caller: Redis µs as close to each script's own cost, and allocs to each call's, as a shared\n")
				w("machine allows (many callers on 2 cores also count the time the server waits for the CPU). Each\n")
				w("round gives every contender %d turns of %v, so that ratios pair turns close in time.\n\n", sc.parts, rep.duration/time.Duration(sc.parts))
			}
			w("| contender | decisions/s | spread | × trivial | Redis µs | p50 | p99 | allocs | errors |\n")
			w("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		}
		for _, c := range sc.contenders {
			var t tally
			var calls int64
			for _, s := range c.samples {
				t.add(s.tally)
				calls += s.calls
			}
			tail := fmt.Sprintf("| %.2f | %s | %s | %.1f | %d |\n", c.med(usec), fmtDur(c.med(p50)), fmtDur(c.med(p99)), c.med(allocs), t.errors)
			if sc.flood {
				vs := "–"
				if u := sc.find(strings.TrimSuffix(c.name, ", local cache")); u != c {
					vs = fmt.Sprintf("%.2f", pairedRatio(c, u, rate))
				}
				n := float64(max(t.decisions, 1))
				w("| %s | %s | %s | %.2f%% | %.4f %s", c.name, fmtRate(c.med(rate)), vs, 100-100*float64(t.allowed)/n, float64(calls)/n, tail)
				continue
			}
			w("| %s | %s | %s | %.2f %s", c.name, fmtRate(c.med(rate)), c.spread(), pairedRatio(c, sc.contenders[0], rate), tail)
			if base, ok := strings.CutSuffix(c.name, ", stored config"); ok {
				def := sc.find(base)
				stored = append(stored, fmt.Sprintf("| %s | %s | %.2f | %+.2f |\n", sc.name, base, pairedRatio(c, def, rate), c.med(usec)-def.med(usec)))
			}
		}
		w("\n")
	}
	if len(stored) > 0 {
		w("### Stored config (SetRate) against WithDefault\n\n")
		w("The script reads the limiter's hash either way (a stored config wins over a default).\n\n")
		w("| scenario | limiter | decisions/s, stored ÷ default | Redis µs, stored − default |\n|---|---|--:|--:|\n%s\n", strings.Join(stored, ""))
	}
	for _, s := range rep.sections {
		if s.title != "" {
			w("## %s\n\n", s.title)
		}
		w("%s\n\n%s\n%s\n\n", s.about, s.header, strings.Join(s.rows, "\n"))
	}
	rep.throughputTargets()
	w("## Targets (issue 9)\n\n")
	w("Judged on this run's figures; a miss says by how much, as a share of the target.\n\n")
	w("| target | figures | status |\n|---|---|---|\n")
	for _, t := range targets {
		w("%s", rep.verdicts[t].row(t))
	}
	return b.String()
}

// The targets of issue 9, in its order.
const (
	targetUsec        = "Redis µs per call, one caller: funnel, fixed window ≤ 1.0× redis_rate's"
	targetUsecStretch = "… stretch: funnel, fixed window ≤ 0.8×"
	targetUsecSliding = "… sliding window (10 buckets) ≤ 1.3×"
	targetUsecTB      = "… token bucket ≤ 1.6×"
	targetRate        = "Decisions/s, 64 callers, 10,000 keys: funnel, fixed window ≥ 1.0× redis_rate's"
	targetRateSliding = "… sliding window ≥ 0.9×"
	targetRateTB      = "… token bucket ≥ 0.8×"
	targetPipelined   = "Auto-pipelined funnel, 512 callers: ≥ 2× redis_rate's plain decisions/s"
	targetAllocs      = "Go allocations per decision ≤ 14"
	targetKeysLoaded  = "Keys in Redis after 2 s of 64 callers over 10,000 funnels ≤ 10,000"
	targetKeysLeft    = "Keys after a limiter with no stored config drains, and after Delete: 0"
	targetBytes       = "State bytes per limiter: funnel, fixed window ≤ 120 B; sliding window ≤ 120 + 16 × Buckets"
)

var targets = []string{targetUsec, targetUsecStretch, targetUsecSliding, targetUsecTB, targetRate, targetRateSliding,
	targetRateTB, targetPipelined, targetAllocs, targetKeysLoaded, targetKeysLeft, targetBytes}

// throughputTargets judges the targets on the throughput scenarios' figures:
// those on a ratio to redis_rate's, by algorithm, and the allocations.
func (rep *report) throughputTargets() {
	for _, sc := range rep.scenarios {
		if sc.flood {
			continue
		}
		peer := sc.find("redis_rate")
		for _, t := range []struct {
			alg                    string
			usec, rate             float64 // at most, at least
			usecTarget, rateTarget string
		}{
			{"Funnel", 1, 1, targetUsec, targetRate},
			{"FixedWindow", 1, 1, targetUsec, targetRate},
			{"SlidingWindow", 1.3, 0.9, targetUsecSliding, targetRateSliding},
			{"TokenBucket", 1.6, 0.8, targetUsecTB, targetRateTB},
		} {
			c := sc.find(t.alg)
			if x := pairedRatio(c, peer, usec); sc.callers == 1 {
				figure := fmt.Sprintf("%.2f× (%.2f vs %.2f µs)", x, c.med(usec), peer.med(usec))
				rep.judge(t.usecTarget, t.alg, figure, x, t.usec, false)
				if t.usec == 1 {
					rep.judge(targetUsecStretch, t.alg, figure, x, 0.8, false)
				}
			}
			if x := pairedRatio(c, peer, rate); sc.callers == 64 && sc.keys == 10000 {
				rep.judge(t.rateTarget, t.alg, fmt.Sprintf("%.2f× (%s vs %s/s)", x, fmtRate(c.med(rate)), fmtRate(peer.med(rate))), x, t.rate, true)
			}
		}
		for _, c := range sc.contenders[3:] { // ours
			if sc.callers == 1 {
				rep.judge(targetAllocs, c.name, fmt.Sprintf("%.1f", c.med(allocs)), c.med(allocs), 14, false)
			}
		}
		if sc.callers == 512 {
			// Redis runs one script at a time: 1e6 ÷ its µs per call is the
			// most any client can get from it.
			c := sc.find("Funnel, auto-pipelined")
			x, u := pairedRatio(c, peer, rate), c.med(usec)
			rep.judge(targetPipelined, sc.name, fmt.Sprintf("%.2f× (%s vs %s/s; at %.1f Redis µs a call, Redis caps it at %s/s)",
				x, fmtRate(c.med(rate)), fmtRate(peer.med(rate)), u, fmtRate(1e6/u)), x, 2, true)
		}
	}
}

// verdict is a target judged on this run: the figures it was measured on,
// and how many of them missed it.
type verdict struct {
	figures []string
	missed  int
}

// judge records figure, measured at where, for target: x is at most want,
// or at least want when higherIsBetter. A miss says by how much, as a share
// of the target.
func (rep *report) judge(target, where, figure string, x, want float64, higherIsBetter bool) {
	v := rep.verdicts[target]
	figure = strings.TrimPrefix(where+": "+figure, ": ")
	off := x - want
	if higherIsBetter {
		off = -off
	}
	switch {
	case off <= 0:
	case want > 0:
		figure += fmt.Sprintf(" (**missed** by %.0f%%)", 100*off/want)
	default:
		figure += " (**missed**)"
	}
	v.figures = append(v.figures, figure)
	v.missed += int(b2u(off > 0))
	rep.verdicts[target] = v
}

// row sums up target: met when met everywhere it was measured.
func (v verdict) row(target string) string {
	status := "**met**"
	if len(v.figures) == 0 {
		status = "not measured"
	} else if v.missed > 0 {
		status = fmt.Sprintf("**missed** (%d of %d)", v.missed, len(v.figures))
	}
	return fmt.Sprintf("| %s | %s | %s |\n", target, strings.Join(v.figures, "<br>"), status)
}

// fmtRate writes a count with thousands separators: 41203 → "41,203".
func fmtRate(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// fmtDur writes a latency in µs below 10 ms (with a decimal below 10 µs)
// and in ms above; "–" for none.
func fmtDur(ns float64) string {
	switch us := ns / 1e3; {
	case ns <= 0:
		return "–"
	case us < 10:
		return fmt.Sprintf("%.1fµs", us)
	case us < 10_000:
		return fmt.Sprintf("%.0fµs", us)
	default:
		return fmt.Sprintf("%.1fms", us/1e3)
	}
}

// fmtTTL writes a PTTL reply: -1 (no expiry) as "none".
func fmtTTL(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return d.Round(time.Millisecond).String()
}
