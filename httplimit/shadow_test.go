package httplimit_test

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// A limiter in shadow mode lets every request through to the handler, which
// sees what enforcing would have answered; the rate-limit fields are sent
// only with WithShadowHeaders, and never Retry-After.
func TestShadowMode(t *testing.T) {
	for _, headers := range []bool{false, true} {
		rdb := redistest.Miniredis(t)
		client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return redistest.WindowStart }))
		var reasons []redlimit.Reason
		opts := []httplimit.Option{httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t.Error("a shadow limiter denied a request")
		}))}
		if headers {
			opts = append(opts, httplimit.WithShadowHeaders())
		}
		handler := httplimit.New(func(key string) *redlimit.Limiter {
			return client.Funnel("shadow:" + key).WithDefault(redlimit.Config{Rate: 1, Interval: time.Second, Burst: 2}).WithShadow()
		}, opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := httplimit.FromContext(r.Context())
			reasons = append(reasons, d.Result.Reason)
		}))
		want := []map[string]string{
			{"RateLimit-Policy": `"default";q=2;w=2`, "RateLimit": `"default";r=1;t=1`},
			{"RateLimit-Policy": `"default";q=2;w=2`, "RateLimit": `"default";r=0;t=2`},
			{"RateLimit-Policy": `"default";q=2;w=2`, "RateLimit": `"default";r=0;t=2`}, // enforcing: denied, retry in 1 s
		}
		for i, fields := range want {
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if rec.Code != http.StatusOK {
				t.Errorf("headers %v, request %d: status %d", headers, i, rec.Code)
			}
			got := map[string]string{}
			for _, f := range rateLimitFields {
				if v := rec.Header().Get(f); v != "" {
					got[f] = v
				}
			}
			if !headers {
				fields = map[string]string{}
			}
			if !maps.Equal(got, fields) {
				t.Errorf("headers %v, request %d: %v, want %v", headers, i, got, fields)
			}
		}
		wantReasons := []redlimit.Reason{redlimit.ReasonLimit, redlimit.ReasonLimit, redlimit.ReasonShadow}
		if !slices.Equal(reasons, wantReasons) {
			t.Errorf("headers %v: the handler saw %v, want %v", headers, reasons, wantReasons)
		}
	}
}
