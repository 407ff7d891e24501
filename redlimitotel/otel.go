// Package redlimitotel records redlimit's decisions as OpenTelemetry metrics.
// It is its own module, so that the library itself does not depend on
// OpenTelemetry; its folder has its name, as go-redis's extra/redisotel
// does: a package otel would clash with go.opentelemetry.io/otel in the
// files that import both.
//
//	observe, err := redlimitotel.Observer(meterProvider)
//	if err != nil { ... }
//	client := redlimit.New(rdb, redlimit.WithObserver(observe))
package redlimitotel

import (
	"context"
	"errors"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/redlimit/redlimit"
)

// ScopeName is the instrumentation scope the instruments are created under.
const ScopeName = "github.com/redlimit/redlimit/redlimitotel"

// The instruments and their attributes.
const (
	DecisionsName = "redlimit.decisions"         // counter, {decision}
	DurationName  = "redlimit.decision.duration" // histogram, seconds: a round trip to Redis (or its attempt), or a local decision (see ReasonKey)

	LimiterKey   = attribute.Key("redlimit.limiter")   // the limiter's name without its key (see LimiterBase)
	AlgorithmKey = attribute.Key("redlimit.algorithm") // tokenbucket, funnel, fixed_window, sliding_window, inflight
	OutcomeKey   = attribute.Key("redlimit.outcome")   // allowed, denied, error, or shadow_denied: granted in shadow mode, denied by the limit
	// ReasonKey is what decided (redlimit.Reason's String): limit (Redis; also
	// an error's, unless granted open or degraded), shadow (shadow mode
	// granted what the limit denied), fail-open (granted while Redis could
	// not decide: outcome error), all after a round trip or its attempt;
	// degraded (decided locally, within this instance's share, what Redis
	// could not decide: WithDegraded), after the attempt, whose error the
	// caller is spared, so its outcome is the local decision's (allowed,
	// denied, shadow_denied), not error; lease (the handle's leased block) and
	// cache (a denial cached by WithLocalCache), both local, without one.
	ReasonKey = attribute.Key("redlimit.reason")
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

// WithLimiterName maps a limiter's full name (with the Client's prefix) to
// the value of the limiter attribute; default LimiterBase. Every distinct
// value is a time series: keep them few.
func WithLimiterName(f func(name string) string) Option {
	return func(c *config) { c.limiterName = f }
}

// WithFullLimiterName makes the limiter attribute the limiter's full name,
// key and all: a time series per limiter, so per user or per IP address
// with limiters made per client. For a few limiters of fixed names only.
func WithFullLimiterName() Option {
	return WithLimiterName(func(name string) string { return name })
}

// LimiterBase is the default limiter attribute: the full name cut at its
// first ':' after the prefix, where a limiter made per client
// (httplimit's and grpclimit's examples, "api:" + key) starts its key. With
// a prefix the name is in a hash tag, which stays closed:
// "app:{api:203.0.113.9}" and "app:{api:2001:db8::1}" are "app:{api}",
// "login:42" is "login", "{api}:42" is "{api}", and a name without a ':'
// ("app:{login}") is itself. A limiter of Type PerClient keeps its clients
// out of its name: it is one value already. Names whose key is not after a
// ':' need WithLimiterName.
//
// Braces are read as the hash tags the library and its callers write, so
// a key must hold none of its own: keys from requests go through
// redlimit.KeyPart (httplimit and grpclimit pass theirs through it), or a
// client sending "{x1}", "{x2}"… would make a series each. A name the
// library refuses (ErrInvalidName: a '{' that opens no tag, "user:a{b"),
// whose decisions are errors, is cut at its first ':' or '{' ("app:user:a{b"
// is "app"), since what follows may be a client's.
func LimiterBase(name string) string {
	open := strings.IndexByte(name, '{')
	if open < 0 {
		base, _, _ := strings.Cut(name, ":")
		return base
	}
	closing := strings.IndexByte(name[open:], '}')
	if closing <= 1 { // unclosed, or "{}": no hash tag
		return name[:strings.IndexAny(name, ":{")]
	}
	tag := name[open+1 : open+closing]
	if cut := strings.IndexByte(tag, ':'); cut >= 0 {
		return name[:open+1+cut] + "}"
	}
	// A tag of the caller's own ("{api}:" + key): the key follows it.
	after := open + closing + 1
	if cut := strings.IndexByte(name[after:], ':'); cut >= 0 {
		return name[:after+cut]
	}
	return name
}

// Observer returns a function for redlimit.WithObserver that counts every
// decision (DecisionsName) and records its latency (DurationName), both by
// limiter (LimiterBase of its name, unless WithLimiterName or
// WithFullLimiterName), algorithm, outcome and reason: a few time series
// however many clients have a limiter of their own. The reason tells the
// decisions that waited for Redis from those a lease or the local cache made
// in microseconds, which would otherwise blur the latency of both, and those
// degraded mode made when Redis could not (DegradedMetrics adds its state).
// A nil provider is the global one (otel.GetMeterProvider).
func Observer(provider metric.MeterProvider, opts ...Option) (func(redlimit.Decision), error) {
	meter, cfg := meterOf(provider, opts)
	decisions, err1 := meter.Int64Counter(DecisionsName,
		metric.WithDescription("Rate-limit decisions made by redlimit."),
		metric.WithUnit("{decision}"))
	duration, err2 := meter.Float64Histogram(DurationName,
		metric.WithDescription("Duration of redlimit decisions: a round trip to Redis, or its attempt, for reasons limit, shadow, fail-open and degraded (then decided locally); local, without one, for lease and cache."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBounds...))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return func(d redlimit.Decision) {
		// A decision degraded mode made carries Redis's error to the
		// observer and none to the caller: its outcome is its own. (In
		// shadow mode, what it denied is granted with reason shadow, which
		// no other error carries.)
		local := d.Result.Reason == redlimit.ReasonDegraded || d.Result.Reason == redlimit.ReasonShadow
		outcome := "denied"
		switch {
		case d.Err != nil && !local:
			outcome = "error"
		case d.Result.Reason == redlimit.ReasonShadow:
			outcome = "shadow_denied"
		case d.Result.Allowed:
			outcome = "allowed"
		}
		attrs := metric.WithAttributes(
			LimiterKey.String(cfg.limiterName(d.Limiter)),
			AlgorithmKey.String(d.Algorithm),
			OutcomeKey.String(outcome),
			ReasonKey.String(d.Result.Reason.String()),
		)
		// The observer has no context of its own: the decision is over.
		ctx := context.Background()
		decisions.Add(ctx, 1, attrs)
		duration.Record(ctx, d.Latency.Seconds(), attrs)
	}, nil
}

// meterOf applies opts and returns the package's meter from provider, the
// global one when nil.
func meterOf(provider metric.MeterProvider, opts []Option) (metric.Meter, config) {
	cfg := config{limiterName: LimiterBase}
	for _, opt := range opts {
		opt(&cfg)
	}
	if provider == nil {
		provider = otel.GetMeterProvider()
	}
	return provider.Meter(ScopeName), cfg
}
