package main

import (
	"cmp"
	"context"
	"fmt"
	"sync"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
)

// decideFunc makes one decision on key number key (0 ≤ key < the contender's
// key count) and reports whether it was granted.
type decideFunc func(ctx context.Context, key int) (allowed bool, err error)

// contender is one way of deciding, measured in turn with the others.
type contender struct {
	name string
	// prepare makes the handles for keys keys and returns the decision; it
	// runs before the measurement, on an empty database.
	prepare func(ctx context.Context, keys int) (decideFunc, error)
}

// env is what contenders share: one go-redis client with default options,
// the AutoPipeliner made from it, and a separate connection for admin
// commands (FLUSHALL, INFO) so those never queue behind the load.
type env struct {
	rdb   *redis.Client
	ap    *redis.AutoPipeliner
	admin *redis.Client
}

// trivial is the ceiling: the cheapest script there is, over the same client.
const trivial = "return 1"

var trivialSHA = redis.NewScript(trivial).Hash()

func ceiling(name string, rdb redis.Scripter) contender {
	return contender{name: name, prepare: func(ctx context.Context, keys int) (decideFunc, error) {
		if err := rdb.ScriptLoad(ctx, trivial).Err(); err != nil {
			return nil, err
		}
		// One key per call, as a limiter sends; the slices are made here so
		// that the loop measures go-redis alone.
		names := make([][]string, keys)
		for i := range names {
			names[i] = []string{fmt.Sprintf("bench:trivial:%d", i)}
		}
		return func(ctx context.Context, key int) (bool, error) {
			return true, rdb.EvalSha(ctx, trivialSHA, names[key]).Err()
		}, nil
	}}
}

// peer is github.com/go-redis/redis_rate/v10, a GCRA in one script like our
// funnel: limit per second, burst = limit.
func peer(name string, rdb *redis.Client, perSecond int) contender {
	limit := redis_rate.PerSecond(perSecond)
	return contender{name: name, prepare: func(ctx context.Context, keys int) (decideFunc, error) {
		limiter := redis_rate.NewLimiter(rdb)
		names := keyNames("redis_rate", keys)
		return func(ctx context.Context, key int) (bool, error) {
			r, err := limiter.Allow(ctx, names[key], limit)
			return err == nil && r.Allowed > 0, err
		}, nil
	}}
}

// algorithm names a redlimit algorithm and how to get its limiter.
type algorithm struct {
	name  string
	short string
	new   func(c *redlimit.Client, name string) *redlimit.Limiter
}

var (
	tokenBucket   = algorithm{"TokenBucket", "tb", (*redlimit.Client).TokenBucket}
	funnel        = algorithm{"Funnel", "funnel", (*redlimit.Client).Funnel}
	fixedWindow   = algorithm{"FixedWindow", "fixed", (*redlimit.Client).FixedWindow}
	slidingWindow = algorithm{"SlidingWindow", "sliding", (*redlimit.Client).SlidingWindow}
	algorithms    = []algorithm{tokenBucket, funnel, fixedWindow, slidingWindow}
)

// ours is one redlimit algorithm's Allow(ctx, 1) on a client made from rdb
// with opts. The handles carry cfg with WithDefault, which stores nothing;
// with storeVia set, cfg is instead stored with SetRate through that client
// before the measurement (the auto-pipeliner: 10,000 SetRate calls take a
// while one at a time) and the handles have no default.
func ours(name string, alg algorithm, rdb redis.Scripter, cfg redlimit.Config, storeVia redis.Scripter, opts ...redlimit.Option) contender {
	return contender{name: name, prepare: func(ctx context.Context, keys int) (decideFunc, error) {
		// A new Client each slice: a local deny cache must not carry
		// denials over from a database since flushed.
		client := redlimit.New(rdb, opts...)
		names := keyNames(alg.short, keys)
		limiters := make([]*redlimit.Limiter, keys)
		for i, n := range names {
			limiters[i] = alg.new(client, n)
			if storeVia == nil {
				limiters[i] = limiters[i].WithDefault(cfg)
			}
		}
		if storeVia != nil {
			setter := redlimit.New(storeVia)
			err := parallel(ctx, 256, keys, func(i int) error {
				return alg.new(setter, names[i]).SetRate(ctx, cfg)
			})
			if err != nil {
				return nil, fmt.Errorf("SetRate: %w", err)
			}
		}
		return func(ctx context.Context, key int) (bool, error) {
			r, err := limiters[key].Allow(ctx, 1)
			return r.Allowed, err
		}, nil
	}}
}

func keyNames(kind string, keys int) []string {
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("bench:%s:%d", kind, i)
	}
	return names
}

// parallel runs do(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, workers, n int, do func(i int) error) error {
	var (
		mu    sync.Mutex
		next  int
		first error
		wg    sync.WaitGroup
	)
	for range min(workers, n) {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := i >= n || first != nil || ctx.Err() != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := do(i); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return cmp.Or(first, ctx.Err())
}
