package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
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

// taggedName is uniqueName under a hash tag of its own: every limiter named
// from it is in one Cluster slot, as NewAll needs.
func taggedName(t *testing.T) string { return fmt.Sprintf("{all%x}", rand.Uint32()) + uniqueName(t) }

// available lists each limiter's AvailablePermits.
func available(t *testing.T, ls ...*redlimit.Limiter) []int64 {
	t.Helper()
	out := make([]int64, len(ls))
	for i, l := range ls {
		n, err := l.AvailablePermits(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out[i] = n
	}
	return out
}

// describeAll writes what FromContext holds under NewAll: the binding
// policy, then each policy's decision.
func describeAll(r *http.Request) string {
	d, ok := httplimit.FromContext(r.Context())
	if !ok {
		return "no decision"
	}
	s := fmt.Sprintf("%s %s %v %v err=%v:", d.Policy, d.Key, d.Result.Allowed, d.Result.RetryAfter, d.Err != nil)
	for _, p := range d.Policies {
		s += fmt.Sprintf(" [%s %s %v %d %v]", p.Policy, p.Key, p.Result.Allowed, p.Result.Remaining, p.Result.RetryAfter)
	}
	return s
}

// TestNewAll: per IP and per user decided at once. A request the per-user
// policy denies leaves the per-IP limiter as it was (a stacked New would
// have counted it there: see TestStackedPolicies, whose steps these
// follow), and the other way round. Both policies are reported, each by its
// own limiter's Result, and the legacy fields and Retry-After are the
// binding policy's. On every backend, a Cluster's names under one hash tag.
func TestNewAll(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		name := taggedName(t)
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		ipLimiter := func(ip string) *redlimit.Limiter {
			return client.FixedWindow(name + "ip:" + ip).WithDefault(redlimit.PerMinute(5))
		}
		userLimiter := func(user string) *redlimit.Limiter {
			if user == "admin" {
				return nil // not limited per user
			}
			return client.FixedWindow(name + "user:" + user).WithDefault(redlimit.PerMinute(2))
		}
		handler := httplimit.NewAll(client, []httplimit.Policy{
			{Name: "per-ip", Limiter: ipLimiter},
			{Name: "per-user", Limiter: userLimiter, Key: httplimit.Header("X-User"), Permits: func(r *http.Request) int64 {
				n, err := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
				if err != nil {
					return 1
				}
				return n
			}},
		}, httplimit.WithLegacyHeaders(), httplimit.WithClock(now.Now),
			// A denial, and a request above a limit (413), are no errors.
			httplimit.WithErrorHook(func(_ *http.Request, err error) { t.Errorf("error hook told %v", err) }),
			httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = io.WriteString(w, describeAll(r))
			})),
			httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, status int, err error) {
				w.WriteHeader(status)
				_, _ = io.WriteString(w, describeAll(r))
			}))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, describeAll(r))
		}))

		const both = `"per-ip";q=5;w=60, "per-user";q=2;w=60`
		reset := strconv.FormatInt(redistest.WindowStart.Unix()+60, 10)
		fields := func(policy, rateLimit, retryAfter, limit, remaining string) map[string]string {
			f := map[string]string{"RateLimit-Policy": policy, "RateLimit": rateLimit,
				"X-RateLimit-Limit": limit, "X-RateLimit-Remaining": remaining, "X-RateLimit-Reset": reset}
			if retryAfter != "" {
				f["Retry-After"] = retryAfter
			}
			return f
		}
		const ip = "192.0.2.1" // httptest.NewRequest's RemoteAddr
		steps := []struct {
			at        time.Duration
			user      string
			cost      string
			status    int
			fields    map[string]string
			body      string
			available []int64 // afterwards: the IP's, alice's, bob's
		}{
			// per-user has fewer permits left: it binds.
			{10 * time.Second, "alice", "", 200, fields(both, `"per-ip";r=4;t=50, "per-user";r=1;t=50`, "", "2", "1"),
				"per-user alice true 0s err=false: [per-ip " + ip + " true 4 0s] [per-user alice true 1 0s]", []int64{4, 1, 2}},
			{20 * time.Second, "alice", "", 200, fields(both, `"per-ip";r=3;t=40, "per-user";r=0;t=40`, "", "2", "0"),
				"per-user alice true 0s err=false: [per-ip " + ip + " true 3 0s] [per-user alice true 0 0s]", []int64{3, 0, 2}},
			// per-user denies: per-ip would have granted, and counted
			// nothing (stacked, it was down to 2 here). Its item says what
			// it still has.
			{30 * time.Second, "alice", "", 429, fields(both, `"per-ip";r=3;t=30, "per-user";r=0;t=30`, "30", "2", "0"),
				"per-user alice false 30s err=false: [per-ip " + ip + " true 3 0s] [per-user alice false 0 30s]", []int64{3, 0, 2}},
			{31 * time.Second, "alice", "", 429, fields(both, `"per-ip";r=3;t=29, "per-user";r=0;t=29`, "29", "2", "0"),
				"per-user alice false 29s err=false: [per-ip " + ip + " true 3 0s] [per-user alice false 0 29s]", []int64{3, 0, 2}},
			// More than per-user ever grants: 413, nothing counted, no
			// Retry-After, RateLimit item or legacy fields for it.
			{31 * time.Second, "bob", "3", 413, map[string]string{"RateLimit-Policy": both, "RateLimit": `"per-ip";r=3;t=29`},
				"per-user bob false -1ns err=true: [per-ip " + ip + " true 3 0s] [per-user bob false 2 -1ns]", []int64{3, 0, 2}},
			// A tie (1 left each, one reset): the first policy binds.
			{40 * time.Second, "bob", "", 200, fields(both, `"per-ip";r=2;t=20, "per-user";r=1;t=20`, "", "2", "1"),
				"per-user bob true 0s err=false: [per-ip " + ip + " true 2 0s] [per-user bob true 1 0s]", []int64{2, 0, 1}},
			{40 * time.Second, "carol", "", 200, fields(both, `"per-ip";r=1;t=20, "per-user";r=1;t=20`, "", "5", "1"),
				"per-ip " + ip + " true 0s err=false: [per-ip " + ip + " true 1 0s] [per-user carol true 1 0s]", []int64{1, 0, 1}},
			// Not limited per user: per-ip alone, binding.
			{41 * time.Second, "admin", "", 200, fields(`"per-ip";q=5;w=60`, `"per-ip";r=0;t=19`, "", "5", "0"),
				"per-ip " + ip + " true 0s err=false: [per-ip " + ip + " true 0 0s]", []int64{0, 0, 1}},
			// per-ip denies: bob's permit stays (stacked, per-user would not
			// have been asked; here it is, and reported, counting nothing).
			{45 * time.Second, "bob", "", 429, fields(both, `"per-ip";r=0;t=15, "per-user";r=1;t=15`, "15", "5", "0"),
				"per-ip " + ip + " false 15s err=false: [per-ip " + ip + " false 0 15s] [per-user bob true 1 0s]", []int64{0, 0, 1}},
			// Both deny: the longer wait is none, a tie: the first binds.
			{50 * time.Second, "alice", "", 429, fields(both, `"per-ip";r=0;t=10, "per-user";r=0;t=10`, "10", "5", "0"),
				"per-ip " + ip + " false 10s err=false: [per-ip " + ip + " false 0 10s] [per-user alice false 0 10s]", []int64{0, 0, 1}},
		}
		for i, step := range steps {
			now.Set(redistest.WindowStart.Add(step.at))
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-User", step.user)
			if step.cost != "" {
				req.Header.Set("X-Cost", step.cost)
			}
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, req)
			if got := fieldsOf(rec.Header()); rec.Code != step.status || !maps.Equal(got, step.fields) || rec.Body.String() != step.body {
				t.Errorf("step %d (+%v, %s): %d %v\n%q\nwant %d %v\n%q", i, step.at, step.user, rec.Code, got, rec.Body, step.status, step.fields, step.body)
			}
			if got := available(t, ipLimiter(ip), userLimiter("alice"), userLimiter("bob")); !slices.Equal(got, step.available) {
				t.Errorf("step %d: available %v, want %v", i, got, step.available)
			}
		}
	})
}

// TestNewAllLongestWait: of two denials, Retry-After and the binding
// policy are the longer wait's, whichever comes first, and a request above
// a limit binds over any wait; the policies' own limiters keep what a
// denied call did not take.
func TestNewAllLongestWait(t *testing.T) {
	rdb := redistest.Miniredis(t)
	now := redistest.NewClock(redistest.WindowStart.Add(5 * time.Second))
	client := redlimit.New(rdb, redlimit.WithClock(now.Now))
	burst := client.FixedWindow("burst").WithDefault(redlimit.Config{Rate: 1, Interval: 10 * time.Second})
	minute := client.FixedWindow("minute").WithDefault(redlimit.PerMinute(1))
	var denials []string
	handler := httplimit.NewAll(client, []httplimit.Policy{
		{Name: "burst", Limiter: func(string) *redlimit.Limiter { return burst }, Permits: func(r *http.Request) int64 {
			n, _ := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
			return max(n, 1)
		}},
		{Name: "minute", Limiter: func(string) *redlimit.Limiter { return minute }},
	}, httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		denials = append(denials, describeAll(r))
		w.WriteHeader(http.StatusTooManyRequests)
	})), httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, status int, err error) {
		denials = append(denials, describeAll(r))
		w.WriteHeader(status)
	}))(http.NotFoundHandler())

	const policy = `"burst";q=1;w=10, "minute";q=1;w=60`
	steps := []struct {
		at     time.Duration
		cost   string // X-Cost, burst's permits
		status int
		fields map[string]string
	}{
		{5 * time.Second, "", 404, map[string]string{"RateLimit-Policy": policy, "RateLimit": `"burst";r=0;t=5, "minute";r=0;t=55`}},
		// Both deny: burst for 4s, minute for 54s.
		{6 * time.Second, "", 429, map[string]string{"RateLimit-Policy": policy, "RateLimit": `"burst";r=0;t=4, "minute";r=0;t=54`, "Retry-After": "54"}},
		// A new burst window: it would grant, and keeps its permit.
		{12 * time.Second, "", 429, map[string]string{"RateLimit-Policy": policy, "RateLimit": `"burst";r=1;t=0, "minute";r=0;t=48`, "Retry-After": "48"}},
		// More than burst ever grants, no wait helps: that is longer than
		// any wait, so no Retry-After, and 413.
		{13 * time.Second, "2", 413, map[string]string{"RateLimit-Policy": policy, "RateLimit": `"minute";r=0;t=47`}},
	}
	for i, step := range steps {
		now.Set(redistest.WindowStart.Add(step.at))
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Cost", step.cost)
		handler.ServeHTTP(rec, req)
		if got := fieldsOf(rec.Header()); rec.Code != step.status || !maps.Equal(got, step.fields) {
			t.Errorf("step %d (+%v): %d %v\nwant %d %v", i, step.at, rec.Code, got, step.status, step.fields)
		}
	}
	want := []string{
		"minute 192.0.2.1 false 54s err=false: [burst 192.0.2.1 false 0 4s] [minute 192.0.2.1 false 0 54s]",
		"minute 192.0.2.1 false 48s err=false: [burst 192.0.2.1 true 1 0s] [minute 192.0.2.1 false 0 48s]",
		"burst 192.0.2.1 false -1ns err=true: [burst 192.0.2.1 false 1 -1ns] [minute 192.0.2.1 false 0 47s]",
	}
	if !slices.Equal(denials, want) {
		t.Errorf("the denied handler saw\n%q\nwant\n%q", denials, want)
	}
	if got := available(t, burst, minute); !slices.Equal(got, []int64{1, 0}) {
		t.Errorf("available %v, want [1 0]", got)
	}
}

// TestNewAllShadow: a policy in shadow mode does not hold back the others,
// and sends its fields only with WithShadowHeaders, never Retry-After.
func TestNewAllShadow(t *testing.T) {
	for _, headers := range []bool{false, true} {
		rdb := redistest.Miniredis(t)
		client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return redistest.WindowStart }))
		trial := client.FixedWindow("trial").WithDefault(redlimit.PerMinute(1)).WithShadow()
		enforced := client.FixedWindow("enforced").WithDefault(redlimit.PerMinute(10))
		opts := []httplimit.Option{}
		if headers {
			opts = append(opts, httplimit.WithShadowHeaders())
		}
		var reasons []redlimit.Reason
		handler := httplimit.NewAll(client, []httplimit.Policy{
			{Name: "trial", Limiter: func(string) *redlimit.Limiter { return trial }},
			{Name: "enforced", Limiter: func(string) *redlimit.Limiter { return enforced }},
		}, opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := httplimit.FromContext(r.Context())
			reasons = append(reasons, d.Policies[0].Result.Reason)
		}))
		for i, remaining := range []string{"9", "8"} {
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			want := map[string]string{"RateLimit-Policy": `"enforced";q=10;w=60`, "RateLimit": `"enforced";r=` + remaining + `;t=60`}
			if headers {
				want = map[string]string{"RateLimit-Policy": `"trial";q=1;w=60, "enforced";q=10;w=60`,
					"RateLimit": `"trial";r=0;t=60, "enforced";r=` + remaining + `;t=60`}
			}
			if got := fieldsOf(rec.Header()); rec.Code != 200 || !maps.Equal(got, want) {
				t.Errorf("headers %v, request %d: %d %v\nwant 200 %v", headers, i, rec.Code, got, want)
			}
		}
		if want := []redlimit.Reason{redlimit.ReasonLimit, redlimit.ReasonShadow}; !slices.Equal(reasons, want) {
			t.Errorf("headers %v: the trial policy's reasons %v, want %v", headers, reasons, want)
		}
	}
}

// TestNewAllErrors: what a request gets when the policies cannot be
// decided. As New: 400 for a KeyFunc's error, 503 or a pass (WithFailOpen)
// when Redis is down, 500 for everything else, fail-open or not. Limiters
// of two Clients cannot be decided in one call: ErrMisconfigured.
func TestNewAllErrors(t *testing.T) {
	tests := []struct {
		name    string
		redis   string // "up", "down", "wrong password"
		opts    []httplimit.Option
		other   bool // the per-user limiter is another Client's
		status  int
		wantErr error
		body    string // the error handler's, or the next handler's
	}{
		{"no key: 400, even failing open", "up", []httplimit.Option{httplimit.WithFailOpen()}, false, 400, httplimit.ErrNoKey,
			"per-user  false 0s err=true:"},
		{"redis down: 503", "down", nil, false, 503, redlimit.ErrUnavailable,
			"  false 0s err=true: [per-ip 192.0.2.1 false 0 0s] [per-user alice false 0 0s]"},
		{"redis down: fail open", "down", []httplimit.Option{httplimit.WithFailOpen()}, false, 200, redlimit.ErrUnavailable,
			"  true 0s err=true: [per-ip 192.0.2.1 true 0 0s] [per-user alice true 0 0s]"},
		{"misconfigured: 500, even failing open", "wrong password", []httplimit.Option{httplimit.WithFailOpen()}, false, 500, redlimit.ErrMisconfigured,
			"  false 0s err=true: [per-ip 192.0.2.1 false 0 0s] [per-user alice false 0 0s]"},
		{"two Clients: 500, even failing open", "up", []httplimit.Option{httplimit.WithFailOpen()}, true, 500, redlimit.ErrMisconfigured,
			"  false 0s err=true: [per-ip 192.0.2.1 false 0 0s] [per-user alice false 0 0s]"},
		{"negative permits: 500", "up", []httplimit.Option{httplimit.WithPermits(func(*http.Request) int64 { return -1 })}, false, 500, redlimit.ErrInvalidPermits,
			"  false 0s err=true: [per-ip 192.0.2.1 false 0 0s] [per-user alice false 0 0s]"},
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
			client := redlimit.New(rdb)
			userClient := client
			if tt.other {
				userClient = redlimit.New(rdb)
			}
			var hooked, handled []error
			opts := append([]httplimit.Option{
				httplimit.WithErrorHook(func(_ *http.Request, err error) { hooked = append(hooked, err) }),
				httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, status int, err error) {
					handled = append(handled, err)
					w.WriteHeader(status)
					_, _ = io.WriteString(w, describeAll(r))
				}),
			}, tt.opts...)
			handler := httplimit.NewAll(client, []httplimit.Policy{
				{Name: "per-ip", Limiter: func(ip string) *redlimit.Limiter {
					return client.FixedWindow("ip:" + ip).WithDefault(redlimit.PerMinute(5))
				}},
				{Name: "per-user", Key: httplimit.Header("X-User"), Limiter: func(user string) *redlimit.Limiter {
					return userClient.FixedWindow("user:" + user).WithDefault(redlimit.PerMinute(5))
				}},
			}, opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, describeAll(r))
			}))
			req := httptest.NewRequest("GET", "/", nil)
			if tt.wantErr != httplimit.ErrNoKey {
				req.Header.Set("X-User", "alice")
			}
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, req)
			if rec.Code != tt.status || rec.Body.String() != tt.body {
				t.Errorf("%d %q\nwant %d %q", rec.Code, rec.Body, tt.status, tt.body)
			}
			if len(hooked) != 1 || !errors.Is(hooked[0], tt.wantErr) {
				t.Errorf("hook got %v, want one error matching %v", hooked, tt.wantErr)
			}
			if wantHandled := tt.status != 200; len(handled) != 0 != wantHandled || wantHandled && handled[0] != hooked[0] {
				t.Errorf("error handler got %v, want the hook's error: %v", handled, wantHandled)
			}
			if got := fieldsOf(rec.Header()); len(got) > 0 {
				t.Errorf("fields %v, want none", got)
			}
		})
	}
}

// TestNewAllCrossSlot: on a Cluster, limiters whose names have no common
// hash tag cannot be decided in one call. The request is answered 500
// through the error handler (ErrMisconfigured, never failed open), nothing
// is sent, and each limiter keeps every permit. With one tag the same
// policies decide.
func TestNewAllCrossSlot(t *testing.T) {
	cluster := redistest.SharedCluster(t)
	client := redlimit.New(cluster.Client(t))
	name := uniqueName(t)
	tag := fmt.Sprintf("{all%x}", rand.Uint32())
	for _, tt := range []struct {
		ip, user string // the limiters' names
		status   int
		wantErr  error
		left     []int64
	}{
		{name + "a:ip", name + "b:user", 500, redlimit.ErrMisconfigured, []int64{5, 5}},
		{tag + name + "a:ip", tag + name + "b:user", 200, nil, []int64{4, 4}},
	} {
		ip := client.FixedWindow(tt.ip).WithDefault(redlimit.PerMinute(5))
		user := client.FixedWindow(tt.user).WithDefault(redlimit.PerMinute(5))
		var hooked, handled error
		handler := httplimit.NewAll(client, []httplimit.Policy{
			{Name: "per-ip", Limiter: func(string) *redlimit.Limiter { return ip }},
			{Name: "per-user", Limiter: func(string) *redlimit.Limiter { return user }},
		}, httplimit.WithFailOpen(),
			httplimit.WithErrorHook(func(_ *http.Request, err error) { hooked = err }),
			httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, status int, err error) {
				handled = err
				w.WriteHeader(status)
			}))(http.NotFoundHandler())
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if wantStatus := map[int]int{200: 404, 500: 500}[tt.status]; rec.Code != wantStatus || !errors.Is(hooked, tt.wantErr) || handled != hooked ||
			tt.wantErr != nil && !strings.Contains(hooked.Error(), "hash") {
			t.Errorf("%s, %s: %d, hook %v, error handler %v; want %d and %v", tt.ip, tt.user, rec.Code, hooked, handled, wantStatus, tt.wantErr)
		}
		if got := available(t, ip, user); !slices.Equal(got, tt.left) {
			t.Errorf("%s, %s: available %v, want %v", tt.ip, tt.user, got, tt.left)
		}
	}
}

// TestNewAllClientFailsOpen: a Client made redlimit.WithFailOpen grants
// the call itself when Redis is down: no error, no fields, the policies'
// Results ReasonFailOpen with Limit 0.
func TestNewAllClientFailsOpen(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	m.Close()
	client := redlimit.New(rdb, redlimit.WithFailOpen())
	hooked := false
	var seen httplimit.Decision
	handler := httplimit.NewAll(client, []httplimit.Policy{
		{Name: "a", Limiter: func(k string) *redlimit.Limiter {
			return client.FixedWindow("a:" + k).WithDefault(redlimit.PerMinute(1))
		}},
		{Name: "b", Limiter: func(k string) *redlimit.Limiter {
			return client.FixedWindow("b:" + k).WithDefault(redlimit.PerMinute(1))
		}},
	}, httplimit.WithErrorHook(func(*http.Request, error) { hooked = true }))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = httplimit.FromContext(r.Context())
	}))
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	open := redlimit.Result{Allowed: true, Reason: redlimit.ReasonFailOpen}
	want := httplimit.Decision{Policy: "a", Key: "192.0.2.1", Result: open,
		Policies: []httplimit.Decision{{Policy: "a", Key: "192.0.2.1", Result: open}, {Policy: "b", Key: "192.0.2.1", Result: open}}}
	if got := fieldsOf(rec.Header()); rec.Code != 200 || len(got) > 0 || hooked || !reflect.DeepEqual(seen, want) {
		t.Errorf("%d %v, hook called: %v, decision %+v\nwant 200, no fields, no hook, %+v", rec.Code, got, hooked, seen, want)
	}
}

// TestNewAllClientGone: a request whose client has gone away gets no
// answer, and its context's error is not an error to report.
func TestNewAllClientGone(t *testing.T) {
	client := redlimit.New(redistest.Miniredis(t))
	hooked := false
	handler := httplimit.NewAll(client, []httplimit.Policy{
		{Name: "a", Limiter: func(k string) *redlimit.Limiter {
			return client.FixedWindow("a:" + k).WithDefault(redlimit.PerMinute(1))
		}},
	}, httplimit.WithErrorHook(func(*http.Request, error) { hooked = true }))(http.NotFoundHandler())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if rec.Body.Len() != 0 || len(rec.Header()) != 0 || hooked {
		t.Errorf("answered %d %v %q, hook called: %v", rec.Code, rec.Header(), rec.Body, hooked)
	}
}

// TestNewAllPanics: policies NewAll cannot serve are refused when it is
// made, not on a request.
func TestNewAllPanics(t *testing.T) {
	client := redlimit.New(redistest.Miniredis(t))
	l := func(string) *redlimit.Limiter { return nil }
	for name, policies := range map[string][]httplimit.Policy{
		"not ASCII":  {{Name: "ünï", Limiter: l}},
		"repeated":   {{Name: "a", Limiter: l}, {Name: "a", Limiter: l}},
		"no Limiter": {{Name: "a"}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			httplimit.NewAll(client, policies)
		}()
	}
}
