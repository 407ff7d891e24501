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

// At most two exports at once, across every instance: a third waits for a
// slot, or is turned away by TryAcquire.
func ExampleClient_InFlight() {
	mr, _ := miniredis.Run() // stands in for your Redis
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	client := redlimit.New(rdb, redlimit.WithPrefix("reports:"))
	exports := client.InFlight("exports")
	// Two at once; a crashed holder's slot comes back 30s after its last
	// refresh (a Hold refreshes itself every 10s while held).
	if _, err := exports.TrySetLimit(ctx, redlimit.InFlightConfig{Limit: 2, TTL: 30 * time.Second}); err != nil {
		log.Fatal(err)
	}

	first, err := exports.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	second, _ := exports.Acquire(ctx)
	third, _ := exports.TryAcquire(ctx)
	fmt.Println("third granted at once:", third != nil)

	go func() {
		time.Sleep(50 * time.Millisecond) // the first export's work
		_ = first.Release(ctx)
	}()
	// Acquire waits, until a holder releases or ctx ends.
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	third, err = exports.Acquire(wait)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("third granted once the first was released:", third != nil)
	holders, _ := exports.Holders(ctx)
	fmt.Println("held:", len(holders))

	for _, h := range []*redlimit.Hold{second, third} {
		if err := h.Release(ctx); errors.Is(err, redlimit.ErrHoldLost) {
			log.Print("the export outlived its hold: its slot may have gone to another")
		}
	}
	// Output:
	// third granted at once: false
	// third granted once the first was released: true
	// held: 2
}

// A holder that crashes never releases: its hold expires TTL after it was
// taken or last refreshed, and its slot serves another then. Here the
// clock is moved by hand (WithClock) and the crashed holder is one that
// never refreshes.
func ExampleHold_Lost() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	jobs := client.InFlight("jobs").WithDefault(redlimit.InFlightConfig{Limit: 1, TTL: time.Minute})

	crashed, _ := jobs.TryAcquire(ctx) // its process dies with the hold
	now = now.Add(59 * time.Second)
	other, _ := jobs.TryAcquire(ctx)
	fmt.Println("at 59s granted:", other != nil)
	now = now.Add(time.Second)
	other, _ = jobs.TryAcquire(ctx)
	fmt.Println("at 60s granted:", other != nil)

	// Had the crashed holder come back, it would learn it lost its slot.
	err := crashed.Refresh(ctx)
	<-crashed.Lost()
	fmt.Println(errors.Is(err, redlimit.ErrHoldLost))
	_ = other.Release(ctx)
	// Output:
	// at 59s granted: false
	// at 60s granted: true
	// true
}
