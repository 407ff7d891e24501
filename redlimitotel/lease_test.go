package redlimitotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimitotel"
)

// The counters report what a leased handle took, used and gave back, and
// its calls, as its LeaseStats say.
func TestLeaseCounters(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	now := time.Unix(1_800_000_000, 0)
	client := redlimit.New(rdb, redlimit.WithPrefix("app:"), redlimit.WithClock(func() time.Time { return now }))
	l := client.FixedWindow("partner").WithDefault(redlimit.PerMinute(100)).WithLease(redlimit.Lease{Time: time.Second})
	reader := sdkmetric.NewManualReader()
	reg, err := redlimitotel.LeaseCounters(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), []*redlimit.Limiter{l})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	for range 3 {
		if ok, err := l.TryAcquire(ctx, 1); err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// 1 taken, then a block of the cap, 10; 3 used; 8 given back.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || !sum.IsMonotonic {
				t.Fatalf("metric %q: %T", m.Name, m.Data)
			}
			for _, dp := range sum.DataPoints {
				what, _ := dp.Attributes.Value(redlimitotel.LeaseKey)
				got[m.Name+" "+m.Unit+" "+series(dp.Attributes)+what.AsString()] = dp.Value
			}
		}
	}
	want := map[string]int64{
		"redlimit.lease.permits {permit} app:{partner}/fixed_window/taken":    11,
		"redlimit.lease.permits {permit} app:{partner}/fixed_window/used":     3,
		"redlimit.lease.permits {permit} app:{partner}/fixed_window/returned": 8,
		"redlimit.lease.calls {call} app:{partner}/fixed_window/":             3,
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
}
