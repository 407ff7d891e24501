package redlimit

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRedisCost prints Redis µs per decision, lone and batched, per algorithm.
func TestRedisCost(t *testing.T) {
	addr := os.Getenv("RCOST_ADDR")
	if addr == "" {
		t.Skip()
	}
	admin := redis.NewClient(&redis.Options{Addr: addr})
	ctx := context.Background()
	usec := func() (float64, float64) {
		info := admin.Info(ctx, "commandstats").Val()
		_, rest, ok := strings.Cut(info, "cmdstat_evalsha:calls=")
		if !ok {
			return 0, 0
		}
		calls, _ := strconv.ParseFloat(rest[:strings.IndexByte(rest, ',')], 64)
		_, rest, _ = strings.Cut(rest, "usec=")
		u, _ := strconv.ParseFloat(rest[:strings.IndexByte(rest, ',')], 64)
		return calls, u
	}
	for _, mode := range []string{"lone", "batch"} {
		for _, alg := range []string{"funnel", "fixed_window", "sliding_window", "tokenbucket"} {
			rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
			c := New(rdb, WithPrefix(fmt.Sprintf("rc%d:", time.Now().UnixNano())))
			mk := map[string]func(string) *Limiter{"funnel": c.Funnel, "fixed_window": c.FixedWindow, "sliding_window": c.SlidingWindow, "tokenbucket": c.TokenBucket}[alg]
			cfg := Config{Rate: 1_000_000, Interval: time.Second}
			n := 20000
			workers := 1
			if mode == "batch" {
				workers = 64
			}
			// warm up
			for i := range 200 {
				mk(strconv.Itoa(i%1000)).WithDefault(cfg).Allow(ctx, 1)
			}
			admin.ConfigResetStat(ctx)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := w; i < n; i += workers {
						mk(strconv.Itoa(i%1000)).WithDefault(cfg).Allow(ctx, 1)
					}
				})
			}
			wg.Wait()
			calls, u := usec()
			fmt.Printf("%s %-15s redis µs/decision %6.2f  (calls %d, decisions/call %.1f)\n", mode, alg, u/float64(n), int(calls), float64(n)/calls)
			rdb.Close()
		}
	}
}
