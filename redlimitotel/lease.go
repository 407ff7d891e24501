package redlimitotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/redlimit/redlimit"
)

// The counters of leased handles (Limiter.WithLease), this instance's.
const (
	LeasePermitsName = "redlimit.lease.permits" // permits taken into blocks, used from them, and given back
	LeaseCallsName   = "redlimit.lease.calls"   // script calls made for blocks: takes and refunds
)

// LeaseKey says what a LeasePermitsName or HotPermitsName count is (taken,
// used or returned), and what a HotLeasesName count is (started, cooled).
const LeaseKey = attribute.Key("redlimit.lease")

// LeaseCounters registers counters of what each of limiters, leased
// handles, did with its blocks (Limiter.LeaseStats), read at each
// collection from memory, without a round trip: permits taken, used and
// returned (LeasePermitsName, attribute LeaseKey), and the script calls
// made (LeaseCallsName). Taken − used − returned is what the instance held
// unused or lost when a block's window ended. Their attributes are also the
// limiter (LimiterBase of its name, unless WithLimiterName or
// WithFullLimiterName) and its algorithm. Decisions, local or not, are
// counted by a Client's Observer. A nil provider is the global one.
func LeaseCounters(provider metric.MeterProvider, limiters []*redlimit.Limiter, opts ...Option) (metric.Registration, error) {
	meter, cfg := meterOf(provider, opts)
	permits, err1 := meter.Int64ObservableCounter(LeasePermitsName,
		metric.WithDescription("Permits redlimit's leased handles took into blocks, used from them, and gave back."),
		metric.WithUnit("{permit}"))
	calls, err2 := meter.Int64ObservableCounter(LeaseCallsName,
		metric.WithDescription("Script calls redlimit's leased handles made for their blocks."),
		metric.WithUnit("{call}"))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, l := range limiters {
			s := l.LeaseStats()
			limiter, algorithm := LimiterKey.String(cfg.limiterName(l.Name())), AlgorithmKey.String(l.Algorithm())
			for _, c := range []struct {
				what string
				n    int64
			}{{"taken", s.Taken}, {"used", s.Used}, {"returned", s.Returned}} {
				o.ObserveInt64(permits, c.n, metric.WithAttributes(limiter, algorithm, LeaseKey.String(c.what)))
			}
			o.ObserveInt64(calls, s.Calls, metric.WithAttributes(limiter, algorithm))
		}
		return nil
	}, permits, calls)
}

// The instruments of a Client's hot leases (redlimit.WithHotLeases).
const (
	HotLimitersName = "redlimit.lease.hot.limiters" // gauge: the limiters leased now
	HotLeasesName   = "redlimit.lease.hot.leases"   // counter: leases started and given back (LeaseKey: started, cooled)
	HotTimeName     = "redlimit.lease.hot.time"     // gauge, seconds: Lease.Time, the bound's slack
	HotPermitsName  = "redlimit.lease.hot.permits"  // counter: permits taken into blocks, used and given back (LeaseKey)
	HotCallsName    = "redlimit.lease.hot.calls"    // counter: script calls made for blocks
)

// HotLeaseMetrics registers what client's hot leases hold and did
// (Client.HotLeaseStats), read at each collection from memory: the
// limiters leased now (HotLimitersName, by limiter, as LeaseCounters names
// them, and algorithm), the leases started and given back (HotLeasesName),
// the bound's slack (HotTimeName: no grant comes from a block more than
// this after Redis counted it), and what every hot lease did with its
// blocks (HotPermitsName, HotCallsName: used permits are decisions made
// without a round trip). A nil provider is the global one.
func HotLeaseMetrics(provider metric.MeterProvider, client *redlimit.Client, opts ...Option) (metric.Registration, error) {
	meter, cfg := meterOf(provider, opts)
	limiters, err1 := meter.Int64ObservableGauge(HotLimitersName,
		metric.WithDescription("Limiters redlimit leases now, being hot on this instance."),
		metric.WithUnit("{limiter}"))
	leases, err2 := meter.Int64ObservableCounter(HotLeasesName,
		metric.WithDescription("Hot leases redlimit started (a limiter turning hot) and gave back (cooling)."),
		metric.WithUnit("{lease}"))
	slack, err3 := meter.Float64ObservableGauge(HotTimeName,
		metric.WithDescription("The lease time of redlimit's hot leases: the bound's slack."),
		metric.WithUnit("s"))
	permits, err4 := meter.Int64ObservableCounter(HotPermitsName,
		metric.WithDescription("Permits redlimit's hot leases took into blocks, used from them, and gave back."),
		metric.WithUnit("{permit}"))
	calls, err5 := meter.Int64ObservableCounter(HotCallsName,
		metric.WithDescription("Script calls redlimit's hot leases made for their blocks."),
		metric.WithUnit("{call}"))
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return nil, err
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := client.HotLeaseStats()
		// Limiters of one name under LimiterBase add up to one series.
		type series struct{ limiter, algorithm string }
		leased := map[series]int64{}
		for _, l := range s.Leased {
			leased[series{cfg.limiterName(l.Limiter), l.Algorithm}]++
		}
		for k, n := range leased {
			o.ObserveInt64(limiters, n, metric.WithAttributes(LimiterKey.String(k.limiter), AlgorithmKey.String(k.algorithm)))
		}
		o.ObserveInt64(leases, s.Started, metric.WithAttributes(LeaseKey.String("started")))
		o.ObserveInt64(leases, s.Cooled, metric.WithAttributes(LeaseKey.String("cooled")))
		o.ObserveFloat64(slack, s.Lease.Time.Seconds())
		for _, c := range []struct {
			what string
			n    int64
		}{{"taken", s.Taken}, {"used", s.Used}, {"returned", s.Returned}} {
			o.ObserveInt64(permits, c.n, metric.WithAttributes(LeaseKey.String(c.what)))
		}
		o.ObserveInt64(calls, s.Calls)
		return nil
	}, limiters, leases, slack, permits, calls)
}
