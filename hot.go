package redlimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Hot leases. A lease (lease.go) pays off on a limiter that many decisions
// hit within its lease time, and costs on the others: a block held unused
// is denied to every other instance. Which limiters are hot is often known
// only at run time (a limiter per customer or per API key, a few of which
// take most of the traffic), so a Client with WithHotLeases measures each
// limiter's decision rate on itself and leases it only while that rate is
// high.
//
// The bound is an explicit lease's, whatever the transitions: a hot
// limiter decides through a leased handle (Limiter.WithLease with
// HotLeases.Lease), which grants only permits Redis counted less than
// Lease.Time before; when it cools, the handle is closed as Limiter.Close
// does (what its block holds unused goes back, and a take in flight is
// waited for and given back too), and its decisions go to Redis again; a
// limiter that heats again takes a new handle, whose blocks obey the same
// bound. No grant is ever made from a block more than Lease.Time after
// Redis counted it, leased, cooling or not.

// HotLeases is how a Client leases the limiters that are hot on it
// (WithHotLeases).
type HotLeases struct {
	// Above is the decision rate, per second on this Client, above which a
	// limiter is leased; it decides through Redis again once its rate falls
	// below half of Above. Required.
	Above float64
	// Lease is how a hot limiter takes its blocks, as Limiter.WithLease's:
	// Lease.Time is the bound's slack, Share and Max cap each block.
	Lease Lease
}

// WithHotLeases leases each limiter of the Client while it is hot on it.
// Its decisions on this Client (Allow, and what calls it, made with any
// handle on the same limiter and config) are counted, and their rate over
// the last second, on the Client's clock, estimated from this second's
// count and the last's as a sliding window does. From the decision that
// takes it above cfg.Above, they are decided from blocks of permits, as a
// handle made by Limiter.WithLease(cfg.Lease) decides them; once it falls
// below half of Above (seen by its next decision, or by the sweep of the
// leases each second makes), what its block holds unused goes back and it
// decides through Redis again: within two seconds of its last decision.
//
// The bound is an explicit lease's (see Lease): a permit is counted in
// Redis before it is granted and granted less than Lease.Time after, so a
// fixed window never grants more than its Rate in a window; a sliding
// window no more than Rate in any span of Interval × (buckets − 1) /
// buckets − Time; a token bucket in any span of Interval − Time; a funnel
// no more than Burst + Rate × (t + Time) / Interval in any span of t. It
// holds across the transitions: a limiter that cools gives its block back
// as Limiter.Close does. What a Client withholds from the other instances
// is what an explicit lease withholds: at most a block's cap (Share of the
// limit, or Max) per hot limiter, for at most Time (a token bucket's until
// its records age out).
//
// Use it when the hot limiters are not known when the code is written;
// name a known hot limit with WithLease instead, which leases from its
// first decision. Measuring costs a lookup in a table of the limiters
// recently decided on the Client, bounded (2,048 entries at most, however
// many keys requests bring): a limiter dropped from it cools. A handle
// with a lease of its own (WithLease) keeps it, and peeks go to Redis.
// HotLeaseStats reports what the Client leases; Close gives every block
// back and ends hot leasing. Bad settings make every decision that takes
// permits fail with ErrInvalidConfig.
func WithHotLeases(cfg HotLeases) Option {
	return func(c *Client) {
		t := &hotLeases{client: c, cfg: cfg, current: map[string]*hotEntry{}, leased: map[*hotEntry]struct{}{},
			closing: map[*Limiter]struct{}{}}
		if !(cfg.Above > 0 && cfg.Above < math.Inf(1)) { // and not NaN
			t.err = fmt.Errorf("%w: hot leases above %v: must be a positive rate", ErrInvalidConfig, cfg.Above)
		} else if err := cfg.Lease.validate(); err != nil {
			t.err = err
		}
		if t.cfg.Lease.Share == 0 {
			t.cfg.Lease.Share = 0.1 // as WithLease does, for HotLeaseStats
		}
		c.hot = t
	}
}

// HotLeaseStats is what a Client's hot leases (WithHotLeases) hold and did.
type HotLeaseStats struct {
	// Above and Lease are the settings: Lease.Time is the bound's slack.
	Above float64
	Lease Lease
	// Leased are the limiters leased now, by name.
	Leased []HotLease
	// Started counts the leases taken (a limiter turning hot), Cooled those
	// given back (a limiter cooling, dropped from the table, or Close).
	Started, Cooled int64
	// LeaseStats adds up what every hot lease of the Client did with its
	// blocks: Used is the decisions made without a round trip.
	LeaseStats
}

// HotLease is one limiter leased now.
type HotLease struct {
	Limiter   string  // its full name, with the prefix
	Algorithm string  // as Limiter.Algorithm says
	Rate      float64 // its decisions a second on this Client, as measured now
	Held      int64   // permits its block holds unused
	Cap       int64   // the most a block takes: Share of its limit, or Max
}

// HotLeaseStats reports what the Client's hot leases hold and did; zero
// without WithHotLeases. It reads memory only.
func (c *Client) HotLeaseStats() HotLeaseStats {
	t := c.hot
	if t == nil {
		return HotLeaseStats{}
	}
	now := c.clock()
	t.mu.RLock()
	defer t.mu.RUnlock()
	s := HotLeaseStats{Above: t.cfg.Above, Lease: t.cfg.Lease, Started: t.started, Cooled: t.cooled, LeaseStats: t.done}
	for e := range t.leased {
		e.mu.Lock()
		h, rate := e.h, e.rate(now, 0)
		e.mu.Unlock()
		h.lease.mu.Lock()
		held, most := h.lease.block.held, h.lease.most(1)
		h.lease.mu.Unlock()
		s.Leased = append(s.Leased, HotLease{Limiter: h.name, Algorithm: h.alg.Name, Rate: rate, Held: held, Cap: most})
		s.LeaseStats.add(h.LeaseStats())
	}
	for h := range t.closing {
		s.LeaseStats.add(h.LeaseStats())
	}
	slices.SortFunc(s.Leased, func(a, b HotLease) int {
		return cmp.Or(strings.Compare(a.Limiter, b.Limiter), strings.Compare(a.Algorithm, b.Algorithm))
	})
	return s
}

func (s *LeaseStats) add(o LeaseStats) {
	s.Calls, s.Taken, s.Used, s.Returned = s.Calls+o.Calls, s.Taken+o.Taken, s.Used+o.Used, s.Returned+o.Returned
}

// hotPeriod is what a rate is measured over: the decisions of the current
// period, and the previous period's weighted by the part of it still
// within the last hotPeriod (as a sliding window estimates its count).
const hotPeriod = time.Second

// hotPerGeneration bounds the table of limiters recently decided: as the
// Client's families are (maxFamilies), it is kept in two generations, so
// it holds at most twice this many entries (84 bytes each, measured, their
// names shared with the handles'), however many keys pass through. A
// limiter dropped from it cools: its rate is counted again from zero.
const hotPerGeneration = 1024

// hotLeases is a Client's table of the limiters recently decided on it,
// and the leases of those that are hot. Locks are taken in the order
// hotLeases.mu, hotEntry.mu, lease.mu.
type hotLeases struct {
	client *Client
	cfg    HotLeases
	err    error // the settings', every decision's

	// mu guards the table and the leases: a decision on a limiter in the
	// current generation only read-locks it, so that decisions do not queue
	// behind one another.
	mu                sync.RWMutex
	current, previous map[string]*hotEntry
	leased            map[*hotEntry]struct{} // the entries with a lease now
	closing           map[*Limiter]struct{}  // leases being given back: their figures are not yet in done
	done              LeaseStats             // what the leases given back did
	started, cooled   int64
	timer             *time.Timer // on the real clock, the next sweep, while leases are out
	// closed: by Client.Close, after which no lease is taken again; swept:
	// the latest period a decision swept the leases in (sweep).
	closed atomic.Bool
	swept  atomic.Int64
}

// hotEntry is one way of deciding a limiter (its handles' denial key: the
// algorithm, name, client and config), its recent decisions, and its lease.
type hotEntry struct {
	key       string
	mu        sync.Mutex
	period    int64 // the period cur counts, in hotPeriods since 1970
	cur, prev int64
	h         *Limiter // the leased handle while hot, else nil
}

// rate counts n decisions at now and returns the rate, in decisions a
// second, over the last hotPeriod. The entry's lock is held.
func (e *hotEntry) rate(now time.Time, n int64) float64 {
	ns := now.UnixNano()
	p := ns / int64(hotPeriod)
	switch {
	case p == e.period+1:
		e.prev, e.cur = e.cur, 0
	case p > e.period+1:
		e.prev, e.cur = 0, 0
	}
	e.period = max(e.period, p) // a clock gone back counts in the latest period
	e.cur += n
	left := float64((e.period+1)*int64(hotPeriod)-ns) / float64(hotPeriod)
	return (float64(e.cur) + float64(e.prev)*min(max(left, 0), 1)) / hotPeriod.Seconds()
}

// lease counts a decision of l and returns the leased handle its limiter
// decides through while it is hot, else nil.
func (t *hotLeases) lease(ctx context.Context, l *Limiter) (*Limiter, error) {
	if t.err != nil {
		return nil, t.err
	}
	now := t.client.clock()
	if p, last := now.UnixNano()/int64(hotPeriod), t.swept.Load(); p > last && t.swept.CompareAndSwap(last, p) {
		t.sweep(ctx, now)
	}
	e := t.entry(ctx, l.denial)
	e.mu.Lock()
	rate, h := e.rate(now, 1), e.h
	e.mu.Unlock()
	if h == nil && (rate <= t.cfg.Above || t.closed.Load()) || h != nil && rate >= t.cfg.Above/2 {
		return h, nil
	}
	// A change, rare: under the table's lock, against a sweep's or a
	// concurrent decision's.
	var cooled []*Limiter
	t.mu.Lock()
	e.mu.Lock()
	rate = e.rate(now, 0)
	switch {
	case e.h == nil && rate > t.cfg.Above && !t.closed.Load():
		e.h = l.WithLease(t.cfg.Lease)
		t.leased[e] = struct{}{}
		t.started++
		t.arm(now)
	case e.h != nil && rate < t.cfg.Above/2:
		cooled = append(cooled, t.cool(e))
	}
	h = e.h
	e.mu.Unlock()
	t.mu.Unlock()
	t.giveBack(ctx, cooled)
	return h, nil
}

// entry returns the table's entry for key, made and moved into the current
// generation as needed; a generation dropped takes its leases with it.
func (t *hotLeases) entry(ctx context.Context, key string) *hotEntry {
	t.mu.RLock()
	e, current := t.current[key]
	t.mu.RUnlock()
	if current {
		return e
	}
	var dropped []*Limiter
	t.mu.Lock()
	if e = t.current[key]; e == nil {
		if e = t.previous[key]; e == nil {
			e = &hotEntry{key: key}
		}
		delete(t.previous, key)
		if len(t.current) >= hotPerGeneration {
			for old := range t.leased {
				if t.previous[old.key] == old {
					old.mu.Lock()
					dropped = append(dropped, t.cool(old))
					old.mu.Unlock()
				}
			}
			t.previous, t.current = t.current, make(map[string]*hotEntry, hotPerGeneration)
		}
		t.current[key] = e
	}
	t.mu.Unlock()
	t.giveBack(ctx, dropped)
	return e
}

// sweep cools the leased limiters whose rate fell, whether or not they
// are asked again: a decision in a new period runs it, and on the real
// clock a timer too.
func (t *hotLeases) sweep(ctx context.Context, now time.Time) {
	var cooled []*Limiter
	t.mu.Lock()
	for e := range t.leased {
		e.mu.Lock()
		if e.rate(now, 0) < t.cfg.Above/2 {
			cooled = append(cooled, t.cool(e))
		}
		e.mu.Unlock()
	}
	t.mu.Unlock()
	t.giveBack(ctx, cooled)
}

// arm sets the timer that sweeps at the next period, on the real clock
// (on WithClock's, decisions sweep). Its sweeps go on while leases are
// out, and so stop within two periods of the last decision. t.mu is held.
func (t *hotLeases) arm(now time.Time) {
	if t.client.now != nil || t.timer != nil || len(t.leased) == 0 {
		return
	}
	next := now.Truncate(hotPeriod).Add(hotPeriod)
	t.timer = time.AfterFunc(next.Sub(now), func() {
		t.sweep(context.Background(), time.Now())
		t.mu.Lock()
		t.timer = nil
		t.arm(time.Now())
		t.mu.Unlock()
	})
}

// cool takes e's lease off it, for giveBack. t.mu and e.mu are held.
func (t *hotLeases) cool(e *hotEntry) *Limiter {
	h := e.h
	e.h = nil
	delete(t.leased, e)
	t.closing[h] = struct{}{}
	t.cooled++
	return h
}

// giveBack closes the leased handles cooled: on WithClock's clock before
// the decision goes on, in order, so that a run on a controlled clock is
// the same every time; else meanwhile.
func (t *hotLeases) giveBack(ctx context.Context, cooled []*Limiter) {
	for _, h := range cooled {
		if t.client.now != nil {
			_ = t.closeLease(ctx, h)
		} else {
			go t.closeLease(context.Background(), h)
		}
	}
}

// closeLease gives back what h holds, as Limiter.Close does (a refund
// that fails leaves its permits counted until they age out: denied to
// others for a while, never granted twice), and counts what h did.
func (t *hotLeases) closeLease(ctx context.Context, h *Limiter) error {
	err := h.Close(ctx)
	t.mu.Lock()
	delete(t.closing, h)
	t.done.add(h.LeaseStats())
	t.mu.Unlock()
	return err
}

// close ends hot leasing (Client.Close): every lease goes back, and none
// is taken again.
func (t *hotLeases) close(ctx context.Context) error {
	if t == nil {
		return nil
	}
	var cooled []*Limiter
	t.mu.Lock()
	t.closed.Store(true)
	for e := range t.leased {
		e.mu.Lock()
		cooled = append(cooled, t.cool(e))
		e.mu.Unlock()
	}
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
	t.mu.Unlock()
	var errs []error
	for _, h := range cooled {
		errs = append(errs, t.closeLease(ctx, h))
	}
	return errors.Join(errs...)
}

// forget drops the local denials of the hot leases on the limiter key
// names, however it is decided (Limiter.forget).
func (t *hotLeases) forget(key string) {
	limiter, _ := splitDenialKey(key)
	var leases []*lease
	t.mu.RLock()
	for e := range t.leased {
		if l, _ := splitDenialKey(e.key); l == limiter {
			leases = append(leases, e.h.lease) // e.h changes under t.mu's write lock
		}
	}
	t.mu.RUnlock()
	for _, s := range leases {
		s.forgetDenial()
	}
}
