package redlimit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Leases across real processes, on a real Redis and Cluster: three
// processes of 64 callers lease from one limiter at its limit, each grant
// stamped with the wall clock around its call (the machine's one clock,
// which Redis TIME reads too), and every span is checked against the bound
// lease.go states; and a holder killed with SIGKILL, whose permits come back
// as any grant's do.

// leaseSpec is what a child is told.
type leaseSpec struct {
	Addrs       []string
	Cluster     bool
	Algorithm   string
	Name        string
	Lease       Lease
	Hold        bool  // take a block, say so, and wait to be killed
	Start, Stop int64 // wall µs
}

// leaseReport is what a child says: its grants' stamps, [before, after]
// its call in wall µs, and its lease's figures.
type leaseReport struct {
	Grants   [][2]int64
	Denied   int
	Errors   []string
	Stats    LeaseStats
	Decided  int
	Duration time.Duration
}

// leaseChild is a child of TestLeaseAcrossProcesses, which reports a
// leaseReport, and of TestLeaseHolderKilled, which kills it holding.
func leaseChild(t *testing.T, raw []byte) any {
	var spec leaseSpec
	decodeSpec(t, raw, &spec)
	a, ok := algorithmNamed(spec.Algorithm)
	require.True(t, ok)
	var rdb redis.Scripter
	if spec.Cluster {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: spec.Addrs, PoolSize: 64})
		defer cc.Close()
		rdb = cc
	} else {
		c := redis.NewClient(&redis.Options{Addr: spec.Addrs[0], PoolSize: 64})
		defer c.Close()
		rdb = c
	}
	ctx := context.Background()
	l := a.new(New(rdb), spec.Name).WithLease(spec.Lease)
	if spec.Hold {
		// Early in a second, so that a 1 s window the block counts in is
		// still the current one when the parent looks, after the kill.
		if into := time.Since(time.Now().Truncate(time.Second)); into > 300*time.Millisecond {
			time.Sleep(time.Second - into)
		}
		for range 2 {
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok)
		}
		fmt.Println("holding", l.LeaseStats().Taken)
		time.Sleep(time.Minute)
		return nil
	}
	_, err := l.Allow(ctx, 0) // loads the script and the cluster slots
	require.NoError(t, err)
	time.Sleep(time.Until(time.UnixMicro(spec.Start)))
	var mu sync.Mutex
	report := leaseReport{}
	began := time.Now()
	hammer(ctx, 64, func(g, n int) bool {
		before := time.Now().UnixMicro()
		if before >= spec.Stop {
			return true
		}
		r, err := l.Allow(ctx, 1)
		after := time.Now().UnixMicro()
		mu.Lock()
		defer mu.Unlock()
		report.Decided++
		switch {
		case err != nil:
			if len(report.Errors) < 5 {
				report.Errors = append(report.Errors, err.Error())
			}
		case r.Allowed:
			report.Grants = append(report.Grants, [2]int64{before, after})
		default:
			report.Denied++
		}
		return false
	})()
	report.Duration = time.Since(began)
	require.NoError(t, l.Close(ctx))
	report.Stats = l.LeaseStats()
	return report
}

// leaseBound is, per algorithm, the config the tests lease from and how far
// grants stamped [before, after] (sorted by before) pass its bound with
// lease time d. A grant is counted in a span only when its whole stamp lies
// inside: a count that can only be too low, so a breach is a breach.
var leaseBound = map[string]struct {
	cfg  Config
	over func(grants [][2]int64, d time.Duration) (worst int, at int64)
	// most is what the limit itself grants from the first grant (µs) to
	// stop when demand always exceeds it, leaving out the refills of the
	// last 250 ms (a block taken then may not be used before the stop, if
	// the machine stalls the callers a moment):
	// under-admission is the shortfall.
	most func(first, stop int64) int
}{
	// No window grants more than Rate.
	"fixed_window": {PerSecond(200), func(g [][2]int64, d time.Duration) (int, int64) {
		return spanOver(g, func(x int64) (int64, int64) { s := x - x%1_000_000; return s, s + 1_000_000 }, func(int64, int64) int { return 200 })
	}, func(first, stop int64) int { return int((stop-250_000)/1_000_000-first/1_000_000+1) * 200 }},
	// No span of Interval × (buckets − 1) / buckets − d grants more than Rate.
	"sliding_window": {Config{Rate: 200, Interval: time.Second, Buckets: 10}, func(g [][2]int64, d time.Duration) (int, int64) {
		span := 900_000 - d.Microseconds()
		return spanOver(g, func(x int64) (int64, int64) { return x, x + span }, func(int64, int64) int { return 200 })
	}, func(first, stop int64) int {
		// The first sub-window's 200 come back whole every ten sub-windows.
		k := first / 100_000
		return int(((stop-250_000)/100_000-k)/10+1) * 200
	}},
	// No span of Interval − d grants more than Rate.
	"tokenbucket": {PerSecond(200), func(g [][2]int64, d time.Duration) (int, int64) {
		span := 1_000_000 - d.Microseconds()
		return spanOver(g, func(x int64) (int64, int64) { return x, x + span }, func(int64, int64) int { return 200 })
	}, func(first, stop int64) int { return int((stop-250_000-first)/1_000_000+1) * 200 }},
	// No span of t grants more than Burst + Rate × (t + d) / Interval.
	"funnel": {Config{Rate: 200, Interval: time.Second, Burst: 20}, func(g [][2]int64, d time.Duration) (int, int64) {
		worst, at := 0, int64(0)
		for i := range g {
			for j := i; j < len(g); j++ {
				from, to := g[i][0], g[j][1]
				n := 0
				for k := i; k <= j; k++ {
					if g[k][0] >= from && g[k][1] <= to {
						n++
					}
				}
				if o := n - 20 - int((to-from+d.Microseconds())*200/1_000_000); o > worst {
					worst, at = o, from
				}
			}
		}
		return worst, at
	}, func(first, stop int64) int { return 20 + int((stop-first)*200/1_000_000) }},
}

// spanOver returns how far the grants inside the span starting at each
// grant's stamp (span gives its ends) pass limit, and where.
func spanOver(g [][2]int64, span func(x int64) (int64, int64), limit func(from, to int64) int) (worst int, at int64) {
	for i := range g {
		from, to := span(g[i][0])
		n := 0
		for k := i; k < len(g) && g[k][0] < to; k++ {
			if g[k][0] >= from && g[k][1] < to {
				n++
			}
		}
		if o := n - limit(from, to); o > worst {
			worst, at = o, from
		}
	}
	return worst, at
}

func TestLeaseAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes for ~25s")
	}
	const d = 100 * time.Millisecond
	for _, b := range concBackends {
		t.Run(b.name, func(t *testing.T) {
			addrs, rdb, tags := b.setup(t)
			for _, a := range algorithms {
				t.Run(a.name, func(t *testing.T) {
					bound := leaseBound[a.name]
					name := tags[0] + uniqueName(t)
					require.NoError(t, a.new(New(rdb), name).SetRate(context.Background(), bound.cfg))
					start := time.Now().Add(time.Second)
					spec := leaseSpec{Addrs: addrs, Cluster: b.name == "cluster", Algorithm: a.name, Name: name,
						Lease: Lease{Time: d, Share: 0.2}, Start: start.UnixMicro(), Stop: start.Add(2 * time.Second).UnixMicro()}
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					var all leaseReport
					for _, r := range runChildren[leaseReport](ctx, t, "lease", []any{spec, spec, spec}, nil) {
						all.Grants = append(all.Grants, r.Grants...)
						all.Denied += r.Denied
						all.Decided += r.Decided
						all.Errors = append(all.Errors, r.Errors...)
						all.Stats.Calls += r.Stats.Calls
						all.Stats.Taken += r.Stats.Taken
						all.Stats.Used += r.Stats.Used
						all.Stats.Returned += r.Stats.Returned
					}
					require.Empty(t, all.Errors)
					slices.SortFunc(all.Grants, func(x, y [2]int64) int { return int(x[0] - y[0]) })
					worst, at := bound.over(all.Grants, d)
					require.NotEmpty(t, all.Grants)
					ideal := bound.most(all.Grants[0][0], spec.Stop)
					t.Logf("%d decisions, %d granted (%d%% of the %d the limit allows in the run's 2 s but its last 250 ms), %d denied; leases: %d calls, %d taken, %d used, %d returned",
						all.Decided, len(all.Grants), 100*len(all.Grants)/ideal, ideal, all.Denied, all.Stats.Calls, all.Stats.Taken, all.Stats.Used, all.Stats.Returned)
					assert.Zero(t, worst, "grants past the bound, in the span from %v", time.UnixMicro(at))
					assert.Greater(t, all.Denied, len(all.Grants), "demand exceeded the limit")
					// Under demand that never stops, a block is used as soon as
					// it is taken: what is lost is at most what the three held
					// when the run stopped, a cap each.
					limit := bound.cfg.Rate
					if bound.cfg.Burst > 0 {
						limit = bound.cfg.Burst
					}
					assert.GreaterOrEqual(t, len(all.Grants), ideal-3*int(float64(limit)*spec.Lease.Share), "under-admission")
					assert.Equal(t, int64(len(all.Grants)), all.Stats.Used, "every grant came from a lease")
				})
			}
		})
	}
}

// A holder killed with SIGKILL gives nothing back: its block counts in
// Redis as any grant does, until its window passes, and then is free.
func TestLeaseHolderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	for _, b := range concBackends {
		t.Run(b.name, func(t *testing.T) {
			addrs, rdb, tags := b.setup(t)
			for _, a := range algorithms {
				t.Run(a.name, func(t *testing.T) {
					ctx := context.Background()
					cfg := leaseBound[a.name].cfg
					if a.name == "funnel" {
						// Its block of 11 drains in 550 ms, not 55: still
						// counting when the parent looks.
						cfg = Config{Rate: 200, Interval: 10 * time.Second, Burst: 20}
					}
					name := tags[0] + uniqueName(t)
					l := a.new(New(rdb), name)
					require.NoError(t, l.SetRate(ctx, cfg))
					spec := leaseSpec{Addrs: addrs, Cluster: b.name == "cluster", Algorithm: a.name, Name: name,
						Hold: true, Lease: Lease{Time: time.Hour, Share: 0.5}}
					cctx, cancel := context.WithTimeout(ctx, time.Minute)
					defer cancel()
					holder := startChild(cctx, t, "lease", spec)
					deadline := time.Now().Add(30 * time.Second)
					for !strings.Contains(holder.stdout.String(), "holding") && time.Now().Before(deadline) {
						time.Sleep(10 * time.Millisecond)
					}
					require.Contains(t, holder.stdout.String(), "holding", "%s\n%s", tail(holder.stdout.String(), 2000), tail(holder.stderr.String(), 2000))
					holder.kill(t)
					killed := time.Now()
					r, err := l.Allow(ctx, 0)
					require.NoError(t, err)
					t.Logf("killed holding: %s; available %d of %d", strings.TrimSpace(holder.stdout.String()), r.Remaining, r.Limit)
					assert.Less(t, r.Remaining, r.Limit-1, "the block still counts")
					// short: when the last look that found the block still
					// counting was sent. Redis decided it no earlier, so the
					// block counted then: a bound that holds however late a
					// starved machine runs the next look.
					var short time.Duration
					for r.Remaining < r.Limit && time.Since(killed) < 2*r.Window {
						short = time.Since(killed)
						time.Sleep(5 * time.Millisecond)
						r, err = l.Allow(ctx, 0)
						require.NoError(t, err)
					}
					t.Logf("all %d back %v after the kill, still counting at %v (window %v)", r.Limit, time.Since(killed).Round(time.Millisecond),
						short.Round(time.Millisecond), r.Window)
					assert.Equal(t, r.Limit, r.Remaining)
					// A token bucket's grants share a record per slice of
					// Interval/64, freed with its latest grant: a slice more.
					assert.LessOrEqual(t, short, r.Window+r.Window/64+time.Millisecond, "back within the window, as any grant's")
				})
			}
		})
	}
}
