package redlimit

// Several rates in one limiter (Config.And): a request is granted only if
// every rate allows it, and then counts in every one. The proof here is the
// algorithms' model (model_test.go): each rate's own single-rate
// arithmetic, restated in µs (rateModel), combined as the Result documents
// (limiterModel), predicts every field of every Result of long random
// sequences on a controlled clock. Apart from the model, the sequences' grants and denials are checked
// against each rate's guarantee directly (overAdmitted, roomFor).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/wire"
)

// --- Each rate's guarantee, straight from a sequence's grants. ---

// event is one request of a sequence and its answer.
type event struct {
	at, permits    int64 // µs
	allowed, never bool
}

// overAdmitted returns breaches of one rate's guarantee (a rate from
// ratesOf) by the grants among events (in time order): more than its
// capacity in one of its windows.
func overAdmitted(a algo, rate Config, events []event) []string {
	var grants []event
	for _, e := range events {
		if e.allowed && e.permits > 0 {
			grants = append(grants, e)
		}
	}
	var out []string
	intervalMS := rate.Interval.Milliseconds()
	switch a.name {
	case funnelAlgo.name:
		// GCRA: the permits granted from t_i to t_j are at most burst plus
		// one per emission in between.
		emission := rate.Interval.Microseconds() / rate.Rate
		for i := range grants {
			var sum int64
			for _, g := range grants[i:] {
				if sum += g.permits; sum > rate.Burst+(g.at-grants[i].at)/emission {
					out = append(out, fmt.Sprintf("%d permits from %d to %dµs, burst %d, one per %dµs", sum, grants[i].at, g.at, rate.Burst, emission))
					break
				}
			}
		}
	default:
		// The windows: at most Rate permits in the window of each grant.
		for _, g := range grants {
			var sum int64
			for _, h := range grants {
				if sameWindow(a, rate, g.at, h.at) {
					sum += h.permits
				}
			}
			if sum > rate.Rate {
				out = append(out, fmt.Sprintf("%d permits in the window of %dµs (%dms, %d buckets)", sum, g.at, intervalMS, rate.Buckets))
			}
		}
	}
	return out
}

// sameWindow reports whether a window algorithm's rate counts a grant made at
// then in its window of now: the token bucket's (now − interval, now] in ms,
// the fixed window's, or the buckets sub-windows up to now's.
func sameWindow(a algo, rate Config, now, then int64) bool {
	nowMS, thenMS, intervalMS := floorDiv(now, 1000), floorDiv(then, 1000), rate.Interval.Milliseconds()
	switch a.name {
	case tokenBucketAlgo.name:
		return thenMS > nowMS-intervalMS && thenMS <= nowMS
	case fixedWindowAlgo.name:
		return floorDiv(thenMS, intervalMS) == floorDiv(nowMS, intervalMS)
	default:
		b := int64(rate.Buckets)
		cell, cur := floorDiv(thenMS*b, intervalMS), floorDiv(nowMS*b, intervalMS)
		return cell > cur-b && cell <= cur
	}
}

// roomFor reports whether one rate (from ratesOf), after the grants among
// earlier, has room for permits at now.
func roomFor(a algo, rate Config, earlier []event, now, permits int64) bool {
	if a.name == funnelAlgo.name {
		emission := rate.Interval.Microseconds() / rate.Rate
		var tat int64
		for _, e := range earlier {
			if e.allowed {
				tat = max(tat, e.at) + emission*e.permits
			}
		}
		return max(tat, now)+emission*permits-emission*rate.Burst <= now
	}
	used := permits
	if a.name == tokenBucketAlgo.name {
		// Grants of one slice (Interval / 64) share a record, which counts
		// until the latest of them leaves the window (scripts/tokenbucket.lua).
		q := ceilDiv(rate.Interval.Milliseconds(), 64)
		latest := map[int64]int64{}
		for _, e := range earlier {
			if e.allowed && e.permits > 0 {
				latest[floorDiv(floorDiv(e.at, 1000), q)] = e.at
			}
		}
		for _, e := range earlier {
			if e.allowed && sameWindow(a, rate, now, latest[floorDiv(floorDiv(e.at, 1000), q)]) {
				used += e.permits
			}
		}
		return used <= rate.Rate
	}
	for _, e := range earlier {
		if e.allowed && sameWindow(a, rate, now, e.at) {
			used += e.permits
		}
	}
	return used <= rate.Rate
}

// checkGuarantees checks a sequence against every rate directly: no rate's
// guarantee broken; every denial made while some rate had no room (a Never
// one only when some rate's capacity is below its permits, and those always).
func checkGuarantees(t *testing.T, a algo, cfg Config, events []event) {
	t.Helper()
	for k, rate := range ratesOf(cfg) {
		assert.Empty(t, overAdmitted(a, rate, events), "over-admission by rate %d (%v)", k, rate)
	}
	for i, e := range events {
		tooMany := false
		full := false
		for _, rate := range ratesOf(cfg) {
			tooMany = tooMany || e.permits > quotaOf(rate).Limit
			full = full || !roomFor(a, rate, events[:i], e.at, e.permits)
		}
		assert.Equal(t, tooMany, e.never, "request %d at %dµs for %d: Never iff above some rate's capacity", i, e.at, e.permits)
		if !e.allowed && !e.never {
			assert.True(t, full, "request %d at %dµs for %d denied while every rate had room", i, e.at, e.permits)
		}
	}
}

// --- Random sequences. ---

// gridUS: every interval of a random config is a multiple of it, so every
// window and sub-window edge a key's expiry can follow is one of its
// multiples too (the sliding window's with one bucket; with more, a new
// sub-window's key lives (buckets − 1) sub-windows at least).
const gridUS = int64(10 * time.Second / time.Microsecond)

// marginUS keeps every request at least this far before a multiple of
// gridUS, so that no key is written with an expiry shorter than that: real
// Redis ages expiries in real time, and its keys must not expire while the
// controlled clock, standing nearly still, still counts their state.
const marginUS = int64(2 * time.Second / time.Microsecond)

// randomRates returns a valid config of n rates for a, in random order:
// intervals of 10s to an hour, multiples of gridUS; each longer one granting
// more, but well under what the shorter one would over its interval, and a
// funnel's holding more (a larger burst), so that every rate binds at
// times; at most 40 permits an interval and emission intervals of 2s at
// least, so that a funnel's key lives that long after a grant.
func randomRates(rng *rand.Rand, a algo, n int) Config {
	intervals := []time.Duration{10 * time.Second, 20 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
		10 * time.Minute, 30 * time.Minute, time.Hour}
	picked := rng.Perm(len(intervals))[:n]
	sort.Ints(picked)
	rates := make([]Config, n)
	var last, lastBurst int64
	for k, i := range picked {
		interval := intervals[i]
		rate := 1 + rng.Int64N(min(6, int64(interval/(2*time.Second))))
		if k > 0 {
			ratio := int64(interval / rates[k-1].Interval)
			rate = max(last+1, min(40, last+1+rng.Int64N(max(1, last*(ratio-1)/2))))
		}
		last = rate
		var burst int64
		if rng.IntN(2) == 0 || rate <= lastBurst {
			burst = lastBurst + 1 + rng.Int64N(max(1, rate+rate/2-lastBurst))
		}
		lastBurst = max(burst, rate)
		buckets := []int{0, 1, 2, 3, 7, 10, 60}[rng.IntN(7)]
		rates[k] = a.tune(Per(rate, interval), burst, buckets)
	}
	rng.Shuffle(n, func(i, j int) { rates[i], rates[j] = rates[j], rates[i] })
	return rates[0].And(rates[1:]...)
}

// sequence draws random requests for a config, in phases: each paces them
// at about three quarters of one rate's emission interval (Interval / Rate),
// for long enough that the demand, at two permits or so a request, outruns
// that rate (or a shorter one) over its interval. Some requests come at the
// same instant, a few after a pause longer than the longest interval. None
// lands within marginUS before a multiple of gridUS.
type sequence struct {
	rng    *rand.Rand
	rates  []Config
	quotas []Quota
	now    int64 // µs
	pace   int64 // the phase's longest step, µs
	left   int   // requests left in the phase
}

func newSequence(rng *rand.Rand, cfg Config) *sequence {
	return &sequence{rng: rng, rates: ratesOf(cfg), quotas: quotasOf(cfg), now: epoch.UnixMicro()}
}

// next returns the instant and the permits of the next request.
func (s *sequence) next() (now, permits int64) {
	rng := s.rng
	if s.left == 0 {
		r := s.rates[rng.IntN(len(s.rates))]
		s.pace = 3 * r.Interval.Microseconds() / r.Rate / 2
		s.left = int(r.Rate) * (2 + rng.IntN(3))
	}
	s.left--
	switch p := rng.IntN(100); {
	case p < 12:
	case p < 99:
		s.now += rng.Int64N(s.pace)
	default:
		var longest int64
		for _, r := range s.rates {
			longest = max(longest, r.Interval.Microseconds())
		}
		s.now += longest + rng.Int64N(longest)
	}
	if s.now%gridUS >= gridUS-marginUS {
		s.now += gridUS - s.now%gridUS + rng.Int64N(marginUS)
	}
	return s.now, s.permits()
}

// permits asks for a few permits mostly, at times none (a peek), any number
// up to past the largest capacity, or more than some rate's capacity.
func (s *sequence) permits() int64 {
	rng := s.rng
	smallest, largest := s.quotas[0].Limit, s.quotas[0].Limit
	for _, q := range s.quotas {
		smallest, largest = min(smallest, q.Limit), max(largest, q.Limit)
	}
	switch p := rng.IntN(100); {
	case p < 12:
		return 0
	case p < 82:
		return 1 + rng.Int64N(min(3, smallest))
	case p < 92:
		return 1 + rng.Int64N(largest+2)
	default:
		return smallest + rng.Int64N(largest-smallest+3)
	}
}

// The random rounds: how many rates each has, how many requests, and each
// algorithm's seed. The seeds are ones whose every round has every rate
// bind denials (as Bound, the longest wait) twice at least
// (TestMultiRateSequencesBindEveryRate): not every random config and
// sequence does.
var (
	multiRateRounds = []int{2, 3, 1, 4, 2, 3}
	multiRateCalls  = 300
	multiRateSeeds  = map[string]uint64{tokenBucketAlgo.name: 5, funnelAlgo.name: 362, fixedWindowAlgo.name: 1, slidingWindowAlgo.name: 1}
)

// stateLifetimes returns, for each key holding some of the limiter's
// state, the µs it must live for from now: until the rates whose state it
// holds are full again. The funnel and the windows keep every rate's state
// in the limiter's hash; the token bucket its first rate's in Redisson's
// value and permits keys, the others' in the grants log.
func stateLifetimes(a algo, l *Limiter, resets []int64) map[string]int64 {
	longest := func(resets []int64) int64 {
		var most int64
		for _, r := range resets {
			most = max(most, r)
		}
		return most
	}
	if a.name != tokenBucketAlgo.name {
		return map[string]int64{l.Name(): longest(resets)}
	}
	out := map[string]int64{wire.KeyOf(l.Name(), "value"): resets[0], wire.KeyOf(l.Name(), "permits"): resets[0]}
	if len(resets) > 1 {
		out[wire.KeyOf(l.Name(), "grants")] = longest(resets[1:])
	}
	return out
}

// TestMultiRateMatchesModel plays long random sequences against limiters of
// one to four rates, each on a fresh limiter and controlled clock, and
// checks every Result field against limiterModel, the keys' expiries
// against what their state needs, and the sequence against every rate's
// guarantee.
func TestMultiRateMatchesModel(t *testing.T) {
	calls := multiRateCalls
	if testing.Short() {
		calls = 100
	}
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(12, multiRateSeeds[a.name]))
		for round, n := range multiRateRounds {
			cfg := randomRates(rng, a, n)
			clk := newClock()
			l := a.new(newClient(rdb, clk), uniqueName(t))
			// Half the rounds store the config, half use it as a default:
			// only then does the hash holding the state expire.
			stored := round%2 == 0
			if stored {
				require.NoError(t, l.SetRate(ctx, cfg))
				assertConfig(t, l, cfg)
			} else {
				l = l.WithDefault(cfg)
			}
			model := newLimiterModel(a, cfg)
			seq := newSequence(rng, cfg)
			began := time.Now()
			var now int64
			var events []event
			for i := range calls {
				var permits int64
				now, permits = seq.next()
				clk.Set(time.UnixMicro(now))
				got, err := allowAny(ctx, l, permits)
				require.NoError(t, err)
				want := model.allow(now, permits)
				require.Equal(t, want, got, "round %d call %d: %v (stored %v), %d permits at epoch + %dµs", round, i, cfg, stored, permits, now-epoch.UnixMicro())
				events = append(events, event{now, permits, got.Allowed, got.RetryAfter == Never})

				resets := make([]int64, len(model.rates))
				for k, r := range model.rates {
					_, resets[k] = r.state(now)
				}
				// Real Redis ages expiries in real time: allow for the time
				// the round has taken so far, and for the time a script reads
				// being a few ms older than the call (the server's cached
				// clock).
				slack := time.Since(began).Milliseconds() + 100
				lifetimes := stateLifetimes(a, l, resets)
				ttls := map[string]*redis.DurationCmd{}
				_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
					for key := range lifetimes {
						ttls[key] = p.PTTL(ctx, key)
					}
					return nil
				})
				require.NoError(t, err)
				for key, need := range lifetimes {
					ttl := ttls[key].Val()
					switch {
					case stored && key == l.Name():
						// The stored config never expires; the state in it with it.
					case need > 0:
						require.True(t, ttl > 0 && ttl.Milliseconds()+slack >= ceilDiv(need, 1000), "round %d call %d: %s expires in %v, its state counts for %dµs", round, i, key, ttl, need)
					}
				}
			}
			checkGuarantees(t, a, cfg, events)
			denied, never, peeks := 0, 0, 0
			for _, e := range events {
				switch {
				case e.never:
					never++
				case !e.allowed:
					denied++
				case e.permits == 0:
					peeks++
				}
			}
			t.Logf("round %d: %v: %d requests over %v, %d granted, %d denied, %d never, %d peeks", round, cfg, calls,
				time.Duration(now-epoch.UnixMicro())*time.Microsecond, calls-denied-never-peeks, denied, never, peeks)
			if n == 1 {
				// One rate writes what one rate always wrote: no grants log,
				// no fields of further rates.
				fields := rdb.HKeys(ctx, l.Name()).Val()
				for _, f := range fields {
					assert.NotRegexp(t, "^more$|[2-9]$", f, "a field of a further rate")
				}
				assert.Zero(t, rdb.Exists(ctx, wire.KeyOf(l.Name(), "grants")).Val(), "a grants log")
			}
		}
	})
}

// Every rate binds in every random round TestMultiRateMatchesModel plays
// (else it proves less than it says): by the model, each is the Bound of
// some denials. The configs are valid, and a funnel's key lives 2s at least
// after a grant (randomRates).
func TestMultiRateSequencesBindEveryRate(t *testing.T) {
	for _, a := range algorithms {
		rng := rand.New(rand.NewPCG(12, multiRateSeeds[a.name]))
		for round, n := range multiRateRounds {
			cfg := randomRates(rng, a, n)
			require.NoError(t, cfg.validate(), "%s round %d: %v", a.name, round, cfg)
			for _, r := range ratesOf(cfg) {
				assert.GreaterOrEqual(t, r.Interval/time.Duration(r.Rate), 2*time.Second, "%s round %d: %v", a.name, round, r)
			}
			model := newLimiterModel(a, cfg)
			deniedBy, grantedBy := make([]int, n), make([]int, n)
			seq := newSequence(rng, cfg)
			for range multiRateCalls {
				r := model.allow(seq.next())
				if r.Allowed {
					grantedBy[r.Bound]++
				} else if r.RetryAfter != Never {
					deniedBy[r.Bound]++
				}
			}
			for k := range n {
				assert.GreaterOrEqual(t, deniedBy[k], 2, "%s round %d: %v: rate %d seldom denied alone (denials by rate %v)", a.name, round, cfg, k, deniedBy)
			}
			t.Logf("%s round %d: %v: denials by rate %v, grants bound by rate %v", a.name, round, cfg, deniedBy, grantedBy)
		}
	}
}

// The guarantee checks can fail: a history that breaks the second rate's
// guarantee only, and denials with and without a full rate.
func TestMultiRateChecksCatchBreaches(t *testing.T) {
	s := int64(time.Second / time.Microsecond)
	base := epoch.UnixMicro()
	cfg := Per(2, 10*time.Second).And(PerMinute(3))
	for _, a := range algorithms {
		r1, r2 := ratesOf(cfg)[0], ratesOf(cfg)[1]
		// 2 at 0s and 2 at 10s: the first rate allows both (a new window, a
		// drained funnel), the second holds 4 of 3.
		events := []event{{at: base, permits: 2, allowed: true}, {at: base + 10*s, permits: 2, allowed: true}}
		assert.Empty(t, overAdmitted(a, r1, events), a.name)
		assert.NotEmpty(t, overAdmitted(a, r2, events), a.name)
		events[1].permits = 1
		assert.Empty(t, overAdmitted(a, r2, events), a.name)

		// After 2 at 0s, the first rate is full at 4s and has room again at
		// 10s, where the second does too.
		granted := events[:1]
		assert.False(t, roomFor(a, r1, granted, base+4*s, 1), a.name)
		assert.True(t, roomFor(a, r2, granted, base+4*s, 1), a.name)
		assert.True(t, roomFor(a, r1, granted, base+10*s, 1), a.name)
		assert.True(t, roomFor(a, r2, granted, base+10*s, 1), a.name)
		assert.False(t, roomFor(a, r2, granted, base+10*s, 2), a.name)
	}
}

func TestMultiRateConfigRoundTrip(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		c := newClient(rdb, newClock(), WithClientID("c1"))
		l := a.new(c, name)
		cfg := a.tune(Config{Type: PerClient, Rate: 7, Interval: 3 * time.Second, KeepAlive: 2 * time.Hour}, 9, 3).
			And(a.tune(Per(20, time.Minute), 25, 6), a.tune(PerHour(100), 0, 0))
		require.Len(t, cfg.More, 2)

		// A default is used, and never stored.
		withDefault := l.WithDefault(cfg)
		assertConfig(t, withDefault, cfg)
		r, err := withDefault.Allow(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, quotasOf(cfg), r.Quotas)
		assert.Empty(t, limiterKeys(t, rdb, name), "a peek on a default writes nothing")

		ok, err := l.TrySetRate(ctx, cfg)
		require.NoError(t, err)
		assert.True(t, ok)
		for _, h := range []*Limiter{l, withDefault, a.new(c, name).WithDefault(PerSecond(1))} {
			assertConfig(t, h, cfg, "the further rates read back as set, Type and KeepAlive zero")
		}
		ok, err = l.TrySetRate(ctx, PerSecond(5).And(PerMinute(50)))
		require.NoError(t, err)
		assert.False(t, ok, "TrySetRate twice keeps the first")
		assertConfig(t, l, cfg)

		// Back to one rate: no further rates are left behind, and a one-rate
		// Result has neither Bound nor Quotas.
		one := a.tune(Per(10, time.Minute), 12, 5)
		require.NoError(t, l.SetRate(ctx, one))
		assertConfig(t, l, one)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Nil(t, r.Quotas)
		assert.Zero(t, r.Bound)
		assert.Equal(t, quotasOf(one)[0], Quota{Limit: r.Limit, Window: r.Window})

		// And to four, in no order of interval.
		four := PerHour(1000).And(PerSecond(5), Per(100, 10*time.Minute), PerMinute(20))
		require.NoError(t, l.SetRate(ctx, four))
		assertConfig(t, l, four)
		r, err = l.Allow(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, quotasOf(four), limitsAndWindows(r.Quotas))
	})
}

// SetRate keeps the usage of every rate whose interval the new config has
// too, wherever it stands in the list, and drops the usage of the rates
// that go: a new rate starts empty.
func TestMultiRateSetRateKeepsUsageOfRatesThatStay(t *testing.T) {
	s := time.Second
	a0 := Per(5, 10*s).And(PerHour(20))
	b := Per(15, 10*time.Minute).And(PerHour(20)) // 10s goes, 10min comes, 1h stays
	steps := map[string]struct{ before, after []step }{
		fixedWindowAlgo.name: {
			before: []step{
				{0, 4, true, 1, 0, 3600 * s, 0},
				{10 * s, 0, true, 5, 0, 3590 * s, 0},
				{10 * s, 3, true, 2, 0, 3590 * s, 0}, // 7 in the hour
			},
			after: []step{
				{10 * s, 0, true, 13, 0, 3590 * s, 1}, // the hour's 7 kept; the 10s's 3 not carried over
				{10 * s, 10, true, 3, 0, 3590 * s, 1},
				{600 * s, 4, false, 3, 3000 * s, 3000 * s, 1},
				{600 * s, 3, true, 0, 0, 3000 * s, 1},
			},
		},
		slidingWindowAlgo.name: { // sub-windows of 1s, 1min and 6min
			before: []step{
				{0, 4, true, 1, 0, 3600 * s, 0},
				{10 * s, 0, true, 5, 0, 3590 * s, 0},
				{10 * s, 3, true, 2, 0, 3590 * s, 0},
			},
			after: []step{
				{10 * s, 0, true, 13, 0, 3590 * s, 1},
				{10 * s, 10, true, 3, 0, 3590 * s, 1},
				{600 * s, 4, false, 3, 3000 * s, 3000 * s, 1},
				{600 * s, 3, true, 0, 0, 3360 * s, 1}, // sub-window 1 of the hour's leaves at 3960s
			},
		},
		funnelAlgo.name: { // a permit leaks out every 2s, 3min; then every 40s, 3min
			before: []step{
				{0, 4, true, 1, 0, 720 * s, 0},
				{10 * s, 0, true, 5, 0, 710 * s, 0},
				{10 * s, 3, true, 2, 0, 1250 * s, 0},
			},
			after: []step{
				{10 * s, 0, true, 13, 0, 1250 * s, 1},
				{10 * s, 10, true, 3, 0, 3050 * s, 1},
				{600 * s, 7, false, 6, 120 * s, 2460 * s, 1}, // 3 more leaked out of the hour's rate by 600s
				{600 * s, 6, true, 0, 0, 3540 * s, 1},
			},
		},
	}
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		st, ok := steps[a.name]
		if !ok {
			t.Skip("a token bucket's further rates read one log of grants: TestMultiRateTokenBucketSetRate")
		}
		clk := newClock()
		l := a.new(newClient(rdb, clk), uniqueName(t))
		require.NoError(t, l.SetRate(context.Background(), a0))
		runSteps(t, l, clk, a0, st.before)
		require.NoError(t, l.SetRate(context.Background(), b))
		runSteps(t, l, clk, b, st.after)
	})
}

// A token bucket's first rate keeps Redisson's log across SetRate; a
// further rate added to a limiter of one rate starts empty (the grants log
// is kept only while there are several).
func TestMultiRateTokenBucketSetRate(t *testing.T) {
	s := time.Second
	one := Per(5, 10*s)
	two := one.And(PerHour(8))
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		l := newClient(rdb, clk).TokenBucket(uniqueName(t))
		require.NoError(t, l.SetRate(context.Background(), one))
		runSteps(t, l, clk, one, []step{{0, 3, true, 2, 0, 10 * s, 0}})
		require.NoError(t, l.SetRate(context.Background(), two))
		runSteps(t, l, clk, two, []step{
			{0, 0, true, 2, 0, 10 * s, 0},
			{0, 3, false, 2, 10 * s, 10 * s, 0},
			{10 * s, 5, true, 0, 0, 3600 * s, 0},
			{20 * s, 0, true, 3, 0, 3590 * s, 1}, // the hour holds the 5 since SetRate only
			{20 * s, 4, false, 3, 3590 * s, 3590 * s, 1},
		})
	})
}

// A limiter of one rate given a second keeps the first's usage; the second
// starts empty.
func TestMultiRateSetRateAddsARate(t *testing.T) {
	s := time.Second
	one := Per(5, 10*s)
	two := one.And(PerHour(8))
	steps := map[string][]step{
		fixedWindowAlgo.name: {
			{0, 0, true, 2, 0, 10 * s, 0},
			{10 * s, 5, true, 0, 0, 3590 * s, 0},
			{20 * s, 0, true, 3, 0, 3580 * s, 1},
			{20 * s, 4, false, 3, 3580 * s, 3580 * s, 1},
		},
		slidingWindowAlgo.name: {
			{0, 0, true, 2, 0, 10 * s, 0},
			{10 * s, 5, true, 0, 0, 3590 * s, 0},
			{20 * s, 0, true, 3, 0, 3580 * s, 1},
			{20 * s, 4, false, 3, 3580 * s, 3580 * s, 1},
		},
		funnelAlgo.name: { // one leaks out every 2s, and every 450s
			{0, 0, true, 2, 0, 6 * s, 0},
			{10 * s, 5, true, 0, 0, 2250 * s, 0},
			{20 * s, 0, true, 3, 0, 2240 * s, 1},
			{20 * s, 4, false, 3, 440 * s, 2240 * s, 1},
		},
	}
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		st, ok := steps[a.name]
		if !ok {
			t.Skip("TestMultiRateTokenBucketSetRate")
		}
		clk := newClock()
		l := a.new(newClient(rdb, clk), uniqueName(t))
		require.NoError(t, l.SetRate(context.Background(), one))
		runSteps(t, l, clk, one, []step{{0, 3, true, 2, 0, map[bool]time.Duration{true: 6 * s, false: 10 * s}[a.name == funnelAlgo.name], 0}})
		require.NoError(t, l.SetRate(context.Background(), two))
		runSteps(t, l, clk, two, st)
	})
}

// Ties go to the lowest index: a grant is bound by the first of the rates
// with the fewest permits left, a denial by the first of those with the
// longest wait.
func TestMultiRateBoundTies(t *testing.T) {
	s := time.Second
	windows := PerMinute(2).And(PerHour(6))
	funnelCfg := PerMinute(4).And(Config{Rate: 2, Interval: 10 * s, Burst: 4}) // one leaks out every 15s, and every 5s
	for _, c := range []struct {
		a     algo
		cfg   Config
		steps []step
	}{
		{fixedWindowAlgo, windows, []step{
			{0, 2, true, 0, 0, 3600 * s, 0},
			{60 * s, 2, true, 0, 0, 3540 * s, 0},
			{120 * s, 0, true, 2, 0, 3480 * s, 0},
			{3540 * s, 2, true, 0, 0, 60 * s, 0},
			{3540 * s, 1, false, 0, 60 * s, 60 * s, 0},
		}},
		{slidingWindowAlgo, windows, []step{ // sub-windows of 6s and 6min
			{0, 2, true, 0, 0, 3600 * s, 0},
			{60 * s, 2, true, 0, 0, 3540 * s, 0},
			{120 * s, 0, true, 2, 0, 3480 * s, 0},
			{3540 * s, 2, true, 0, 0, 3300 * s, 0}, // the hour's sub-window 9 leaves at 6840s
			{3540 * s, 1, false, 0, 60 * s, 3300 * s, 0},
		}},
		{tokenBucketAlgo, windows, []step{
			{0, 2, true, 0, 0, 3600 * s, 0},
			{60 * s, 2, true, 0, 0, 3600 * s, 0},
			{120 * s, 0, true, 2, 0, 3540 * s, 0},
			{3540 * s, 2, true, 0, 0, 3600 * s, 0},
			{3540 * s, 1, false, 0, 60 * s, 3600 * s, 0},
		}},
		{funnelAlgo, funnelCfg, []step{
			{0, 2, true, 2, 0, 30 * s, 0},
			{0, 1, true, 1, 0, 45 * s, 0},
		}},
	} {
		t.Run(c.a.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
				clk := newClock()
				l := c.a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(c.cfg)
				runSteps(t, l, clk, c.cfg, c.steps)
			})
		})
	}
}

// A reservation's Release gives back in every rate: after 5 of 5 per 10s and 6 per hour,
// 3 back leave 3 and 4, and once the 10s rate is full again the hour's 4
// bind.
func TestMultiRateRelease(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		clk := newClock()
		l := a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(Per(5, 10*time.Second).And(PerHour(6)))
		res, err := l.Reserve(ctx, 5)
		require.NoError(t, err)
		back, err := res.Release(ctx, 3)
		require.NoError(t, err)
		require.Equal(t, int64(3), back)
		for _, c := range []struct {
			at              time.Duration
			remaining       int64
			bound           int
			limit           int64
			window          time.Duration
			remainingReason string
		}{
			{0, 3, 0, 5, 10 * time.Second, "3 back in the 10s rate"},
			{10 * time.Second, 4, 1, 6, time.Hour, "3 back in the hour's too"},
		} {
			clk.Set(epoch.Add(c.at))
			r, err := l.Allow(ctx, 0)
			require.NoError(t, err)
			assert.Equal(t, [4]any{c.remaining, c.bound, c.limit, c.window}, [4]any{r.Remaining, r.Bound, r.Limit, r.Window}, c.remainingReason)
		}
	})
}

// Each client has its own usage in every rate; Reset, a type change and
// Delete reach every client's every rate.
func TestMultiRatePerClient(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		clk := newClock()
		cfg := Config{Type: PerClient, Rate: 2, Interval: time.Minute}.And(PerHour(3))
		x := a.new(newClient(rdb, clk, WithClientID("x")), name)
		y := a.new(newClient(rdb, clk, WithClientID("y")), name)
		require.NoError(t, x.SetRate(ctx, cfg))
		try := func(l *Limiter, want bool, bound int, msg string) {
			t.Helper()
			r, err := l.Allow(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, [2]any{want, bound}, [2]any{r.Allowed, r.Bound}, msg)
		}
		for _, l := range []*Limiter{x, y} {
			try(l, true, 0, "first")
			try(l, true, 0, "second")
			try(l, false, 0, "the minute's rate is full")
		}
		clk.Add(time.Minute)
		for _, l := range []*Limiter{x, y} {
			try(l, true, 1, "a new minute, the hour's last")
			try(l, false, 1, "the hour's rate is full")
		}
		ids, err := x.Clients(ctx)
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"x", "y"}, ids)

		require.NoError(t, x.Reset(ctx))
		for _, l := range []*Limiter{x, y} {
			assertAvailable(t, l, 2, "Reset clears every client's every rate")
			try(l, true, 0, "after Reset")
			try(l, true, 0, "after Reset")
		}
		clk.Add(time.Minute)
		assertAvailable(t, x, 1, "the hour's rate counted again after Reset")

		overall := PerMinute(2).And(PerHour(3))
		require.NoError(t, y.SetRate(ctx, overall))
		for _, l := range []*Limiter{x, y} {
			assertAvailable(t, l, 2, "a type change clears every rate")
		}
		assert.Equal(t, []string{x.Name()}, limiterKeys(t, rdb, name), "every client's keys are gone")
		require.NoError(t, x.SetRate(ctx, cfg))
		try(x, true, 0, "per client again")
		ok, err := y.Delete(ctx)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Empty(t, limiterKeys(t, rdb, name), "Delete removes every client's keys")
	})
}

// A request for more than some rate can ever grant is denied with Never,
// bound by the first such rate (a funnel's capacity is its burst, so not
// always the shorter interval's), and counted nowhere.
func TestMultiRatePermitsAboveALimit(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		cfg := a.tune(PerHour(100), 0, 0).And(a.tune(PerSecond(10), 30, 0))
		quotas := quotasOf(cfg) // a funnel's: 100 per hour, 30 per 3s; the others': 100 per hour, 10 per second
		l := a.new(newClient(rdb, newClock()), uniqueName(t)).WithDefault(cfg)
		var granted int64
		// Until the hour's rate is full again: 36s a permit (a funnel's).
		full := func(granted int64) time.Duration { return time.Duration(granted) * 36 * time.Second }
		for _, permits := range []int64{11, 31, 101, 1 << 40} {
			r, err := l.Allow(ctx, permits)
			if permits <= quotas[1].Limit {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrPermitsExceedRate, "%d", permits)
			}
			bound := 1
			if permits > quotas[0].Limit {
				bound = 0
			}
			if permits <= quotas[1].Limit { // the funnel's 11
				granted += permits
				assert.Equal(t, want(quotas, true, quotas[1].Limit-granted, 0, full(granted), 1), withoutResets(t, r), "%d", permits)
				continue
			}
			assert.Equal(t, want(quotas, false, quotas[1].Limit-granted, Never, full(granted), bound), withoutResets(t, r), "%d", permits)
			_, err = l.TryAcquire(ctx, permits)
			assert.ErrorIs(t, err, ErrPermitsExceedRate, "%d", permits)
		}
		assertAvailable(t, l, quotas[1].Limit-granted, "nothing counted")
	})
}

// Configs that are not one limit. Validate, SetRate, TrySetRate and
// WithDefault refuse each with ErrInvalidConfig (TestBadInputTable).
var contradictingRates = []struct {
	what string
	cfg  Config
}{
	{"no rates: rate 0 with further ones", Config{Interval: time.Second}.And(PerMinute(10))},
	{"a further rate of rate 0", PerSecond(10).And(Config{Interval: time.Minute})},
	{"a further rate without an interval", PerSecond(10).And(Config{Rate: 100})},
	{"a further rate of 1.5ms", PerSecond(10).And(Config{Rate: 1, Interval: 1500 * time.Microsecond})},
	{"a duplicate interval", PerSecond(10).And(PerSecond(20))},
	{"a duplicate interval, not next to it", PerSecond(10).And(PerHour(500), Per(20, time.Second))},
	{"a longer interval with fewer permits", PerSecond(10).And(PerMinute(5))},
	{"a longer interval with as many permits", PerSecond(10).And(PerMinute(10))},
	{"a shorter interval after, with more permits", PerMinute(10).And(PerSecond(20))},
	{"a contradiction between further rates", PerSecond(1).And(PerHour(50), PerMinute(60))},
	{"a further rate of another type", PerSecond(10).And(Config{Type: PerClient, Rate: 100, Interval: time.Minute})},
	{"a further rate of an unknown type", PerSecond(10).And(Config{Type: 7, Rate: 100, Interval: time.Minute})},
	{"a further rate with a keep-alive of its own", Config{Rate: 10, Interval: time.Second, KeepAlive: time.Hour}.And(Config{Rate: 100, Interval: time.Minute, KeepAlive: 2 * time.Hour})},
	{"a further rate with a keep-alive the first lacks", PerSecond(10).And(Config{Rate: 100, Interval: time.Minute, KeepAlive: time.Hour})},
	{"a keep-alive shorter than a further rate's interval", Config{Rate: 10, Interval: time.Second, KeepAlive: time.Minute}.And(PerHour(100))},
	{"a further rate holding rates", Config{Rate: 10, Interval: time.Second, More: []Config{{Rate: 100, Interval: time.Minute, More: []Config{PerHour(1000)}}}}},
	{"five rates", PerSecond(1).And(PerMinute(60), PerHour(3600), Per(86_400, 24*time.Hour), Per(604_800, 7*24*time.Hour))},
	{"a further rate's burst negative", PerSecond(10).And(Config{Rate: 100, Interval: time.Minute, Burst: -1})},
	{"a further rate's buckets too many", PerSecond(10).And(Config{Rate: 100, Interval: time.Minute, Buckets: 1001})},
}

func TestMultiRateValidation(t *testing.T) {
	for _, c := range contradictingRates {
		assert.ErrorIs(t, c.cfg.validate(), ErrInvalidConfig, c.what)
	}
	for _, cfg := range []Config{
		PerSecond(10).And(PerHour(1000)),
		PerHour(1000).And(PerSecond(10)),
		PerSecond(1).And(PerMinute(60), PerHour(3600), Per(86_400, 24*time.Hour)),
		Config{Type: PerClient, Rate: 10, Interval: time.Second, KeepAlive: time.Hour}.And(Config{Type: PerClient, Rate: 100, Interval: time.Minute, KeepAlive: time.Hour}),
		Config{Type: PerClient, Rate: 10, Interval: time.Second, KeepAlive: time.Hour}.And(PerHour(100)),
	} {
		assert.NoError(t, cfg.validate(), "%v", cfg)
	}
	// A field only one algorithm reads is refused in a further rate too.
	for _, a := range algorithms {
		l := a.new(New(redis.NewClient(&redis.Options{})), "x")
		for _, more := range []Config{{Rate: 100, Interval: time.Minute, Burst: 200}, {Rate: 100, Interval: time.Minute, Buckets: 6}} {
			err := l.Validate(PerSecond(10).And(more))
			if a.reads(more) {
				assert.NoError(t, err, "%s %v", a.name, more)
			} else {
				assert.ErrorIs(t, err, ErrInvalidConfig, "%s %v", a.name, more)
			}
		}
	}
}

func TestConfigAnd(t *testing.T) {
	first := PerSecond(10)
	two := first.And(PerHour(1000))
	three := two.And(PerMinute(100))
	assert.Nil(t, first.More, "And leaves its receiver alone")
	assert.Len(t, two.More, 1)
	assert.Equal(t, []Config{PerHour(1000), PerMinute(100)}, three.More)
	assert.Equal(t, three, first.And(PerHour(1000).And(PerMinute(100))), "a further rate's own rates are flattened in")
	assert.Equal(t, "10 per 1s and 1000 per 1h0m0s and 100 per 1m0s", three.String())
	assert.Equal(t, "10 per 1s per client and 100 per 1m0s", Config{Type: PerClient, Rate: 10, Interval: time.Second}.And(Config{Type: PerClient, Rate: 100, Interval: time.Minute}).String())
	assert.Equal(t, first, first.And())
}

// A bad config sent to a limiter holding several rates in use changes
// nothing, byte for byte.
func TestMultiRateBadConfigChangesNothing(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		l := a.new(newClient(rdb, newClock()), name)
		cfg := Per(5, 10*time.Second).And(PerHour(50))
		require.NoError(t, l.SetRate(ctx, cfg))
		_, err := l.Allow(ctx, 3)
		require.NoError(t, err)
		before := snapshot(t, rdb, name)
		for _, c := range contradictingRates {
			assert.ErrorIs(t, l.Validate(c.cfg), ErrInvalidConfig, c.what)
			assert.ErrorIs(t, l.SetRate(ctx, c.cfg), ErrInvalidConfig, c.what)
			_, err := l.TrySetRate(ctx, c.cfg)
			assert.ErrorIs(t, err, ErrInvalidConfig, c.what)
			_, err = l.WithDefault(c.cfg).Allow(ctx, 1)
			assert.ErrorIs(t, err, ErrInvalidConfig, c.what)
		}
		assert.Equal(t, before, snapshot(t, rdb, name))
		assertConfig(t, l, cfg)
	})
}

// The token bucket's grants log coalesces each further rate's grants by
// slices of its interval (Interval / 64) and drops the rate's records out of
// its window with each new one: it never holds more than 65 records a rate,
// however many grants its window holds.
func TestMultiRateGrantsLogStaysBounded(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		l := newClient(rdb, clk).TokenBucket(uniqueName(t)).WithDefault(PerSecond(5).And(PerMinute(100)))
		grants := wire.KeyOf(l.Name(), "grants")
		most := int64(0)
		for i := range 600 { // one grant every 700ms for 7 minutes
			clk.Set(epoch.Add(time.Duration(i) * 700 * time.Millisecond))
			r, err := l.Allow(ctx, 1)
			require.NoError(t, err)
			require.True(t, r.Allowed, "grant %d", i)
			n, err := rdb.ZCard(ctx, grants).Result()
			require.NoError(t, err)
			most = max(most, n)
		}
		// A minute holds 86 grants at one per 700ms, in slices of 938ms.
		assert.Equal(t, int64(65), most, "slices + 1, where one record a grant would be 86")
	})
}
