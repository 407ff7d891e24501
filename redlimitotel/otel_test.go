package redlimitotel_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimitotel"
)

// series names a time series by its attributes: limiter/algorithm/outcome.
func series(set attribute.Set) string {
	get := func(k attribute.Key) string { v, _ := set.Value(k); return v.AsString() }
	return get(redlimitotel.LimiterKey) + "/" + get(redlimitotel.AlgorithmKey) + "/" + get(redlimitotel.OutcomeKey)
}

// durationDescription says which durations are round trips to Redis.
const durationDescription = "Duration of redlimit decisions: a round trip to Redis, or its attempt, for reasons limit, shadow, fail-open and degraded (then decided locally); local, without one, for lease and cache."

// decisionSeries names a series of the decision instruments: series and
// its reason, limiter/algorithm/outcome/reason. It reports an attribute set
// with anything else, or without one of the four.
func decisionSeries(t *testing.T, set attribute.Set) string {
	t.Helper()
	for _, k := range []attribute.Key{redlimitotel.LimiterKey, redlimitotel.AlgorithmKey, redlimitotel.OutcomeKey, redlimitotel.ReasonKey} {
		if !set.HasValue(k) {
			t.Errorf("attributes %v: no %s", set.ToSlice(), k)
		}
	}
	if set.Len() != 4 {
		t.Errorf("attributes %v: want limiter, algorithm, outcome and reason only", set.ToSlice())
	}
	reason, _ := set.Value(redlimitotel.ReasonKey)
	return series(set) + "/" + reason.AsString()
}

// collect reads what the SDK aggregated: the counter's value and the
// histogram's data point per series (decisionSeries).
func collect(t *testing.T, reader sdkmetric.Reader) (map[string]int64, map[string]metricdata.HistogramDataPoint[float64]) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	histograms := map[string]metricdata.HistogramDataPoint[float64]{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != redlimitotel.ScopeName {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name != redlimitotel.DecisionsName || m.Unit != "{decision}" || !data.IsMonotonic {
					t.Errorf("counter %q unit %q monotonic %v", m.Name, m.Unit, data.IsMonotonic)
				}
				for _, dp := range data.DataPoints {
					counts[decisionSeries(t, dp.Attributes)] = dp.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name != redlimitotel.DurationName || m.Unit != "s" || m.Description != durationDescription {
					t.Errorf("histogram %q unit %q description %q", m.Name, m.Unit, m.Description)
				}
				for _, dp := range data.DataPoints {
					histograms[decisionSeries(t, dp.Attributes)] = dp
				}
			default:
				t.Errorf("unexpected metric %q: %T", m.Name, m.Data)
			}
		}
	}
	return counts, histograms
}

// TestDecisionsOnRedis counts real decisions of every outcome.
func TestDecisionsOnRedis(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	observe, err := redlimitotel.Observer(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	client := redlimit.New(rdb, redlimit.WithObserver(observe), redlimit.WithPrefix("app:"))
	ctx := context.Background()

	window := client.FixedWindow("login").WithDefault(redlimit.PerMinute(2))
	for range 5 { // 2 allowed, 3 denied
		if _, err := window.Allow(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.TokenBucket("unset").Allow(ctx, 1); !errors.Is(err, redlimit.ErrNotInitialized) {
		t.Fatalf("error %v, want ErrNotInitialized", err)
	}
	if _, err := client.Throttle(ctx, "cell", 0, 1, time.Minute, 1); err != nil {
		t.Fatal(err)
	}

	counts, histograms := collect(t, reader)
	want := map[string]int64{
		"app:{login}/fixed_window/allowed/limit": 2,
		"app:{login}/fixed_window/denied/limit":  3,
		"app:{unset}/tokenbucket/error/limit":    1,
		"app:{cell}/funnel/allowed/limit":        1,
	}
	if !maps.Equal(counts, want) {
		t.Errorf("decisions %v, want %v", counts, want)
	}
	for name, n := range want {
		h := histograms[name]
		if h.Count != uint64(n) {
			t.Errorf("%s: %d durations recorded, want %d", name, h.Count, n)
		}
	}
}

// TestDurations feeds decisions of known latency, to check the buckets and
// the limiter name mapping.
func TestDurations(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	observe, err := redlimitotel.Observer(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		redlimitotel.WithLimiterName(func(name string) string { return "api" }))
	if err != nil {
		t.Fatal(err)
	}
	for _, latency := range []time.Duration{50 * time.Microsecond, 300 * time.Microsecond, 400 * time.Microsecond, 2 * time.Second} {
		observe(redlimit.Decision{Limiter: "api:203.0.113.9", Algorithm: "sliding_window", Permits: 1,
			Result: redlimit.Result{Allowed: true}, Latency: latency})
	}

	counts, histograms := collect(t, reader)
	if want := map[string]int64{"api/sliding_window/allowed/limit": 4}; !maps.Equal(counts, want) {
		t.Errorf("decisions %v, want %v", counts, want)
	}
	h := histograms["api/sliding_window/allowed/limit"]
	wantBounds := []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}
	// ≤100µs, ≤250µs, ≤500µs … and one past the last bound.
	wantCounts := []uint64{1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}
	if !slices.Equal(h.Bounds, wantBounds) || !slices.Equal(h.BucketCounts, wantCounts) {
		t.Errorf("bounds %v counts %v\nwant %v %v", h.Bounds, h.BucketCounts, wantBounds, wantCounts)
	}
	if h.Count != 4 || h.Sum != 2.00075 {
		t.Errorf("count %d sum %v, want 4 and 2.00075", h.Count, h.Sum)
	}
}

// TestBoundedByDefault: the README's per-IP HTTP example (a limiter per
// client IP, "api:" + ip) made a time series per client; by default it is
// one per outcome, and WithFullLimiterName brings the series per client back.
func TestBoundedByDefault(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	var ips []string
	for i := range 200 {
		ips = append(ips, fmt.Sprintf("203.0.%d.%d", i/100, i%100))
	}
	for i := range 50 {
		ips = append(ips, fmt.Sprintf("2001:db8:%x::1", i))
	}
	for _, full := range []bool{false, true} {
		reader := sdkmetric.NewManualReader()
		var opts []redlimitotel.Option
		if full {
			opts = append(opts, redlimitotel.WithFullLimiterName())
		}
		observe, err := redlimitotel.Observer(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), opts...)
		if err != nil {
			t.Fatal(err)
		}
		client := redlimit.New(rdb, redlimit.WithObserver(observe), redlimit.WithPrefix(fmt.Sprintf("full-%v:", full)))
		for _, ip := range ips {
			for range 2 { // 1 per minute: one allowed, one denied
				if _, err := client.FixedWindow("api:"+ip).WithDefault(redlimit.PerMinute(1)).Allow(ctx, 1); err != nil {
					t.Fatal(err)
				}
			}
		}
		counts, histograms := collect(t, reader)
		if !full {
			want := map[string]int64{"full-false:{api}/fixed_window/allowed/limit": 250, "full-false:{api}/fixed_window/denied/limit": 250}
			if !maps.Equal(counts, want) || len(histograms) != 2 {
				t.Errorf("decisions %v, %d histograms; want %v", counts, len(histograms), want)
			}
			continue
		}
		if len(counts) != 2*len(ips) || len(histograms) != 2*len(ips) || counts["full-true:{api:2001:db8:31::1}/fixed_window/denied/limit"] != 1 {
			t.Errorf("WithFullLimiterName: %d series of decisions, %d of durations; want %d", len(counts), len(histograms), 2*len(ips))
		}
	}
}

func TestLimiterBase(t *testing.T) {
	for name, want := range map[string]string{
		"app:{api:203.0.113.9}": "app:{api}", "app:{api:2001:db8::1}": "app:{api}", "app:{login}": "app:{login}",
		"login:42": "login", "login": "login", "{api}:42": "{api}", "{g}:h:i": "{g}", "svc:{x}": "svc:{x}",
		// Names the library refuses (ErrInvalidName: a '{' that opens no
		// tag), such as a key from a request put in as it came: nothing
		// after the first ':' or '{', which may be the client's, is kept.
		"a{b": "a", "app:user:a{b": "app", "user:{}": "user", "app:user:{}x:y": "app", "{": "",
	} {
		if got := redlimitotel.LimiterBase(name); got != want {
			t.Errorf("LimiterBase(%q) = %q, want %q", name, got, want)
		}
	}
}

// A limiter in shadow mode counts what the limit would have denied as
// shadow_denied, apart from the grants enforcing would have made too.
func TestShadowDenials(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	observe, err := redlimitotel.Observer(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	client := redlimit.New(rdb, redlimit.WithObserver(observe))
	trial := client.SlidingWindow("trial").WithDefault(redlimit.PerMinute(2)).WithShadow()
	for range 5 {
		r, err := trial.Allow(context.Background(), 1)
		if err != nil || !r.Allowed {
			t.Fatalf("%+v %v: shadow mode grants every request", r, err)
		}
	}
	counts, _ := collect(t, reader)
	want := map[string]int64{"trial/sliding_window/allowed/limit": 2, "trial/sliding_window/shadow_denied/shadow": 3}
	if !maps.Equal(counts, want) {
		t.Errorf("decisions %v, want %v", counts, want)
	}
}

// TestReasons: every decision carries what made it, so that the durations
// of those that waited for Redis (limit, shadow, fail-open) are told from
// those made locally (lease, cache), and each series has exactly the four
// attributes (decisionSeries).
func TestReasons(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	observe, err := redlimitotel.Observer(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	now := time.Unix(1_800_000_000, 0) // fixed: the lease's blocks and the cached denial outlive the test
	client := redlimit.New(rdb, redlimit.WithObserver(observe), redlimit.WithClock(func() time.Time { return now }), redlimit.WithLocalCache())

	allow := func(l *redlimit.Limiter, want redlimit.Reason) {
		t.Helper()
		r, err := l.Allow(ctx, 1)
		if err != nil || r.Reason != want {
			t.Fatalf("%s: %+v %v, want reason %v", l.Name(), r, err, want)
		}
	}
	// Redis grants, then denies; the next denial is the cached one's.
	plain := client.FixedWindow("plain").WithDefault(redlimit.PerMinute(1))
	allow(plain, redlimit.ReasonLimit)
	allow(plain, redlimit.ReasonLimit)
	allow(plain, redlimit.ReasonCache)
	// A leased handle takes a block of 1, then one of 10 (a tenth of the
	// rate), each a round trip; then it grants from the block.
	leased := client.FixedWindow("leased").WithDefault(redlimit.PerMinute(100)).WithLease(redlimit.Lease{Time: time.Second})
	allow(leased, redlimit.ReasonLimit)
	allow(leased, redlimit.ReasonLimit)
	allow(leased, redlimit.ReasonLease)
	allow(leased, redlimit.ReasonLease)
	// Shadow mode: a grant the limit made, then one it would have denied.
	trial := client.SlidingWindow("trial").WithDefault(redlimit.PerMinute(1)).WithShadow()
	allow(trial, redlimit.ReasonLimit)
	allow(trial, redlimit.ReasonShadow)
	// A Client failing open grants what a Redis that is down cannot decide.
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	open := redlimit.New(down, redlimit.WithObserver(observe), redlimit.WithFailOpen())
	allow(open.FixedWindow("open").WithDefault(redlimit.PerMinute(1)), redlimit.ReasonFailOpen)
	// Degraded mode decides locally what it cannot, within its share:
	// ⌈3 / 2⌉ = 2, having never reached Redis (MinInstances). The caller
	// gets no error, so the outcome is the local decision's; in shadow
	// mode, what it denies is granted.
	unreachable := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = unreachable.Close() })
	degraded := redlimit.New(unreachable, redlimit.WithObserver(observe), redlimit.WithClock(func() time.Time { return now }),
		redlimit.WithDegraded(redlimit.Degraded{Heartbeat: time.Hour, MinInstances: 2}))
	t.Cleanup(func() { _ = degraded.Close(ctx) })
	local := degraded.FixedWindow("local").WithDefault(redlimit.PerMinute(3))
	trialLocal := degraded.FixedWindow("local-trial").WithDefault(redlimit.PerMinute(3)).WithShadow()
	for range 2 {
		allow(local, redlimit.ReasonDegraded)
		allow(trialLocal, redlimit.ReasonDegraded)
	}
	allow(local, redlimit.ReasonDegraded)
	allow(trialLocal, redlimit.ReasonShadow)

	counts, histograms := collect(t, reader)
	want := map[string]int64{
		"plain/fixed_window/allowed/limit":              1,
		"plain/fixed_window/denied/limit":               1,
		"plain/fixed_window/denied/cache":               1,
		"leased/fixed_window/allowed/limit":             2,
		"leased/fixed_window/allowed/lease":             2,
		"trial/sliding_window/allowed/limit":            1,
		"trial/sliding_window/shadow_denied/shadow":     1,
		"open/fixed_window/error/fail-open":             1,
		"local/fixed_window/allowed/degraded":           2,
		"local/fixed_window/denied/degraded":            1,
		"local-trial/fixed_window/allowed/degraded":     2,
		"local-trial/fixed_window/shadow_denied/shadow": 1,
	}
	if !maps.Equal(counts, want) {
		t.Errorf("decisions %v\nwant %v", counts, want)
	}
	for name, n := range want {
		if h := histograms[name]; h.Count != uint64(n) {
			t.Errorf("%s: %d durations recorded, want %d", name, h.Count, n)
		}
	}
	if len(histograms) != len(want) {
		t.Errorf("%d series of durations, want %d", len(histograms), len(want))
	}
}
