package redlimitotel_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimitotel"
)

// The degraded mode gauges report what Client.DegradedState says: the
// instances its heartbeats counted, all and of its own id, and whether it
// decides locally: from its first local decision while Redis is down until
// Redis decides again. A Client without degraded mode reports nothing.
func TestDegradedMetrics(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	now := time.Unix(1_800_000_000, 0)
	newClient := func(id string) *redlimit.Client {
		t.Helper()
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { _ = rdb.Close() })
		c := redlimit.New(rdb, redlimit.WithPrefix("app:"), redlimit.WithClientID(id), redlimit.WithClock(func() time.Time { return now }),
			redlimit.WithDegraded(redlimit.Degraded{Heartbeat: time.Hour}))
		t.Cleanup(func() { _ = c.Close(ctx) })
		for deadline := time.Now().Add(10 * time.Second); c.DegradedState().Beat.IsZero(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no first heartbeat", id)
			}
		}
		return c
	}
	newClient("api")
	newClient("worker")
	client := newClient("api") // its first beat counts the three
	plain := redlimit.New(redis.NewClient(&redis.Options{Addr: m.Addr()}))

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	for _, c := range []*redlimit.Client{client, plain} {
		reg, err := redlimitotel.DegradedMetrics(provider, c)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Unregister()
	}
	collect := func() map[string]float64 {
		t.Helper()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				gauge, ok := m.Data.(metricdata.Gauge[int64])
				if !ok {
					t.Fatalf("metric %q: %T", m.Name, m.Data)
				}
				for _, dp := range gauge.DataPoints {
					which, _ := dp.Attributes.Value(redlimitotel.InstancesKey)
					got[m.Name+" "+m.Unit+" "+which.AsString()] = float64(dp.Value)
				}
			}
		}
		return got
	}
	l := client.FixedWindow("partner").WithDefault(redlimit.PerMinute(10))
	allow := func(want redlimit.Result) {
		t.Helper()
		if r, err := l.Allow(ctx, 1); err != nil || !reflect.DeepEqual(r, want) {
			t.Fatalf("Allow: %+v %v, want %+v", r, err, want)
		}
	}
	allow(redlimit.Result{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Minute, Window: time.Minute})
	check(t, collect(), map[string]float64{
		"redlimit.degraded.instances {instance} all":     3,
		"redlimit.degraded.instances {instance} same_id": 2,
		"redlimit.degraded.active 1 ":                    0,
	})

	// Redis down: decided locally, within ⌈10 / 3⌉ = 4.
	m.Close()
	allow(redlimit.Result{Allowed: true, Limit: 4, Remaining: 3, ResetAfter: time.Minute, Window: time.Minute, Reason: redlimit.ReasonDegraded})
	check(t, collect(), map[string]float64{
		"redlimit.degraded.instances {instance} all":     3,
		"redlimit.degraded.instances {instance} same_id": 2,
		"redlimit.degraded.active 1 ":                    1,
	})

	// Back: Redis decides again (nothing it granted locally was counted).
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	allow(redlimit.Result{Allowed: true, Limit: 10, Remaining: 8, ResetAfter: time.Minute, Window: time.Minute})
	check(t, collect(), map[string]float64{
		"redlimit.degraded.instances {instance} all":     3,
		"redlimit.degraded.instances {instance} same_id": 2,
		"redlimit.degraded.active 1 ":                    0,
	})
}
