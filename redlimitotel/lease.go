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

// LeaseKey says what a LeasePermitsName count is: taken, used or returned.
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
