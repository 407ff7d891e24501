package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// TestLeasedLimiter: the middleware in front of a kept leased handle sends
// the fields a lease's Results carry: what its block and Redis had left,
// and, denied, when Redis said permits fit.
func TestLeasedLimiter(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		now.Set(redistest.WindowStart.Add(20 * time.Second))
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		limiter := client.FixedWindow(uniqueName(t)).WithDefault(redlimit.PerMinute(10)).WithLease(redlimit.Lease{Time: time.Minute, Share: 0.5})
		handler := httplimit.New(func(string) *redlimit.Limiter { return limiter })(http.NotFoundHandler())
		want := []struct {
			status int
			fields string // RateLimit, then Retry-After
		}{
			{404, `"default";r=9;t=40 `}, {404, `"default";r=8;t=40 `}, {404, `"default";r=7;t=40 `},
			{404, `"default";r=6;t=40 `}, {404, `"default";r=5;t=40 `}, {404, `"default";r=4;t=40 `},
			{404, `"default";r=3;t=40 `}, {404, `"default";r=2;t=40 `}, {404, `"default";r=1;t=40 `},
			{404, `"default";r=0;t=40 `}, {429, `"default";r=0;t=40 40`}, {429, `"default";r=0;t=40 40`},
		}
		for i, w := range want {
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if got := rec.Header().Get("RateLimit") + " " + rec.Header().Get("Retry-After"); rec.Code != w.status || got != w.fields {
				t.Errorf("request %d: %d, %q; want %d, %q", i, rec.Code, got, w.status, w.fields)
			}
		}
		if s := limiter.LeaseStats(); s.Used != 10 || s.Calls > 6 {
			t.Errorf("lease %+v: want 10 used in 6 calls or fewer", s)
		}
	})
}
