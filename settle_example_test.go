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

// An LLM call's cost is known only once it has streamed: it reserves an
// estimate, reports the tokens as they come (what it holds follows them up,
// charged at once), and settles with the total. A short call gets back what
// it did not use; a call never settled within its time stays charged its
// estimate.
func ExampleReservation_Settle() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	tokens := client.TokenBucket("tenant-42:tokens").WithDefault(redlimit.PerMinute(10000))
	left := func() int64 {
		n, err := tokens.AvailablePermits(ctx)
		if err != nil {
			log.Fatal(err)
		}
		return n
	}

	call, err := tokens.Reserve(ctx, 1000, redlimit.SettleWithin(30*time.Second))
	if err != nil || !call.Allowed {
		log.Fatal("denied: ", err)
	}
	for _, soFar := range []int64{400, 1200, 1800} {
		r, err := call.SettlePartial(ctx, soFar)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("streamed %d: holds %d, charged %d\n", soFar, r.Held, r.Charged)
	}
	r, err := call.Settle(ctx, 2100)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("done at 2100: holds %d, charged %d; %d left\n", r.Held, r.Charged, left())

	short, _ := tokens.Reserve(ctx, 1000, redlimit.SettleWithin(30*time.Second))
	r, _ = short.Settle(ctx, 250)
	fmt.Printf("done at 250: refunded %d; %d left\n", r.Refunded, left())

	lost, _ := tokens.Reserve(ctx, 500, redlimit.SettleWithin(30*time.Second))
	now = start.Add(30 * time.Second)
	r, _ = lost.Settle(ctx, 0)
	fmt.Printf("settled after its 30s: refunded %d; %d left\n", r.Refunded, left())
	// Output:
	// streamed 400: holds 1000, charged 0
	// streamed 1200: holds 1200, charged 200
	// streamed 1800: holds 1800, charged 600
	// done at 2100: holds 2100, charged 300; 7900 left
	// done at 250: refunded 750; 7650 left
	// settled after its 30s: refunded 0; 7150 left
}
