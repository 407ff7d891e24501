package redlimit

// The algorithms' model: what each algorithm's script must answer, restated
// apart from the code under test, in µs on the controlled clock. One rate
// of each algorithm (rateModel: tokenModel, funnelModel, fixedModel,
// slidingModel), and a limiter of one rate or several (limiterModel), whose
// allow predicts every field of a Result. Every test that checks the
// scripts' answers against a model uses this one.

import (
	"math/big"
	"slices"
	"sort"
	"time"
)

// rateModel is one rate as its algorithm's script decides it alone, in µs
// on the controlled clock.
type rateModel interface {
	// wait returns the µs until permits fit; 0 or less when they fit now.
	wait(now, permits int64) int64
	// take counts a grant of permits at now.
	take(now, permits int64)
	// state returns the permits left at now and the µs until the rate is
	// full again.
	state(now int64) (remaining, reset int64)
}

// ratesOf lists cfg's rates as the models read them, apart from the code
// under test: its own, then More's, each with its defaults (Burst: Rate;
// Buckets: 10) and no more rates of its own.
func ratesOf(cfg Config) []Config {
	var out []Config
	for _, r := range append([]Config{cfg}, cfg.More...) {
		r.Type, r.KeepAlive, r.More = Overall, 0, nil
		if r.Burst == 0 {
			r.Burst = r.Rate
		}
		if r.Buckets == 0 {
			r.Buckets = 10
		}
		out = append(out, r)
	}
	return out
}

// newRateModel returns the model of one rate of a's (from ratesOf).
func newRateModel(a algo, cfg Config) rateModel {
	switch a.name {
	case tokenBucketAlgo.name:
		return &tokenModel{rate: cfg.Rate, intervalMS: cfg.Interval.Milliseconds()}
	case funnelAlgo.name:
		return &funnelModel{newExactRate(cfg)}
	case fixedWindowAlgo.name:
		return &fixedModel{rate: cfg.Rate, intervalMS: cfg.Interval.Milliseconds()}
	case slidingWindowAlgo.name:
		return &slidingModel{rate: cfg.Rate, intervalMS: cfg.Interval.Milliseconds(), buckets: int64(cfg.Buckets)}
	}
	panic("no model of " + a.name)
}

// tokenModel: a grant made in millisecond g counts in every millisecond of
// (g − interval, g], or, coalesced with later grants of its slice (take),
// until the latest of them ages out; at most rate permits count at once. A wait lasts until
// enough of the oldest grants age out.
type tokenModel struct {
	rate, intervalMS int64
	log              []msGrant // oldest first
}

type msGrant struct{ ms, n int64 }

// live returns the grants that count at now.
func (m *tokenModel) live(now int64) []msGrant {
	cutoff := floorDiv(now, 1000) - m.intervalMS
	return m.log[sort.Search(len(m.log), func(i int) bool { return m.log[i].ms > cutoff }):]
}

func (m *tokenModel) wait(now, permits int64) int64 {
	need := permits - m.rate
	for _, g := range m.live(now) {
		need += g.n
	}
	for _, g := range m.live(now) {
		if need <= 0 {
			break
		}
		if need -= g.n; need <= 0 {
			return (g.ms+m.intervalMS)*1000 - now
		}
	}
	return 0
}

// take coalesces as scripts/tokenbucket.lua does: a grant in the slice
// (interval / 64 rounded up, aligned to the epoch) of the newest record
// joins it, and the record takes the grant's time.
func (m *tokenModel) take(now, permits int64) {
	ms, slice := floorDiv(now, 1000), ceilDiv(m.intervalMS, 64)
	if n := len(m.log); n > 0 && m.log[n-1].ms >= ms-ms%slice {
		m.log[n-1].ms, m.log[n-1].n = max(m.log[n-1].ms, ms), m.log[n-1].n+permits
		return
	}
	m.log = append(m.log, msGrant{ms, permits})
}

func (m *tokenModel) state(now int64) (int64, int64) {
	live := m.live(now)
	remaining := m.rate
	for _, g := range live {
		remaining -= g.n
	}
	if len(live) == 0 {
		return remaining, 0
	}
	return remaining, (live[len(live)-1].ms+m.intervalMS)*1000 - now
}

// funnelModel: GCRA as CL.THROTTLE computes it (REFERENCE.md §2), with an
// exact emission interval (exactRate): a grant moves
// the theoretical arrival time on by Interval / Rate per permit, and permits
// fit while it stays within burst of them of now.
type funnelModel struct{ r *exactRate }

func (m *funnelModel) wait(now, permits int64) int64 { return ceilRat(m.r.wait(now, permits)) }

func (m *funnelModel) take(now, permits int64) { m.r.take(now, permits) }

func (m *funnelModel) state(now int64) (int64, int64) {
	return m.r.remaining(now), ceilRat(m.r.held(now))
}

// fixedModel: windows of interval aligned to the Unix epoch, at most rate
// permits in each.
type fixedModel struct {
	rate, intervalMS int64
	start, count     int64 // the window of the last grant, its start in ms
}

// window returns the window of now and the permits granted in it.
func (m *fixedModel) window(now int64) (start, count int64) {
	ms := floorDiv(now, 1000)
	start = ms - ms%m.intervalMS
	if start == m.start {
		return start, m.count
	}
	return start, 0
}

func (m *fixedModel) wait(now, permits int64) int64 {
	start, count := m.window(now)
	if count+permits > m.rate {
		return (start+m.intervalMS)*1000 - now
	}
	return 0
}

func (m *fixedModel) take(now, permits int64) {
	start, count := m.window(now)
	m.start, m.count = start, count+permits
}

func (m *fixedModel) state(now int64) (int64, int64) {
	start, count := m.window(now)
	if count == 0 {
		return m.rate, 0
	}
	return m.rate - count, (start+m.intervalMS)*1000 - now
}

// slidingModel: sub-windows of interval / buckets aligned to the Unix epoch
// (sub-window i starts at ⌈i × interval / buckets⌉ ms), at most rate permits
// in any buckets consecutive ones.
type slidingModel struct {
	rate, intervalMS, buckets int64
	cells                     []cellCount // oldest first
}

type cellCount struct{ index, n int64 }

func (m *slidingModel) current(now int64) int64 {
	return floorDiv(floorDiv(now, 1000)*m.buckets, m.intervalMS)
}

func (m *slidingModel) startOf(index int64) int64 { return ceilDiv(index*m.intervalMS, m.buckets) }

// live returns the sub-windows that count at now, and their sum.
func (m *slidingModel) live(now int64) ([]cellCount, int64) {
	oldest := m.current(now) - m.buckets
	live := m.cells[sort.Search(len(m.cells), func(i int) bool { return m.cells[i].index > oldest }):]
	var total int64
	for _, c := range live {
		total += c.n
	}
	return live, total
}

func (m *slidingModel) wait(now, permits int64) int64 {
	live, total := m.live(now)
	need := total + permits - m.rate
	for _, c := range live {
		if need <= 0 {
			break
		}
		if need -= c.n; need <= 0 {
			return m.startOf(c.index+m.buckets)*1000 - now
		}
	}
	return 0
}

func (m *slidingModel) take(now, permits int64) {
	cur := m.current(now)
	if n := len(m.cells); n > 0 && m.cells[n-1].index == cur {
		m.cells[n-1].n += permits
		return
	}
	m.cells = append(m.cells, cellCount{cur, permits})
}

func (m *slidingModel) state(now int64) (int64, int64) {
	live, total := m.live(now)
	if len(live) == 0 {
		return m.rate, 0
	}
	return m.rate - total, m.startOf(live[len(live)-1].index+m.buckets)*1000 - now
}

// limiterModel is a limiter of several rates: a request is granted iff every
// rate's model allows it, and then taken in all of them.
type limiterModel struct {
	rates  []rateModel
	quotas []Quota
}

func newLimiterModel(a algo, cfg Config) *limiterModel {
	m := &limiterModel{}
	for _, r := range ratesOf(cfg) {
		m.rates = append(m.rates, newRateModel(a, r))
		m.quotas = append(m.quotas, quotaOf(r))
	}
	return m
}

// quotaOf is the Limit and Window a Result reports for one rate (from
// ratesOf): its capacity (Rate; a funnel's Burst) and the time the capacity
// takes to drain at Rate per Interval, in whole ms rounded up.
func quotaOf(r Config) Quota {
	return Quota{Limit: r.Burst, Window: time.Duration(ceilDiv(r.Burst*r.Interval.Milliseconds(), r.Rate)) * time.Millisecond}
}

// allow decides as the scripts must: Never, bound by the first rate whose
// capacity is below permits; else denied, bound by the longest wait (the
// first of equals), RetryAfter that wait; else granted in every rate, bound
// by the fewest permits left (the first of equals). Remaining is the
// fewest, ResetAfter the longest of the rates' (each Quota's ResetAfter).
// Quotas only with several rates.
func (m *limiterModel) allow(now, permits int64) Result {
	var r Result
	bound := -1
	for k, q := range m.quotas {
		if permits > q.Limit {
			bound, r.RetryAfter = k, Never
			break
		}
	}
	if bound < 0 {
		var longest int64
		for k, rate := range m.rates {
			if w := rate.wait(now, permits); w > longest {
				longest, bound = w, k
			}
		}
		if bound >= 0 {
			r.RetryAfter = time.Duration(longest) * time.Microsecond
		} else {
			r.Allowed = true
			for _, rate := range m.rates {
				if permits > 0 {
					rate.take(now, permits)
				}
			}
		}
	}
	fewest := 0
	quotas := slices.Clone(m.quotas)
	for k, rate := range m.rates {
		remaining, reset := rate.state(now)
		if k == 0 || remaining < r.Remaining {
			r.Remaining, fewest = remaining, k
		}
		quotas[k].ResetAfter = time.Duration(reset) * time.Microsecond
		r.ResetAfter = max(r.ResetAfter, quotas[k].ResetAfter)
	}
	if r.Allowed {
		bound = fewest
	}
	r.Limit, r.Window = m.quotas[bound].Limit, m.quotas[bound].Window
	if len(m.quotas) > 1 {
		r.Bound, r.Quotas = bound, quotas
	}
	return r
}

// release gives back a funnel's grant (at, size) in every rate (see
// exactRate.release), and returns what each gave back. Funnels only.
func (m *limiterModel) release(now, permits, at, size int64) []int64 {
	var back []int64
	for _, r := range m.rates {
		back = append(back, r.(*funnelModel).r.release(now, permits, at, size))
	}
	return back
}

// since is when a funnel's grant made now starts to drain: the earliest of
// the rates' TATs, in whole µs. Funnels only.
func (m *limiterModel) since(now int64) int64 {
	at := m.rates[0].(*funnelModel).r.since(now)
	for _, r := range m.rates[1:] {
		at = min(at, r.(*funnelModel).r.since(now))
	}
	return at
}

// quotasOf lists cfg's rates' quotas.
func quotasOf(cfg Config) []Quota {
	var out []Quota
	for _, r := range ratesOf(cfg) {
		out = append(out, quotaOf(r))
	}
	return out
}

// exactRate is one rate of an exact GCRA model, in rationals: a grant moves
// the theoretical arrival time (tat) on by Interval / Rate µs a permit, and
// permits fit while tat stays within Burst of them of now.
type exactRate struct {
	rate, burst, intervalUS int64
	tat                     *big.Rat // nil: empty
}

func newExactRate(cfg Config) *exactRate {
	cfg = cfg.withDefaults()
	return &exactRate{rate: cfg.Rate, burst: cfg.Burst, intervalUS: cfg.Interval.Microseconds()}
}

func (r *exactRate) emission(n int64) *big.Rat {
	return new(big.Rat).Mul(big.NewRat(n, 1), big.NewRat(r.intervalUS, r.rate))
}

// at returns the TAT as of now: never before now.
func (r *exactRate) at(now int64) *big.Rat {
	n := big.NewRat(now, 1)
	if r.tat == nil || r.tat.Cmp(n) < 0 {
		return n
	}
	return r.tat
}

// wait is how long until permits fit (≤ 0: now), exactly.
func (r *exactRate) wait(now, permits int64) *big.Rat {
	w := new(big.Rat).Add(r.at(now), r.emission(permits-r.burst))
	return w.Sub(w, big.NewRat(now, 1))
}

func (r *exactRate) take(now, permits int64) {
	r.tat = new(big.Rat).Add(r.at(now), r.emission(permits))
}

// held is the TAT's lead on now, in µs.
func (r *exactRate) held(now int64) *big.Rat {
	return new(big.Rat).Sub(r.at(now), big.NewRat(now, 1))
}

// remaining is how many permits fit now: the whole emission intervals in
// Burst's minus what the funnel holds.
func (r *exactRate) remaining(now int64) int64 {
	slack := new(big.Rat).Sub(r.emission(r.burst), r.held(now))
	return min(r.burst, max(0, floorRat(slack.Quo(slack, r.emission(1)))))
}

// release gives back up to permits whole emission intervals of a grant of
// size permits that started to drain at at µs: never more than the TAT
// holds, nor than what has not drained of the grant, and returns how many.
func (r *exactRate) release(now, permits, at, size int64) int64 {
	held := r.held(now)
	back := min(permits, size, floorRat(held.Quo(held, r.emission(1))))
	left := new(big.Rat).Add(big.NewRat(at-now, 1), r.emission(size))
	back = min(back, max(0, floorRat(left.Quo(left, r.emission(1)))))
	r.tat = new(big.Rat).Sub(r.at(now), r.emission(back))
	return back
}

// since is when a grant made now starts to drain: the TAT, in whole µs.
func (r *exactRate) since(now int64) int64 { return floorRat(r.at(now)) }

func floorRat(x *big.Rat) int64 {
	return new(big.Int).Div(x.Num(), x.Denom()).Int64() // Euclidean: rounds down for a positive denominator
}

func ceilRat(x *big.Rat) int64 { return -floorRat(new(big.Rat).Neg(x)) }

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

// limitsAndWindows is quotas without their resets: what a config says of
// its rates, for tests that check the config, not the state.
func limitsAndWindows(quotas []Quota) []Quota {
	out := make([]Quota, len(quotas))
	for i, q := range quotas {
		out[i] = Quota{Limit: q.Limit, Window: q.Window}
	}
	return out
}
