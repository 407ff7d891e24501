package redlimit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// The examples run on miniredis, an in-process Redis, and most on a clock
// they move by hand (WithClock), so that their output is exact. In a service,
// pass your go-redis client and leave the clock to Redis.

func ExampleNew() {
	mr, _ := miniredis.Run() // stands in for your Redis
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	client := redlimit.New(rdb, redlimit.WithPrefix("mailer:"))
	limiter := client.TokenBucket("welcome-emails")
	// TrySetRate stores the rate unless one is stored already: every instance
	// can call it at start-up, and an operator's SetRate is kept.
	if _, err := limiter.TrySetRate(ctx, redlimit.PerMinute(2)); err != nil {
		log.Fatal(err)
	}
	for range 3 {
		ok, err := limiter.TryAcquire(ctx, 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ok)
	}
	// Output:
	// true
	// true
	// false
}

// A token bucket as Redisson keeps it: each grant comes back exactly one
// Interval after it was made, and a full bucket grants everything at once.
func ExampleClient_TokenBucket() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	limiter := client.TokenBucket("exports").WithDefault(redlimit.Per(3, 10*time.Second))

	for _, step := range []struct {
		at      time.Duration
		permits int64
	}{{0, 2}, {4 * time.Second, 1}, {5 * time.Second, 1}, {10 * time.Second, 1}, {14 * time.Second, 2}} {
		now = start.Add(step.at)
		r, err := limiter.Allow(context.Background(), step.permits)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("at %-3v take %d: allowed %-5v remaining %d, retry after %v\n", step.at, step.permits, r.Allowed, r.Remaining, r.RetryAfter)
	}
	// Output:
	// at 0s  take 2: allowed true  remaining 1, retry after 0s
	// at 4s  take 1: allowed true  remaining 0, retry after 0s
	// at 5s  take 1: allowed false remaining 0, retry after 5s
	// at 10s take 1: allowed true  remaining 1, retry after 0s
	// at 14s take 2: allowed true  remaining 0, retry after 0s
}

// A funnel (GCRA, as redis-cell computes it) takes a burst, then drains
// evenly: one permit every Interval/Rate.
func ExampleClient_Funnel() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	limiter := client.Funnel("webhooks").WithDefault(redlimit.Config{Rate: 1, Interval: time.Second, Burst: 3})

	for _, at := range []time.Duration{0, 0, 0, 0, 1500 * time.Millisecond, 1500 * time.Millisecond, 2 * time.Second} {
		now = start.Add(at)
		r, err := limiter.Allow(context.Background(), 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("at %-4v allowed %-5v retry after %v\n", at, r.Allowed, r.RetryAfter)
	}
	// Output:
	// at 0s   allowed true  retry after 0s
	// at 0s   allowed true  retry after 0s
	// at 0s   allowed true  retry after 0s
	// at 0s   allowed false retry after 1s
	// at 1.5s allowed true  retry after 0s
	// at 1.5s allowed false retry after 500ms
	// at 2s   allowed true  retry after 0s
}

// A fixed window counts per window aligned to the epoch: cheap, but a burst
// at the end of one window and another at the start of the next pass twice
// the rate within a second.
func ExampleClient_FixedWindow() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	limiter := client.FixedWindow("logins").WithDefault(redlimit.Per(3, 10*time.Second))

	granted := 0
	for _, at := range []time.Duration{9500 * time.Millisecond, 10 * time.Second} {
		now = start.Add(at)
		for range 5 {
			ok, err := limiter.TryAcquire(context.Background(), 1)
			if err != nil {
				log.Fatal(err)
			}
			if ok {
				granted++
			}
		}
	}
	fmt.Println("granted within half a second:", granted)
	// Output:
	// granted within half a second: 6
}

// A sliding window sums the last Buckets sub-windows, so the burst that a
// fixed window lets through twice is let through once.
func ExampleClient_SlidingWindow() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	limiter := client.SlidingWindow("logins").WithDefault(redlimit.Per(3, 10*time.Second)) // 10 buckets of 1s

	granted := 0
	for _, at := range []time.Duration{9500 * time.Millisecond, 10 * time.Second} {
		now = start.Add(at)
		for range 5 {
			ok, err := limiter.TryAcquire(context.Background(), 1)
			if err != nil {
				log.Fatal(err)
			}
			if ok {
				granted++
			}
		}
	}
	r, err := limiter.Allow(context.Background(), 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("granted within half a second:", granted)
	fmt.Println("next permit in", r.RetryAfter)
	// Output:
	// granted within half a second: 3
	// next permit in 9s
}

// The rate lives in Redis: one instance changes it and every other follows
// on its next call, with no restart and no message between them.
func ExampleLimiter_SetRate() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	ctx := context.Background()
	instance := func() *redlimit.Client { // each with its own connection and client ID
		return redlimit.New(redis.NewClient(&redis.Options{Addr: mr.Addr()}))
	}
	a, b := instance(), instance()
	handle := func(c *redlimit.Client) *redlimit.Limiter {
		return c.SlidingWindow("search").WithDefault(redlimit.PerSecond(100))
	}

	r, err := handle(b).Allow(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("b sees a limit of", r.Limit)

	if err := handle(a).SetRate(ctx, redlimit.PerSecond(20)); err != nil {
		log.Fatal(err)
	}
	r, err = handle(b).Allow(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := handle(b).Config(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("b sees a limit of", r.Limit)
	fmt.Println("stored:", cfg)
	// Output:
	// b sees a limit of 100
	// b sees a limit of 20
	// stored: 20 per 1s
}

// Several rates in one limiter: at most 2 a second and 3 a minute, decided
// together in one script call. Each Result is of the rate that bound it
// (Bound, with its Limit and Window): on a grant the one with the fewest
// permits left, on a denial the one with the longest wait.
func ExampleConfig_And() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	cfg := redlimit.PerSecond(2).And(redlimit.PerMinute(3))
	limiter := client.FixedWindow("search").WithDefault(cfg)
	fmt.Println(cfg)

	var r redlimit.Result
	for _, at := range []time.Duration{0, 0, 0, time.Second, 2 * time.Second} {
		now = start.Add(at)
		var err error
		if r, err = limiter.Allow(context.Background(), 1); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("at %v allowed %-5v remaining %d, retry after %-3v rate %d: %d per %v\n",
			at, r.Allowed, r.Remaining, r.RetryAfter, r.Bound, r.Limit, r.Window)
	}
	fmt.Println("every rate:", r.Quotas)
	// Output:
	// 2 per 1s and 3 per 1m0s
	// at 0s allowed true  remaining 1, retry after 0s  rate 0: 2 per 1s
	// at 0s allowed true  remaining 0, retry after 0s  rate 0: 2 per 1s
	// at 0s allowed false remaining 0, retry after 1s  rate 0: 2 per 1s
	// at 1s allowed true  remaining 0, retry after 0s  rate 1: 3 per 1m0s
	// at 2s allowed false remaining 0, retry after 58s rate 1: 3 per 1m0s
	// every rate: [{2 1s 0s} {3 1m0s 58s}]
}

// A monthly quota billed from the 31st: the window follows New York's
// calendar, so February's starts on its last day.
func ExamplePerMonthFrom() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2027, 2, 27, 9, 0, 0, 0, ny)
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	cfg := redlimit.PerMonthFrom(3, ny, 31)
	limiter := client.FixedWindow("tenant-42").WithDefault(cfg)
	fmt.Println(cfg)

	for _, at := range []time.Time{now, now, now, now, time.Date(2027, 2, 28, 0, 0, 0, 0, ny)} {
		now = at
		r, err := limiter.Allow(context.Background(), 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s allowed %-5v remaining %d, retry after %v; this month's window: %v\n",
			at.Format("Jan 2 15:04"), r.Allowed, r.Remaining, r.RetryAfter, r.Window)
	}
	// Output:
	// 3 per month from day 31 in America/New_York
	// Feb 27 09:00 allowed true  remaining 2, retry after 0s; this month's window: 672h0m0s
	// Feb 27 09:00 allowed true  remaining 1, retry after 0s; this month's window: 672h0m0s
	// Feb 27 09:00 allowed true  remaining 0, retry after 0s; this month's window: 672h0m0s
	// Feb 27 09:00 allowed false remaining 0, retry after 15h0m0s; this month's window: 672h0m0s
	// Feb 28 00:00 allowed true  remaining 2, retry after 0s; this month's window: 743h0m0s
}

// Acquire waits for its permits, but not past the context's deadline: when
// the limiter says the wait is longer, it returns at once.
func ExampleLimiter_Acquire() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	limiter := redlimit.New(rdb).TokenBucket("reports").WithDefault(redlimit.PerMinute(1))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 2 {
		start := time.Now()
		err := limiter.Acquire(ctx, 1)
		fmt.Printf("error: %v, deadline exceeded: %v, returned at once: %v\n",
			err != nil, errors.Is(err, context.DeadlineExceeded), time.Since(start) < time.Second)
	}
	// Output:
	// error: false, deadline exceeded: false, returned at once: true
	// error: true, deadline exceeded: true, returned at once: true
}

// Throttle answers as redis-cell's CL.THROTTLE does, without the module:
// here `CL.THROTTLE key 4 1 1 quantity`, a burst of 5 then 1 per second,
// through redis-cell's worked example.
func ExampleClient_Throttle() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))

	fmt.Println("time quantity: limited limit remaining retry_after reset_after")
	for _, step := range []struct {
		at       time.Duration
		quantity int64
	}{
		{0, 6}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1},
		{3 * time.Second, 1}, {3100 * time.Millisecond, 1}, {4 * time.Second, 1}, {8 * time.Second, 1},
		{9500 * time.Millisecond, 1}, {9500 * time.Millisecond, 0}, {9500 * time.Millisecond, 2}, {9500 * time.Millisecond, 5},
	} {
		now = start.Add(step.at)
		r, err := client.Throttle(context.Background(), "user123", 4, 1, time.Second, step.quantity)
		if err != nil {
			log.Fatal(err)
		}
		limited := 0
		if r.Limited {
			limited = 1
		}
		fmt.Printf("%-4v %d: %d %d %d %2d %d\n", step.at, step.quantity, limited, r.Limit, r.Remaining, r.RetryAfter, r.ResetAfter)
	}
	// Output:
	// time quantity: limited limit remaining retry_after reset_after
	// 0s   6: 1 5 5 -1 0
	// 0s   1: 0 5 4 -1 1
	// 0s   1: 0 5 3 -1 2
	// 0s   1: 0 5 2 -1 3
	// 0s   1: 0 5 1 -1 4
	// 0s   1: 0 5 0 -1 5
	// 0s   1: 1 5 0  1 5
	// 3s   1: 0 5 2 -1 3
	// 3.1s 1: 0 5 1 -1 4
	// 4s   1: 0 5 1 -1 4
	// 8s   1: 0 5 4 -1 1
	// 9.5s 1: 0 5 4 -1 1
	// 9.5s 0: 0 5 4 -1 1
	// 9.5s 2: 0 5 2 -1 3
	// 9.5s 5: 1 5 2  3 3
}

// Shadow mode tries a limit on live traffic: every request is decided and
// counted as when enforcing, and every caller is let through; Reason says
// which ones enforcing would have denied. SetShadow turns it on and off for
// every instance at runtime.
func ExampleLimiter_WithShadow() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))

	trial := client.FixedWindow("exports").WithDefault(redlimit.PerMinute(2)).WithShadow()
	for range 3 {
		r, err := trial.Allow(ctx, 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(r.Allowed, r.Reason, r.RetryAfter)
	}

	// The stored config's shadow mode, for every instance.
	stored := client.FixedWindow("reports")
	if err := stored.SetRate(ctx, redlimit.PerMinute(1)); err != nil {
		log.Fatal(err)
	}
	for _, shadow := range []bool{true, false} {
		if err := stored.SetShadow(ctx, shadow); err != nil {
			log.Fatal(err)
		}
		for range 2 {
			r, err := stored.Allow(ctx, 1)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println(shadow, r.Allowed, r.Reason)
		}
	}
	// Output:
	// true limit 0s
	// true limit 0s
	// true shadow 1m0s
	// true true limit
	// true true shadow
	// false false limit
	// false false limit
}

// Charge takes a cost known only after the work, even past the limit: the
// debt is waited out by the requests that follow.
func ExampleLimiter_Charge() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	tokens := client.TokenBucket("llm-tokens").WithDefault(redlimit.PerMinute(1000))

	r, _ := tokens.Charge(ctx, 1500) // the call used 1,500 tokens
	fmt.Println(r.Allowed, r.Remaining)
	r, _ = tokens.Allow(ctx, 1)
	fmt.Println(r.Allowed, r.RetryAfter) // until the 1,500 come back
	now = now.Add(time.Minute)
	r, _ = tokens.Allow(ctx, 1)
	fmt.Println(r.Allowed, r.Remaining)
	// Output:
	// true 0
	// false 1m0s
	// true 999
}
