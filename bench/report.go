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
// the checks' sections, and the limiters against redis_rate.
type report struct {
	options
	started   time.Time
	machine   string // the rows of the machine table known before the run
	scenarios []*scenario
	sections  []*section
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
	return &report{options: o, started: time.Now(), machine: m}, err
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

func rate(s sample) float64      { return s.rate }
func usec(s sample) float64      { return s.script.perCall() }
func allocs(s sample) float64    { return s.allocs }
func clientCPU(s sample) float64 { return s.clientCPU }
func serverCPU(s sample) float64 { return s.serverCPU }
func cpu(s sample) float64       { return s.clientCPU + s.serverCPU }
func p50(s sample) float64       { return float64(s.p50) }
func p99(s sample) float64       { return float64(s.p99) }

// perDecision is the script's Redis µs per decision, which batching makes
// less than per call: one EVALSHA decides several.
func perDecision(s sample) float64 {
	if s.decisions == 0 {
		return 0
	}
	return float64(s.script.usec) / float64(s.decisions)
}

// decisionsPerCall is 1 when every decision is an EVALSHA of its own, more
// as batches form; 0 when no EVALSHA ran.
func decisionsPerCall(s sample) float64 {
	if s.script.calls == 0 {
		return 0
	}
	return float64(s.decisions) / float64(s.script.calls)
}

// medOf is c's median figure with two decimals, or "–" when the scenario has
// no such contender (c is nil) or the figure is 0.
func medOf(c *contender, figure func(sample) float64) string {
	if c == nil || c.med(figure) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", c.med(figure))
}

// ratioOf is pairedRatio with two decimals, or "–" when the scenario lacks
// either contender or they share no round.
func ratioOf(a, b *contender, figure func(sample) float64) string {
	if a == nil || b == nil {
		return "–"
	}
	if r := pairedRatio(a, b, figure); r > 0 {
		return fmt.Sprintf("%.2f", r)
	}
	return "–"
}

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

// totals adds up c's decisions over every turn, and the EVALSHA calls Redis ran.
func (c *contender) totals() (t tally, calls int64) {
	for _, s := range c.samples {
		t.add(s.tally)
		calls += s.script.calls
	}
	return t, calls
}

// spread is (highest − lowest) ÷ median decisions/s over the turns.
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
	w("`EVALSHA` of `return 1`) and against [redis_rate](https://github.com/go-redis/redis_rate) v10\n")
	w("(through a plain go-redis Client and through its AutoPipeliner), on a redis-server the program\n")
	w("starts for itself (the first on PATH). Reproduce from the repository root with `go run ./bench`\n")
	w("and the flags below (`-duration 200ms -rounds 1 -out ''` for a quick look). Figures are medians\n")
	w("over the rounds; within a round the contenders take turns, each on an emptied database, and\n")
	w("ratios are medians of ratios taken within a round.\n\n")
	w("## Machine and run\n\n| | |\n|---|---|\n%s%s after (1, 5, 15 min; the machine is shared, so figures move between runs) |\n",
		rep.machine, loadAverage())
	w("| date | %s (run took %v) |\n\n", rep.started.UTC().Format("2006-01-02 15:04 MST"), time.Since(rep.started).Round(time.Second))

	w("## Throughput\n\n")
	w("Limits: redlimit `PerSecond(%d)` through `WithDefault` (nothing stored) unless the row says\n", bigRate)
	w("\"stored config\" (`SetRate` before the run); redis_rate `PerSecond(%d)` (burst %d). The limits\n", bigRate, bigRate)
	w("are far above what this machine decides, so every request is granted and all do the same work.\n\n")
	w("Columns: decisions/s; spread: (highest − lowest) ÷ median of the turns' decisions/s, over every\n")
	w("turn of every round: how much the machine moved the figure; × trivial: ratio to the trivial\n")
	w("EVALSHA's decisions/s in the same round;\n")
	w("Redis µs: the script's time on the server alone per call (`usec` ÷ `calls` of `cmdstat_evalsha`,\n")
	w("INFO commandstats, read as each turn's measurement starts and as it ends); a call decides a whole\n")
	w("batch when decisions are batched (per decision: [Batched decisions](#batched-decisions)); CPU µs:\n")
	w("CPU time per decision, user + system, of the benchmark's own process (callers and go-redis) and\n")
	w("of redis-server (the script and the network work every call costs it); p50/p99: latency of one\n")
	w("decision seen by the caller; allocs: Go heap allocations per decision, whole process\n")
	w("(runtime.MemStats.Mallocs).\n\n")
	var stored, several []string
	for _, sc := range rep.scenarios {
		if sc.leases {
			continue
		}
		w("### %s\n\n", sc.name)
		if sc.flood {
			w("Every caller hammers one key limited to %d/s, so about 99%% or more of the requests are denied.\n", floodRate)
			w("Round trips: EVALSHA calls Redis ran per decision. With the local deny cache\n")
			w("(`redlimit.WithLocalCache`) the Go side takes both cores, so the few scripts that still run wait\n")
			w("for the CPU, which shows in their Redis µs.\n\n")
			w("| contender | decisions/s | × uncached | denied | round trips | Redis µs | p50 | p99 | allocs | errors |\n")
			w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		} else {
			if sc.callers == 1 {
				w("One caller: Redis µs as close to each script's own cost, and allocs to each call's, as a shared\n")
				w("machine allows (many callers on 2 cores also count the time the server waits for the CPU).\n")
			}
			if sc.parts > 1 {
				w("Each round gives every contender %d turns of %v, so that ratios pair turns close in time.\n\n", sc.parts, rep.duration/time.Duration(sc.parts))
			}
			w("| contender | decisions/s | spread | × trivial | Redis µs | CPU µs: client + server | p50 | p99 | allocs | errors |\n")
			w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		}
		for _, c := range sc.contenders {
			t, calls := c.totals()
			tail := fmt.Sprintf("| %s | %s | %.1f | %d |\n", fmtDur(c.med(p50)), fmtDur(c.med(p99)), c.med(allocs), t.errors)
			if !sc.flood {
				tail = fmt.Sprintf("| %.1f + %.1f %s", c.med(clientCPU), c.med(serverCPU), tail)
			}
			tail = fmt.Sprintf("| %.2f %s", c.med(usec), tail)
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
			if base, ok := strings.CutSuffix(c.name, threeRates); ok {
				one, two := sc.find(base), sc.find(base+twoRates)
				r2, r3 := pairedRatio(two, one, usec), pairedRatio(c, one, usec)
				several = append(several, fmt.Sprintf("| %s | %s | %.2f | %.2f | %+.0f%% |\n", sc.name, base, r2, r3, 100*max(r2-1, (r3-1)/2)))
			}
		}
		w("\n")
	}
	if len(stored) > 0 {
		w("### Stored config (SetRate) against WithDefault\n\n")
		w("The script reads the limiter's hash either way (a stored config wins over a default).\n\n")
		w("| scenario | limiter | decisions/s, stored ÷ default | Redis µs, stored − default |\n|---|---|--:|--:|\n%s\n", strings.Join(stored, ""))
	}
	if len(several) > 0 {
		w("### Several rates (Config.And) against one\n\n")
		w("The same limiter with a second rate per minute and a third per hour, both far above what is\n")
		w("decided: Redis µs over the one-rate limiter's, paired within a round; per extra rate: the larger\n")
		w("of two rates' excess and half of three rates'.\n\n")
		w("| scenario | limiter | two rates ÷ one | three rates ÷ one | per extra rate |\n|---|---|--:|--:|--:|\n%s\n", strings.Join(several, ""))
	}
	rep.batching(w)
	rep.leases(w)
	for _, s := range rep.sections {
		if s.title != "" {
			w("## %s\n\n", s.title)
		}
		w("%s\n\n%s\n%s\n\n", s.about, s.header, strings.Join(s.rows, "\n"))
	}
	w("## Against redis_rate\n\n")
	w("Each redlimit limiter's figures over redis_rate's, through the plain Client and through the\n")
	w("AutoPipeliner (ap), in the same scenario and round, medians over the rounds: Redis µs per decision\n")
	w("(the script's time ÷ decisions, since a batch of decisions is one call) and CPU µs per decision,\n")
	w("client + server (lower is better), and decisions/s (higher is better).\n\n")
	w("| scenario | limiter | Redis µs per decision ÷ redis_rate's | ÷ redis_rate ap's | CPU µs ÷ redis_rate's | ÷ redis_rate ap's | decisions/s ÷ redis_rate's | ÷ redis_rate ap's |\n")
	w("|---|---|--:|--:|--:|--:|--:|--:|\n")
	for _, sc := range rep.scenarios {
		if sc.flood || sc.leases {
			continue
		}
		peer, pipelined := sc.find(redisRate), sc.find(redisRate+autoPipelined)
		for _, c := range sc.contenders {
			if c.ours {
				w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", sc.name, c.name, ratioOf(c, peer, perDecision), ratioOf(c, pipelined, perDecision),
					ratioOf(c, peer, cpu), ratioOf(c, pipelined, cpu), ratioOf(c, peer, rate), ratioOf(c, pipelined, rate))
			}
		}
	}
	return b.String()
}

// batching writes what shows batched decisions at work: the funnel's Redis
// time per decision against redis_rate's, how many decisions each script
// call carried, and what batching costs the latency of a caller alone.
func (rep *report) batching(w func(format string, a ...any)) {
	var scenarios []*scenario
	var alone *scenario
	for _, sc := range rep.scenarios {
		if !sc.flood && !sc.leases {
			scenarios = append(scenarios, sc)
		}
		if sc.callers == 1 && alone == nil {
			alone = sc
		}
	}
	if len(scenarios) == 0 {
		return
	}
	w("## Batched decisions\n\n")
	w("From the throughput turns above. Redis µs per decision: the script's time (`usec` of\n")
	w("`cmdstat_evalsha`) ÷ the decisions made, since with batching one EVALSHA decides several;\n")
	w("redis_rate makes one call per decision, auto-pipelined or not. Unless the name says otherwise,\n")
	w("redlimit runs through a plain go-redis Client with batching on (the default); \"batching off\":\n")
	w("`redlimit.WithoutBatching()`. Ratios are paired within a round.\n\n")
	w("### Redis µs per decision: Funnel against redis_rate\n\n")
	w("| scenario | Funnel | Funnel%s | Funnel%s | redis_rate | redis_rate%s | Funnel ÷ redis_rate | Funnel ÷ redis_rate%s | Funnel decisions/s, batching on ÷ off |\n",
		batchingOff, autoPipelined, autoPipelined, autoPipelined)
	w("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, sc := range scenarios {
		f, peer, pipelined := sc.find(funnel.name), sc.find(redisRate), sc.find(redisRate+autoPipelined)
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sc.name, medOf(f, perDecision), medOf(sc.find(funnel.name+batchingOff), perDecision),
			medOf(sc.find(funnel.name+autoPipelined), perDecision), medOf(peer, perDecision), medOf(pipelined, perDecision),
			ratioOf(f, peer, perDecision), ratioOf(f, pipelined, perDecision), ratioOf(f, sc.find(funnel.name+batchingOff), rate))
	}

	// One row per redlimit contender, in the order they first appear, so
	// that the same contender's batches read across the load shapes.
	var names []string
	for _, sc := range scenarios {
		for _, c := range sc.contenders {
			if c.ours && !slices.Contains(names, c.name) {
				names = append(names, c.name)
			}
		}
	}
	w("\n### Decisions per script call\n\n")
	w("Decisions made ÷ EVALSHA calls Redis ran, over the same window (medians over the rounds): 1.00\n")
	w("when every decision is a call of its own, more as batches form. The flood is left out: its\n")
	w("round trips column is the inverse, and the local cache, not batching, is what spares calls there.\n\n")
	w("| limiter |")
	for _, sc := range scenarios {
		w(" %s |", sc.name)
	}
	w("\n|---|%s\n", strings.Repeat("--:|", len(scenarios)))
	for _, name := range names {
		w("| %s |", name)
		for _, sc := range scenarios {
			w(" %s |", medOf(sc.find(name), decisionsPerCall))
		}
		w("\n")
	}

	if alone == nil {
		w("\n")
		return
	}
	w("\n### %s: latency with batching on and off\n\n", alone.name)
	w("A caller alone has no one to share a batch with: whatever batching waits for shows here.\n")
	w("p50/p99: medians over the turns of each turn's percentile; on ÷ off: the median, over the\n")
	w("slices of every round, of the percentile of the slice's turn with batching on over that of its\n")
	w("turn with it off, which runs next to it, so that one machine's moods move both alike.")
	for _, name := range []string{redisRate, redisRate + autoPipelined} {
		if c := alone.find(name); c != nil {
			w(" %s: p50 %s, p99 %s.", name, fmtDur(c.med(p50)), fmtDur(c.med(p99)))
		}
	}
	w("\n\n| limiter | p50, on | p99, on | p50, off | p99, off | p50, on ÷ off | p99, on ÷ off | decisions/s, on ÷ off | Redis µs per decision, on | off |\n")
	w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, alg := range algorithms {
		on, off := alone.find(alg.name), alone.find(alg.name+batchingOff)
		if on == nil || off == nil {
			continue
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", alg.name, fmtDur(on.med(p50)), fmtDur(on.med(p99)), fmtDur(off.med(p50)), fmtDur(off.med(p99)),
			ratioOf(on, off, p50), ratioOf(on, off, p99), ratioOf(on, off, rate), medOf(on, perDecision), medOf(off, perDecision))
	}
	w("\n")
}

// leases writes the lease scenario: decisions/s of leased handles against
// redis_rate's, their latency, and how rarely they call Redis.
func (rep *report) leases(w func(format string, a ...any)) {
	for _, sc := range rep.scenarios {
		if !sc.leases {
			continue
		}
		w("## Leases\n\n### %s\n\n", sc.name)
		w("Every caller asks one limiter, `Per(%d, %v)` (a config holds at most a permit per µs, so a\n", hotRate, hotRate*time.Microsecond)
		w("limit far above what even local decisions reach needs a long window), so every request is\n")
		w("granted; redis_rate: `PerSecond(%d)`. redlimit's handles lease\n", hotRate)
		w("(`WithLease(redlimit.Lease{Time: %v})`): each takes a block of permits in one script call and\n", leaseTime)
		w("grants from it in memory. Redis calls per 1,000 decisions: EVALSHA calls Redis ran (takes and\n")
		w("refunds) over the same window. Each round gives every contender %d turns of %v.\n\n", sc.parts, rep.duration/time.Duration(sc.parts))
		w("| contender | decisions/s | ÷ redis_rate | ÷ redis_rate%s | p50 | p99 | Redis calls per 1,000 decisions | allocs | errors |\n", autoPipelined)
		w("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		peer, pipelined := sc.find(redisRate), sc.find(redisRate+autoPipelined)
		for _, c := range sc.contenders {
			t, calls := c.totals()
			w("| %s | %s | %s | %s | %s | %s | %.3f | %.1f | %d |\n", c.name, fmtRate(c.med(rate)), ratioOf(c, peer, rate), ratioOf(c, pipelined, rate),
				fmtDur(c.med(p50)), fmtDur(c.med(p99)), 1000*float64(calls)/float64(max(t.decisions, 1)), c.med(allocs), t.errors)
		}
		w("\n")
	}
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

// fmtTTL writes a PTTL reply: -1 (no expiry) as "none", -2 (the key
// expired since it was listed) as "expired".
func fmtTTL(d time.Duration) string {
	switch {
	case d == -2:
		return "expired"
	case d < 0:
		return "none"
	}
	return d.Round(time.Millisecond).String()
}
