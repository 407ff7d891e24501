// Package degradedlocal is what degraded mode (the package redlimit's
// WithDegraded) keeps of each limiter: the config last seen in force,
// learnt from the decisions Redis made, and the local state that decides
// within the instance's share, with the algorithm's own arithmetic
// (internal/local), while Redis cannot. The root package says which
// limiters can be degraded, how many instances share a limit (the
// heartbeat's count), and what the share bounds.
package degradedlocal

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/local"
	"github.com/redlimit/redlimit/internal/wire"
)

// Quota is one rate's Limit and Window, as a decision reports them, and
// the time until it is full again (redlimit.Quota).
type Quota struct {
	Limit      int64
	Window     time.Duration
	ResetAfter time.Duration
}

// never is redlimit.Never: the RetryAfter of a request no wait can satisfy.
const never time.Duration = -1

// Family is what degraded mode keeps of one limiter (its family's), C
// being the root's config: the config last seen in force, and the local
// state.
type Family[C any] struct {
	seen     atomic.Pointer[Seen[C]]
	fetching atomic.Bool // a read of the stored config is under way
	mu       sync.Mutex  // makes state
	state    atomic.Pointer[state[C]]
}

// Seen is a config a decision found in force, and the limits and windows
// that decision reported: while decisions report the same, it is still the
// one.
type Seen[C any] struct {
	Config C
	quotas []Quota
}

// Seen returns the config last seen in force, or nil.
func (f *Family[C]) Seen() *Seen[C] { return f.seen.Load() }

// Learning is what Learn is told of a decision Redis made.
type Learning[C any] struct {
	Quotas []Quota // the rates it reported: their Limit and Window
	// Default is the handle's default, when the handle has one, and
	// DefaultRates its rates as replies give them.
	Default      *C
	DefaultRates []wire.Rate
	// Read reads the stored config, within Timeout; InOrder: on the
	// caller's goroutine (a controlled clock: a test's run is the same
	// every time), else on its own.
	Read    func(context.Context) (C, error)
	Timeout time.Duration
	InOrder bool
}

// Knows reports whether a decision that reported quotas found the config
// last seen still in force: the same limits.
func (f *Family[C]) Knows(quotas []Quota) bool {
	s := f.seen.Load()
	return s != nil && slices.Equal(quotas, s.quotas)
}

// Learn keeps the config in force at a decision Redis made whose limits
// are not those last seen (Knows): the handle's default if the decision
// reports the default's limits, else the stored config, read once.
func (f *Family[C]) Learn(l Learning[C]) {
	if l.Default != nil && defaultQuotas(l.Quotas, l.DefaultRates) {
		f.seen.Store(&Seen[C]{Config: *l.Default, quotas: slices.Clone(l.Quotas)})
		return
	}
	if !f.fetching.CompareAndSwap(false, true) {
		return
	}
	quotas := slices.Clone(l.Quotas)
	if l.InOrder {
		f.fetch(l.Read, l.Timeout, quotas)
		return
	}
	go f.fetch(l.Read, l.Timeout, quotas)
}

// fetch reads the stored config, which decisions reported as quotas.
func (f *Family[C]) fetch(read func(context.Context) (C, error), timeout time.Duration, quotas []Quota) {
	defer f.fetching.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if cfg, err := read(ctx); err == nil {
		f.seen.Store(&Seen[C]{Config: cfg, quotas: quotas})
	}
}

// defaultQuotas reports whether qs are the rates of a default, as the
// scripts report them.
func defaultQuotas(qs []Quota, rates []wire.Rate) bool {
	if len(rates) != len(qs) {
		return false
	}
	for i, rate := range rates {
		limit, window := wire.Quota(rate)
		if qs[i] != (Quota{Limit: limit, Window: time.Duration(window) * time.Millisecond}) {
			return false
		}
	}
	return true
}

// Rate is one rate of a config, as the whole limit has it (not yet
// shared), and its own capacity: a request above it never fits.
type Rate struct {
	local.Rate
	Full int64
}

// state is a limiter decided locally: on cfg, shared by n instances.
type state[C any] struct {
	cfg    C
	n      int64
	mu     sync.Mutex // guards lim
	lim    *local.Limiter
	quotas []Quota       // the share's rates' Limit and Window
	full   []int64       // each rate's own capacity: a request above it never fits
	retry  time.Duration // what a request above the share but within the limit is told to wait
	// edges are each calendar rate's windows (nil for the others), or nil
	// with none: such a rate's Window is the length of the window that
	// holds now, as Redis reports it.
	edges []func(us int64) (start, end int64)
}

// Config is what Decide decides on: the config in force and how many
// instances share it.
type Config[C any] struct {
	Config C
	Equal  func(a, b C) bool
	N      int64 // the instances that share it
	// Rates makes the config's rates, for algorithm (internal/local's
	// name), when no state is kept for it yet.
	Rates     func() []Rate
	Algorithm string
	// Retry is what a request above the share but within the limit is
	// told to wait: until Redis decides again.
	Retry time.Duration
}

// Decide decides permits at now (µs) locally, in the state kept for cfg,
// made afresh when the config or the instance count changed. ok is false
// when the rates are none internal/local takes: a config validation let
// through would be a bug, and fails as without degraded mode.
func (f *Family[C]) Decide(cfg Config[C], now, permits int64) (_ Outcome, ok bool) {
	s := f.local(cfg)
	if s == nil {
		return Outcome{}, false
	}
	s.mu.Lock()
	dec := s.lim.Allow(now, permits)
	s.mu.Unlock()
	return s.result(dec, permits, now), true
}

// local returns the limiter's local state for cfg: the one kept, or a new
// one when the config or the instance count changed.
func (f *Family[C]) local(cfg Config[C]) *state[C] {
	if s := f.state.Load(); s != nil && s.n == cfg.N && cfg.Equal(s.cfg, cfg.Config) {
		return s
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.state.Load(); s != nil && s.n == cfg.N && cfg.Equal(s.cfg, cfg.Config) {
		return s // made meanwhile
	}
	s := &state[C]{cfg: cfg.Config, n: cfg.N, retry: cfg.Retry}
	all := cfg.Rates()
	rates := make([]local.Rate, 0, len(all))
	for k, r := range all {
		if r.Window != nil {
			if s.edges == nil {
				s.edges = make([]func(int64) (int64, int64), len(all))
			}
			s.edges[k] = r.Window
		}
		lr := r.Shared(cfg.N)
		limit, window := wire.Quota(wire.Rate{Rate: lr.Rate, IntervalMS: lr.IntervalMS, Burst: lr.Burst})
		s.quotas = append(s.quotas, Quota{Limit: limit, Window: time.Duration(window) * time.Millisecond})
		s.full = append(s.full, r.Full)
		rates = append(rates, lr)
	}
	lim, err := local.New(cfg.Algorithm, rates)
	if err != nil {
		return nil
	}
	s.lim = lim
	f.state.Store(s)
	return s
}

// Outcome is a local decision, as redlimit.Result reports it.
type Outcome struct {
	Allowed                bool
	Remaining              int64
	RetryAfter, ResetAfter time.Duration
	Limit                  int64
	Window                 time.Duration
	Bound                  int
	Quotas                 []Quota // several rates only
}

// result is the Outcome of a local decision on permits at now (µs). A
// request above a rate's own capacity never fits, as Redis would say; one
// above the share only, not until Redis decides again: it is told to retry
// after a Heartbeat.
func (s *state[C]) result(dec local.Decision, permits, now int64) Outcome {
	r := Outcome{Allowed: dec.Allowed, Remaining: dec.Remaining, RetryAfter: micros(dec.Retry), ResetAfter: micros(dec.Reset)}
	bound := dec.Bound
	if dec.Retry < 0 {
		r.RetryAfter = s.retry
		for k, full := range s.full {
			if permits > full {
				r.RetryAfter, bound = never, k
				break
			}
		}
	}
	quotas := s.quotas
	if s.edges != nil {
		quotas = slices.Clone(s.quotas)
		for k, edges := range s.edges {
			if edges != nil {
				start, end := edges(now)
				quotas[k].Window = time.Duration(end-start) * time.Microsecond
			}
		}
	}
	r.Limit, r.Window = quotas[bound].Limit, quotas[bound].Window
	if len(quotas) > 1 {
		r.Bound, r.Quotas = bound, slices.Clone(quotas)
		for k := range r.Quotas {
			r.Quotas[k].ResetAfter = micros(dec.Resets[k])
		}
	}
	return r
}

// micros is a duration of µs, or never for a negative one.
func micros(us int64) time.Duration {
	if us < 0 {
		return never
	}
	return time.Duration(us) * time.Microsecond
}
