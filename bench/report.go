package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// result gathers one contender's samples in one scenario, one per round, in
// round order, so that ratios can pair samples of the same round.
type result struct {
	contender contender
	samples   []sample
}

func (r *result) med(f func(sample) float64) float64 {
	xs := make([]float64, len(r.samples))
	for i, s := range r.samples {
		xs[i] = f(s)
	}
	return median(xs)
}

func rate(s sample) float64   { return s.rate }
func usec(s sample) float64   { return s.usec }
func p50(s sample) float64    { return float64(s.p50) }
func p99(s sample) float64    { return float64(s.p99) }
func allocs(s sample) float64 { return s.allocs }

// spread is (highest − lowest) ÷ median decisions/s over the rounds.
func (r *result) spread() string {
	if len(r.samples) < 2 || r.med(rate) == 0 {
		return "–"
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range r.samples {
		lo, hi = min(lo, s.rate), max(hi, s.rate)
	}
	return fmt.Sprintf("%.0f%%", 100*(hi-lo)/r.med(rate))
}

// total sums a count over the rounds; first is the first error seen.
func (r *result) total() (decided, allowed, calls, errors uint64, first error) {
	for _, s := range r.samples {
		decided, allowed, calls, errors = decided+s.decisions, allowed+s.allowed, calls+uint64(s.calls), errors+s.errors
		if first == nil {
			first = s.firstErr
		}
	}
	return
}

type report struct {
	options
	machine           machine
	started, finished time.Time
	scenarios         []*scenario
	results           [][]*result
	checks            *checks
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
	w("on a redis-server the program starts for itself (the first on PATH). Reproduce from the\n")
	w("repository root with\n\n")
	w("    %s\n\n", strings.TrimSpace("go run ./bench "+rep.flags()))
	w("(`go run ./bench -duration 200ms -rounds 1 -out ''` for a quick look.) Figures are medians over\n")
	w("the rounds; within a round the contenders take turns, each on an emptied database, and every\n")
	w("ratio is the median of ratios taken within a round. The tests own correctness; this measures.\n\n")

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

	if len(rep.scenarios) > 0 {
		rep.writeThroughput(w)
		rep.writeStored(w)
		rep.writeFlood(w)
	}
	if rep.checks != nil {
		rep.checks.write(w)
	}
	rep.writeTargets(w)
	return b.String()
}

func (rep *report) writeThroughput(w func(string, ...any)) {
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
			_, _, _, n, _ := r.total()
			w("| %s | %s | %s | %s | %.2f | %s | %s | %.1f | %d |\n", r.contender.name, fmtRate(r.med(rate)), r.spread(),
				fmtRatio(pairedRatio(r, rep.results[i][0], rate)), r.med(usec), fmtDur(r.med(p50)), fmtDur(r.med(p99)), r.med(allocs), n)
		}
		w("\n")
		rep.writeErrors(w, i)
	}
}

func (rep *report) writeErrors(w func(string, ...any), i int) {
	for _, r := range rep.results[i] {
		decided, allowed, _, n, first := r.total()
		if n > 0 {
			w("- **%s: %d errors**, first: `%v`\n", r.contender.name, n, first)
		}
		// The throughput limits are meant never to deny: say so if they did.
		if denied := decided - allowed - n; !rep.scenarios[i].flood && !strings.HasPrefix(r.contender.name, "trivial") && denied > 0 {
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
				w("The script reads the limiter's hash either way (a stored config wins over a default).\n\n")
				w("| scenario | limiter | decisions/s, stored ÷ default | Redis µs, stored − default |\n|---|---|--:|--:|\n")
				header = true
			}
			w("| %s | %s | %.2f | %+.2f |\n", sc.name, alg.name, pairedRatio(st, def, rate), st.med(usec)-def.med(usec))
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
		w("Round trips: EVALSHA calls Redis ran per decision. With the local deny cache\n")
		w("(`redlimit.WithLocalCache`) the Go side takes both cores, so the few scripts that still run wait\n")
		w("for the CPU, which shows in their Redis µs.\n\n")
		w("| contender | decisions/s | × uncached | denied | round trips | Redis µs | p50 | p99 | allocs | errors |\n")
		w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, r := range rep.results[i] {
			vs := "–"
			if base, ok := strings.CutSuffix(r.contender.name, ", local cache"); ok {
				if u := rep.find(i, base); u != nil {
					vs = fmtRatio(pairedRatio(r, u, rate))
				}
			}
			decided, allowed, calls, n, _ := r.total()
			denied, trips := 0.0, 0.0
			if decided > 0 {
				denied, trips = 1-float64(allowed)/float64(decided), float64(calls)/float64(decided)
			}
			w("| %s | %s | %s | %.2f%% | %.4f | %.2f | %s | %s | %.1f | %d |\n", r.contender.name, fmtRate(r.med(rate)), vs,
				100*denied, trips, r.med(usec), fmtDur(r.med(p50)), fmtDur(r.med(p99)), r.med(allocs), n)
		}
		w("\n")
		rep.writeErrors(w, i)
	}
}

func (c *checks) write(w func(string, ...any)) {
	w("## Redis time per call, one caller\n\n")
	w("One caller, 2,000 calls per contender per round over 1,000 keys, contenders interleaved for 7 rounds;\n")
	w("EVALSHA usec_per_call from INFO commandstats. The server's own cost of each script, without the\n")
	w("CPU contention of the concurrent runs above; ratios are medians of per-round ratios.\n\n")
	w("| contender | Redis µs per call (least) | × redis_rate | × trivial EVALSHA |\n|---|--:|--:|--:|\n")
	for _, r := range c.serial {
		w("| %s | %.2f | %.2f | %.2f |\n", r.name, r.usec, r.vsPeer, r.vsFloor)
	}

	w("\n## Allocations, one caller\n\n")
	w("Go heap allocations per call on one goroutine (3,000 calls), against go-redis's own floor.\n\n")
	w("| call | allocs | above the floor |\n|---|--:|--:|\n")
	w("| go-redis `EvalSha` of `return 1`, 1 key (the floor) | %.1f | – |\n", c.floor)
	w("| go-redis `EvalSha` with a funnel's wire shape (4 keys, 13 args boxed once, 5-integer reply) | %.1f | %+.1f |\n", c.shaped, c.shaped-c.floor)
	for _, a := range c.allocs {
		w("| %s | %.1f | %+.1f |\n", a.name, a.allocs, a.allocs-c.floor)
	}

	w("\n## Memory\n\n")
	w("MEMORY USAGE (SAMPLES 0) of every key a limiter named `%s` holds, right after its grants\n", memoryName)
	w("(no prefix). `Per(1000, 200ms)` and 1 grant, but the sliding windows: `Rate 1000, Interval 1s`, the\n")
	w("client's clock stepped one sub-window per grant so every bucket holds one.\n\n")
	w("| limiter | bytes | target | keys |\n|---|--:|--:|---|\n")
	for _, m := range c.memory {
		var names []string
		for _, k := range m.keys {
			names = append(names, fmt.Sprintf("`%s` %d B, ttl %s", k.key, k.bytes, fmtTTL(k.ttl)))
		}
		target := "–"
		if m.target > 0 {
			target = fmt.Sprintf("≤ %d", m.target)
		}
		w("| %s | %d | %s | %s |\n", m.limiter, m.bytes(), target, strings.Join(names, "<br>"))
	}
	w("\nToken bucket permits log (`Per(1000000, 1h)`):\n\n| records | zset bytes | bytes per record |\n|--:|--:|--:|\n")
	for _, r := range c.tbRecords {
		w("| %d | %d | %.1f |\n", r.records, r.bytes, float64(r.bytes)/float64(r.records))
	}

	w("\n## Keys\n\n")
	w("Keys left in the benchmark's own, otherwise empty, database: \"drained\" is 50 grants on\n")
	w("`Per(1000, 200ms)` with no stored config, then a wait of 500 ms (the interval, plus time for\n")
	w("Redis's active expiry); \"Delete\" follows 50 grants from each of two Clients on a stored config.\n\n")
	w("| limiter | after | keys before | keys left | what is left |\n|---|---|--:|--:|---|\n")
	for _, k := range c.keys {
		var left []string
		for _, kb := range k.left {
			left = append(left, fmt.Sprintf("`%q` ttl %s", kb.key, fmtTTL(kb.ttl)))
		}
		w("| %s | %s | %d | %d | %s |\n", k.limiter, k.after, k.held, len(k.left), cmp.Or(strings.Join(left, "<br>"), "nothing"))
	}
	w("\nDBSIZE right after %d callers decided for %v over %s limiters (`Per(%d, 1000h)`: it never\n",
		c.loadedCallers, c.loadedFor, fmtRate(float64(c.loadedLimiters)), bigRate)
	w("denies, and each grant keeps a limiter's state 3.6 s longer, so every limiter touched still\n")
	w("holds all its keys):\n\n")
	w("| limiter | decisions | keys in Redis | keys per limiter |\n|---|--:|--:|--:|\n")
	for _, l := range c.loaded {
		w("| %s | %s | %s | %.2f |\n", l.limiter, fmtRate(float64(l.decisions)), fmtRate(float64(l.dbsize)), float64(l.dbsize)/float64(c.loadedLimiters))
	}

	w("\n## Token bucket: Redis time against the size of its log\n\n")
	w("Interval 1h, Rate = records + 50, the log written directly in Redisson's layout. Then 15\n")
	w("batches, the sizes taking turns: 50 grants, 50 denials on the full log, Release(50); medians\n")
	w("of the batches' Redis µs per call.\n\n")
	w("| records in the log | Redis µs per grant | Redis µs per denial |\n|--:|--:|--:|\n")
	for _, s := range c.scaling {
		w("| %s | %.2f | %.2f |\n", fmtRate(float64(s.records)), s.usec, s.denyUsec)
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
