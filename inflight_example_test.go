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

// A holder cut off from Redis gives its hold up on its own clock before
// Redis can hand the slot to another: at TTL − (TTL/10 + 2ms) after its
// last renewal was sent, 53.998s with a TTL of a minute; the slot is
// another's from 60s. Here the clock is moved by hand (WithClock), and the
// holder's refreshes (every 20s of the real clock) never come, as though it
// were cut off.
func ExampleHold_Lost() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return now }))
	jobs := client.InFlight("jobs").WithDefault(redlimit.InFlightConfig{Limit: 1, TTL: time.Minute})

	cutOff, _ := jobs.TryAcquire(ctx)
	now = now.Add(53997 * time.Millisecond)
	fmt.Println("at 53.997s held:", cutOff.Err() == nil)
	now = now.Add(time.Millisecond)
	<-cutOff.Lost()
	fmt.Println("at 53.998s held:", cutOff.Err() == nil)

	now = now.Add(6001 * time.Millisecond)
	other, _ := jobs.TryAcquire(ctx)
	fmt.Println("at 59.999s another granted:", other != nil)
	now = now.Add(time.Millisecond)
	other, _ = jobs.TryAcquire(ctx)
	fmt.Println("at 60s another granted:", other != nil)

	// Its work ran on without the slot from 53.998s: Release says so.
	fmt.Println(errors.Is(cutOff.Release(ctx), redlimit.ErrHoldLost))
	_ = other.Release(ctx)
	// Output:
	// at 53.997s held: true
	// at 53.998s held: false
	// at 59.999s another granted: false
	// at 60s another granted: true
	// true
}
