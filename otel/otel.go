// Package redlimitotel records redlimit's decisions as OpenTelemetry metrics.
// It is its own module, so that the library itself does not depend on
// OpenTelemetry.
//
//	observe, err := redlimitotel.Observer(meterProvider)
//	if err != nil { ... }
//	client := redlimit.New(rdb, redlimit.WithObserver(observe))
package redlimitotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/redlimit/redlimit"
)

// ScopeName is the instrumentation scope the instruments are created under.
const ScopeName = "github.com/redlimit/redlimit/otel"

// The instruments and their attributes.
const (
	DecisionsName = "redlimit.decisions"         // counter, {decision}
	DurationName  = "redlimit.decision.duration" // histogram, seconds: the round trip to Redis

	LimiterKey   = attribute.Key("redlimit.limiter")   // the limiter's full name (see WithLimiterName)
	AlgorithmKey = attribute.Key("redlimit.algorithm") // tokenbucket, funnel, fixed_window, sliding_window
	OutcomeKey   = attribute.Key("redlimit.outcome")   // allowed, denied or error
)

// durationBounds suit a Redis round trip, from 100µs to a second; the SDK's
// default bounds (0, 5, 10, 25 … 10000) were chosen for milliseconds and
// would put every decision in the first bucket.
var durationBounds = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// Option configures Observer.
type Option func(*config)

type config struct {
	limiterName func(string) string
}

// WithLimiterName maps a limiter's name to the value of the limiter
// attribute; default the name itself. Every distinct value is a time series:
// limiters made per user or per IP address (as with httplimit) must be mapped
// to a few values, e.g. by cutting the key off the name.
func WithLimiterName(f func(name string) string) Option {
	return func(c *config) { c.limiterName = f }
}

// Observer returns a function for redlimit.WithObserver that counts every
// decision (DecisionsName) and records its latency (DurationName), both by
// limiter, algorithm and outcome. A nil provider is the global one
// (otel.GetMeterProvider).
func Observer(provider metric.MeterProvider, opts ...Option) (func(redlimit.Decision), error) {
	cfg := config{limiterName: func(name string) string { return name }}
	for _, opt := range opts {
		opt(&cfg)
	}
	if provider == nil {
		provider = otel.GetMeterProvider()
	}
	meter := provider.Meter(ScopeName)
	decisions, err1 := meter.Int64Counter(DecisionsName,
		metric.WithDescription("Rate-limit decisions made by redlimit."),
		metric.WithUnit("{decision}"))
	duration, err2 := meter.Float64Histogram(DurationName,
		metric.WithDescription("Duration of redlimit decisions, one round trip to Redis each."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBounds...))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return func(d redlimit.Decision) {
		outcome := "denied"
		switch {
		case d.Err != nil:
			outcome = "error"
		case d.Result.Allowed:
			outcome = "allowed"
		}
		attrs := metric.WithAttributes(
			LimiterKey.String(cfg.limiterName(d.Limiter)),
			AlgorithmKey.String(d.Algorithm),
			OutcomeKey.String(outcome),
		)
		// The observer has no context of its own: the decision is over.
		ctx := context.Background()
		decisions.Add(ctx, 1, attrs)
		duration.Record(ctx, d.Latency.Seconds(), attrs)
	}, nil
}
