package main

import (
	"fmt"
	"math"
	"strings"
)

// measure is one figure a target is judged on, in one place.
type measure struct {
	where  string  // scenario or case; "" when there is one
	figure string  // as shown
	miss   float64 // 0 when met, else by how much, as a fraction of the target; NaN for a yes/no
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
		f := m.figure
		if m.where != "" {
			f = m.where + ": " + f
		}
		figures = append(figures, f)
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
		status = fmt.Sprintf("**missed** in %d of %d", len(missed), len(ms))
	case len(missed) > 0 && fmt.Sprintf("%.0f", 100*lo) == fmt.Sprintf("%.0f", 100*hi):
		status = fmt.Sprintf("**missed** by %.0f%% (%d of %d)", 100*hi, len(missed), len(ms))
	case len(missed) > 0:
		status = fmt.Sprintf("**missed** by %.0f–%.0f%% (%d of %d)", 100*lo, 100*hi, len(missed), len(ms))
	}
	return fmt.Sprintf("| %s | %s | %s |\n", what, strings.Join(figures, "<br>"), status)
}

// writeTargets judges the figures against issue 9's targets: each met, or
// missed by how much, where it was measured.
func (rep *report) writeTargets(w func(string, ...any)) {
	var rows []string
	add := func(what string, ms []measure) { rows = append(rows, targetRow(what, ms)) }
	c := rep.checks
	if c == nil {
		c = &checks{}
	}

	// Redis µs per call, one caller.
	serial := func(most float64, algs ...string) (ms []measure) {
		for _, r := range c.serial {
			for _, alg := range algs {
				if r.name == alg {
					ms = append(ms, judge(alg, fmt.Sprintf("%.2f×", r.vsPeer), r.vsPeer, most, false))
				}
			}
		}
		return ms
	}
	add("Redis µs per call, one caller: funnel, fixed window ≤ 1.0× redis_rate's", serial(1, "Funnel", "FixedWindow"))
	add("… stretch: funnel, fixed window ≤ 0.8×", serial(0.8, "Funnel", "FixedWindow"))
	add("… sliding window (10 buckets) ≤ 1.3×", serial(1.3, "SlidingWindow"))
	add("… token bucket ≤ 1.6×", serial(1.6, "TokenBucket"))

	// Decisions/s against redis_rate's in the same round.
	versusPeer := func(callers int, contender string, least float64, figure func(r, peer *result, x float64) string) (ms []measure) {
		for i, sc := range rep.scenarios {
			r, peer := rep.find(i, contender), rep.find(i, "redis_rate")
			if sc.flood || sc.callers != callers || r == nil || peer == nil {
				continue
			}
			where := fmt.Sprintf("%d keys", sc.keys)
			if sc.keys == 1 {
				where = "hot key"
			}
			x := pairedRatio(r, peer, rate)
			ms = append(ms, judge(where, figure(r, peer, x), x, least, true))
		}
		return ms
	}
	plain := func(r, peer *result, x float64) string {
		return fmt.Sprintf("%.2f× (%s vs %s/s)", x, fmtRate(r.med(rate)), fmtRate(peer.med(rate)))
	}
	manyKeys := func(ms []measure) []measure { // the target is over many keys
		var out []measure
		for _, m := range ms {
			if m.where != "hot key" {
				out = append(out, m)
			}
		}
		return out
	}
	for _, t := range []struct {
		what  string
		algs  []string
		least float64
	}{
		{"Decisions/s, 64 callers: funnel, fixed window ≥ 1.0× redis_rate's", []string{"Funnel", "FixedWindow"}, 1},
		{"… sliding window ≥ 0.9×", []string{"SlidingWindow"}, 0.9},
		{"… token bucket ≥ 0.8×", []string{"TokenBucket"}, 0.8},
	} {
		var ms []measure
		for _, alg := range t.algs {
			for _, m := range manyKeys(versusPeer(64, alg, t.least, plain)) {
				m.where = alg + ", " + m.where
				ms = append(ms, m)
			}
		}
		add(t.what, ms)
	}
	// Redis runs one script at a time: 1e6 ÷ its µs per call is the most
	// any client can get from it.
	add("Auto-pipelined funnel, 512 callers: ≥ 2× redis_rate's plain decisions/s", versusPeer(512, "Funnel, auto-pipelined", 2,
		func(r, peer *result, x float64) string {
			return fmt.Sprintf("%.2f× (%s vs %s/s; Redis at %.1f µs a call caps it at %s/s)",
				x, fmtRate(r.med(rate)), fmtRate(peer.med(rate)), r.med(usec), fmtRate(1e6/r.med(usec)))
		}))

	var allocs []measure
	for _, a := range c.allocs {
		if name, ok := strings.CutSuffix(a.name, " Allow"); ok {
			allocs = append(allocs, judge(name, fmt.Sprintf("%.1f", a.allocs), a.allocs, 14, false))
		} else if name, ok := strings.CutSuffix(a.name, " Allow, stored config"); ok && name != "redis_rate" {
			allocs = append(allocs, judge(name+", stored", fmt.Sprintf("%.1f", a.allocs), a.allocs, 14, false))
		}
	}
	add("Go allocations per decision ≤ 14", allocs)

	var loaded []measure
	for _, l := range c.loaded {
		if l.target > 0 {
			loaded = append(loaded, judge(l.limiter, fmt.Sprintf("%s keys after %s decisions", fmtRate(float64(l.dbsize)), fmtRate(float64(l.decisions))),
				float64(l.dbsize), float64(l.target), false))
		}
	}
	add(fmt.Sprintf("Keys in Redis after %v of %d callers over %s funnels ≤ %s", c.loadedFor, c.loadedCallers,
		fmtRate(float64(c.loadedLimiters)), fmtRate(float64(c.loadedLimiters))), loaded)

	var left []measure
	for _, k := range c.keys {
		left = append(left, yesNo(k.limiter+", "+strings.Split(k.after, " (")[0], fmt.Sprintf("%d", len(k.left)), len(k.left) == 0))
	}
	add("Keys after a limiter with no stored config drains, and after Delete: 0", left)

	var state []measure
	for _, m := range c.memory {
		if m.target > 0 {
			state = append(state, judge(strings.TrimSuffix(m.limiter, ", each holding a grant"), fmt.Sprintf("%d B (≤ %d)", m.bytes(), m.target),
				float64(m.bytes()), float64(m.target), false))
		}
	}
	add("State bytes per limiter: funnel, fixed window ≤ 120 B; sliding window ≤ 120 + 16 × Buckets", state)

	w("## Targets (issue 9)\n\n")
	w("Judged on this run's figures: ratios are medians of ratios taken within a round, so a machine\n")
	w("busy with other work slows both sides; a miss is by how much, as a share of the target.\n\n")
	w("| target | figures | status |\n|---|---|---|\n")
	for _, r := range rows {
		w("%s", r)
	}
	w("\n")
}
