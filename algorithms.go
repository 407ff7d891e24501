package redlimit

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/redlimit/redlimit/internal/wire"
)

// The four algorithms. Each is a module of the decision script
// (scripts/<name>.lua) holding its arithmetic; internal/wire says where its
// state lives.

// TokenBucket returns the limiter called name (after the Client's prefix) as
// Redisson's RRateLimiter keeps it: a log of grants, each given back exactly
// Interval after it was made. At most Rate permits are granted in any span of
// Interval; a full bucket grants all of them at once. Grants in one slice of
// the Interval (Interval/64) share a record, freed with the latest of them:
// the log holds at most 65 records, which bounds both Redis memory and each
// call's work, and the bucket may under-admit by one slice's permits for at
// most one slice. Rate must be below 2^32: Redisson's records count permits
// in 4 bytes.
//
// Its keys are byte-compatible with Redisson 3.21+ (the NAME hash, the
// {NAME}:value string and the {NAME}:permits zset), so Java services on
// Redisson and Go services on redlimit can share one limiter.
func (c *Client) TokenBucket(name string) *Limiter { return c.limiter(name, wire.TokenBucket) }

// Funnel returns the limiter called name (after the Client's prefix) as a
// leaky bucket computed with GCRA, as redis-cell's CL.THROTTLE does: Burst
// permits (0: Rate) fit in the funnel, which drains Rate permits per Interval,
// one every Interval/Rate. Grants are spread evenly once the burst is spent.
// Its state is one integer, a field of the limiter's hash (one hash per client
// for PerClient), which expires when the funnel is empty.
func (c *Client) Funnel(name string) *Limiter { return c.limiter(name, wire.Funnel) }

// FixedWindow returns the limiter called name (after the Client's prefix) as a
// counter per window: at most Rate permits in each window of Interval, windows
// aligned to the Unix epoch so that every instance agrees where one starts.
// Cheapest of all (two integer fields of the limiter's hash), but up to
// 2 × Rate can pass in one Interval that straddles a window edge.
func (c *Client) FixedWindow(name string) *Limiter { return c.limiter(name, wire.FixedWindow) }

// SlidingWindow returns the limiter called name (after the Client's prefix)
// as window counters: Interval split into Buckets sub-windows (0: 10), a
// decision summing the last Buckets of them. No span shorter than
// Interval × (Buckets−1)/Buckets holds more than Rate grants. Its state is one
// field of the limiter's hash listing at most Buckets counters.
func (c *Client) SlidingWindow(name string) *Limiter { return c.limiter(name, wire.SlidingWindow) }

// ThrottleResult holds CL.THROTTLE's five reply values.
type ThrottleResult struct {
	Limited    bool
	Limit      int64 // maxBurst + 1
	Remaining  int64
	RetryAfter int64 // whole seconds as CL.THROTTLE rounds them; -1 when allowed or when it can never succeed
	ResetAfter int64 // whole seconds until the funnel is empty
}

// Throttle answers as redis-cell's `CL.THROTTLE key maxBurst count period
// quantity` does, without the module (managed Redis services do not allow
// modules): count permits per period, bursts of maxBurst + 1. Quantity 0
// reports the state; unlike redis-cell, it writes nothing. The rate comes from
// the arguments only, never from a config stored under key.
func (c *Client) Throttle(ctx context.Context, key string, maxBurst, count int64, period time.Duration, quantity int64) (ThrottleResult, error) {
	if quantity < 0 {
		return ThrottleResult{}, fmt.Errorf("%w: %d", ErrInvalidPermits, quantity)
	}
	if maxBurst < 0 {
		return ThrottleResult{}, fmt.Errorf("%w: max burst %d is negative", ErrInvalidConfig, maxBurst)
	}
	if maxBurst == math.MaxInt64 { // its capacity, maxBurst + 1, would overflow
		return ThrottleResult{}, fmt.Errorf("%w: max burst %d is too large", ErrInvalidConfig, maxBurst)
	}
	l := c.Funnel(key)
	cfg := Config{Rate: count, Interval: period, Burst: maxBurst + 1}
	if err := l.Validate(cfg); err != nil {
		return ThrottleResult{}, err
	}
	// CL.THROTTLE answers a quantity above the capacity as limited, with
	// retry -1: decide, not Allow, which calls it ErrPermitsExceedRate.
	r, err := l.withConfig(wire.SourceFixed, cfg).decide(ctx, quantity)
	if err != nil {
		return ThrottleResult{}, err
	}
	retry := int64(-1)
	if !r.Allowed && r.RetryAfter >= 0 {
		retry = clSeconds(r.RetryAfter)
	}
	return ThrottleResult{Limited: !r.Allowed, Limit: r.Limit, Remaining: r.Remaining, RetryAfter: retry, ResetAfter: clSeconds(r.ResetAfter)}, nil
}

// clSeconds rounds as redis-cell does: whole seconds, plus one when the
// millisecond part is not zero.
func clSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if (d%time.Second)/time.Millisecond != 0 {
		s++
	}
	return s
}
