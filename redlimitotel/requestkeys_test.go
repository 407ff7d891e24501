package redlimitotel_test

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/redlimitotel"
)

// TestKeysFromRequestsOneSeries: limiters made per user from a header, as
// docs/operations.md makes them ("user:" + key), are one series however many users
// there are and whatever they send: braces that would make a hash tag or
// an invalid name, control bytes, 100 KB.
func TestKeysFromRequestsOneSeries(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	observe, err := redlimitotel.Observer(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	client := redlimit.New(rdb, redlimit.WithObserver(observe), redlimit.WithPrefix("app:"))
	handler := httplimit.New(func(key string) *redlimit.Limiter {
		return client.FixedWindow("user:" + key).WithDefault(redlimit.PerMinute(10))
	}, httplimit.WithKey(httplimit.Header("X-User")))(http.NotFoundHandler())

	var users []string
	for i := range 5 {
		n := strconv.Itoa(i)
		users = append(users, "u"+n, "{x"+n+"}", "a{"+n, "a:b{"+n+"}", "\x00\xff"+n, strings.Repeat(n, 100<<10))
	}
	for _, user := range users {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header["X-User"] = []string{user}
		handler.ServeHTTP(httptest.NewRecorder(), req)
	}
	counts, _ := collect(t, reader)
	if want := map[string]int64{"app:{user}/fixed_window/allowed/limit": int64(len(users))}; !maps.Equal(counts, want) {
		t.Errorf("decisions %v, want %v", counts, want)
	}
}

// TestInvalidNamesOneSeries: a name the library refuses is an error
// decision, and all such names under one prefix are one series, though
// each holds a client's text.
func TestInvalidNamesOneSeries(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	observe, err := redlimitotel.Observer(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	client := redlimit.New(rdb, redlimit.WithObserver(observe), redlimit.WithPrefix("app:"))
	for i := range 10 {
		// The key as it came, without redlimit.KeyPart: an unclosed '{'.
		l := client.FixedWindow("user:a{" + strconv.Itoa(i)).WithDefault(redlimit.PerMinute(10))
		if _, err := l.Allow(context.Background(), 1); err == nil {
			t.Fatal("an invalid name decided")
		}
	}
	counts, _ := collect(t, reader)
	if want := map[string]int64{"app/fixed_window/error/limit": 10}; !maps.Equal(counts, want) {
		t.Errorf("decisions %v, want %v", counts, want)
	}
}
