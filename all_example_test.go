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

// A sign-up is checked against its IP and its e-mail address together: a
// sign-up one of them denies uses up neither. The IP allows 2 a minute, the
// address 3 an hour; the third sign-up from the IP is denied, and the
// address keeps its permit for a sign-up from elsewhere.
func ExampleClient_AllowAll() {
	mr, _ := miniredis.Run() // stands in for your Redis
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	client := redlimit.New(rdb, redlimit.WithPrefix("signup:"), redlimit.WithClock(func() time.Time { return now }))

	// One hash tag for the two names keeps them in one Cluster slot.
	perIP := client.FixedWindow("{signup}ip:203.0.113.7").WithDefault(redlimit.PerMinute(2))
	perEmail := client.SlidingWindow("{signup}email:ann@example.com").WithDefault(redlimit.PerHour(3))
	for range 3 {
		all, err := client.AllowAll(ctx, redlimit.Want{Limiter: perIP, Permits: 1}, redlimit.Want{Limiter: perEmail, Permits: 1})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed %v, retry after %v: ip %v (%d left), e-mail %v (%d left)\n", all.Allowed, all.RetryAfter,
			all.Results[0].Allowed, all.Results[0].Remaining, all.Results[1].Allowed, all.Results[1].Remaining)
	}
	// Output:
	// allowed true, retry after 0s: ip true (1 left), e-mail true (2 left)
	// allowed true, retry after 0s: ip true (0 left), e-mail true (1 left)
	// allowed false, retry after 1m0s: ip false (0 left), e-mail true (1 left)
}
