package redlimitotel_test

import (
	"context"
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

// The hot lease metrics report the limiters leased now (two of one base
// name: one series of 2), the leases started and given back, the bound's
// slack, and what the leases did, as Client.HotLeaseStats says.
func TestHotLeaseMetrics(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	now := time.Unix(1_800_000_000, 0)
	client := redlimit.New(rdb, redlimit.WithPrefix("app:"), redlimit.WithClock(func() time.Time { return now }),
		redlimit.WithHotLeases(redlimit.HotLeases{Above: 100, Lease: redlimit.Lease{Time: 100 * time.Millisecond}}))
	reader := sdkmetric.NewManualReader()
	reg, err := redlimitotel.HotLeaseMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), client)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	allow := func(name string) {
		if _, err := client.FixedWindow(name).WithDefault(redlimit.PerMinute(100_000)).Allow(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	for range 300 {
		allow("partner:acme")
		allow("partner:bigco")
		now = now.Add(time.Millisecond)
	}
	collect := func() map[string]float64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				key := func(attrs attribute.Set) string {
					what, _ := attrs.Value(redlimitotel.LeaseKey)
					return m.Name + " " + m.Unit + " " + series(attrs) + what.AsString()
				}
				switch data := m.Data.(type) {
				case metricdata.Sum[int64]:
					for _, dp := range data.DataPoints {
						got[key(dp.Attributes)] = float64(dp.Value)
					}
				case metricdata.Gauge[int64]:
					for _, dp := range data.DataPoints {
						got[key(dp.Attributes)] = float64(dp.Value)
					}
				case metricdata.Gauge[float64]:
					for _, dp := range data.DataPoints {
						got[key(dp.Attributes)] = dp.Value
					}
				default:
					t.Fatalf("metric %q: %T", m.Name, m.Data)
				}
			}
		}
		return got
	}
	// Each: 100 decisions in Redis, a take of 1, then a block of 200 each
	// lease time (100 ms): 401 taken, 200 used, 100 given back as the
	// second block is taken, in 4 calls.
	check(t, collect(), map[string]float64{
		"redlimit.lease.hot.limiters {limiter} app:{partner}/fixed_window/": 2,
		"redlimit.lease.hot.leases {lease} //started":                       2,
		"redlimit.lease.hot.leases {lease} //cooled":                        0,
		"redlimit.lease.hot.time s //":                                      0.1,
		"redlimit.lease.hot.permits {permit} //taken":                       802,
		"redlimit.lease.hot.permits {permit} //used":                        400,
		"redlimit.lease.hot.permits {permit} //returned":                    200,
		"redlimit.lease.hot.calls {call} //":                                8,
	})

	// Two quiet seconds, a decision elsewhere: both cool, and what their
	// blocks held goes back: 101 each, in a call each.
	now = now.Add(2 * time.Second)
	allow("other")
	check(t, collect(), map[string]float64{
		"redlimit.lease.hot.leases {lease} //started":    2,
		"redlimit.lease.hot.leases {lease} //cooled":     2,
		"redlimit.lease.hot.time s //":                   0.1,
		"redlimit.lease.hot.permits {permit} //taken":    802,
		"redlimit.lease.hot.permits {permit} //used":     400,
		"redlimit.lease.hot.permits {permit} //returned": 402,
		"redlimit.lease.hot.calls {call} //":             10,
	})
}

func check(t *testing.T, got, want map[string]float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}
