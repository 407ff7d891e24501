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

// The gauge reports each limit's live holds, whichever Client holds them.
func TestInFlightGauge(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	cfg := redlimit.InFlightConfig{Limit: 3, TTL: time.Minute}
	exports := redlimit.New(rdb, redlimit.WithPrefix("app:")).InFlight("exports").WithDefault(cfg)
	imports := redlimit.New(rdb, redlimit.WithPrefix("app:")).InFlight("imports").WithDefault(cfg)
	reader := sdkmetric.NewManualReader()
	reg, err := redlimitotel.InFlightGauge(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), []*redlimit.InFlight{exports, imports})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	held := func() map[string]int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				gauge, ok := m.Data.(metricdata.Gauge[int64])
				if m.Name != redlimitotel.HeldName || m.Unit != "{hold}" || !ok {
					t.Fatalf("metric %q unit %q: %T", m.Name, m.Unit, m.Data)
				}
				for _, dp := range gauge.DataPoints {
					got[series(dp.Attributes)] = dp.Value
				}
			}
		}
		return got
	}
	var holds []*redlimit.Hold
	for _, l := range []*redlimit.InFlight{exports, exports, imports} {
		h, err := l.TryAcquire(ctx)
		if err != nil || h == nil {
			t.Fatalf("acquire: %v %v", h, err)
		}
		holds = append(holds, h)
	}
	want := map[string]int64{"app:{exports}/inflight/": 2, "app:{imports}/inflight/": 1}
	if got := held(); len(got) != 2 || got["app:{exports}/inflight/"] != 2 || got["app:{imports}/inflight/"] != 1 {
		t.Fatalf("held %v, want %v", got, want)
	}
	for _, h := range holds {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := held(); got["app:{exports}/inflight/"] != 0 || got["app:{imports}/inflight/"] != 0 {
		t.Fatalf("held %v after every release, want 0", got)
	}
}
