package redlimit_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// Three instances of a service share 10 searches a minute. Redis goes away:
// each instance then grants its share, ⌈10 / 3⌉ = 4 a minute, by itself,
// and goes back to Redis once it answers again. What it granted alone was
// not counted there.
func ExampleWithDegraded() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), DialerRetries: 1})
	defer rdb.Close()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := redlimit.WithClock(func() time.Time { return now })

	// A heartbeat every 10 ms, so that the example need not wait; the
	// breaker answers for Redis while it is away.
	degraded := redlimit.WithDegraded(redlimit.Degraded{Heartbeat: 10 * time.Millisecond})
	var instances []*redlimit.Client
	for range 3 {
		instances = append(instances, redlimit.New(rdb, redlimit.WithPrefix("api:"), clock, degraded,
			redlimit.WithBreaker(1, 20*time.Millisecond)))
	}
	client := instances[0]
	for client.DegradedState().Instances < 3 {
		time.Sleep(time.Millisecond) // the instances count each other
	}
	search := client.FixedWindow("search").WithDefault(redlimit.PerMinute(10))
	show := func(r redlimit.Result, err error) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed %-5v by %-8v limit %2d, remaining %d\n", r.Allowed, r.Reason, r.Limit, r.Remaining)
	}

	show(search.Allow(ctx, 1))
	mr.Close() // Redis goes away
	for range 5 {
		show(search.Allow(ctx, 1))
	}
	fmt.Println("degraded:", client.DegradedState().Active)

	_ = mr.Restart() // Redis is back, its data kept
	for {            // peeks, which count nothing, until the breaker lets one through to Redis
		if r, err := search.Allow(ctx, 0); err == nil && r.Reason == redlimit.ReasonLimit {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	show(search.Allow(ctx, 1))
	fmt.Println("degraded:", client.DegradedState().Active)
	// Output:
	// allowed true  by limit    limit 10, remaining 9
	// allowed true  by degraded limit  4, remaining 3
	// allowed true  by degraded limit  4, remaining 2
	// allowed true  by degraded limit  4, remaining 1
	// allowed true  by degraded limit  4, remaining 0
	// allowed false by degraded limit  4, remaining 0
	// degraded: true
	// allowed true  by limit    limit 10, remaining 8
	// degraded: false
}
