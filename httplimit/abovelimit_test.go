package httplimit_test

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// TestAboveLimit: a request that costs more than the limit can ever grant
// is answered 413 Content Too Large through the error handler, with
// RateLimit-Policy (q tells the client the most it may ask for) and
// nothing else: no Retry-After, no RateLimit r or t, no legacy fields,
// which would say "come back then" to a request no wait lets through. It
// takes nothing, is not an outage (the error hook is not told), and under a
// stacked middleware the outer one's decision is reported as ever.
func TestAboveLimit(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := redistest.NewClock(redistest.WindowStart.Add(10 * time.Second))
		name := uniqueName(t)
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		var hooked []error
		hook := httplimit.WithErrorHook(func(_ *http.Request, err error) { hooked = append(hooked, err) })
		type handled struct {
			status  int
			errOK   bool // the error is ErrPermitsExceedRate, FromContext's too
			limit   int64
			retryAt time.Duration
		}
		var errorHandled []handled
		perUser := httplimit.New(func(user string) *redlimit.Limiter {
			return client.FixedWindow(name + "user:" + user).WithDefault(redlimit.PerMinute(3))
		}, httplimit.WithPolicy("per-user"), httplimit.WithKey(httplimit.Header("X-User")), httplimit.WithLegacyHeaders(), httplimit.WithClock(now.Now), hook,
			httplimit.WithPermits(func(r *http.Request) int64 {
				n, _ := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
				return n
			}),
			httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, status int, err error) {
				d, _ := httplimit.FromContext(r.Context())
				errorHandled = append(errorHandled, handled{status, errors.Is(err, redlimit.ErrPermitsExceedRate) && d.Err == err, d.Result.Limit, d.Result.RetryAfter})
				w.WriteHeader(status)
			}),
			httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = io.WriteString(w, "denied")
			})))
		perIP := httplimit.New(func(ip string) *redlimit.Limiter {
			return client.FixedWindow(name + "ip:" + ip).WithDefault(redlimit.PerMinute(10))
		}, httplimit.WithPolicy("per-ip"), hook)
		ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })

		const user = `"per-user";q=3;w=60`
		reset := strconv.FormatInt(redistest.WindowStart.Unix()+60, 10)
		steps := []struct {
			stacked bool // behind perIP
			cost    string
			status  int
			body    string
			fields  map[string]string
		}{
			{cost: "4", status: 413, fields: map[string]string{"RateLimit-Policy": user}},
			// It took nothing: the whole limit is there.
			{cost: "3", status: 200, body: "ok", fields: map[string]string{"RateLimit-Policy": user, "RateLimit": `"per-user";r=0;t=50`,
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset}},
			// Spent or not, no wait lets 4 through: 413, not 429.
			{cost: "4", status: 413, fields: map[string]string{"RateLimit-Policy": user}},
			{cost: "1", status: 429, body: "denied", fields: map[string]string{"RateLimit-Policy": user, "RateLimit": `"per-user";r=0;t=50`, "Retry-After": "50",
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset}},
			// The outer middleware granted, and says so; the inner one adds
			// its policy only.
			{stacked: true, cost: "4", status: 413, fields: map[string]string{
				"RateLimit-Policy": `"per-ip";q=10;w=60, ` + user, "RateLimit": `"per-ip";r=9;t=50`}},
		}
		for i, step := range steps {
			handler := perUser(ok)
			if step.stacked {
				handler = perIP(handler)
			}
			errorHandled = nil
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-User", "alice")
			req.Header.Set("X-Cost", step.cost)
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, req)
			if got := fieldsOf(rec.Header()); rec.Code != step.status || rec.Body.String() != step.body || !maps.Equal(got, step.fields) {
				t.Errorf("step %d (cost %s): %d %q %v\nwant %d %q %v", i, step.cost, rec.Code, rec.Body, got, step.status, step.body, step.fields)
			}
			if want := (handled{413, true, 3, redlimit.Never}); step.status == 413 && (len(errorHandled) != 1 || errorHandled[0] != want) {
				t.Errorf("step %d: error handler got %+v, want one call with %+v", i, errorHandled, want)
			}
		}
		if len(hooked) > 0 {
			t.Errorf("error hook told %v", hooked)
		}
	})
}

// aboveLimitAllower answers as Limiter.Allow did before it returned
// ErrPermitsExceedRate: a denial with RetryAfter Never and no error, as an
// Allower written then still may.
type aboveLimitAllower struct{}

func (*aboveLimitAllower) Allow(_ context.Context, _ int64) (redlimit.Result, error) {
	return redlimit.Result{Limit: 5, Remaining: 5, RetryAfter: redlimit.Never, Window: 10 * time.Second}, nil
}

// TestAboveLimitFromAllower: such an answer is the same 413, with the
// default error handler's body.
func TestAboveLimitFromAllower(t *testing.T) {
	hooked := false
	handler := httplimit.New(func(string) *aboveLimitAllower { return &aboveLimitAllower{} },
		httplimit.WithErrorHook(func(*http.Request, error) { hooked = true }),
		httplimit.WithLegacyHeaders())(http.NotFoundHandler())
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	want := map[string]string{"RateLimit-Policy": `"default";q=5;w=10`}
	if got := fieldsOf(rec.Header()); rec.Code != 413 || rec.Body.String() != "Request Entity Too Large\n" || !maps.Equal(got, want) || hooked {
		t.Errorf("%d %q %v, hook called: %v\nwant 413 %v", rec.Code, rec.Body, got, hooked, want)
	}
}
