package redlimit

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/redlimit/redlimit/internal/denials"
	"github.com/redlimit/redlimit/internal/hotkeys"
	"github.com/redlimit/redlimit/internal/leasing"
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
		t := &hotLeases{cfg: cfg}
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
	var s HotLeaseStats
	t.table.Read(c.clock(), func(in hotkeys.Stats[*Limiter]) {
		s = HotLeaseStats{Above: t.cfg.Above, Lease: t.cfg.Lease, Started: in.Started, Cooled: in.Cooled, LeaseStats: t.done}
		for _, e := range in.Leased {
			h := e.Lease
			held, most := h.lease.Holding()
			s.Leased = append(s.Leased, HotLease{Limiter: h.name, Algorithm: h.alg.Name, Rate: e.Rate, Held: held, Cap: most})
			s.LeaseStats.add(h.LeaseStats())
		}
		for _, h := range in.Closing {
			s.LeaseStats.add(h.LeaseStats())
		}
	})
	slices.SortFunc(s.Leased, func(a, b HotLease) int {
		return cmp.Or(strings.Compare(a.Limiter, b.Limiter), strings.Compare(a.Algorithm, b.Algorithm))
	})
	return s
}

func (s *LeaseStats) add(o LeaseStats) {
	s.Calls, s.Taken, s.Used, s.Returned = s.Calls+o.Calls, s.Taken+o.Taken, s.Used+o.Used, s.Returned+o.Returned
}

// hotLeases is a Client's hot leases: internal/hotkeys measures each
// limiter's decision rate (its handles' denial key: the algorithm, name,
// client and config) and keeps a leased handle on each hot one.
type hotLeases struct {
	cfg   HotLeases
	err   error // the settings', every decision's
	table *hotkeys.Table[*Limiter]
	// done is what the leases given back did: written by the table's
	// Closed and read in its Read, both under its lock.
	done LeaseStats
}

// start makes the table, once the Client's options are known (its clock).
func (t *hotLeases) start(c *Client) {
	if t == nil {
		return
	}
	t.table = hotkeys.New(hotkeys.Config[*Limiter]{
		Above: t.cfg.Above, Now: c.now,
		// A refund that fails leaves its permits counted until they age
		// out: denied to others for a while, never granted twice.
		Close:  func(ctx context.Context, h *Limiter) error { return h.Close(ctx) },
		Closed: func(h *Limiter) { t.done.add(h.LeaseStats()) },
	})
}

// lease counts a decision of l and returns the leased handle its limiter
// decides through while it is hot, else nil.
func (t *hotLeases) lease(ctx context.Context, l *Limiter) (*Limiter, error) {
	if t.err != nil {
		return nil, t.err
	}
	h, _ := t.table.Lease(ctx, l.denial, func() *Limiter { return l.WithLease(t.cfg.Lease) })
	return h, nil
}

// close ends hot leasing (Client.Close): every lease goes back, and none
// is taken again.
func (t *hotLeases) close(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.table.Close(ctx)
}

// forget drops the local denials of the hot leases on the limiter key
// names, however it is decided (Limiter.forget).
func (t *hotLeases) forget(key string) {
	limiter, _ := denials.Split(key)
	var leases []*leasing.Lease[Result]
	t.table.Leases(func(k string, h *Limiter) {
		if l, _ := denials.Split(k); l == limiter {
			leases = append(leases, h.lease)
		}
	})
	for _, s := range leases {
		s.ForgetDenial()
	}
}
