package redlimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redlimit/redlimit/internal/leasing"
	"github.com/redlimit/redlimit/internal/requestid"
)

// Lease is how a leased handle takes its blocks (Limiter.WithLease).
//
// One limiter lives on one Redis thread, and every decision waits a round
// trip: a hot limit shared by every instance tops out at what that thread
// decides. A leased handle instead takes a block of permits in one script
// call, counted in Redis like any grant, and serves its decisions from the
// block in memory until the block runs out or Time passes; then it gives
// back what it did not use, and takes another, sized to its recent demand.
//
// The bound: a permit is counted in Redis before it is used, and used at
// most Time after Redis counted it, so the grants an instance makes are
// those Redis made, each moved later by less than Time:
//   - fixed window: a block is never used past its window's end, so no
//     window ever grants more than Rate: the bound is the limiter's own;
//   - sliding window: no span of Interval × (buckets − 1) / buckets − Time
//     grants more than Rate; token bucket: no span of Interval − Time;
//   - funnel: no span of length t grants more than Burst + Rate × (t + Time)
//     / Interval, the GCRA's bound over a span Time longer.
//
// What a block holds unused is denied to every other instance until it is
// given back: at most the number of instances × the block cap, for at most
// Time (the token bucket's until its records age out).
type Lease struct {
	// Time is the longest a block is used: the bound's slack, and how long
	// a rate change (SetRate) takes to reach the handle. Required.
	Time time.Duration
	// Max caps a block's permits; 0 leaves only Share's cap.
	Max int64
	// Share caps a block at this fraction of the limit (the smallest Limit
	// of its rates), so that a few instances cannot hold it all; 0 is 0.1.
	// A request for more than the cap is decided in Redis, unleased.
	Share float64
}

// LeaseStats counts what a leased handle did with its blocks.
type LeaseStats struct {
	Calls    int64 // script calls made for blocks: takes and refunds
	Taken    int64 // permits taken into blocks
	Used     int64 // permits granted from blocks
	Returned int64 // permits given back that Redis took back
}

// WithLease returns a handle that decides from blocks of permits it leases
// from the limiter (see Lease for the bound it keeps). Every other method
// behaves as the handle's own; a peek (zero permits) and a request larger
// than a block's cap go to Redis. Keep the handle, as the block is its
// own: the Client keeps it too, until it is closed. Close it when done, or
// the Client (Client.Close) on shutdown, so its unused permits go back at
// once.
func (l *Limiter) WithLease(cfg Lease) *Limiter {
	d := *l
	if err := cfg.validate(); err != nil {
		d.err = errors.Join(d.err, err)
	}
	if cfg.Share == 0 {
		cfg.Share = 0.1
	}
	// The blocks are internal/leasing's; they reach Redis through d.
	d.lease = leasing.New[Result](leasing.Config{Time: cfg.Time, Max: cfg.Max, Share: cfg.Share},
		leaseCalls{l: &d, time: cfg.Time}, l.client.now)
	if d.err == nil {
		l.client.leases.Store(&d, struct{}{})
	}
	return &d
}

// validate says why cfg cannot be a lease's, wrapping ErrInvalidConfig.
func (cfg Lease) validate() error {
	switch {
	case cfg.Time <= 0:
		return fmt.Errorf("%w: lease time %v: must be positive", ErrInvalidConfig, cfg.Time)
	case cfg.Max < 0:
		return fmt.Errorf("%w: lease max %d: must be 0 or more", ErrInvalidConfig, cfg.Max)
	case !(cfg.Share >= 0 && cfg.Share <= 1): // and not NaN
		return fmt.Errorf("%w: lease share %v: must be within 0 to 1", ErrInvalidConfig, cfg.Share)
	}
	return nil
}

// Close gives back what every leased handle made from the Client holds
// unused, and makes them decide in Redis from then on (Limiter.Close): for
// a service's shutdown, so that its blocks serve the other instances at
// once rather than when their lease time is up. It ends hot leases too
// (WithHotLeases): their blocks go back, and no limiter is leased again;
// and degraded mode's heartbeat (WithDegraded). It does not close the
// go-redis client, which the caller owns.
func (c *Client) Close(ctx context.Context) error {
	c.degraded.close()
	errs := []error{c.hot.close(ctx)}
	c.leases.Range(func(h, _ any) bool {
		errs = append(errs, h.(*Limiter).Close(ctx))
		return true
	})
	return errors.Join(errs...)
}

// LeaseStats reports what the handle's leases did; zero for a handle
// without one.
func (l *Limiter) LeaseStats() LeaseStats {
	if l.lease == nil {
		return LeaseStats{}
	}
	return LeaseStats(l.lease.Stats())
}

// Close gives back what the handle's lease holds unused, and makes it
// decide in Redis from then on. It does nothing on a handle without one.
func (l *Limiter) Close(ctx context.Context) error {
	if l.lease == nil {
		return nil
	}
	defer l.client.leases.Delete(l)
	return l.lease.Close(ctx)
}

// leaseCalls is how a leased handle's lease (internal/leasing) takes its
// blocks and gives them back: reservations of the limiter, and their
// releases.
type leaseCalls struct {
	l    *Limiter
	time time.Duration // the lease's Time
}

// Take reserves want permits, or as few as least: its id stays in the
// request log for as long as a refund may come (the lease's Time, and a
// minute for go-redis's re-sending).
func (lc leaseCalls) Take(ctx context.Context, want, least int64, id *requestid.ID) (leasing.Taken[Result], error) {
	l := lc.l
	r, d, err := l.ask(ctx, request{op: opReserve, permits: want, least: least, id: id,
		logWindow: max(l.client.retryWindow, lc.time+time.Minute).Milliseconds()})
	if err == nil && (d.Taken != 0 && d.Taken < least || d.Taken > want) {
		err = unexpected(d)
	}
	if err != nil {
		return leasing.Taken[Result]{}, err
	}
	limit := r.Limit
	for _, q := range r.Quotas {
		limit = min(limit, q.Limit)
	}
	return leasing.Taken[Result]{Answer: r, Limit: limit, RetryAfter: r.RetryAfter, At: d.GrantAt, Permits: d.Taken, EndsUS: d.EndsUS}, nil
}

// Refund releases what b holds: Redis takes back only what is still
// counted of b's grant, once.
func (lc leaseCalls) Refund(ctx context.Context, b leasing.Block) (int64, error) {
	r, _, err := lc.l.ask(ctx, request{op: opRelease, permits: b.Held, id: b.ID, grantAt: b.At, grantSize: b.Size})
	if err != nil {
		return 0, err
	}
	lc.l.forget()
	return r.Remaining, nil
}

// allowLeased decides permits from the handle's lease; served is false
// when the request must go to Redis as an unleased one would.
func (l *Limiter) allowLeased(ctx context.Context, permits int64) (_ Result, _ error, served bool) {
	a, err, served := l.lease.Allow(ctx, permits)
	if err != nil || !served {
		return Result{}, err, served
	}
	r := a.Last
	r.Quotas = slices.Clone(r.Quotas) // the caller's own, as a round trip's are
	switch a.Kind {
	case leasing.FromBlock:
		r.Allowed, r.RetryAfter, r.Remaining, r.Reason = true, 0, a.Held+r.Remaining, ReasonLease
		r.ResetAfter = max(0, r.ResetAfter-a.Since)
	case leasing.Denied:
		r.RetryAfter, r.Reason = r.RetryAfter-a.Since, ReasonLease
		r.ResetAfter = max(0, r.ResetAfter-a.Since)
	case leasing.Took:
		r.Remaining += a.Held
	case leasing.TookDenied:
		r.Reason = ReasonLimit
	}
	return r, nil, true
}
