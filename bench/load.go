package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// tally counts decisions.
type tally struct {
	decisions, allowed, errors uint64
	firstErr                   error
}

func (t *tally) add(o tally) {
	t.decisions, t.allowed, t.errors = t.decisions+o.decisions, t.allowed+o.allowed, t.errors+o.errors
	if t.firstErr == nil {
		t.firstErr = o.firstErr
	}
}

// sample is one contender's measured slice of one round.
type sample struct {
	tally              // completed while measuring
	rate   float64     // decisions per second
	script scriptStats // EVALSHA calls Redis ran while measuring (a batch of decisions is one), and their time
	allocs float64     // Go heap allocations per decision, whole process
	// CPU µs per decision, user + system: this process's (the callers and
	// go-redis) and redis-server's (the script, and the network work every
	// call costs it). With many callers the two share the machine's cores,
	// so their sum, more than the script's Redis µs, sets decisions/s.
	clientCPU, serverCPU float64
	p50, p99             time.Duration
}

// caller is one goroutine's record. Each has its own, so recording needs no
// lock and no allocation.
type caller struct {
	tally
	hist histogram
}

// load drives a contender with concurrent callers.
type load struct {
	env              *env
	callers          []caller // reused across slices: 16 KiB each
	warmup, duration time.Duration
}

// measure runs c's slice on an empty database, so that no contender pays
// for another's keys (big logs, expiring state).
func (l *load) measure(ctx context.Context, c *contender, callers, keys int) (sample, error) {
	if err := l.env.admin.FlushAll(ctx).Err(); err != nil {
		return sample{}, err
	}
	decide, err := c.prepare(ctx, keys)
	if err != nil {
		return sample{}, err
	}
	return l.run(ctx, decide, callers, keys)
}

// run calls decide from n callers on random keys among keys: a warm-up
// (connections dialled, scripts cached), then duration measured, then stop.
// A decision counts when it completes while measuring, so the figures are
// steady-state throughput.
func (l *load) run(ctx context.Context, decide decideFunc, n, keys int) (sample, error) {
	if len(l.callers) < n {
		l.callers = make([]caller, n)
	}
	callers := l.callers[:n]
	clear(callers)
	var measuring, stopped atomic.Bool
	var wg sync.WaitGroup
	// A clean heap for each slice, so one contender's garbage is not
	// collected on the next one's time.
	runtime.GC()
	for i := range callers {
		c := &callers[i]
		wg.Go(func() {
			for !stopped.Load() {
				t0 := time.Now()
				ok, err := decide(ctx, rand.IntN(keys))
				d := time.Since(t0)
				if !measuring.Load() {
					continue
				}
				c.hist.record(d)
				c.add(tally{decisions: 1, allowed: b2u(ok), errors: b2u(err != nil), firstErr: err})
			}
		})
	}
	defer wg.Wait()
	defer stopped.Store(true)

	var s sample
	if err := sleep(ctx, l.warmup); err != nil {
		return s, err
	}
	server0, err := redisCPU(ctx, l.env.admin)
	if err != nil {
		return s, err
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	client0 := processCPU()
	t0 := time.Now()
	measuring.Store(true)
	// The EVALSHA counts are read right after measuring starts and right
	// after it stops, the same way at both ends: each read waits behind
	// the scripts already queued, so the calls counted cover the same
	// stretch of Redis's work as the decisions counted (a reset before
	// measuring would count that queue's calls at the end only: with 64
	// callers and no batching, 4% more calls than decisions).
	script0, err := evalshaStats(ctx, l.env.admin)
	if err == nil {
		err = sleep(ctx, l.duration)
	}
	measuring.Store(false)
	elapsed := time.Since(t0)
	client1 := processCPU()
	runtime.ReadMemStats(&after)
	if err != nil {
		return s, err
	}
	script1, err := evalshaStats(ctx, l.env.admin)
	if err != nil {
		return s, err
	}
	s.script = scriptStats{calls: script1.calls - script0.calls, usec: script1.usec - script0.usec}
	server1, err := redisCPU(ctx, l.env.admin)
	if err != nil {
		return s, err
	}
	stopped.Store(true)
	wg.Wait() // the callers' last decisions do not count, but their tallies must settle
	var hist histogram
	for i := range callers {
		s.add(callers[i].tally)
		hist.merge(&callers[i].hist)
	}
	s.rate = float64(s.decisions) / elapsed.Seconds()
	s.allocs = float64(after.Mallocs-before.Mallocs) / float64(max(s.decisions, 1))
	s.clientCPU = (client1 - client0).Seconds() * 1e6 / float64(max(s.decisions, 1))
	s.serverCPU = (server1 - server0).Seconds() * 1e6 / float64(max(s.decisions, 1))
	s.p50, s.p99 = hist.percentile(0.50), hist.percentile(0.99)
	return s, nil
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// sleep waits d, or returns ctx's error if it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// histogram counts latencies in buckets 2^(1/32) apart, so a recorded one
// is known to within about 1%. Recording is an array increment: it never
// allocates, so it does not disturb the allocation count being measured.
type histogram [64 * 32]uint64

func (h *histogram) record(d time.Duration) { h[int(32*math.Log2(float64(max(d, 1))))]++ }

func (h *histogram) merge(o *histogram) {
	for i, n := range o {
		h[i] += n
	}
}

// percentile returns the latency below which a fraction p (0..1] of the
// recorded ones lie; 0 when nothing was recorded.
func (h *histogram) percentile(p float64) time.Duration {
	var total, seen uint64
	for _, n := range h {
		total += n
	}
	for i, n := range h {
		if seen += n; n > 0 && float64(seen) >= p*float64(total) {
			return time.Duration(math.Exp2((float64(i) + 0.5) / 32))
		}
	}
	return 0
}

// median returns the middle of xs (the mean of the two middle ones for an
// even count), or 0 for none. xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// infoField returns one "name:value" field of INFO section, or "" when
// there is none.
func infoField(ctx context.Context, admin *redis.Client, section, name string) (string, error) {
	info, err := admin.Info(ctx, section).Result()
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, err
		}
	}
	return "", err
}

// processCPU is the CPU time this process has used, user + system.
func processCPU() time.Duration {
	var u syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &u) != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// redisCPU is the CPU time redis-server has used, user + system (INFO cpu).
func redisCPU(ctx context.Context, admin *redis.Client) (time.Duration, error) {
	info, err := admin.Info(ctx, "cpu").Result()
	var total time.Duration
	found := 0
	for line := range strings.Lines(info) {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			secs, perr := strconv.ParseFloat(v, 64)
			if perr != nil {
				return 0, fmt.Errorf("INFO cpu %s: %q", name, v)
			}
			total += time.Duration(secs * 1e9)
			found++
		}
	}
	if err == nil && found != 2 {
		err = fmt.Errorf("INFO cpu: no used_cpu_user and used_cpu_sys")
	}
	return total, err
}

// scriptStats is what INFO commandstats says of EVALSHA: the calls Redis
// ran and their time on the server alone, without network or client time.
type scriptStats struct {
	calls, usec int64
}

// perCall is the average µs of a call, 0 when none ran (every decision was
// local).
func (st scriptStats) perCall() float64 {
	if st.calls == 0 {
		return 0
	}
	return float64(st.usec) / float64(st.calls)
}

// evalshaStats reads EVALSHA's counts since the server started or since the
// last CONFIG RESETSTAT; both are 0 when no EVALSHA ran.
func evalshaStats(ctx context.Context, admin *redis.Client) (scriptStats, error) {
	var st scriptStats
	v, err := infoField(ctx, admin, "commandstats", "cmdstat_evalsha")
	if err == nil && v != "" {
		_, err = fmt.Sscanf(v, "calls=%d,usec=%d,", &st.calls, &st.usec)
	}
	return st, err
}
