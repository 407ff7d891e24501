// Package local decides a limiter's rates in memory, as the scripts decide
// them in Redis: redlimit's degraded mode, in which an instance that cannot
// reach Redis enforces its share of each limit by itself. Each algorithm
// keeps its own semantics, and its arithmetic is the scripts' (see
// scripts/<algorithm>.lua), in exact integers:
//
//   - token bucket: a grant counts for Interval from the millisecond it was
//     made; grants within one slice of the Interval (Interval/64, rounded up,
//     aligned to the epoch) share a record, freed with the latest of them;
//   - funnel: GCRA, with an emission interval of Interval / Rate µs kept as
//     whole µs and a remainder in 1/Rate µs, so that no rounding drains it
//     faster than its rate;
//   - fixed window: a count per window of Interval aligned to the Unix epoch,
//     or per calendar window (Rate.Window);
//   - sliding window: counts per sub-window, Buckets of them per Interval,
//     sub-window i starting at ⌈i × Interval / Buckets⌉ ms.
//
// A limiter of several rates grants a request only when every rate allows
// it, and then counts it in all of them, as the scripts do.
//
// The package knows nothing of Redis or of instances: Share and
// Rate.Shared compute an instance's share, and the root package says what
// the share bounds.
package local

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"

	"github.com/redlimit/redlimit/internal/wire"
)

// ErrRate: a rate the scripts would never be given (the root package
// validates configs before they reach here).
var ErrRate = errors.New("local: invalid rate")

// Rate is one rate of a limiter.
type Rate struct {
	Rate       int64 // permits per Interval
	IntervalMS int64
	Burst      int64 // the funnel's capacity; 0 means Rate
	Buckets    int64 // the sliding window's sub-windows per Interval; 0 means 10
	// Window, for a fixed window that follows the calendar: the window
	// holding now (µs), [start, end) in µs. nil: windows of IntervalMS
	// aligned to the Unix epoch.
	Window func(now int64) (start, end int64)
}

// Share is one of instances' share of limit: ⌈limit / instances⌉, so that
// the shares add up to at least the limit (no instance rounds down to
// nothing) and exceed it by less than instances.
func Share(limit, instances int64) int64 {
	if instances < 1 {
		instances = 1
	}
	return limit/instances + min(1, limit%instances)
}

// Shared is r as one of instances enforces it: its Rate and Burst each
// Share'd, its Interval, Buckets and Window its own.
func (r Rate) Shared(instances int64) Rate {
	if r.Burst != 0 {
		r.Burst = Share(r.Burst, instances)
	}
	r.Rate = Share(r.Rate, instances)
	return r
}

// Decision is what Allow decided.
type Decision struct {
	Allowed   bool
	Remaining int64   // the fewest permits any rate could grant now
	Retry     int64   // µs until the request fits, 0 when allowed; -1: never (more than a rate's capacity)
	Reset     int64   // µs until every rate is full again
	Resets    []int64 // µs until each rate is full again, in order (several rates only)
	// Bound is the rate that bound the answer: denied, the one with the
	// longest wait (the first of equals; the first that can never grant
	// it); allowed, the one with the fewest permits left (the first of
	// equals).
	Bound int
}

// Limiter is a limiter's rates and their state. It is not safe for
// concurrent use: its caller locks.
type Limiter struct {
	rates []rater
	last  int64 // the latest now seen, µs
}

// rater is one rate's arithmetic, in µs. now never goes back.
type rater interface {
	capacity() int64
	// wait returns the µs until permits (at most capacity) fit; 0 or less
	// when they fit now.
	wait(now, permits int64) int64
	// take counts a grant of permits.
	take(now, permits int64)
	// state returns the permits left and the µs until the rate is full.
	state(now int64) (remaining, reset int64)
}

// New returns a limiter of algorithm (a wire.Algorithm's Name) with rates,
// its state empty.
func New(algorithm string, rates []Rate) (*Limiter, error) {
	if len(rates) == 0 {
		return nil, fmt.Errorf("%w: no rate", ErrRate)
	}
	l := &Limiter{}
	for _, r := range rates {
		if r.Burst == 0 {
			r.Burst = r.Rate
		}
		if r.Buckets == 0 {
			r.Buckets = wire.DefaultBuckets
		}
		switch {
		case r.Rate < 1 || r.IntervalMS < 1 || r.Burst < 1 || r.Buckets < 1:
			return nil, fmt.Errorf("%w: %d per %d ms, burst %d, buckets %d", ErrRate, r.Rate, r.IntervalMS, r.Burst, r.Buckets)
		case r.IntervalMS > wire.MaxTTLMS:
			return nil, fmt.Errorf("%w: interval %d ms", ErrRate, r.IntervalMS)
		}
		var rr rater
		switch algorithm {
		case wire.TokenBucket.Name:
			rr = &bucket{rate: r.Rate, interval: r.IntervalMS, slice: (r.IntervalMS + 63) / 64}
		case wire.Funnel.Name:
			if r.Rate > r.IntervalMS*1000 {
				return nil, fmt.Errorf("%w: %d per %d ms is finer than a permit per µs", ErrRate, r.Rate, r.IntervalMS)
			}
			rr = newFunnel(r.Rate, r.IntervalMS*1000, r.Burst)
		case wire.FixedWindow.Name:
			rr = &window{rate: r.Rate, interval: r.IntervalMS * 1000, edges: r.Window}
		case wire.SlidingWindow.Name:
			if r.Buckets > r.IntervalMS {
				return nil, fmt.Errorf("%w: %d buckets in %d ms", ErrRate, r.Buckets, r.IntervalMS)
			}
			rr = &sliding{rate: r.Rate, interval: r.IntervalMS, buckets: r.Buckets}
		default:
			return nil, fmt.Errorf("%w: algorithm %q", ErrRate, algorithm)
		}
		l.rates = append(l.rates, rr)
	}
	return l, nil
}

// Allow decides a request for permits at now (µs): granted, it counts in
// every rate; zero permits is a peek, and counts nothing. A now before one
// already seen is taken as that one: a clock stepped back does not reopen a
// window.
func (l *Limiter) Allow(now, permits int64) Decision {
	now = max(now, l.last)
	l.last = now
	d := Decision{Bound: -1}
	for k, r := range l.rates {
		if permits > r.capacity() {
			d.Bound, d.Retry = k, -1
			break
		}
	}
	if d.Bound < 0 {
		for k, r := range l.rates {
			if w := r.wait(now, permits); w > d.Retry {
				d.Retry, d.Bound = w, k
			}
		}
	}
	if d.Bound < 0 {
		d.Allowed = true
		if permits > 0 {
			for _, r := range l.rates {
				r.take(now, permits)
			}
		}
	}
	if len(l.rates) > 1 {
		d.Resets = make([]int64, len(l.rates))
	}
	for k, r := range l.rates {
		remaining, reset := r.state(now)
		if k == 0 || remaining < d.Remaining {
			d.Remaining = remaining
			if d.Allowed {
				d.Bound = k
			}
		}
		d.Reset = max(d.Reset, reset)
		if d.Resets != nil {
			d.Resets[k] = reset
		}
	}
	return d
}

// Capacity is the most permits rate k grants one request.
func (l *Limiter) Capacity(k int) int64 { return l.rates[k].capacity() }

// --- Token bucket (scripts/tokenbucket.lua) ---

// bucket: a grant made in millisecond g counts until g + interval ms; at
// most rate permits count at once.
type bucket struct {
	rate, interval, slice int64 // ms
	log                   []grant
}

type grant struct{ ms, n int64 }

func (b *bucket) capacity() int64 { return b.rate }

// live drops the records out of the window (score ≤ now − interval) and
// returns the permits the others count.
func (b *bucket) live(now int64) int64 {
	cutoff := now/1000 - b.interval
	out := sort.Search(len(b.log), func(i int) bool { return b.log[i].ms > cutoff })
	b.log = b.log[out:]
	var n int64
	for _, g := range b.log {
		n += g.n
	}
	return n
}

func (b *bucket) wait(now, permits int64) int64 {
	need := b.live(now) + permits - b.rate
	for _, g := range b.log {
		if need <= 0 {
			break
		}
		if need -= g.n; need <= 0 {
			return (g.ms+b.interval)*1000 - now
		}
	}
	return 0
}

// take joins the newest record when it is in now's slice, and moves it to
// now; else it starts a record.
func (b *bucket) take(now, permits int64) {
	ms := now / 1000
	if n := len(b.log); n > 0 && b.log[n-1].ms >= ms-ms%b.slice {
		b.log[n-1].ms, b.log[n-1].n = max(b.log[n-1].ms, ms), b.log[n-1].n+permits
		return
	}
	b.log = append(b.log, grant{ms, permits})
}

func (b *bucket) state(now int64) (int64, int64) {
	remaining := b.rate - b.live(now)
	if len(b.log) == 0 {
		return remaining, 0
	}
	return remaining, (b.log[len(b.log)-1].ms+b.interval)*1000 - now
}

// --- Funnel (scripts/funnel.lua) ---

// funnel: GCRA. A time is whole µs (t) and a remainder in 1/rate µs (f,
// below rate); the emission interval is pe + pr/rate µs, exactly
// interval/rate.
type funnel struct {
	rate, interval, burst int64 // interval in µs
	pe, pr                int64
	tolerance, tf         int64 // burst emission intervals
	tat, tatf             int64 // the theoretical arrival time; 0: empty
}

func newFunnel(rate, interval, burst int64) *funnel {
	f := &funnel{rate: rate, interval: interval, burst: burst, pe: interval / rate, pr: interval % rate}
	f.tolerance, f.tf = f.times(burst)
	return f
}

// times returns m emission intervals, m ≥ 0: m × pe + ⌊m × pr / rate⌋ µs
// and (m × pr) mod rate, in 128 bits where the product needs them.
func (f *funnel) times(m int64) (int64, int64) {
	hi, lo := bits.Mul64(uint64(m), uint64(f.pr))
	q, r := bits.Div64(hi, lo, uint64(f.rate)) // hi < rate: m × pr < 2^64 × rate
	return m*f.pe + int64(q), int64(r)
}

func (f *funnel) capacity() int64 { return f.burst }

// at brings the TAT up to now: an empty funnel's.
func (f *funnel) at(now int64) {
	if f.tat < now {
		f.tat, f.tatf = now, 0
	}
}

// wait: permits fit when tat + permits × emission ≤ now + tolerance; the
// wait is the exact difference, rounded up to whole µs.
func (f *funnel) wait(now, permits int64) int64 {
	f.at(now)
	w, r := f.times(f.burst - permits)
	wait := f.tat - now - w
	if f.tatf > r {
		wait++
	}
	return wait
}

func (f *funnel) take(now, permits int64) {
	f.at(now)
	w, r := f.times(permits)
	f.tat, f.tatf = f.tat+w, f.tatf+r
	if f.tatf >= f.rate {
		f.tat, f.tatf = f.tat+1, f.tatf-f.rate
	}
}

// state: the whole emission intervals in tolerance − (tat − now), and the
// µs until the funnel is empty, rounded up.
func (f *funnel) state(now int64) (int64, int64) {
	f.at(now)
	reset := f.tat - now
	w, r := f.tolerance-reset, f.tf-f.tatf
	if r < 0 {
		w, r = w-1, r+f.rate
	}
	var remaining int64
	if w >= 0 {
		// ⌊(w × rate + r) / interval⌋: pe × rate + pr is interval.
		hi, lo := bits.Mul64(uint64(w), uint64(f.rate))
		lo, carry := bits.Add64(lo, uint64(r), 0)
		q, _ := bits.Div64(hi+carry, lo, uint64(f.interval)) // below burst: fits
		remaining = int64(q)
	}
	if f.tatf > 0 {
		reset++
	}
	return remaining, reset
}

// --- Fixed window (scripts/fixed_window.lua) ---

// window: at most rate permits in each window.
type window struct {
	rate, interval int64 // interval in µs
	edges          func(now int64) (start, end int64)
	start, count   int64 // the window of the last grant
	counted        bool
}

func (w *window) capacity() int64 { return w.rate }

// at returns the window holding now and what it has granted.
func (w *window) at(now int64) (start, end, count int64) {
	if w.edges != nil {
		start, end = w.edges(now)
	} else {
		start = now - now%w.interval
		end = start + w.interval
	}
	if w.counted && start == w.start {
		count = w.count
	}
	return start, end, count
}

func (w *window) wait(now, permits int64) int64 {
	_, end, count := w.at(now)
	if count+permits > w.rate {
		return end - now
	}
	return 0
}

func (w *window) take(now, permits int64) {
	start, _, count := w.at(now)
	w.start, w.count, w.counted = start, count+permits, true
}

func (w *window) state(now int64) (int64, int64) {
	_, end, count := w.at(now)
	if count == 0 {
		return w.rate, 0
	}
	return w.rate - count, end - now
}

// --- Sliding window (scripts/sliding_window.lua) ---

// sliding: sub-window i of now's ms is ⌊ms × buckets / interval⌋; at most
// rate permits in any buckets consecutive sub-windows.
type sliding struct {
	rate, interval, buckets int64 // interval in ms
	cells                   []cell
}

type cell struct{ index, n int64 }

func (s *sliding) capacity() int64 { return s.rate }

func (s *sliding) current(now int64) int64 { return now / 1000 * s.buckets / s.interval }

// startOf is the ms sub-window index starts at: ⌈index × interval / buckets⌉.
func (s *sliding) startOf(index int64) int64 { return (index*s.interval + s.buckets - 1) / s.buckets }

// live drops the sub-windows that no longer count and returns the sum of
// the others.
func (s *sliding) live(now int64) int64 {
	oldest := s.current(now) - s.buckets
	out := sort.Search(len(s.cells), func(i int) bool { return s.cells[i].index > oldest })
	s.cells = s.cells[out:]
	var n int64
	for _, c := range s.cells {
		n += c.n
	}
	return n
}

func (s *sliding) wait(now, permits int64) int64 {
	need := s.live(now) + permits - s.rate
	for _, c := range s.cells {
		if need <= 0 {
			break
		}
		if need -= c.n; need <= 0 {
			return s.startOf(c.index+s.buckets)*1000 - now
		}
	}
	return 0
}

func (s *sliding) take(now, permits int64) {
	cur := s.current(now)
	if n := len(s.cells); n > 0 && s.cells[n-1].index == cur {
		s.cells[n-1].n += permits
		return
	}
	s.cells = append(s.cells, cell{cur, permits})
}

func (s *sliding) state(now int64) (int64, int64) {
	total := s.live(now)
	if len(s.cells) == 0 {
		return s.rate, 0
	}
	return s.rate - total, s.startOf(s.cells[len(s.cells)-1].index+s.buckets)*1000 - now
}
