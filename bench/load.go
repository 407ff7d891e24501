package main

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// sample is one contender's measured slice of one round.
type sample struct {
	decisions uint64  // completed while measuring
	allowed   uint64  // of those, granted
	rate      float64 // decisions per second
	usec      float64 // Redis µs per EVALSHA (INFO commandstats)
	calls     int64   // EVALSHA calls Redis ran while measuring
	allocs    float64 // Go heap allocations per decision, whole process
	p50, p99  time.Duration
	errors    uint64
	firstErr  error
}

// caller is one goroutine's tally. Each has its own, so recording needs no
// lock and no allocation.
type caller struct {
	hist      histogram
	decisions uint64
	allowed   uint64
	errors    uint64
	firstErr  error
}

// Phases of a slice: callers only record while measuring.
const (
	warming int32 = iota
	measuring
	stopped
)

// load drives a contender with concurrent callers.
type load struct {
	env      *env
	callers  []caller // reused across slices: 15 KiB each
	warmup   time.Duration
	duration time.Duration
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
	var phase atomic.Int32
	var wg sync.WaitGroup
	// A clean heap for each slice, so one contender's garbage is not
	// collected on the next one's time.
	runtime.GC()

	var s sample
	for i := range callers {
		c := &callers[i]
		wg.Go(func() {
			for {
				p := phase.Load()
				if p == stopped {
					return
				}
				key := 0
				if keys > 1 {
					key = rand.IntN(keys)
				}
				t0 := time.Now()
				ok, err := decide(ctx, key)
				d := time.Since(t0)
				if phase.Load() != measuring {
					continue
				}
				c.decisions++
				if ok {
					c.allowed++
				}
				c.hist.record(d)
				if err != nil {
					c.errors++
					if c.firstErr == nil {
						c.firstErr = err
					}
				}
			}
		})
	}

	stop := func() { phase.Store(stopped); wg.Wait() }
	if !sleep(ctx, l.warmup) {
		stop()
		return s, ctx.Err()
	}
	if err := l.env.admin.ConfigResetStat(ctx).Err(); err != nil {
		stop()
		return s, err
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	phase.Store(measuring)
	ok := sleep(ctx, l.duration)
	phase.Store(stopped)
	elapsed := time.Since(t0)
	runtime.ReadMemStats(&after)
	calls, usec, statErr := evalshaStats(ctx, l.env.admin)
	wg.Wait()
	if !ok {
		return s, ctx.Err()
	}

	var hist histogram
	for i := range callers {
		c := &callers[i]
		s.decisions += c.decisions
		s.allowed += c.allowed
		s.errors += c.errors
		if s.firstErr == nil {
			s.firstErr = c.firstErr
		}
		hist.merge(&c.hist)
	}
	s.rate = float64(s.decisions) / elapsed.Seconds()
	if s.decisions > 0 {
		s.allocs = float64(after.Mallocs-before.Mallocs) / float64(s.decisions)
	}
	s.p50, s.p99 = hist.percentile(0.50), hist.percentile(0.99)
	s.calls, s.usec = calls, usec
	return s, statErr
}

// sleep waits d or until ctx ends, and reports whether it waited d.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
