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

// A limiter per partner, one of them hot: above 100 decisions a second on
// this instance, its decisions come from leased blocks of permits, without
// a round trip; the quiet partner's all go to Redis. Once the hot one
// quietens, its block goes back and it decides through Redis again.
func ExampleWithHotLeases() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }),
		redlimit.WithHotLeases(redlimit.HotLeases{Above: 100, Lease: redlimit.Lease{Time: 100 * time.Millisecond}}))
	defer client.Close(ctx) // gives back what hot leases hold
	partner := func(name string) *redlimit.Limiter {
		return client.FixedWindow("partner:" + name).WithDefault(redlimit.PerMinute(300_000))
	}
	allow := func(name string) redlimit.Result {
		r, err := partner(name).Allow(ctx, 1)
		if err != nil {
			log.Fatal(err)
		}
		return r
	}

	// A second: "acme" calls 1,000 times, "tiny" 10 times. acme's first 100
	// decisions go to Redis; from the 101st, one decision per lease time
	// (100 ms) takes a block, sized to its pace, and the others come from
	// it.
	fromLease := 0
	for ms := range 1000 {
		if allow("acme").Reason == redlimit.ReasonLease {
			fromLease++
		}
		if ms%100 == 0 {
			allow("tiny")
		}
		now = now.Add(time.Millisecond)
	}
	s := client.HotLeaseStats()
	fmt.Printf("acme: %d of 1000 decisions from leases\n", fromLease)
	for _, l := range s.Leased {
		fmt.Printf("leased: %s at %.0f/s, blocks of at most %d, used for at most %v\n", l.Limiter, l.Rate, l.Cap, s.Lease.Time)
	}

	// A quiet second later, acme's lease has gone back: every permit taken
	// is used or given back.
	now = now.Add(time.Second)
	fmt.Println("acme:", allow("acme").Reason)
	s = client.HotLeaseStats()
	fmt.Printf("leased: %d; leases started %d, given back %d; permits taken %d, used %d, given back %d\n",
		len(s.Leased), s.Started, s.Cooled, s.Taken, s.Used, s.Returned)
	// Output:
	// acme: 890 of 1000 decisions from leases
	// leased: partner:acme at 1000/s, blocks of at most 30000, used for at most 100ms
	// acme: limit
	// leased: 0; leases started 1, given back 1; permits taken 1801, used 900, given back 901
}
