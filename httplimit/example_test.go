package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
)

// Two requests a minute per client IP, shared by every instance of the
// service. Behind a load balancer on 10.0.0.0/8, the client is read from
// X-Forwarded-For.
func ExampleNew() {
	mr, _ := miniredis.Run() // stands in for your Redis
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	now := func() time.Time { return time.Unix(1_800_000_030, 0) } // fixed, for a stable output
	client := redlimit.New(rdb, redlimit.WithClock(now))

	cfg := redlimit.PerMinute(2)
	limit := httplimit.New(func(ip string) *redlimit.Limiter {
		return client.FixedWindow("api:" + ip).WithDefault(cfg)
	},
		httplimit.WithKey(httplimit.ClientIP("X-Forwarded-For", netip.MustParsePrefix("10.0.0.0/8"))),
	)
	handler := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	}))

	for range 3 {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "10.1.2.3:40000" // the load balancer
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"))
		if wait := rec.Header().Get("Retry-After"); wait != "" {
			fmt.Println("Retry-After:", wait)
		}
	}
	// Output:
	// 200 "default";q=2;w=60 "default";r=1;t=30
	// 200 "default";q=2;w=60 "default";r=0;t=30
	// 429 "default";q=2;w=60 "default";r=0;t=30
	// Retry-After: 30
}

// Stacked limits: per client IP outside, per user inside. The response
// reports both policies, outer first; the per-user one binds.
func ExampleNew_stacked() {
	mr, _ := miniredis.Run() // stands in for your Redis
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	now := func() time.Time { return time.Unix(1_800_000_030, 0) } // fixed, for a stable output
	client := redlimit.New(rdb, redlimit.WithClock(now))

	perIP := httplimit.New(func(ip string) *redlimit.Limiter {
		return client.FixedWindow("ip:" + ip).WithDefault(redlimit.PerMinute(100))
	}, httplimit.WithPolicy("per-ip"))
	perUser := httplimit.New(func(user string) *redlimit.Limiter {
		return client.FixedWindow("user:" + user).WithDefault(redlimit.PerMinute(1))
	}, httplimit.WithPolicy("per-user"), httplimit.WithKey(httplimit.Header("X-User")),
		// A JSON body for denials, from the decision.
		httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := httplimit.FromContext(r.Context())
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, `{"policy":%q,"retry_after_ms":%d}`+"\n", d.Policy, d.Result.RetryAfter.Milliseconds())
		})))
	handler := perIP(perUser(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	})))

	for range 2 {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-User", "alice")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit-Policy"))
		fmt.Println(rec.Header().Get("RateLimit"))
		fmt.Print(rec.Body)
	}
	// Output:
	// 200 "per-ip";q=100;w=60, "per-user";q=1;w=60
	// "per-ip";r=99;t=30, "per-user";r=0;t=30
	// hello
	// 429 "per-ip";q=100;w=60, "per-user";q=1;w=60
	// "per-ip";r=98;t=30, "per-user";r=0;t=30
	// {"policy":"per-user","retry_after_ms":30000}
}

// Per client IP and per user, decided at once: a request the per-user
// limit denies takes nothing from the IP's, which everyone behind that IP
// shares (stacked New middlewares would have counted it there). One hash
// tag keeps both limiters in one Redis Cluster slot.
func ExampleNewAll() {
	mr, _ := miniredis.Run() // stands in for your Redis
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	now := func() time.Time { return time.Unix(1_800_000_030, 0) } // fixed, for a stable output
	client := redlimit.New(rdb, redlimit.WithClock(now))

	perIP := func(ip string) *redlimit.Limiter {
		return client.FixedWindow("{api}ip:" + ip).WithDefault(redlimit.PerMinute(3))
	}
	limit := httplimit.NewAll(client, []httplimit.Policy{
		{Name: "per-ip", Limiter: perIP},
		{Name: "per-user", Key: httplimit.Header("X-User"), Limiter: func(user string) *redlimit.Limiter {
			return client.FixedWindow("{api}user:" + user).WithDefault(redlimit.PerMinute(1))
		}},
	})
	handler := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	}))

	for _, user := range []string{"alice", "alice", "alice", "bob"} {
		req := httptest.NewRequest("GET", "/", nil) // all from 192.0.2.1
		req.Header.Set("X-User", user)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(user, rec.Code, rec.Header().Get("RateLimit"))
		if wait := rec.Header().Get("Retry-After"); wait != "" {
			fmt.Println("Retry-After:", wait)
		}
	}
	left, _ := perIP("192.0.2.1").AvailablePermits(context.Background())
	fmt.Println("left for the IP:", left)
	// Output:
	// alice 200 "per-ip";r=2;t=30, "per-user";r=0;t=30
	// alice 429 "per-ip";r=2;t=30, "per-user";r=0;t=30
	// Retry-After: 30
	// alice 429 "per-ip";r=2;t=30, "per-user";r=0;t=30
	// Retry-After: 30
	// bob 200 "per-ip";r=1;t=30, "per-user";r=0;t=30
	// left for the IP: 1
}
