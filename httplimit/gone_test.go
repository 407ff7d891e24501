package httplimit_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// TestClientGoneMidDecision: a client that closes its connection while its
// request is being decided (net/http then cancels the request's context)
// never gets the handler run, on a Client made WithFailOpen and with
// WithFailOpen: a client that is gone is not an outage. Whether Redis had
// granted it or not, nothing is written back, and the error hook is not told.
func TestClientGoneMidDecision(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		for _, ran := range []bool{false, true} {
			rdb := newRDB()
			hook := redistest.NewHeldDecision(ran)
			rdb.AddHook(hook)
			client := redlimit.New(rdb, redlimit.WithFailOpen())
			name := uniqueName(t)
			var handled, hooked atomic.Int64
			gone := make(chan struct{}, 1)
			limit := httplimit.New(func(key string) *redlimit.Limiter {
				return client.FixedWindow(name + key).WithDefault(redlimit.PerMinute(5))
			}, httplimit.WithFailOpen(), httplimit.WithErrorHook(func(*http.Request, error) { hooked.Add(1) }))
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { handled.Add(1) })).ServeHTTP(w, r)
				gone <- struct{}{}
			}))
			for i := range 3 {
				conn, err := net.Dial("tcp", srv.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				select {
				case <-hook.Arrived():
				case <-time.After(10 * time.Second):
					t.Fatal("the decision never reached Redis")
				}
				_ = conn.Close()
				select {
				case <-gone:
				case <-time.After(10 * time.Second):
					t.Fatalf("request %d: the middleware never returned", i)
				}
			}
			srv.Close()
			if handled.Load() != 0 || hooked.Load() != 0 {
				t.Errorf("script ran %v: handler ran %d times for 3 clients gone, error hook told %d times", ran, handled.Load(), hooked.Load())
			}
		}
	})
}

// TestNilLimiter: a limiterFor that returns nil leaves the request unlimited,
// as grpclimit does: the handler runs, with no rate-limit fields.
func TestNilLimiter(t *testing.T) {
	handled := 0
	handler := httplimit.New(func(string) *redlimit.Limiter { return nil })(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled++
		if _, ok := httplimit.FromContext(r.Context()); ok {
			t.Error("a decision for a request nothing decided")
		}
		_, _ = io.WriteString(w, "ok")
	}))
	for range 3 {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != http.StatusOK || rec.Body.String() != "ok" || len(fieldsOf(rec.Header())) != 0 {
			t.Errorf("answered %d %q %v", rec.Code, rec.Body, rec.Header())
		}
	}
	if handled != 3 {
		t.Errorf("handler ran %d times, want 3", handled)
	}
}
