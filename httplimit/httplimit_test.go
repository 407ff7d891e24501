package httplimit_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// windowStart is a minute boundary: fixed windows are aligned to the epoch.
var windowStart = time.Unix(1_800_000_000, 0)

// clock is the controlled time every instance decides on (redlimit.WithClock),
// so the header values are exact. The handlers read it on other goroutines.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// forEachBackend runs test on miniredis and on a real redis-server (skipped
// when none is installed). newRDB gives each instance its own connection, as
// separate processes would have.
func forEachBackend(t *testing.T, test func(t *testing.T, newRDB func() redis.UniversalClient)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		test(t, func() redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
	})
	t.Run("redis", func(t *testing.T) {
		s := redistest.Shared(t)
		test(t, func() redis.UniversalClient { return s.Client(t) })
	})
}

// uniqueName keeps tests sharing one redis-server apart.
func uniqueName(t *testing.T) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "httplimit-test:" + t.Name() + ":" + hex.EncodeToString(b) + ":"
}

var rateLimitFields = []string{"RateLimit-Policy", "RateLimit", "Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}

// TestInstancesShareOneLimit runs two instances of a service, each with its
// own redlimit.Client and HTTP server, in front of one Redis: a client's
// requests count against one limit whichever instance serves them.
func TestInstancesShareOneLimit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := &clock{}
		name := uniqueName(t)
		cfg := redlimit.PerMinute(3)
		var admin *redlimit.Client // to change the rate, as an operator would
		startInstance := func() string {
			client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
			admin = client
			limit := httplimit.New(func(key string) *redlimit.Limiter {
				return client.FixedWindow(name + key).WithDefault(cfg)
			},
				httplimit.Window(cfg.Interval),
				httplimit.LegacyHeaders(true),
				httplimit.Clock(now.Now),
				// The test's requests all come from 127.0.0.1: trusting it as a
				// proxy lets X-Forwarded-For stand for other clients.
				httplimit.ClientIP("X-Forwarded-For", netip.MustParsePrefix("127.0.0.1/32")),
				httplimit.PermitsFunc(func(r *http.Request) int64 {
					n, err := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
					if err != nil {
						return 1
					}
					return n
				}),
			)
			srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, "ok")
			})))
			t.Cleanup(srv.Close)
			return srv.URL
		}
		instances := []string{startInstance(), startInstance()}

		const policy = `"default";q=3;w=60`
		reset := func(s int64) string { return strconv.FormatInt(windowStart.Unix()+s, 10) }
		steps := []struct {
			at       time.Duration // since windowStart
			instance int
			client   string // X-Forwarded-For; "" for 127.0.0.1 itself
			cost     string // X-Cost
			setRate  int64  // per minute, stored before the request when > 0
			status   int
			fields   map[string]string // every rate-limit field: absent ones must be absent
		}{
			{at: 15 * time.Second, instance: 0, status: 200, fields: map[string]string{
				"RateLimit-Policy": policy, "RateLimit": `"default";r=2;t=45`,
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": reset(60)}},
			{at: 20 * time.Second, instance: 1, status: 200, fields: map[string]string{
				"RateLimit-Policy": policy, "RateLimit": `"default";r=1;t=40`,
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": reset(60)}},
			{at: 20 * time.Second, instance: 0, status: 200, fields: map[string]string{
				"RateLimit-Policy": policy, "RateLimit": `"default";r=0;t=40`,
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset(60)}},
			// The limit is spent on both instances: denied until the window ends.
			{at: 21 * time.Second, instance: 1, status: 429, fields: map[string]string{
				"RateLimit-Policy": policy, "RateLimit": `"default";r=0;t=39`, "Retry-After": "39",
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset(60)}},
			// 38.5s to wait: seconds are rounded up, the reset time is exact.
			{at: 21500 * time.Millisecond, instance: 0, status: 429, fields: map[string]string{
				"RateLimit-Policy": policy, "RateLimit": `"default";r=0;t=39`, "Retry-After": "39",
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset(60)}},
			// Another client has its own limit.
			{at: 21500 * time.Millisecond, instance: 1, client: "203.0.113.9", status: 200, fields: map[string]string{
				"RateLimit-Policy": policy, "RateLimit": `"default";r=2;t=39`,
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": reset(60)}},
			// A new window.
			{at: 60 * time.Second, instance: 1, status: 200, fields: map[string]string{
				"RateLimit-Policy": policy, "RateLimit": `"default";r=2;t=60`,
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": reset(120)}},
			{at: 61 * time.Second, instance: 0, cost: "2", status: 200, fields: map[string]string{
				"RateLimit-Policy": policy, "RateLimit": `"default";r=0;t=59`,
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset(120)}},
			// More than the limit: no wait would help, so no Retry-After.
			{at: 61 * time.Second, instance: 1, client: "203.0.113.9", cost: "4", status: 429, fields: map[string]string{
				"RateLimit-Policy": policy, "RateLimit": `"default";r=3;t=0`,
				"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "3", "X-RateLimit-Reset": reset(61)}},
			// A rate stored in Redis wins over the handles' default, on every
			// instance at once: q follows it with no extra round trip.
			{at: 62 * time.Second, instance: 1, setRate: 5, status: 200, fields: map[string]string{
				"RateLimit-Policy": `"default";q=5;w=60`, "RateLimit": `"default";r=1;t=58`,
				"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": reset(120)}},
		}
		for i, step := range steps {
			now.Set(windowStart.Add(step.at))
			if step.setRate > 0 {
				if err := admin.FixedWindow(name+"127.0.0.1").SetRate(context.Background(), redlimit.PerMinute(step.setRate)); err != nil {
					t.Fatal(err)
				}
			}
			req, err := http.NewRequest("GET", instances[step.instance], nil)
			if err != nil {
				t.Fatal(err)
			}
			if step.client != "" {
				req.Header.Set("X-Forwarded-For", step.client)
			}
			if step.cost != "" {
				req.Header.Set("X-Cost", step.cost)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			got := map[string]string{}
			for _, f := range rateLimitFields {
				if v := resp.Header.Values(f); len(v) > 0 {
					got[f] = v[0]
				}
			}
			if resp.StatusCode != step.status || !maps.Equal(got, step.fields) {
				t.Errorf("step %d (+%v, instance %d): %d %v\nwant %d %v", i, step.at, step.instance, resp.StatusCode, got, step.status, step.fields)
			}
		}
	})
}

// TestErrors covers what happens when no decision can be made.
func TestErrors(t *testing.T) {
	type limiterFor func(*redlimit.Client) func(string) *redlimit.Limiter
	withDefault := func(client *redlimit.Client) func(string) *redlimit.Limiter {
		return func(key string) *redlimit.Limiter {
			return client.FixedWindow("errors:" + key).WithDefault(redlimit.PerSecond(10))
		}
	}
	withoutConfig := func(client *redlimit.Client) func(string) *redlimit.Limiter {
		return func(key string) *redlimit.Limiter { return client.FixedWindow("errors:" + key) }
	}

	tests := []struct {
		name       string
		limiterFor limiterFor
		clientOpts []redlimit.Option
		opts       []httplimit.Option
		redisDown  bool
		status     int
		wantErr    error // nil: the hook must not be called
	}{
		{"no key: 400, even failing open", withDefault, nil, []httplimit.Option{httplimit.Header("X-API-Key"), httplimit.FailOpen(true)}, false, 400, httplimit.ErrNoKey},
		{"not initialized: 500, even failing open", withoutConfig, nil, []httplimit.Option{httplimit.FailOpen(true)}, false, 500, redlimit.ErrNotInitialized},
		{"negative permits: 500", withDefault, nil, []httplimit.Option{httplimit.PermitsFunc(func(*http.Request) int64 { return -1 })}, false, 500, redlimit.ErrInvalidPermits},
		{"redis down: fail closed", withDefault, nil, nil, true, 503, redlimit.ErrUnavailable},
		{"redis down: fail open", withDefault, nil, []httplimit.Option{httplimit.FailOpen(true)}, true, 200, redlimit.ErrUnavailable},
		{"redis down: the Client fails open", withDefault, []redlimit.Option{redlimit.WithFailOpen()}, nil, true, 200, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := miniredis.RunT(t)
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			if tt.redisDown {
				m.Close()
			}
			var hooked []error
			opts := append([]httplimit.Option{httplimit.ErrorHook(func(_ *http.Request, err error) { hooked = append(hooked, err) })}, tt.opts...)
			handler := httplimit.New(tt.limiterFor(redlimit.New(rdb, tt.clientOpts...)), opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, "ok")
			}))
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))

			if rec.Code != tt.status {
				t.Errorf("status %d, want %d", rec.Code, tt.status)
			}
			switch {
			case tt.wantErr == nil && len(hooked) > 0:
				t.Errorf("hook got %v, want nothing", hooked)
			case tt.wantErr != nil && (len(hooked) != 1 || !errors.Is(hooked[0], tt.wantErr)):
				t.Errorf("hook got %v, want one error matching %v", hooked, tt.wantErr)
			}
			for _, f := range rateLimitFields {
				if v := rec.Header().Get(f); v != "" {
					t.Errorf("%s: %q without a decision", f, v)
				}
			}
		})
	}
}

// TestDefaults: one permit per request, no window, no legacy fields, and a
// funnel's q is its burst.
func TestDefaults(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return windowStart }))
	cfg := redlimit.Config{Rate: 1, Interval: time.Second, Burst: 2}
	var denied bool
	handler := httplimit.New(func(key string) *redlimit.Limiter {
		return client.Funnel("defaults:" + key).WithDefault(cfg)
	}, httplimit.PolicyName(`per "ip"`), httplimit.DeniedHandler(func(w http.ResponseWriter, r *http.Request) {
		denied = true
		w.WriteHeader(http.StatusTooManyRequests)
	}))(http.NotFoundHandler())

	want := []map[string]string{
		{"RateLimit-Policy": `"per \"ip\"";q=2`, "RateLimit": `"per \"ip\"";r=1;t=1`},
		{"RateLimit-Policy": `"per \"ip\"";q=2`, "RateLimit": `"per \"ip\"";r=0;t=2`},
		{"RateLimit-Policy": `"per \"ip\"";q=2`, "RateLimit": `"per \"ip\"";r=0;t=1`, "Retry-After": "1"},
	}
	for i, fields := range want {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		got := map[string]string{}
		for _, f := range rateLimitFields {
			if v := rec.Header().Get(f); v != "" {
				got[f] = v
			}
		}
		if !maps.Equal(got, fields) {
			t.Errorf("request %d: %v, want %v", i, got, fields)
		}
	}
	if !denied {
		t.Error("the DeniedHandler was not called")
	}
}

// TestClientGone: a request whose client has gone away gets no answer, and
// its context's error is not an error to report.
func TestClientGone(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	client := redlimit.New(rdb)
	hooked := false
	handler := httplimit.New(func(key string) *redlimit.Limiter {
		return client.FixedWindow("gone:" + key).WithDefault(redlimit.PerSecond(1))
	}, httplimit.ErrorHook(func(*http.Request, error) { hooked = true }))(http.NotFoundHandler())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if rec.Body.Len() != 0 || len(rec.Header()) != 0 || hooked {
		t.Errorf("answered %d %v %q, hook called: %v", rec.Code, rec.Header(), rec.Body, hooked)
	}
}
