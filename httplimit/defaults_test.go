package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// TestIPv6SubscriberSharesALimit: the three addresses of one /64 that once
// had a limit each share one, as do an IPv4 client and its IPv4-mapped
// IPv6 form; another /64 has its own.
func TestIPv6SubscriberSharesALimit(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		now.Set(redistest.WindowStart.Add(10 * time.Second))
		name := uniqueName(t)
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		var keys []string
		handler := httplimit.New(func(key string) *redlimit.Limiter {
			keys = append(keys, key)
			return client.FixedWindow(name + key).WithDefault(redlimit.PerMinute(2))
		})(http.NotFoundHandler())
		steps := []struct {
			remote string
			status int
		}{
			{"[2001:db8:1:2::1]:50000", 404},
			{"[2001:db8:1:2::2]:50001", 404},
			{"[2001:db8:1:2:ffff::9]:50002", 429},
			{"[2001:db8:1:3::1]:50003", 404},
			{"1.2.3.4:50004", 404},
			{"[::ffff:1.2.3.4]:50005", 404},
			{"1.2.3.4:50006", 429},
		}
		for i, step := range steps {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = step.remote
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, r)
			if rec.Code != step.status {
				t.Errorf("request %d from %s: %d, want %d", i, step.remote, rec.Code, step.status)
			}
		}
		want := []string{"2001:db8:1:2::/64", "2001:db8:1:2::/64", "2001:db8:1:2::/64", "2001:db8:1:3::/64", "1.2.3.4", "1.2.3.4", "1.2.3.4"}
		if !slices.Equal(keys, want) {
			t.Errorf("keys %q\nwant %q", keys, want)
		}
	})
}

// fakeLimiter is an httplimit.Allower of its own: it answers from a script
// and records what it was asked.
type fakeLimiter struct {
	answers []redlimit.Result
	permits []int64
}

func (f *fakeLimiter) Allow(_ context.Context, permits int64) (redlimit.Result, error) {
	f.permits = append(f.permits, permits)
	res := f.answers[0]
	f.answers = f.answers[1:]
	return res, nil
}

// TestFakeLimiter: the middleware takes any Allower, fields and status
// coming from its Results; a nil one leaves the request unlimited.
func TestFakeLimiter(t *testing.T) {
	fake := &fakeLimiter{answers: []redlimit.Result{
		{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 1500 * time.Millisecond, Window: 10 * time.Second},
		{Allowed: false, Limit: 5, Remaining: 0, RetryAfter: 2500 * time.Millisecond, ResetAfter: 9 * time.Second, Window: 10 * time.Second},
	}}
	handler := httplimit.New(func(key string) *fakeLimiter {
		if key == "health" {
			return nil
		}
		return fake
	}, httplimit.WithKey(httplimit.Header("X-User")), httplimit.WithPermits(func(*http.Request) int64 { return 3 }))(http.NotFoundHandler())
	steps := []struct {
		user   string
		status int
		fields map[string]string
	}{
		{"alice", 404, map[string]string{"RateLimit-Policy": `"default";q=5;w=10`, "RateLimit": `"default";r=4;t=2`}},
		{"health", 404, map[string]string{}},
		{"alice", 429, map[string]string{"RateLimit-Policy": `"default";q=5;w=10`, "RateLimit": `"default";r=0;t=3`, "Retry-After": "3"}},
	}
	for i, step := range steps {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", step.user)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, r)
		if got := fieldsOf(rec.Header()); rec.Code != step.status || !maps.Equal(got, step.fields) {
			t.Errorf("request %d: %d %v\nwant %d %v", i, rec.Code, got, step.status, step.fields)
		}
	}
	if !slices.Equal(fake.permits, []int64{3, 3}) {
		t.Errorf("permits asked %v, want [3 3]", fake.permits)
	}
}

// scriptedErrors is an Allower that answers each call with the next error
// of its script, nil for a grant.
type scriptedErrors struct{ errs []error }

func (s *scriptedErrors) Allow(context.Context, int64) (redlimit.Result, error) {
	err := s.errs[0]
	s.errs = s.errs[1:]
	if err != nil {
		return redlimit.Result{}, err
	}
	return redlimit.Result{Allowed: true, Limit: 1, Window: time.Second}, nil
}

// TestBreakerOpenToldOnce: 10,000 requests answered by an open breaker are
// one call of the error hook, not 10,000; the failures that opened it are told
// each, and a run told is told again once something else came between.
func TestBreakerOpenToldOnce(t *testing.T) {
	hooked := func() (func(*http.Request, error), *[]error) {
		var errs []error
		return func(_ *http.Request, err error) { errs = append(errs, err) }, &errs
	}
	serve := func(handler http.Handler, n int, want int) {
		t.Helper()
		for range n {
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if rec.Code != want {
				t.Fatalf("status %d, want %d", rec.Code, want)
			}
		}
	}

	t.Run("a real breaker", func(t *testing.T) {
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { _ = rdb.Close() })
		m.Close()
		client := redlimit.New(rdb, redlimit.WithBreaker(3, time.Hour))
		hook, errs := hooked()
		handler := httplimit.New(func(key string) *redlimit.Limiter {
			return client.FixedWindow("breaker:" + key).WithDefault(redlimit.PerSecond(10))
		}, httplimit.WithErrorHook(hook))(http.NotFoundHandler())
		serve(handler, 10_000, 503)
		if len(*errs) != 4 {
			t.Fatalf("hook called %d times, want 4: %v", len(*errs), (*errs)[:min(len(*errs), 6)])
		}
		for i, err := range *errs {
			if open := errors.Is(err, redlimit.ErrBreakerOpen); !errors.Is(err, redlimit.ErrUnavailable) || open != (i == 3) {
				t.Errorf("error %d: %v; want ErrUnavailable, ErrBreakerOpen only for the last", i, err)
			}
		}
	})

	t.Run("runs", func(t *testing.T) {
		open := fmt.Errorf("%w: %w for 1s more", redlimit.ErrUnavailable, redlimit.ErrBreakerOpen)
		down := fmt.Errorf("%w: connection refused", redlimit.ErrUnavailable)
		var script []error
		for _, run := range []struct {
			err error
			n   int
		}{{open, 4000}, {nil, 1}, {open, 3000}, {down, 1}, {open, 2998}} {
			for range run.n {
				script = append(script, run.err)
			}
		}
		for _, failOpen := range []bool{false, true} {
			hook, errs := hooked()
			fake := &scriptedErrors{errs: slices.Clone(script)}
			opts := []httplimit.Option{httplimit.WithErrorHook(hook)}
			if failOpen {
				opts = append(opts, httplimit.WithFailOpen())
			}
			handler := httplimit.New(func(string) *scriptedErrors { return fake }, opts...)(http.NotFoundHandler())
			for i, err := range script {
				rec := httptest.NewRecorder()
				handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
				if want := map[bool]int{true: 404, false: 503}[err == nil || failOpen]; rec.Code != want {
					t.Fatalf("fail open %v, request %d: %d, want %d", failOpen, i, rec.Code, want)
				}
			}
			if want := []error{open, open, down, open}; !slices.Equal(*errs, want) {
				t.Errorf("fail open %v: hook told %v\nwant %v", failOpen, *errs, want)
			}
		}
	})
}
