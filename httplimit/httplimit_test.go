package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func uniqueName(t *testing.T) string { return redistest.UniqueName(t, "httplimit-test:") }

var rateLimitFields = []string{"RateLimit-Policy", "RateLimit", "Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}

// TestInstancesShareOneLimit runs two instances of a service, each with its
// own redlimit.Client and HTTP server, in front of one Redis: a client's
// requests count against one limit whichever instance serves them.
func TestInstancesShareOneLimit(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		name := uniqueName(t)
		cfg := redlimit.PerMinute(3)
		var admin *redlimit.Client // to change the rate, as an operator would
		startInstance := func() string {
			client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
			admin = client
			limit := httplimit.New(func(key string) *redlimit.Limiter {
				return client.FixedWindow(name + key).WithDefault(cfg)
			},
				httplimit.WithLegacyHeaders(),
				httplimit.WithClock(now.Now),
				// The test's requests all come from 127.0.0.1: trusting it as a
				// proxy lets X-Forwarded-For stand for other clients.
				httplimit.WithKey(httplimit.ClientIP("X-Forwarded-For", netip.MustParsePrefix("127.0.0.1/32"))),
				httplimit.WithPermits(func(r *http.Request) int64 {
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
		reset := func(s int64) string { return strconv.FormatInt(redistest.WindowStart.Unix()+s, 10) }
		steps := []struct {
			at       time.Duration // since redistest.WindowStart
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
			// More than the limit can ever grant: 413, with the policy (q is
			// the most a request may ask for) and nothing that says when to
			// come back, as no wait would help.
			{at: 61 * time.Second, instance: 1, client: "203.0.113.9", cost: "4", status: 413, fields: map[string]string{
				"RateLimit-Policy": policy}},
			// A rate stored in Redis wins over the handles' default, on every
			// instance at once: q follows it with no extra round trip.
			{at: 62 * time.Second, instance: 1, setRate: 5, status: 200, fields: map[string]string{
				"RateLimit-Policy": `"default";q=5;w=60`, "RateLimit": `"default";r=1;t=58`,
				"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": reset(120)}},
		}
		for i, step := range steps {
			now.Set(redistest.WindowStart.Add(step.at))
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

// TestErrors covers what happens when no decision can be made: the status,
// what the error hook and handler are told, what a request let through
// finds in its context (the Result a Client made WithFailOpen gives, from
// either), and that the only field set is Retry-After, when the breaker is
// open.
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
	negative := httplimit.WithPermits(func(*http.Request) int64 { return -1 })
	breaker := redlimit.WithBreaker(1, time.Hour)

	tests := []struct {
		name       string
		limiterFor limiterFor
		clientOpts []redlimit.Option
		opts       []httplimit.Option
		redis      string // "up", "down", or "wrong password"
		before     int    // requests served before the one checked
		status     int
		wantErr    error  // nil: the hook must not be called
		retryAfter string // "": none
	}{
		{"no key: 400, even failing open", withDefault, nil, []httplimit.Option{httplimit.WithKey(httplimit.Header("X-API-Key")), httplimit.WithFailOpen()}, "up", 0, 400, httplimit.ErrNoKey, ""},
		{"not initialized: 500, even failing open", withoutConfig, nil, []httplimit.Option{httplimit.WithFailOpen()}, "up", 0, 500, redlimit.ErrNotInitialized, ""},
		{"negative permits: 500", withDefault, nil, []httplimit.Option{negative}, "up", 0, 500, redlimit.ErrInvalidPermits, ""},
		{"negative permits: 500, even failing open", withDefault, nil, []httplimit.Option{negative, httplimit.WithFailOpen()}, "up", 0, 500, redlimit.ErrInvalidPermits, ""},
		{"misconfigured: 500, even failing open", withDefault, nil, []httplimit.Option{httplimit.WithFailOpen()}, "wrong password", 0, 500, redlimit.ErrMisconfigured, ""},
		{"misconfigured: 500, even with the Client failing open", withDefault, []redlimit.Option{redlimit.WithFailOpen()}, nil, "wrong password", 0, 500, redlimit.ErrMisconfigured, ""},
		{"redis down: fail closed", withDefault, nil, nil, "down", 0, 503, redlimit.ErrUnavailable, ""},
		{"redis down: fail open", withDefault, nil, []httplimit.Option{httplimit.WithFailOpen()}, "down", 0, 200, redlimit.ErrUnavailable, ""},
		{"redis down: the Client fails open", withDefault, []redlimit.Option{redlimit.WithFailOpen()}, nil, "down", 0, 200, nil, ""},
		// The first failure opens the breaker; the next request is answered
		// by it, and told when to come back.
		{"breaker: the failure that opens it", withDefault, []redlimit.Option{breaker}, nil, "down", 0, 503, redlimit.ErrUnavailable, ""},
		{"breaker open: 503 with Retry-After", withDefault, []redlimit.Option{breaker}, nil, "down", 1, 503, redlimit.ErrBreakerOpen, "1"},
		{"breaker open: fail open", withDefault, []redlimit.Option{breaker}, []httplimit.Option{httplimit.WithFailOpen()}, "down", 1, 200, redlimit.ErrBreakerOpen, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := miniredis.RunT(t)
			ro := &redis.Options{Addr: m.Addr(), MaxRetries: -1}
			switch tt.redis {
			case "down":
				m.Close()
			case "wrong password":
				m.RequireAuth("secret")
				ro.Password = "wrong"
			}
			rdb := redis.NewClient(ro)
			t.Cleanup(func() { _ = rdb.Close() })
			var hooked []error
			type handled struct {
				status int
				err    error
				ctxErr error // FromContext's
			}
			var errorHandled []handled
			opts := append([]httplimit.Option{
				httplimit.WithErrorHook(func(_ *http.Request, err error) { hooked = append(hooked, err) }),
				httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, status int, err error) {
					d, _ := httplimit.FromContext(r.Context())
					errorHandled = append(errorHandled, handled{status, err, d.Err})
					w.WriteHeader(status)
					_, _ = io.WriteString(w, "custom: "+err.Error())
				}),
			}, tt.opts...)
			var passed []httplimit.Decision
			handler := httplimit.New(tt.limiterFor(redlimit.New(rdb, tt.clientOpts...)), opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				d, _ := httplimit.FromContext(r.Context())
				passed = append(passed, d)
				_, _ = io.WriteString(w, "ok")
			}))
			for range tt.before {
				handler.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
			}
			hooked, errorHandled, passed = nil, nil, nil
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
			if tt.status == 200 {
				if len(errorHandled) > 0 || rec.Body.String() != "ok" {
					t.Errorf("error handler got %v, body %q; want the next handler's", errorHandled, rec.Body)
				}
				want := redlimit.Result{Allowed: true, Reason: redlimit.ReasonFailOpen}
				if len(passed) != 1 || !reflect.DeepEqual(passed[0].Result, want) || !errors.Is(passed[0].Err, tt.wantErr) || (tt.wantErr == nil) != (passed[0].Err == nil) {
					t.Errorf("the next handler saw %+v, want Result %+v and an error matching %v", passed, want, tt.wantErr)
				}
			} else {
				if len(errorHandled) != 1 || errorHandled[0].status != tt.status || !errors.Is(errorHandled[0].err, tt.wantErr) || errorHandled[0].ctxErr != errorHandled[0].err {
					t.Errorf("error handler got %v, want one call with %d and an error matching %v, in the context too", errorHandled, tt.status, tt.wantErr)
				} else if want := "custom: " + errorHandled[0].err.Error(); rec.Body.String() != want {
					t.Errorf("body %q, want %q", rec.Body, want)
				}
			}
			for _, f := range rateLimitFields {
				want := ""
				if f == "Retry-After" {
					want = tt.retryAfter
				}
				if v := rec.Header().Get(f); v != want {
					t.Errorf("%s: %q, want %q", f, v, want)
				}
			}
		})
	}
}

// TestMisconfiguredOnRedis: a refusal from a real Redis (an ACL that does not
// cover the limiter's keys) is a 500 that no WithFailOpen turns into a pass.
func TestMisconfiguredOnRedis(t *testing.T) {
	ctx := context.Background()
	s := redistest.Shared(t)
	admin := s.Client(t)
	user := uniqueName(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~elsewhere:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(ctx, "ACL", "DELUSER", user).Err() })
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: user, Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	client := redlimit.New(rdb, redlimit.WithFailOpen())
	var hooked error
	handler := httplimit.New(func(key string) *redlimit.Limiter {
		return client.FixedWindow(uniqueName(t) + key).WithDefault(redlimit.PerSecond(10))
	}, httplimit.WithFailOpen(), httplimit.WithErrorHook(func(_ *http.Request, err error) { hooked = err }))(http.NotFoundHandler())
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 500 || !errors.Is(hooked, redlimit.ErrMisconfigured) || !strings.Contains(hooked.Error(), "NOPERM") {
		t.Errorf("%d, hook got %v; want 500 and a NOPERM ErrMisconfigured", rec.Code, hooked)
	}
}

// TestDefaults: one permit per request, no legacy fields, and a funnel's q is
// its burst, its w the time the burst takes to drain.
func TestDefaults(t *testing.T) {
	rdb := redistest.Miniredis(t)
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return redistest.WindowStart }))
	cfg := redlimit.Config{Rate: 1, Interval: time.Second, Burst: 2}
	var denied bool
	handler := httplimit.New(func(key string) *redlimit.Limiter {
		return client.Funnel("defaults:" + key).WithDefault(cfg)
	}, httplimit.WithPolicy(`per "ip"`), httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		denied = true
		w.WriteHeader(http.StatusTooManyRequests)
	})))(http.NotFoundHandler())

	want := []map[string]string{
		{"RateLimit-Policy": `"per \"ip\"";q=2;w=2`, "RateLimit": `"per \"ip\"";r=1;t=1`},
		{"RateLimit-Policy": `"per \"ip\"";q=2;w=2`, "RateLimit": `"per \"ip\"";r=0;t=2`},
		{"RateLimit-Policy": `"per \"ip\"";q=2;w=2`, "RateLimit": `"per \"ip\"";r=0;t=1`, "Retry-After": "1"},
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
		t.Error("the denied handler was not called")
	}
}

// TestClientGone: a request whose client has gone away gets no answer, and
// its context's error is not an error to report.
func TestClientGone(t *testing.T) {
	rdb := redistest.Miniredis(t)
	client := redlimit.New(rdb)
	hooked := false
	handler := httplimit.New(func(key string) *redlimit.Limiter {
		return client.FixedWindow("gone:" + key).WithDefault(redlimit.PerSecond(1))
	}, httplimit.WithErrorHook(func(*http.Request, error) { hooked = true }))(http.NotFoundHandler())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if rec.Body.Len() != 0 || len(rec.Header()) != 0 || hooked {
		t.Errorf("answered %d %v %q, hook called: %v", rec.Code, rec.Header(), rec.Body, hooked)
	}
}

// fieldsOf returns every rate-limit field of a response, each field's lines
// joined by " | ": a list must be on one line, which Header.Get reads whole.
func fieldsOf(h http.Header) map[string]string {
	got := map[string]string{}
	for _, f := range rateLimitFields {
		if v := h.Values(f); len(v) > 0 {
			got[f] = strings.Join(v, " | ")
		}
	}
	return got
}

// TestStackedPolicies: a per-IP middleware outside a per-user one. Each
// appends its policy and its decision to the lists, outer first; the legacy
// fields, which hold one limit, hold the one that binds.
func TestStackedPolicies(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		name := uniqueName(t)
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		perIP := httplimit.New(func(ip string) *redlimit.Limiter {
			return client.FixedWindow(name + "ip:" + ip).WithDefault(redlimit.PerMinute(5))
		}, httplimit.WithPolicy("per-ip"), httplimit.WithLegacyHeaders(), httplimit.WithClock(now.Now))
		perUser := httplimit.New(func(user string) *redlimit.Limiter {
			return client.FixedWindow(name + "user:" + user).WithDefault(redlimit.PerMinute(2))
		}, httplimit.WithPolicy("per-user"), httplimit.WithKey(httplimit.Header("X-User")), httplimit.WithLegacyHeaders(), httplimit.WithClock(now.Now))
		handler := perIP(perUser(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "ok")
		})))

		const both = `"per-ip";q=5;w=60, "per-user";q=2;w=60`
		reset := strconv.FormatInt(redistest.WindowStart.Unix()+60, 10)
		// fields are the headers of a response: both lists, Retry-After
		// (none if ""), and the legacy ones.
		fields := func(policy, rateLimit, retryAfter, limit, remaining string) map[string]string {
			f := map[string]string{"RateLimit-Policy": policy, "RateLimit": rateLimit,
				"X-RateLimit-Limit": limit, "X-RateLimit-Remaining": remaining, "X-RateLimit-Reset": reset}
			if retryAfter != "" {
				f["Retry-After"] = retryAfter
			}
			return f
		}
		steps := []struct {
			at     time.Duration
			user   string
			status int
			fields map[string]string
		}{
			// per-user has fewer permits left: it binds.
			{10 * time.Second, "alice", 200, fields(both, `"per-ip";r=4;t=50, "per-user";r=1;t=50`, "", "2", "1")},
			{20 * time.Second, "alice", 200, fields(both, `"per-ip";r=3;t=40, "per-user";r=0;t=40`, "", "2", "0")},
			// per-user denies; per-ip granted, and counted the request.
			{30 * time.Second, "alice", 429, fields(both, `"per-ip";r=2;t=30, "per-user";r=0;t=30`, "30", "2", "0")},
			// A tie (1 left each, same reset): the outer's fields stay.
			{30 * time.Second, "bob", 200, fields(both, `"per-ip";r=1;t=30, "per-user";r=1;t=30`, "", "5", "1")},
			// per-ip has fewer left: it binds.
			{40 * time.Second, "carol", 200, fields(both, `"per-ip";r=0;t=20, "per-user";r=1;t=20`, "", "5", "0")},
			// per-ip denies: per-user never decides, so it is not reported.
			{45 * time.Second, "dave", 429, fields(`"per-ip";q=5;w=60`, `"per-ip";r=0;t=15`, "15", "5", "0")},
		}
		for i, step := range steps {
			now.Set(redistest.WindowStart.Add(step.at))
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-User", step.user)
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, req)
			if got := fieldsOf(rec.Header()); rec.Code != step.status || !maps.Equal(got, step.fields) {
				t.Errorf("step %d (+%v, %s): %d %v\nwant %d %v", i, step.at, step.user, rec.Code, got, step.status, step.fields)
			}
		}
	})
}

// TestSeveralRates: a limiter of two rates lists both in RateLimit-Policy,
// each named after its window, and RateLimit, Retry-After and the legacy
// fields report the rate that bound each decision. The names follow the
// config in force.
func TestSeveralRates(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		name := uniqueName(t)
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		limiter := client.FixedWindow(name).WithDefault(redlimit.PerSecond(2).And(redlimit.PerMinute(3)))
		handler := httplimit.New(func(string) *redlimit.Limiter { return limiter },
			httplimit.WithLegacyHeaders(), httplimit.WithClock(now.Now))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "ok")
		}))

		const both = `"default/1s";q=2;w=1, "default/1m";q=3;w=60`
		// fields are the headers of a response: Retry-After (none if "")
		// and the legacy ones, Reset in seconds since redistest.WindowStart.
		fields := func(policy, rateLimit, retryAfter, limit, remaining string, reset int64) map[string]string {
			f := map[string]string{"RateLimit-Policy": policy, "RateLimit": rateLimit,
				"X-RateLimit-Limit": limit, "X-RateLimit-Remaining": remaining,
				"X-RateLimit-Reset": strconv.FormatInt(redistest.WindowStart.Unix()+reset, 10)}
			if retryAfter != "" {
				f["Retry-After"] = retryAfter
			}
			return f
		}
		steps := []struct {
			at      time.Duration // since redistest.WindowStart
			setRate redlimit.Config
			status  int
			fields  map[string]string
		}{
			// The second has fewer left than the minute: it binds, and t is
			// its reset, not the minute's 50s.
			{at: 10 * time.Second, status: 200, fields: fields(both, `"default/1s";r=1;t=1`, "", "2", "1", 11)},
			// 0.5s to the second's end, rounded up to t=1; the legacy
			// reset is that end, 11s.
			{at: 10500 * time.Millisecond, status: 200, fields: fields(both, `"default/1s";r=0;t=1`, "", "2", "0", 11)},
			// The second denies, for 0.4s; the minute would have granted.
			{at: 10600 * time.Millisecond, status: 429, fields: fields(both, `"default/1s";r=0;t=1`, "1", "2", "0", 11)},
			// A new second: the minute's last permit, so the minute binds.
			{at: 11 * time.Second, status: 200, fields: fields(both, `"default/1m";r=0;t=49`, "", "3", "0", 60)},
			// The minute denies, for 48s; the second has permits.
			{at: 12 * time.Second, status: 429, fields: fields(both, `"default/1m";r=0;t=48`, "48", "3", "0", 60)},
			{at: 60 * time.Second, status: 200, fields: fields(both, `"default/1s";r=1;t=1`, "", "2", "1", 61)},
			// A stored config wins over the default, with no extra round
			// trip: q follows it, and the minute's usage is kept.
			{at: 61 * time.Second, setRate: redlimit.PerSecond(2).And(redlimit.PerMinute(5)), status: 200,
				fields: fields(`"default/1s";q=2;w=1, "default/1m";q=5;w=60`, `"default/1s";r=1;t=1`, "", "2", "1", 62)},
			// Down to one rate: the plain policy name again.
			{at: 62 * time.Second, setRate: redlimit.PerMinute(5), status: 200,
				fields: fields(`"default";q=5;w=60`, `"default";r=2;t=58`, "", "5", "2", 120)},
		}
		for i, step := range steps {
			now.Set(redistest.WindowStart.Add(step.at))
			if step.setRate.Rate > 0 {
				if err := limiter.SetRate(context.Background(), step.setRate); err != nil {
					t.Fatal(err)
				}
			}
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if got := fieldsOf(rec.Header()); rec.Code != step.status || !maps.Equal(got, step.fields) {
				t.Errorf("step %d (+%v): %d %v\nwant %d %v", i, step.at, rec.Code, got, step.status, step.fields)
			}
		}
	})
}

// TestBoundRateReset: with a minute's rate and an hour's, a grant the
// minute binds has t until the minute's window resets (52s, 8s into it),
// not the minute's whole window nor the hour's reset.
func TestBoundRateReset(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		limiter := client.FixedWindow(uniqueName(t)).WithDefault(redlimit.PerMinute(10).And(redlimit.PerHour(100)))
		handler := httplimit.New(func(string) *redlimit.Limiter { return limiter })(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		for _, step := range []struct {
			at   time.Duration
			want string
		}{
			{8 * time.Second, `"default/1m";r=9;t=52`},
			{59500 * time.Millisecond, `"default/1m";r=8;t=1`},
			{61 * time.Second, `"default/1m";r=9;t=59`},
		} {
			now.Set(redistest.WindowStart.Add(step.at))
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if got := rec.Header().Get("RateLimit"); rec.Code != 200 || got != step.want {
				t.Errorf("+%v: %d %s, want 200 %s", step.at, rec.Code, got, step.want)
			}
		}
	})
}

// TestPolicyFollowsConfig: w is the window of the config in force, read from
// each decision, so a SetRate that changes the interval changes w at once.
func TestPolicyFollowsConfig(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		name := uniqueName(t)
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		twoPer10s := redlimit.Config{Rate: 2, Interval: 10 * time.Second}
		limiterFor := map[string]func(string) *redlimit.Limiter{
			"fixed window": func(key string) *redlimit.Limiter {
				return client.FixedWindow(name + "fixed:" + key).WithDefault(twoPer10s)
			},
			// A funnel's q is its Burst, and w the time the Burst takes to
			// drain: 4 at 2 per 10 s is 20 s.
			"funnel": func(key string) *redlimit.Limiter {
				return client.Funnel(name + "funnel:" + key).WithDefault(redlimit.Config{Rate: 2, Interval: 10 * time.Second, Burst: 4})
			},
		}
		steps := []struct {
			at      time.Duration
			alg     string
			setRate redlimit.Config // stored before the request when Rate > 0
			fields  map[string]string
		}{
			{3 * time.Second, "fixed window", redlimit.Config{}, map[string]string{
				"RateLimit-Policy": `"per-user";q=2;w=10`, "RateLimit": `"per-user";r=1;t=7`}},
			// The case: the interval becomes a minute.
			{3 * time.Second, "fixed window", redlimit.PerMinute(2), map[string]string{
				"RateLimit-Policy": `"per-user";q=2;w=60`, "RateLimit": `"per-user";r=0;t=57`}},
			{4 * time.Second, "fixed window", redlimit.Config{}, map[string]string{
				"RateLimit-Policy": `"per-user";q=2;w=60`, "RateLimit": `"per-user";r=0;t=56`, "Retry-After": "56"}},
			{3 * time.Second, "funnel", redlimit.Config{}, map[string]string{
				"RateLimit-Policy": `"per-user";q=4;w=20`, "RateLimit": `"per-user";r=3;t=5`}},
			// The same Burst at 1 per minute drains in 4 minutes.
			{3 * time.Second, "funnel", redlimit.Config{Rate: 1, Interval: time.Minute, Burst: 4}, map[string]string{
				"RateLimit-Policy": `"per-user";q=4;w=240`, "RateLimit": `"per-user";r=2;t=65`}},
		}
		for i, step := range steps {
			now.Set(redistest.WindowStart.Add(step.at))
			if step.setRate.Rate > 0 {
				if err := limiterFor[step.alg]("u1").SetRate(context.Background(), step.setRate); err != nil {
					t.Fatal(err)
				}
			}
			handler := httplimit.New(limiterFor[step.alg], httplimit.WithPolicy("per-user"), httplimit.WithKey(httplimit.Header("X-User")))(http.NotFoundHandler())
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-User", "u1")
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, req)
			if got := fieldsOf(rec.Header()); !maps.Equal(got, step.fields) {
				t.Errorf("step %d (+%v, %s): %v\nwant %v", i, step.at, step.alg, got, step.fields)
			}
		}
	})
}

// TestHandlersSeeDecision: the next handler and denied handler read the
// decision from the request's context, and write their own bodies with it.
func TestHandlersSeeDecision(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		now.Set(redistest.WindowStart.Add(10 * time.Second))
		name := uniqueName(t)
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		describe := func(r *http.Request) string {
			d, ok := httplimit.FromContext(r.Context())
			if !ok {
				return "no decision"
			}
			res := d.Result
			return fmt.Sprintf("%s %s: allowed %v, limit %d, remaining %d, retry after %v, reset after %v, window %v, err %v",
				d.Policy, d.Key, res.Allowed, res.Limit, res.Remaining, res.RetryAfter, res.ResetAfter, res.Window, d.Err)
		}
		handler := httplimit.New(func(user string) *redlimit.Limiter {
			return client.FixedWindow(name + user).WithDefault(redlimit.PerMinute(1))
		}, httplimit.WithPolicy("per-user"), httplimit.WithKey(httplimit.Header("X-User")),
			httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = io.WriteString(w, "denied: "+describe(r))
			})))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "granted: "+describe(r))
		}))

		for i, want := range []struct {
			status int
			body   string
		}{
			{200, "granted: per-user alice: allowed true, limit 1, remaining 0, retry after 0s, reset after 50s, window 1m0s, err <nil>"},
			{429, "denied: per-user alice: allowed false, limit 1, remaining 0, retry after 50s, reset after 50s, window 1m0s, err <nil>"},
		} {
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-User", "alice")
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, req)
			if rec.Code != want.status || rec.Body.String() != want.body {
				t.Errorf("request %d: %d %q\nwant %d %q", i, rec.Code, rec.Body, want.status, want.body)
			}
		}
	})
}
