package redlimitotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/metric"

	"github.com/redlimit/redlimit"
)

// HeldName is the gauge of an in-flight limit's live holds, across every
// instance ({hold}).
const HeldName = "redlimit.inflight.held"

// InFlightGauge registers a gauge (HeldName) reporting, at each collection,
// how many holds each of limits has live, whoever holds them: one round trip
// to Redis per limit per collection (InFlight.Holders), so keep them few.
// Its attributes are the limiter (LimiterBase of its name, unless
// WithLimiterName or WithFullLimiterName) and the algorithm, inflight.
// Acquires are decisions too: a Client's Observer counts them (outcome
// allowed when granted, denied when the limit was full).
// Unregister it (Registration.Unregister) to stop asking. A nil provider is
// the global one.
func InFlightGauge(provider metric.MeterProvider, limits []*redlimit.InFlight, opts ...Option) (metric.Registration, error) {
	meter, cfg := meterOf(provider, opts)
	held, err := meter.Int64ObservableGauge(HeldName,
		metric.WithDescription("Holds of a redlimit in-flight limit live now, across every instance."),
		metric.WithUnit("{hold}"))
	if err != nil {
		return nil, err
	}
	return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		var errs []error
		for _, l := range limits {
			holders, err := l.Holders(ctx)
			if err != nil {
				errs = append(errs, err) // the SDK logs it; the others still report
				continue
			}
			o.ObserveInt64(held, int64(len(holders)), metric.WithAttributes(
				LimiterKey.String(cfg.limiterName(l.Name())), AlgorithmKey.String("inflight")))
		}
		return errors.Join(errs...)
	}, held)
}
