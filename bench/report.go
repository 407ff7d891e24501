package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// result gathers one contender's samples in one scenario, one per round, in
// round order, so that ratios can pair samples of the same round.
type result struct {
	contender contender
	samples   []sample
	ratios    []float64 // to the scenario's baseline, same round
	over      []string  // rounds where grants exceeded the limit's bound
	grants    []float64 // fraction of the bound granted (one-key scenarios)
}

func (r *result) add(s sample, baseline float64, sc *scenario) {
	r.samples = append(r.samples, s)
	if baseline > 0 {
		r.ratios = append(r.ratios, s.rate/baseline)
	}
	// With one key the limit's guarantee can be checked on the total.
	if sc.keys == 1 && r.contender.bound != nil {
		b := r.contender.bound(s.start, s.end)
		r.grants = append(r.grants, float64(s.grants)/float64(b))
		if int64(s.grants) > b {
			r.over = append(r.over, fmt.Sprintf("round %d: %d grants, bound %d", len(r.samples), s.grants, b))
		}
	}
}

func (r *result) med(f func(sample) float64) float64 {
	xs := make([]float64, len(r.samples))
	for i, s := range r.samples {
		xs[i] = f(s)
	}
	return median(xs)
}

// spread is (highest − lowest) ÷ median decisions/s over the rounds.
func (r *result) spread() string {
	if len(r.samples) < 2 || r.rate() == 0 {
		return "–"
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range r.samples {
		lo, hi = min(lo, s.rate), max(hi, s.rate)
	}
	return fmt.Sprintf("%.0f%%", 100*(hi-lo)/r.rate())
}

func (r *result) rate() float64 { return r.med(func(s sample) float64 { return s.rate }) }
func (r *result) usec() float64 { return r.med(func(s sample) float64 { return s.usec }) }

func (r *result) errors() (n uint64, first error) {
	for _, s := range r.samples {
		n += s.errors
		if first == nil {
			first = s.firstErr
		}
	}
	return n, first
}

// pairedRatio is the median over rounds of a's decisions/s over b's in the
// same round.
func pairedRatio(a, b *result) float64 {
	var xs []float64
	for i := range min(len(a.samples), len(b.samples)) {
		if b.samples[i].rate > 0 {
			xs = append(xs, a.samples[i].rate/b.samples[i].rate)
		}
	}
	return median(xs)
}

func pairedUsecRatio(a, b *result) float64 {
	var xs []float64
	for i := range min(len(a.samples), len(b.samples)) {
		if b.samples[i].usec > 0 {
			xs = append(xs, a.samples[i].usec/b.samples[i].usec)
		}
	}
	return median(xs)
}

type report struct {
	options
	machine           machine
	started, finished time.Time
	scenarios         []*scenario
	results           [][]*result
	checks            *checks
	haveCache         bool
	poolSize          int
}

type machine struct {
	cpu, goVersion, goRedis, redis string
	cores                          int
	loadBefore, loadAfter          string // /proc/loadavg: other work on the machine
}

func (m machine) String() string {
	return fmt.Sprintf("%s, %d cores, %s, go-redis %s, Redis %s", m.cpu, m.cores, m.goVersion, m.goRedis, m.redis)
}

func describeMachine(ctx context.Context, admin *redis.Client) (machine, error) {
	m := machine{cpu: "unknown CPU", cores: runtime.NumCPU(), goVersion: runtime.Version(), goRedis: redis.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if name, value, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "model name" {
				m.cpu = strings.TrimSpace(value)
				break
			}
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/redis/go-redis/v9" {
				m.goRedis = d.Version
			}
		}
	}
	m.loadBefore = loadAverage()
	v, err := infoField(ctx, admin, "server", "redis_version")
	m.redis = v
	return m, err
}

// loadAverage returns the 1, 5 and 15 minute load averages, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// find returns the result of the named contender in scenario i, or nil.
func (rep *report) find(i int, name string) *result {
	for _, r := range rep.results[i] {
		if r.contender.name == name {
			return r
		}
	}
	return nil
}

func (rep *report) markdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# Benchmarks\n\n")
	w("Decisions per second of redlimit's limiters against the one-round-trip ceiling (a trivial\n")
	w("`EVALSHA` of `return 1`) and against [redis_rate](https://github.com/go-redis/redis_rate) v10,\n")
	w("on a redis-server the program starts for itself. Reproduce from the repository root with\n\n")
	w("    %s\n\n", strings.TrimSpace("go run ./bench "+rep.flags()))
	w("(`go run ./bench -duration 200ms -rounds 1 -out ''` for a quick look.) Figures are medians over\n")
	w("the rounds; within a round the contenders take turns, each on an emptied database.\n\n")

	w("## Machine and run\n\n")
	w("| | |\n|---|---|\n")
	w("| CPU | %s, %d cores (shared by the Go client and redis-server) |\n", rep.machine.cpu, rep.machine.cores)
	w("| Go | %s, GOMAXPROCS %d |\n", rep.machine.goVersion, runtime.GOMAXPROCS(0))
	w("| go-redis | %s, default options (pool of %d connections, RESP3); AutoPipeliner: `rdb.AutoPipeline()` defaults |\n",
		rep.machine.goRedis, rep.poolSize)
	w("| Redis | %s, no persistence, 127.0.0.1 |\n", rep.machine.redis)
	w("| flags | `-rounds %d -duration %v -warmup %v -callers %s -keys %d` |\n",
		rep.rounds, rep.duration, rep.warmup, joinInts(rep.callers), rep.keys)
	w("| load average | %s before the run, %s after (1, 5, 15 min; the machine is shared, so figures move between runs) |\n",
		rep.machine.loadBefore, rep.machine.loadAfter)
	w("| date | %s (run took %v) |\n\n", rep.started.UTC().Format("2006-01-02 15:04 MST"), rep.finished.Sub(rep.started).Round(time.Second))

	w("## Throughput\n\n")
	w("Limits: redlimit `PerSecond(%d)` through `WithDefault` (nothing stored) unless the row says\n", bigRate)
	w("\"stored config\" (`SetRate` before the run); redis_rate `PerSecond(%d)` (burst %d). The limits\n", bigRate, bigRate)
	w("are far above what this machine decides, so every request is granted and all do the same work.\n\n")
	w("Columns: decisions/s; spread: (highest − lowest) ÷ median of the rounds' decisions/s, how much\n")
	w("the machine moved the figure; × trivial: ratio to the trivial EVALSHA's decisions/s in the same round;\n")
	w("Redis µs: `usec_per_call` of `cmdstat_evalsha` (INFO commandstats, reset before each slice):\n")
	w("the script's time on the server alone; p50/p99: latency of one decision seen by the caller;\n")
	w("allocs: Go heap allocations per decision, whole process (runtime.MemStats.Mallocs).\n\n")
	for i, sc := range rep.scenarios {
		if sc.flood {
			continue
		}
		w("### %s\n\n", sc.name)
		w("| contender | decisions/s | spread | × trivial | Redis µs | p50 | p99 | allocs | errors |\n")
		w("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, r := range rep.results[i] {
			n, _ := r.errors()
			w("| %s | %s | %s | %s | %.2f | %s | %s | %.1f | %d |\n", r.contender.name, fmtRate(r.rate()), r.spread(),
				fmtRatio(median(r.ratios)), r.usec(), fmtDur(r.med(p50)), fmtDur(r.med(p99)),
				r.med(func(s sample) float64 { return s.allocs }), n)
		}
		w("\n")
		rep.writeErrors(w, i)
	}
	rep.writeStored(w)
	rep.writeFlood(w)
	if rep.checks != nil {
		rep.writeChecks(w)
	}
	rep.writeTargets(w)
	return b.String()
}

func p50(s sample) float64 { return float64(s.p50) }
func p99(s sample) float64 { return float64(s.p99) }

func (rep *report) writeErrors(w func(string, ...any), i int) {
	for _, r := range rep.results[i] {
		if n, first := r.errors(); n > 0 {
			w("- **%s: %d errors**, first: `%v`\n", r.contender.name, n, first)
		}
		for _, o := range r.over {
			w("- **%s over-admitted**: %s\n", r.contender.name, o)
		}
		if rep.scenarios[i].flood || r.contender.bound == nil {
			continue
		}
		// The throughput limits are meant never to deny: say so if they did.
		var denied, decided uint64
		for _, s := range r.samples {
			denied += s.decisions - s.allowed - s.errors
			decided += s.decisions
		}
		if denied > 0 {
			w("- %s denied %d of %d requests\n", r.contender.name, denied, decided)
		}
	}
}

func (rep *report) flags() string {
	// The defaults reproduce the run; name the ones that differ.
	var f []string
	if rep.rounds != 3 {
		f = append(f, fmt.Sprintf("-rounds %d", rep.rounds))
	}
	if rep.duration != 600*time.Millisecond {
		f = append(f, fmt.Sprintf("-duration %v", rep.duration))
	}
	if rep.warmup != 100*time.Millisecond {
		f = append(f, fmt.Sprintf("-warmup %v", rep.warmup))
	}
	if c := joinInts(rep.callers); c != "64,512" {
		f = append(f, "-callers "+c)
	}
	if rep.keys != 10000 {
		f = append(f, fmt.Sprintf("-keys %d", rep.keys))
	}
	return strings.Join(f, " ")
}

// writeStored compares each algorithm with a stored config (SetRate) to
// the same with the handle's default, where a scenario measured both.
func (rep *report) writeStored(w func(string, ...any)) {
	header := false
	for i, sc := range rep.scenarios {
		for _, alg := range algorithms {
			st, def := rep.find(i, alg.name+", stored config"), rep.find(i, alg.name)
			if st == nil || def == nil {
				continue
			}
			if !header {
				w("### Stored config (SetRate) against WithDefault\n\n")
				w("The script reads the config hash either way (a stored config wins over a default); with a\n")
				w("stored one it also caps every state key's expiry by the hash's (PTTL) where the config has no\n")
				w("keep-alive.\n\n")
				w("| scenario | limiter | decisions/s, stored ÷ default | Redis µs, stored − default |\n|---|---|--:|--:|\n")
				header = true
			}
			w("| %s | %s | %.2f | %+.2f |\n", sc.name, alg.name, pairedRatio(st, def), st.usec()-def.usec())
		}
	}
	if header {
		w("\n")
	}
}

func (rep *report) writeFlood(w func(string, ...any)) {
	for i, sc := range rep.scenarios {
		if !sc.flood {
			continue
		}
		w("### %s\n\n", sc.name)
		w("Every caller hammers one key limited to %d/s, so about 99%% or more of the requests are denied.\n", floodRate)
		w("Granted: the grants over the whole slice against the most the limit allows over that span\n")
		w("(more would be over-admission).\n\n")
		if !rep.haveCache {
			w("The local deny cache (`redlimit.WithLocalCache`) is not in the library yet, so only the uncached\n")
			w("limiters are measured; build with `-tags redlimit_localcache` once it exists (bench/localcache_on.go).\n\n")
		}
		w("Round trips: EVALSHA calls Redis ran per decision. With the cache the Go side takes both cores,\n")
		w("so the few scripts that still run wait for the CPU, which shows in their Redis µs.\n\n")
		w("| contender | decisions/s | × uncached | denied | round trips | Redis µs | p50 | p99 | allocs | granted / bound | errors |\n")
		w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, r := range rep.results[i] {
			vs := "–"
			if base, ok := strings.CutSuffix(r.contender.name, ", local cache"); ok {
				if u := rep.find(i, base); u != nil {
					vs = fmtRatio(pairedRatio(r, u))
				}
			}
			var allowed, decided, calls float64
			grants, bounds := "", ""
			for _, s := range r.samples {
				allowed += float64(s.allowed)
				decided += float64(s.decisions)
				calls += float64(s.calls)
				b := r.contender.bound(s.start, s.end)
				grants, bounds = joinNum(grants, int64(s.grants)), joinNum(bounds, b)
			}
			denied, trips := 0.0, 0.0
			if decided > 0 {
				denied, trips = 1-allowed/decided, calls/decided
			}
			n, _ := r.errors()
			w("| %s | %s | %s | %.2f%% | %.4f | %.2f | %s | %s | %.1f | %s / %s | %d |\n", r.contender.name, fmtRate(r.rate()), vs,
				100*denied, trips, r.usec(), fmtDur(r.med(p50)), fmtDur(r.med(p99)),
				r.med(func(s sample) float64 { return s.allocs }), grants, bounds, n)
		}
		w("\n")
		rep.writeErrors(w, i)
	}
}

func (rep *report) writeChecks(w func(string, ...any)) {
	c := rep.checks
	w("## Redis time per call, one caller\n\n")
	w("One caller, 2,000 calls per contender per round over 1,000 keys, contenders interleaved for 7 rounds;\n")
	w("EVALSHA usec_per_call from INFO commandstats. The server's own cost of each script, without the\n")
	w("CPU contention of the concurrent runs above; ratios are medians of per-round ratios.\n\n")
	w("| contender | Redis µs per call (least) | × redis_rate | × trivial EVALSHA |\n|---|--:|--:|--:|\n")
	for _, r := range c.serial {
		w("| %s | %.2f | %.2f | %.2f |\n", r.name, r.usec, r.vsPeer, r.vsFloor)
	}
	w("\n")

	w("## Allocations, one caller\n\n")
	w("Go heap allocations per call on one goroutine (3,000 calls), against go-redis's own floor.\n\n")
	w("| call | allocs | above the floor |\n|---|--:|--:|\n")
	w("| go-redis `EvalSha` of `return 1`, 1 key (the floor) | %.1f | – |\n", c.floor)
	w("| go-redis `EvalSha` with a funnel's wire shape (5 keys, 13 args boxed once, 5-integer reply) | %.1f | %+.1f |\n", c.shaped, c.shaped-c.floor)
	for _, a := range c.allocs {
		w("| %s | %.1f | %+.1f |\n", a.name, a.allocs, a.allocs-c.floor)
	}
	w("\n")

	w("## Memory\n\n")
	w("MEMORY USAGE (SAMPLES 0) of every key a limiter named `%s` holds, right after its grants.\n", memoryName)
	w("Funnel and fixed window: `Per(1000, 200ms)`; sliding windows: `Rate 1000, Interval 1s`, the\n")
	w("client's clock stepped one sub-window per grant so every bucket holds one.\n\n")
	w("| limiter | state keys, bytes | target | config hash | replay markers | keys |\n|---|--:|--:|--:|--:|---|\n")
	for _, m := range c.memory {
		var cfg, markers int64
		var nMarkers int
		var markerTTL time.Duration
		var names []string
		for _, k := range m.keys {
			switch kindOf(k.key) {
			case "config":
				cfg += k.bytes
			case "replay marker":
				markers += k.bytes
				nMarkers++
				markerTTL = max(markerTTL, k.ttl)
				continue
			}
			names = append(names, fmt.Sprintf("`%s` %d B, ttl %s", k.key, k.bytes, fmtTTL(k.ttl)))
		}
		if nMarkers > 0 {
			names = append(names, fmt.Sprintf("%d × `{%s}:request:<id>`, ttl ≤ %s", nMarkers, memoryName, fmtTTL(markerTTL)))
		}
		target := "–"
		if m.target > 0 {
			target = fmt.Sprintf("≤ %d", m.target)
		}
		w("| %s | %d | %s | %d | %d B in %d | %s |\n", m.limiter, m.state(), target, cfg, markers, nMarkers, strings.Join(names, "<br>"))
	}
	w("\nToken bucket permits log (`Per(1000000, 1h)`):\n\n| records | zset bytes | bytes per record |\n|--:|--:|--:|\n")
	for _, r := range c.tbRecords {
		w("| %d | %d | %.1f |\n", r.records, r.bytes, float64(r.bytes)/float64(r.records))
	}
	w("\nA token bucket `Per(1000, 200ms)` given %d grants, then one more after 250 ms, holds %d record(s):\n",
		c.tbAging.granted, c.tbAging.afterInterval)
	w("records older than Interval are dropped on the next write.\n\n")

	w("### Every key gone once the limiter is full again\n\n")
	w("50 grants on `Per(1000, 200ms)`, then a wait of %v (the interval, plus time for Redis's\n", c.gone[0].wait)
	w("active expiry), then SCAN and DBSIZE of the benchmark's own, otherwise empty, database.\n\n")
	w("| limiter | keys left (SCAN) | DBSIZE | what is left |\n|---|--:|--:|---|\n")
	for _, g := range c.gone {
		what := "nothing"
		if len(g.left) > 0 {
			kinds := map[string]int{}
			var ttl time.Duration
			for _, k := range g.left {
				kinds[kindOf(k.key)]++
				ttl = max(ttl, k.ttl)
			}
			var parts []string
			for kind, n := range kinds {
				if n != 1 {
					kind += "s"
				}
				parts = append(parts, fmt.Sprintf("%d %s", n, kind))
			}
			slices.Sort(parts) // map order is random
			what = strings.Join(parts, ", ") + fmt.Sprintf(", expiring within %v", ttl.Round(time.Millisecond))
		}
		w("| %s | %d | %d | %s |\n", g.limiter, len(g.left), g.dbsize, what)
	}
	w("\n")

	w("## Token bucket: Redis time against the size of its log\n\n")
	w("Interval 1h, Rate = records + 50, the log written directly in Redisson's layout (checked by a\n")
	w("first Allow). Then %d batches, the sizes taking turns: 50 grants, 50 denials on the full log,\n", 15)
	w("Release(50); medians of the batches' Redis µs per call.\n\n")
	w("| records in the log | Redis µs per grant | Redis µs per denial | records after the batches |\n|--:|--:|--:|--:|\n")
	for _, s := range c.scaling {
		w("| %s | %.2f | %.2f | %s |\n", fmtRate(float64(s.records)), s.usec, s.denyUsec, fmtRate(float64(s.held)))
	}
	w("\n")

	w("## Exactness through the AutoPipeliner, %d callers, one key\n\n", c.apExactCal)
	w("An hour's limit of 5,000, asked %s times: a full limiter grants its 5,000 at once and then\n", fmtRate(float64(c.exact[0].asks)))
	w("nothing more within the hour (the funnel: plus what drains meanwhile), so the count must be\n")
	w("exactly 5,000. Then 1,000/s for 2 s: the grants over the whole run, warm-up included, against\n")
	w("the most the limit allows over that span (bound: Rate per Interval plus one Rate, the funnel's\n")
	w("burst plus its drain, the fixed window Rate per epoch-aligned window the span touches).\n\n")
	w("| limiter | limit | asked | span | grants | bound | verdict | errors |\n|---|---|--:|--:|--:|--:|---|--:|\n")
	for _, x := range c.exact {
		w("| %s | %s | %s | %v | %d | %d | %s | %d |\n", x.limiter, x.config, fmtRate(float64(x.asks)), x.span.Round(time.Millisecond), x.grants, x.bound, x.verdict(), x.errors)
	}
	for _, x := range c.exact {
		if x.err != nil {
			w("- %s, %s: first error `%v`\n", x.limiter, x.config, x.err)
		}
	}
	w("\n")

	w("## SCRIPT FLUSH in the middle of an auto-pipelined run\n\n")
	w("%d callers over %d keys for 1s; `SCRIPT FLUSH` from another connection after 0.5s. Every EVALSHA\n", rep.callers[len(rep.callers)-1], rep.keys)
	w("queued then answers NOSCRIPT; the library must load the script again and retry.\n\n")
	w("| limiter | decisions | after the flush | decisions/s | NOSCRIPT replies | SCRIPT LOADs | errors |\n|---|--:|--:|--:|--:|--:|--:|\n")
	for _, f := range c.flush {
		w("| %s | %d | %d | %s | %d | %d | %d |\n", f.limiter, f.decisions, f.after, fmtRate(f.rate), f.noscripts, f.scriptLoads, f.errors)
	}
	for _, f := range c.flush {
		if f.firstErr != nil {
			w("- %s: first error `%v`\n", f.limiter, f.firstErr)
		}
	}
	w("\n")
}

func (x exactRow) verdict() string {
	switch {
	case int64(x.grants) > x.bound:
		return fmt.Sprintf("**over by %d**", int64(x.grants)-x.bound)
	case int64(x.grants) < x.least:
		return fmt.Sprintf("**under by %d**", x.least-int64(x.grants))
	case x.least > 0:
		return "exact"
	}
	return "within"
}

// measure is one figure a target is judged on, in one place.
type measure struct {
	where  string  // scenario or case
	figure string  // as shown
	miss   float64 // 0 when met, else by how much, as a fraction of the target
}

// judge compares x with a target: at least want (higher is better) or at
// most want.
func judge(where, figure string, x, want float64, higherIsBetter bool) measure {
	m := measure{where: where, figure: figure}
	switch {
	case higherIsBetter && x < want:
		m.miss = (want - x) / want
	case !higherIsBetter && x > want:
		m.miss = (x - want) / want
	}
	return m
}

// yesNo is a target that is met or not, without a degree.
func yesNo(where, figure string, ok bool) measure {
	m := measure{where: where, figure: figure}
	if !ok {
		m.miss = math.NaN()
	}
	return m
}

// targetRow sums up one target over the places it was measured: met when
// met everywhere, else where and by how much it was missed.
func targetRow(what string, ms []measure) string {
	var figures, missed []string
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, m := range ms {
		figures = append(figures, m.where+": "+m.figure)
		if m.miss != 0 {
			missed = append(missed, m.where)
			if !math.IsNaN(m.miss) {
				lo, hi = min(lo, m.miss), max(hi, m.miss)
			}
		}
	}
	status := "**met**"
	switch {
	case len(ms) == 0:
		status = "not measured"
	case len(missed) > 0 && lo > hi: // yes/no targets
		status = fmt.Sprintf("missed in %d of %d", len(missed), len(ms))
	case len(missed) > 0 && fmt.Sprintf("%.0f", 100*lo) == fmt.Sprintf("%.0f", 100*hi):
		status = fmt.Sprintf("missed by %.0f%% (%d of %d)", 100*hi, len(missed), len(ms))
	case len(missed) > 0:
		status = fmt.Sprintf("missed by %.0f–%.0f%% (%d of %d)", 100*lo, 100*hi, len(missed), len(ms))
	}
	return fmt.Sprintf("| %s | %s | %s |\n", what, strings.Join(figures, "<br>"), status)
}

func (rep *report) writeTargets(w func(string, ...any)) {
	var rows []string
	add := func(what string, ms []measure) { rows = append(rows, targetRow(what, ms)) }
	short := func(sc *scenario) string {
		if sc.keys == 1 {
			return fmt.Sprintf("%d callers, hot key", sc.callers)
		}
		return fmt.Sprintf("%d callers, %d keys", sc.callers, sc.keys)
	}
	maxCallers := rep.callers[len(rep.callers)-1]

	for _, alg := range []string{"Funnel", "FixedWindow", "SlidingWindow"} {
		var rate, usec []measure
		for i, sc := range rep.scenarios {
			if sc.flood {
				continue
			}
			r, peer := rep.find(i, alg), rep.find(i, "redis_rate")
			x := pairedRatio(r, peer)
			rate = append(rate, judge(short(sc), fmt.Sprintf("%.2f×", x), x, 1, true))
			u := pairedUsecRatio(r, peer)
			usec = append(usec, judge(short(sc), fmt.Sprintf("%.1f vs %.1f µs (%.2f×)", r.usec(), peer.usec(), u), u, 0.8, false))
		}
		add(alg+": decisions/s ≥ redis_rate's", rate)
		add(alg+": Redis µs ≤ 0.8 × redis_rate's", usec)
	}
	var tb []measure
	for i, sc := range rep.scenarios {
		if !sc.flood {
			x := pairedRatio(rep.find(i, "TokenBucket"), rep.find(i, "trivial EVALSHA"))
			tb = append(tb, judge(short(sc), fmt.Sprintf("%.2f×", x), x, 0.8, true))
		}
	}
	add("TokenBucket: decisions/s ≥ 0.8 × trivial EVALSHA's", tb)
	c := rep.checks
	if c != nil && len(c.scaling) == 3 {
		// log(100000)/log(10) = 5: growing with log(records) allows up to 5×
		// from 10 to 100,000 records; growing with records would be 10,000×.
		lo, hi := c.scaling[0], c.scaling[2]
		add("TokenBucket: Redis µs grows with log(records), not records (≤ 5× from 10 to 100,000)", []measure{
			judge("grant", fmt.Sprintf("%.1f → %.1f µs (%.2f×)", lo.usec, hi.usec, hi.usec/lo.usec), hi.usec/lo.usec, 5, false),
			judge("denial", fmt.Sprintf("%.1f → %.1f µs (%.2f×)", lo.denyUsec, hi.denyUsec, hi.denyUsec/lo.denyUsec), hi.denyUsec/lo.denyUsec, 5, false),
		})
	}
	for _, alg := range algorithms {
		var ap []measure
		for i, sc := range rep.scenarios {
			if sc.flood || sc.callers != maxCallers {
				continue
			}
			r, peer := rep.find(i, alg.name+", auto-pipelined"), rep.find(i, "redis_rate")
			x := pairedRatio(r, peer)
			// Redis runs one script at a time: 1e6 / µs per call is the most
			// any client can get from it.
			ap = append(ap, judge(short(sc), fmt.Sprintf("%.2f× (%s/s; Redis at %.0f µs a call caps it at %s/s; 4× is %s/s)",
				x, fmtRate(r.rate()), r.usec(), fmtRate(1e6/r.usec()), fmtRate(4*peer.rate())), x, 4, true))
		}
		add(alg.name+", auto-pipelined: ≥ 4 × redis_rate's plain decisions/s", ap)
	}
	if c != nil {
		var exact []measure
		for _, x := range c.exact {
			v := x.verdict()
			exact = append(exact, yesNo(x.limiter+" "+x.config, fmt.Sprintf("%d grants, %s", x.grants, strings.Trim(v, "*")), v == "exact" || v == "within"))
		}
		add(fmt.Sprintf("Auto-pipelined at %d callers: decisions exact", c.apExactCal), exact)
		var flush []measure
		for _, f := range c.flush {
			flush = append(flush, yesNo(strings.TrimSuffix(f.limiter, ", auto-pipelined"),
				fmt.Sprintf("%d errors, %d NOSCRIPT retried", f.errors, f.noscripts), f.errors == 0 && f.after > 0))
		}
		add("NOSCRIPT inside auto-pipelined batches handled (SCRIPT FLUSH mid-run)", flush)
		var allocs []measure
		for _, a := range c.allocs[:len(algorithms)] {
			above := a.allocs - c.floor
			allocs = append(allocs, judge(strings.TrimSuffix(a.name, " Allow"), fmt.Sprintf("%.0f (%+.0f)", a.allocs, above), above, 3, false))
		}
		add(fmt.Sprintf("Go: ≤ 3 allocations per decision above go-redis's floor (%.0f)", c.floor), allocs)
		var state, all []measure
		for _, m := range c.memory {
			if m.target == 0 {
				continue
			}
			name := strings.Split(m.limiter, ",")[0]
			if strings.Contains(m.limiter, "buckets") {
				name = strings.Join(strings.Split(m.limiter, ",")[:2], ",")
			}
			state = append(state, judge(name, fmt.Sprintf("%d B (≤ %d)", m.state(), m.target), float64(m.state()), float64(m.target), false))
			var bytes int64
			for _, k := range m.keys {
				bytes += k.bytes
			}
			all = append(all, judge(name, fmt.Sprintf("%d B (≤ %d)", bytes, m.target), float64(bytes), float64(m.target), false))
		}
		add("Memory: funnel, fixed window ≤ 120 B; sliding window ≤ 120 + 16 × Buckets (state keys)", state)
		add("… the same, counting the replay markers each grant leaves for the retry window (15 s)", all)
		add("TokenBucket: no more records than grants in the last Interval", []measure{
			yesNo("300 grants, 250 ms, 1 grant", fmt.Sprintf("%d record(s) left", c.tbAging.afterInterval), c.tbAging.afterInterval <= 1)})
		for _, window := range []bool{false, true} {
			var gone []measure
			label := ""
			for _, g := range c.gone {
				if (g.retryWindow > 0) != window {
					continue
				}
				name, l, _ := strings.Cut(g.limiter, ", ")
				label = l
				gone = append(gone, yesNo(name, fmt.Sprintf("%d keys left", len(g.left)), len(g.left) == 0))
			}
			add("Every key gone once the limiter is full again, "+label, gone)
		}
	}
	for i, sc := range rep.scenarios {
		if !sc.flood {
			continue
		}
		var speed, over []measure
		if rep.haveCache {
			for _, alg := range algorithms {
				cached, plain := rep.find(i, alg.name+", local cache"), rep.find(i, alg.name)
				x := pairedRatio(cached, plain)
				speed = append(speed, judge(alg.name, fmt.Sprintf("%.0f×", x), x, 10, true))
				over = append(over, yesNo(alg.name, fmt.Sprintf("%d of %d rounds over the bound", len(cached.over), len(cached.samples)), len(cached.over) == 0))
			}
		}
		add("Local deny cache: ≥ 10 × the uncached decisions/s under a flood ("+sc.name+")", speed)
		add("Local deny cache: no over-admission", over)
	}

	w("## Targets (issue 5)\n\n")
	w("| target | figures | status |\n|---|---|---|\n")
	for _, r := range rows {
		w("%s", r)
	}
	w("\n")
}

// fmtRate writes a count with thousands separators: 41203 → "41,203".
func fmtRate(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtRatio(x float64) string {
	if x == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", x)
}

// fmtDur writes a latency in µs below 10 ms (with a decimal below 10 µs)
// and in ms above.
func fmtDur(ns float64) string {
	d := time.Duration(ns)
	switch {
	case d <= 0:
		return "–"
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
}

// fmtTTL writes a PTTL reply: -1 (no expiry) as "none".
func fmtTTL(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return d.Round(time.Millisecond).String()
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

func joinNum(s string, n int64) string {
	if s == "" {
		return fmt.Sprint(n)
	}
	return s + ", " + fmt.Sprint(n)
}
