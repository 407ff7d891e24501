package redlimit

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// The funnel is exact GCRA for every rate validation accepts, whether or not
// Interval / Rate is a whole microsecond (issue 24, item 2).

// reservation is a grant the model can give back: its reservation, and
// when it started to drain.
type reservation struct {
	res     Reservation
	at, now int64
}

// funnelEvent is what one call did at µs at: a grant or a denial of n
// permits, or a release, which gave back back[k] in rate k.
type funnelEvent struct {
	at, n  int64
	denied bool
	back   []int64
}

// checkFunnelBounds checks GCRA's guarantee on one client's events, grants
// net of releases, in order. For each rate: over any span from an event to
// a grant, no more than Burst + Rate × span / Interval. And a denied request
// (of at most every Burst) would have passed that bound for some rate in
// some span ending at it: grants fall short of the bound by less than one
// request.
func checkFunnelBounds(t *testing.T, cfg Config, events []funnelEvent, what string) {
	t.Helper()
	var rates []*exactRate
	for _, r := range cfg.rates() {
		rates = append(rates, newExactRate(r))
	}
	// net is what event i counts in rate k; within, whether sum permits over
	// span µs keep to rate k's bound: sum × Interval ≤ Burst × Interval + Rate × span.
	net := func(i, k int) int64 {
		if events[i].back != nil {
			return -events[i].back[k]
		}
		return events[i].n
	}
	within := func(k int, sum, span int64) bool {
		r := rates[k]
		lhs := new(big.Int).Mul(big.NewInt(sum), big.NewInt(r.intervalUS))
		rhs := new(big.Int).Mul(big.NewInt(r.burst), big.NewInt(r.intervalUS))
		rhs.Add(rhs, new(big.Int).Mul(big.NewInt(r.rate), big.NewInt(span)))
		return lhs.Cmp(rhs) <= 0
	}
	smallest := rates[0].burst
	for _, r := range rates {
		smallest = min(smallest, r.burst)
	}
	for j, e := range events {
		switch {
		case e.denied && e.n <= smallest:
			over := false
			for k := range rates {
				sum := e.n
				for i := j - 1; i >= 0 && !over; i-- {
					if !events[i].denied {
						sum += net(i, k)
						over = !within(k, sum, e.at-events[i].at)
					}
				}
			}
			if !over {
				t.Fatalf("%s: event %d: %d permits at %dµs denied, though they would keep to every rate's bound", what, j, e.n, e.at)
			}
		case !e.denied && e.back == nil:
			for k, r := range rates {
				sum := int64(0)
				for i := j; i >= 0; i-- {
					if !events[i].denied {
						sum += net(i, k)
						if !within(k, sum, e.at-events[i].at) {
							t.Fatalf("%s: rate %d: %d permits granted in %dµs (events %d..%d), above burst %d + %d × span / %dµs",
								what, k, sum, e.at-events[i].at, i, j, r.burst, r.rate, r.intervalUS)
						}
					}
				}
			}
		}
	}
}

// funnelAnswer is the model's Result for permits at now, as these tests
// compare it: Limit the first rate's capacity, and neither Window nor the
// several rates' Bound and Quotas (the multi-rate suite checks those; a
// Window here can pass int64 in ms).
func funnelAnswer(m *limiterModel, now, permits int64) Result {
	r := m.allow(now, permits)
	r.Limit, r.Window, r.Bound, r.Quotas = m.quotas[0].Limit, 0, 0, nil
	return r
}

// funnelCase is a config the property test plays, and the most permits
// its requests take: the smallest burst.
type funnelCase struct {
	name string
	cfg  Config
	most int64
}

func newFunnelCase(name string, cfg Config) (funnelCase, bool) {
	c := funnelCase{name: name, cfg: cfg, most: 1 << 62}
	for _, r := range cfg.rates() {
		c.most = min(c.most, r.withDefaults().Burst)
	}
	return c, cfg.validate() == nil
}

// logUniform draws from lo..hi, small numbers as likely as large ones.
func logUniform(rng *rand.Rand, lo, hi int64) int64 {
	bits := 1 + rng.IntN(63)
	return min(hi, lo+rng.Int64N(max(1, min(hi-lo+1, int64(1)<<(bits-1)))))
}

// randomFunnelCase draws a valid config: any interval up to the longest,
// any rate whose emission interval is 1µs at least, any burst validation
// accepts; sometimes a second, longer rate.
func randomFunnelCase(rng *rand.Rand) funnelCase {
	for {
		intervalMS := logUniform(rng, 1, maxInterval.Milliseconds())
		cfg := Per(logUniform(rng, 1, intervalMS*1000), time.Duration(intervalMS)*time.Millisecond)
		if rng.IntN(2) == 0 {
			cfg.Burst = logUniform(rng, 1, maxTolerance/ceilDiv(intervalMS*1000, cfg.Rate))
		}
		if rng.IntN(4) == 0 {
			k := 2 + rng.Int64N(8)
			if long := cfg.Interval * time.Duration(k); long <= maxInterval {
				more := Config{Rate: cfg.Rate + 1 + rng.Int64N(cfg.Rate*(k-1)), Interval: long}
				if rng.IntN(2) == 0 {
					more.Burst = logUniform(rng, 1, cfg.withDefaults().Burst*k)
				}
				cfg = cfg.And(more)
			}
		}
		if c, ok := newFunnelCase(cfg.String(), cfg); ok {
			return c
		}
	}
}

// namedFunnelCases: the issue's rates, a whole emission interval, and the
// extremes where the script's arithmetic takes its longer roads (m × the
// remainder of the emission interval, or what the funnel holds in 1/rate
// µs, past 2^52).
func namedFunnelCases() []funnelCase {
	var cases []funnelCase
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"PerSecond(750000)", PerSecond(750_000)},
		{"PerSecond(600000)", PerSecond(600_000)},
		{"PerMinute(40000000)", PerMinute(40_000_000)},
		{"whole emission", Config{Rate: 1000, Interval: time.Second, Burst: 3000}},
		{"3 per 10s, burst 7", Config{Rate: 3, Interval: 10 * time.Second, Burst: 7}},
		{"burst below rate", Config{Rate: 1_000_003, Interval: time.Hour, Burst: 17}},
		{"PerDay(123456791)", Per(123_456_791, 24*time.Hour)},
		{"emission just above 1µs, burst 2^51", Config{Rate: maxInterval.Microseconds() - 12345, Interval: maxInterval, Burst: 1 << 51}},
		{"two rates", PerSecond(600_000).And(Config{Rate: 7_000_001, Interval: 13 * time.Second, Burst: 900_000})},
	} {
		fc, ok := newFunnelCase(c.name, c.cfg)
		if !ok {
			panic("invalid named funnel case " + c.name)
		}
		cases = append(cases, fc)
	}
	return cases
}

// persistHook has every script's keys lose their expiry in the script's
// own transaction: real Redis ages expiries in real time while the
// controlled clock, the limiters', stands nearly still or leaps, so a state
// could vanish before the clock says it is empty (a key of 1ms, then a
// stall on a busy machine). A state the clock has drained reads as empty
// all the same, so nothing else changes.
type persistHook struct {
	passHook
	tx  redis.UniversalClient // a client without the hook
	off *atomic.Bool          // nil or false: on
}

func (h persistHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		n, ok := any(nil), false
		if cmd.Name() == "evalsha" && len(args) > 2 {
			n, ok = args[2], true
		}
		keys, isInt := n.(int)
		if !ok || !isInt || len(args) < 3+keys || h.off != nil && h.off.Load() {
			return next(ctx, cmd)
		}
		_, err := h.tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			_ = p.Process(ctx, cmd)
			for _, key := range args[3 : 3+keys] {
				p.Persist(ctx, fmt.Sprint(key))
			}
			return nil
		})
		if cmd.Err() != nil {
			return cmd.Err()
		}
		return err
	}
}

// persisting returns a client to rdb's server whose scripts' keys never
// expire (persistHook) unless off says so.
func persisting(t *testing.T, rdb redis.UniversalClient, off *atomic.Bool) redis.UniversalClient {
	c := cloneClient(t, rdb)
	c.AddHook(persistHook{tx: cloneClient(t, rdb), off: off})
	return c
}

// playFunnel plays calls random requests of c against a fresh limiter on a
// controlled clock, checking every reply against the exact model, then
// GCRA's bounds on what was granted. Modes: the config as a default (a
// flat state) or stored (hash fields), Overall or PerClient with two
// clients; releases now and then.
func playFunnel(t *testing.T, rdb redis.UniversalClient, rng *rand.Rand, c funnelCase, calls int) {
	ctx := context.Background()
	clk := newClock()
	cfg := c.cfg
	perClient := rng.IntN(4) == 0
	if perClient {
		cfg.Type = PerClient
	}
	l := newClient(rdb, clk).Funnel(uniqueName(t)).WithDefault(cfg)
	stored := rng.IntN(3) == 0
	if stored {
		require.NoError(t, l.SetRate(ctx, cfg))
	}
	clients := []string{""}
	if perClient {
		clients = []string{"a", "b"}
	}
	models := map[string]*limiterModel{}
	events := map[string][]funnelEvent{}
	reserved := map[string]reservation{}
	for _, id := range clients {
		models[id] = newLimiterModel(funnelAlgo, cfg)
	}
	first := newExactRate(cfg)
	what := fmt.Sprintf("%s (stored %t, per client %t)", c.name, stored, perClient)
	// The clock moves on a few years at most in all: the µs since the
	// epoch, plus a tolerance, stay below 2^53.
	const longest = int64(time.Hour * 24 * 365 / 16 / time.Microsecond)
	for call := range calls {
		var permits int64
		switch rng.IntN(16) {
		case 0:
			permits = 0 // a peek
		case 1:
			permits = c.most + 1 + rng.Int64N(3) // more than some burst: never
		case 2:
			permits = c.most
		default:
			permits = logUniform(rng, 1, c.most)
		}
		// Up to twice the request's emission intervals, or the burst's.
		span := ceilRat(first.emission(2 * max(permits, 1)))
		switch rng.IntN(8) {
		case 0: // the same instant
		case 1:
			span = ceilRat(first.emission(2 * first.burst))
			fallthrough
		default:
			clk.Add(time.Duration(rng.Int64N(min(span, longest)+1)) * time.Microsecond)
		}
		id := clients[rng.IntN(len(clients))]
		h, m := l, models[id]
		if perClient {
			h = l.AsClient(id)
		}
		now := clk.Now().UnixMicro()
		msg := fmt.Sprintf("%s: call %d at %dµs", what, call, now-epoch.UnixMicro())
		if last := reserved[id]; rng.IntN(10) == 0 && last.res.Taken > 0 {
			// A release of the latest reservation, of up to a little more
			// than it took.
			permits = logUniform(rng, 1, last.res.Taken+2)
			back, err := last.res.Release(ctx, permits)
			require.NoError(t, err, msg)
			gave := m.release(now, permits, last.at, last.res.Taken)
			require.Equal(t, slices.Min(gave), back, "%s: a release of %d", msg, permits)
			events[id] = append(events[id], funnelEvent{at: now, back: gave})
			reserved[id] = reservation{}
			continue
		}
		since := m.since(now)
		var got Result
		var err error
		if rng.IntN(2) == 0 && permits > 0 {
			var res Reservation
			res, err = h.Reserve(ctx, permits)
			if errors.Is(err, ErrPermitsExceedRate) {
				err = nil
			}
			got = res.Result
			if res.Taken > 0 {
				reserved[id] = reservation{res: res, at: since, now: now}
			}
		} else {
			got, err = allowAny(ctx, h, permits)
		}
		require.NoError(t, err, msg)
		want := funnelAnswer(m, now, permits)
		if len(m.rates) > 1 {
			// Limit is the binding rate's (Bound); which one binds is not
			// this test's to check.
			require.Equal(t, m.quotas[got.Bound].Limit, got.Limit, msg)
			got.Limit = want.Limit
		}
		got.Window, got.Bound, got.Quotas = 0, 0, nil
		require.Equal(t, want, got, "%s: %d permits", msg, permits)
		if permits > 0 {
			events[id] = append(events[id], funnelEvent{at: now, n: permits, denied: !got.Allowed})
		}
	}
	for _, id := range clients {
		checkFunnelBounds(t, cfg, events[id], fmt.Sprintf("%s, client %q", what, id))
	}
}

func TestFunnelExactProperty(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		rdb := connect()
		if !strings.HasSuffix(t.Name(), "/miniredis") { // whose expiries age only when told
			rdb = persisting(t, rdb, nil)
		}
		rng := rand.New(rand.NewPCG(24, 2)) // the same draws on every backend
		cases := namedFunnelCases()
		for range 24 {
			cases = append(cases, randomFunnelCase(rng))
		}
		for _, c := range cases {
			playFunnel(t, rdb, rng, c, 80)
		}
	})
}

// issueClient plays the issue's client: a 1,000-permit request every 100µs
// from 0 to 10s (the last at 9,999.9ms). It skips the ticks before a
// denial's RetryAfter has passed, which would be denied too (RetryAfter is
// exact), and returns the permits granted.
func issueClient(t *testing.T, allow func(atUS int64) (bool, time.Duration)) int64 {
	var granted int64
	for at := int64(0); at < 10_000_000; {
		ok, retry := allow(at)
		switch {
		case ok:
			granted += 1000
			at += 100
		case retry > 0:
			at += ceilDiv(retry.Microseconds(), 100) * 100
		default:
			t.Fatalf("denied at %dµs with RetryAfter %v", at, retry)
		}
	}
	return granted
}

// The issue's three cases (issue 24, item 2), on real Redis, where it was
// found: the figures a floored emission interval granted, from a model of
// that arithmetic, then the library's, exactly the model's. (Not on
// miniredis: it compiles the script on every call, and these 80,000 calls
// would take a minute there; TestFunnelExactProperty plays these rates on it.)
func TestFunnelExactIssueRates(t *testing.T) {
	// Until the funnels hold a second, their keys are made to last (see
	// persistHook); from then on, each grant gives its key a second or more.
	var held atomic.Bool
	rdb := persisting(t, redistest.Shared(t).Client(t), &held)
	for _, c := range []struct {
		name          string
		cfg           Config
		floored, want int64
	}{
		// A permit every 4/3µs: 750,000 at once, then 1,000 every 4/3ms.
		{"PerSecond(750000)", PerSecond(750_000), 10_749_000, 8_249_000},
		// Every 5/3µs: 600,000 at once, then 1,000 every 5/3ms.
		{"PerSecond(600000)", PerSecond(600_000), 10_599_000, 6_599_000},
		// Every 1.5µs: 40,000,000 at once (in 60s), then 1,000 every 1.5ms.
		{"PerMinute(40000000)", PerMinute(40_000_000), 49_999_000, 46_666_000},
	} {
		t.Run(c.name, func(t *testing.T) {
			model := func(emission *exactRate) func(int64) (bool, time.Duration) {
				f := &limiterModel{rates: []rateModel{&funnelModel{emission}}, quotas: []Quota{{Limit: emission.burst}}}
				return func(at int64) (bool, time.Duration) {
					r := f.allow(at, 1000)
					return r.Allowed, r.RetryAfter
				}
			}
			r := newExactRate(c.cfg)
			floored := &exactRate{rate: 1, intervalUS: r.intervalUS / r.rate, burst: r.burst}
			assert.Equal(t, c.floored, issueClient(t, model(floored)), "a floored emission interval")
			assert.Equal(t, c.want, issueClient(t, model(r)), "exact GCRA")

			// GCRA's ceiling at the last grant: Burst + Rate × span / Interval.
			ceiling := new(big.Rat).Add(big.NewRat(r.burst, 1), big.NewRat(r.rate*9_999_900, r.intervalUS))
			assert.True(t, big.NewRat(c.want, 1).Cmp(ceiling) <= 0 && big.NewRat(c.want+1000, 1).Cmp(ceiling) > 0,
				"%d granted, ceiling %v", c.want, ceiling.FloatString(1))

			clk := newClock()
			l := newClient(rdb, clk).Funnel(uniqueName(t)).WithDefault(c.cfg)
			held.Store(false)
			got := issueClient(t, func(at int64) (bool, time.Duration) {
				clk.Set(epoch.Add(time.Duration(at) * time.Microsecond))
				res, err := l.Allow(context.Background(), 1000)
				require.NoError(t, err)
				held.Store(res.ResetAfter >= time.Second)
				return res.Allowed, res.RetryAfter
			})
			assert.Equal(t, c.want, got)
		})
	}
}

// A TAT as scripts before remainders wrote it (a plain integer) reads with
// remainder 0, in a flat state and in the config hash; a remainder of
// another rate's rounds the TAT up; anything else is corrupt, and left as
// it is.
func TestFunnelReadsEarlierStates(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		rdb := connect()
		us := time.Microsecond
		cfg := PerSecond(600_000) // a permit every 5/3µs; full: 1s
		now := epoch.UnixMicro()
		for _, stored := range []bool{false, true} {
			clk := newClock()
			l := newClient(rdb, clk).Funnel(uniqueName(t)).WithDefault(cfg)
			if stored {
				require.NoError(t, l.SetRate(ctx, cfg))
			}
			set := func(value string) { funnelAlgo.setState(rdb, l, value) }
			if !stored {
				require.NoError(t, rdb.Set(ctx, l.Name(), "", 0).Err()) // where setState writes a flat state
			}
			read := func() string { return overallField(rdb.(*redis.Client), l.Name(), "tat").Val() }

			set(fmt.Sprint(now + 1_000_000)) // full
			got, err := l.Allow(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, Result{Limit: 600_000, RetryAfter: 2 * us, ResetAfter: time.Second, Window: time.Second}, got, "stored %t", stored)
			clk.Add(2 * us) // 1/3µs to spare: TAT now + 1s − 2µs + 5/3µs
			got, err = l.Allow(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, Result{Allowed: true, Limit: 600_000, ResetAfter: time.Second, Window: time.Second}, got, "stored %t", stored)
			assert.Equal(t, fmt.Sprintf("%d,400000", now+1_000_001), read(), "stored %t", stored)

			// 700,000 of 1/600,000µs: another rate's remainder, rounded up to 1µs.
			set(fmt.Sprintf("%d,700000", now+500_000))
			got, err = l.Allow(ctx, 0)
			require.NoError(t, err)
			assert.Equal(t, 500_001*us-2*us, got.ResetAfter, "stored %t", stored)
			assert.Equal(t, int64(300_000), got.Remaining, "(1s − 499,999µs) / 5/3µs")

			for _, bad := range []string{"x", "-5", "1.5", "1e3", "1,x", "1,2,3", ",5", "99999999999999999999"} {
				set(bad)
				_, err := l.Allow(ctx, 1)
				assert.ErrorIs(t, err, ErrCorruptState, "%q, stored %t", bad, stored)
				assert.Equal(t, bad, read(), "left as it was")
			}
		}
	})
}

// A flat state with a remainder becomes the config hash's field as it is
// when SetRate stores a config, and reads the same there.
func TestFunnelRemainderAcrossSetRate(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		rdb := connect()
		clk := newClock()
		cfg := PerSecond(750_000).And(Config{Rate: 7_000_001, Interval: 13 * time.Second})
		l := newClient(rdb, clk).Funnel(uniqueName(t)).WithDefault(cfg)
		model := newLimiterModel(funnelAlgo, cfg)
		step := func(permits int64) {
			t.Helper()
			got, err := allowAny(ctx, l, permits)
			require.NoError(t, err)
			got.Window, got.Bound, got.Quotas = 0, 0, nil
			require.Equal(t, funnelAnswer(model, clk.Now().UnixMicro(), permits), got)
		}
		step(200_001)
		clk.Add(3 * time.Microsecond)
		step(1)
		flat, err := rdb.Get(ctx, l.Name()).Result()
		require.NoError(t, err)
		require.NoError(t, l.SetRate(ctx, cfg))
		tat := rdb.HMGet(ctx, l.Name(), "tat", "tat2").Val()
		assert.Equal(t, flat, fmt.Sprint(tat[0])+";"+fmt.Sprint(tat[1]), "the fields hold the flat state's parts")
		assert.Contains(t, flat, ",", "with remainders")
		clk.Add(time.Millisecond)
		step(999_999)
		step(1000)
	})
}

// A TAT beyond a full funnel (left by a rate decrease) is clamped to a full
// one, remainder and all: here 1,000,001⅔µs, so that 3 permits (5µs) wait
// 5µs, not 6.
func TestFunnelClampKeepsTheRemainder(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		rdb := connect()
		cfg := Config{Rate: 600_000, Interval: time.Second, Burst: 600_001}
		l := newClient(rdb, newClock()).Funnel(uniqueName(t))
		require.NoError(t, l.SetRate(ctx, cfg))
		now := epoch.UnixMicro()
		for _, tat := range []string{fmt.Sprintf("%d,500000", now+1_000_001), fmt.Sprint(now + 5_000_000)} {
			funnelAlgo.setState(rdb, l, tat)
			got, err := l.Allow(ctx, 3)
			require.NoError(t, err)
			assert.Equal(t, Result{Limit: 600_001, RetryAfter: 5 * time.Microsecond, ResetAfter: 1_000_002 * time.Microsecond, Window: 1001 * time.Millisecond}, got, tat)
		}
	})
}
