package redlimit

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/degradedlocal"
	"github.com/redlimit/redlimit/internal/heartbeat"
	"github.com/redlimit/redlimit/internal/local"
	"github.com/redlimit/redlimit/internal/wire"
)

// Degraded configures degraded mode (WithDegraded).
//
// When Redis cannot decide, a Client fails closed (the
// error), or with WithFailOpen grants everything: with N instances, N
// times whatever they are asked, with no bound at all. In degraded mode
// each instance enforces its share of each limit in memory instead, with
// the limiter's own algorithm, until Redis answers again:
//
//   - the share: every Client beats a heartbeat into one key of its prefix,
//     <prefix>redlimit:instances, a zset of the live instances scored by
//     their last beat, and learns from it how many are live (those heard
//     from within Expire, itself included). While Redis is unavailable a
//     limit of L is ⌈L / N⌉ for the instance, N being the most instances its
//     heartbeats counted within Expire of the last one Redis answered: the
//     instances that were live before the outage, even when a Redis that
//     lost its data had not yet heard from all of them again. A rate's Burst
//     (a funnel's) is shared the same way. A PerClient limit is shared by
//     the instances that share this Client's id (each has its own, unless
//     WithClientID gave several the same);
//   - the config: the one in force at the limiter's last decision Redis
//     answered on this instance: the handle's default, or the stored config,
//     which the instance reads once (Limiter.Config) when a decision reports
//     limits its default does not have, and again when they change. A
//     limiter no decision has met is decided on its handle's default; one
//     with neither (no default, never decided) cannot be degraded;
//   - the decision: the algorithm's own arithmetic, the scripts' in Go
//     (internal/local), exact to the µs, on the Client's clock, in a state the instance keeps per limiter, across
//     outages: Redis coming back and going again does not refill it (a new
//     config or instance count starts it afresh). Result.Reason is
//     ReasonDegraded and its Limit the share.
//
// What is counted locally is never written to Redis, nor what Redis
// counted read locally: each side starts from its own count.
//
// The bound. Say M instances decide locally, each on the same config and
// each having counted Nᵢ ≥ M live instances. Every span in which the
// algorithm grants at most L (a fixed window's window; a token bucket's
// Interval; a sliding window's Interval × (Buckets − 1) / Buckets) then
// holds at most Σ ⌈L / Nᵢ⌉ ≤ M × ⌈L / M⌉ ≤ L + M − 1 local grants: the
// shares' rounding. A funnel grants at most Burst + M − 1 + (Rate + M − 1)
// × t / Interval over any span t. A span that holds a switch, from Redis
// or back to it, adds what Redis granted in it: at most L more, so 2L + M
// − 1 in all. (Measured with three processes on a Redis killed and
// restarted under load: 31 a second gives 33 a second during the outage,
// exactly, and 64 in the seconds of the switches.) What the premise leaves
// out is churn: an instance started during the outage
// (or within one Heartbeat before it, before the others counted it) adds
// its own share, and one that never reached Redis decides nothing locally
// unless MinInstances is set; an instance gone before the outage but still
// counted makes the shares smaller, never larger. An outage that only some
// instances see adds their shares to what the others decide in Redis. Each
// instance's windows are its own clock's (WithClock's, else the machine's):
// clocks apart by d move windows apart by d.
//
// Interplay: a request Redis could not decide (ErrUnavailable; never a
// caller's own cancellation) is decided locally when it can be; when it
// cannot (see above, and a handle from Throttle, AsClient or SetRate's),
// WithFailOpen grants it, and otherwise the error is returned, as without
// degraded mode. With both options set, degraded mode so replaces
// fail-open's unbounded grant with the bounded one wherever it can. The
// error still reaches the observer, with the local Result. Shadow mode
// applies to local decisions as to Redis's. Allow, TryAcquire, Acquire,
// leased handles and Reserve are degraded (a reservation granted locally
// has Taken 0: Release gives nothing back); Charge and in-flight limits are
// not. WithBreaker makes the outage cost microseconds a decision rather
// than go-redis's timeouts and dial retries (five, 100 ms apart, by
// default): use them together.
type Degraded struct {
	// Heartbeat is how often the Client counts itself live and learns how
	// many instances are; 0 (or less than 1ms) is 5s. The first beat is
	// sent when the Client is made.
	Heartbeat time.Duration
	// Expire is how long an instance is counted after its last beat, and
	// the heartbeat key's TTL; 0, or no more than Heartbeat, is three
	// Heartbeats.
	Expire time.Duration
	// MinInstances is the fewest instances a share divides by: a floor on
	// what heartbeats count, and what an instance that has not yet reached
	// Redis divides by (0: such an instance cannot degrade).
	MinInstances int
}

// WithDegraded makes the Client decide locally, within its share of each
// limit, what Redis cannot decide, instead of failing closed or open; see
// Degraded for how, and for the bound it keeps. The heartbeat runs on a
// goroutine of its own, one script call each Heartbeat, until the Client
// is garbage collected.
func WithDegraded(d Degraded) Option {
	if d.Heartbeat < time.Millisecond {
		d.Heartbeat = 5 * time.Second
	}
	if d.Expire <= d.Heartbeat {
		d.Expire = 3 * d.Heartbeat
	}
	d.MinInstances = max(d.MinInstances, 0)
	return func(c *Client) { c.degraded = &degraded{cfg: d} }
}

// DegradedState is what a Client in degraded mode knows: Client.DegradedState.
type DegradedState struct {
	Enabled bool // WithDegraded
	// Instances is the share's divisor: the most instances the heartbeats
	// Redis answered counted live within Expire of the latest (this one
	// included); 0 before the first. SameID is the same count of those
	// with this Client's id: a PerClient limit's divisor.
	Instances, SameID int
	Beat              time.Time // when the latest was sent, on the Client's clock
	// Active: a decision Redis could not decide was decided locally, and
	// Redis has decided none since. Since is when that began.
	Active bool
	Since  time.Time
}

// DegradedState reports what degraded mode knows now: for metrics and
// operators. Zero without WithDegraded.
func (c *Client) DegradedState() DegradedState {
	d := c.degraded
	if d == nil {
		return DegradedState{}
	}
	s := DegradedState{Enabled: true, Instances: int(d.heart.Instances()), SameID: int(d.heart.Same()), Beat: d.heart.BeatAt(),
		Active: d.active.Load()}
	if s.Active {
		s.Since = time.Unix(0, d.since.Load())
	}
	return s
}

// degraded is a Client's degraded mode.
type degraded struct {
	cfg   Degraded
	heart *heartbeat.Heart // counts the live instances: the share's divisor
	// active: the latest of Redis's answer and a local decision was the
	// local decision, made since (ns).
	active atomic.Bool
	since  atomic.Int64
}

// start begins the heartbeat, whose goroutine holds nothing of the Client,
// and ends once the Client is unreachable.
func (d *degraded) start(c *Client) {
	if d == nil {
		return
	}
	transport := c.transport
	d.heart = heartbeat.Start(heartbeat.Config{Every: d.cfg.Heartbeat, Expire: d.cfg.Expire,
		Key: wire.HeartbeatKey(c.prefix), Member: wire.HeartbeatMemberOf(c.clientID, randomHex(wire.HeartbeatTagLen/2)), ClientID: c.clientID, Now: c.now,
		Run: func(ctx context.Context, keys, args []any) (any, error) {
			return transport.Run(ctx, scripts.Heartbeat, keys, args)
		}})
	runtime.AddCleanup(c, func(stop func()) { stop() }, d.heart.Stop)
}

// close ends the heartbeat (Client.Close); the instance drops out of the
// count once Expire passes without a beat.
func (d *degraded) close() {
	if d != nil && d.heart != nil {
		d.heart.Stop()
	}
}

// settle is degraded mode's part of the settle layer (pipeline.go): a
// decision Redis made teaches the config in force; one it could not make
// (ErrUnavailable, not the caller's cancellation) is decided locally when
// it can be, and ok says so.
func (d *degraded) settle(ctx context.Context, l *Limiter, permits int64, r Result, err error) (_ Result, ok bool) {
	switch {
	case d == nil:
		return Result{}, false
	case err == nil:
		if r.Reason == ReasonLimit && d.active.Load() {
			d.active.Store(false) // Redis answered: loaded first, as every decision passes here
		}
		d.learn(l, r) // a lease's or a cached denial's limits are a decision's of Redis too
		return Result{}, false
	case !errors.Is(err, ErrUnavailable) || errors.Is(ctx.Err(), context.Canceled):
		return Result{}, false
	}
	return d.decide(l, permits)
}

// degradable: a handle whose config degraded mode can know. Throttle's and
// SetRate's carry a config of their own that is not kept; AsClient's speak
// for another client, whose share is not this instance's.
func degradable(l *Limiter) bool {
	return l.err == nil && l.source != wire.SourceFixed && l.source != wire.SourceNew && l.clientID == l.client.clientIDArg
}

// learn keeps the config in force at a decision Redis made, r: the one
// seen before while r reports the same limits, else the handle's default
// if r reports its limits, else the stored config, read once.
func (d *degraded) learn(l *Limiter, r Result) {
	if !degradable(l) {
		return
	}
	var buf [maxRates]degradedlocal.Quota
	quotas := reported(buf[:0], r)
	if l.family.degraded.Knows(quotas) {
		return // as every decision Redis makes passes here: no allocation
	}
	learning := degradedlocal.Learning[Config]{Quotas: slices.Clone(quotas), Read: l.Config, Timeout: d.cfg.Heartbeat,
		InOrder: l.client.now != nil}
	if l.source == wire.SourceDefault {
		learning.Default, learning.DefaultRates = &l.dflt, l.dfltRates
	}
	l.family.degraded.Learn(learning)
}

// reported appends r's rates' Limit and Window to qs (not their resets:
// the rates, not their state).
func reported(qs []degradedlocal.Quota, r Result) []degradedlocal.Quota {
	if len(r.Quotas) == 0 {
		return append(qs, degradedlocal.Quota{Limit: r.Limit, Window: r.Window})
	}
	for _, q := range r.Quotas {
		qs = append(qs, degradedlocal.Quota{Limit: q.Limit, Window: q.Window})
	}
	return qs
}

// decide decides permits locally, if the limiter can be (see the package
// doc's degraded mode).
func (d *degraded) decide(l *Limiter, permits int64) (Result, bool) {
	if !degradable(l) {
		return Result{}, false
	}
	var cfg Config
	if s := l.family.degraded.Seen(); s != nil {
		cfg = s.Config
	} else if l.source == wire.SourceDefault {
		cfg = l.dflt
	} else {
		return Result{}, false
	}
	n := d.heart.Instances()
	if cfg.Type == PerClient {
		n = d.heart.Same()
	}
	n = max(n, int64(d.cfg.MinInstances))
	if n < 1 {
		return Result{}, false
	}
	now := l.client.clock()
	o, ok := l.family.degraded.Decide(degradedlocal.Config[Config]{Config: cfg, Equal: Config.equal, N: n, Algorithm: l.alg.Name,
		Rates: func() []degradedlocal.Rate { return localRates(l.alg, cfg) }, Retry: d.cfg.Heartbeat}, now.UnixMicro(), permits)
	if !ok {
		return Result{}, false
	}
	if !d.active.Load() && d.active.CompareAndSwap(false, true) {
		d.since.Store(now.UnixNano())
	}
	r := Result{Allowed: o.Allowed, Remaining: o.Remaining, RetryAfter: o.RetryAfter, ResetAfter: o.ResetAfter,
		Limit: o.Limit, Window: o.Window, Bound: o.Bound, Reason: ReasonDegraded}
	for _, q := range o.Quotas {
		r.Quotas = append(r.Quotas, Quota(q))
	}
	return r, true
}

// localRates is cfg's rates as alg decides them locally, each with its own
// capacity.
func localRates(alg *wire.Algorithm, cfg Config) []degradedlocal.Rate {
	var rates []degradedlocal.Rate
	for _, r := range cfg.rates() {
		r = r.withDefaults()
		lr := degradedlocal.Rate{Rate: local.Rate{Rate: r.Rate, IntervalMS: r.Interval.Milliseconds()}, Full: r.Rate}
		switch alg {
		case wire.Funnel:
			lr.Burst, lr.Full = r.Burst, r.Burst
		case wire.SlidingWindow:
			lr.Buckets = int64(r.Buckets)
		}
		if r.Calendar.Period != 0 {
			cal := r.Calendar.rule()
			lr.Window = func(us int64) (int64, int64) {
				start, end := cal.Window(time.UnixMicro(us))
				return start.UnixMicro(), end.UnixMicro()
			}
		}
		rates = append(rates, lr)
	}
	return rates
}
