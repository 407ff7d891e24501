package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
	samples []sample      // one per round, in round order
	ours    bool          // a redlimit limiter, not a baseline or redis_rate
	lease   time.Duration // ours: its handles lease (WithLease) for so long
}

// withLease makes c's handles lease for d.
func (c *contender) withLease(d time.Duration) *contender {
	c.lease = d
	return c
}

// env is what contenders share: one go-redis client with default options,
// the AutoPipeliner made from it, and a client for admin commands.
type env struct {
	rdb   *redis.Client
	ap    *redis.AutoPipeliner
	admin *redis.Client
}

// evalsha is go-redis alone: EVALSHA of script with the keys keysOf names
// (made beforehand, as a limiter makes its keys once) and args.
func evalsha(name string, rdb redis.Scripter, script string, keysOf func(string) []string, args ...any) *contender {
	sha := redis.NewScript(script).Hash()
	return &contender{name: name, prepare: func(ctx context.Context, keys int) (decideFunc, error) {
		names := make([][]string, keys)
		for i, n := range keyNames("evalsha", keys) {
			names[i] = keysOf(n)
		}
		return func(ctx context.Context, key int) (bool, error) {
			return true, rdb.EvalSha(ctx, sha, names[key], args...).Err()
		}, rdb.ScriptLoad(ctx, script).Err()
	}}
}

// ceiling is the cheapest script there is, with one key, over the same client.
func ceiling(name string, rdb redis.Scripter) *contender {
	return evalsha(name, rdb, "return 1", func(n string) []string { return []string{n} })
}

// shaped has the wire shape of a funnel's Allow with a default config: 1
// key, 4 arguments of the same types (boxed once, here), a reply of six
// integers in one string: what go-redis costs for that, before the library
// does anything.
func shaped(rdb redis.Scripter) *contender {
	return evalsha("go-redis EvalSha, a funnel's wire shape (1 key, 4 args, one-string reply)", rdb,
		"return '1 1000000 999999 0 1000000 1000'",
		func(n string) []string { return []string{"{" + n + "}"} },
		"allow", "", int64(1), fmt.Sprintf("default %d 1000 0 0 0 0", bigRate))
}

// The names of redis_rate's contenders, and the suffixes of ours that say
// how they reach Redis.
const (
	redisRate     = "redis_rate"
	autoPipelined = ", auto-pipelined"
	batchingOff   = ", batching off"
)

// redisRateBackend is what redis_rate.NewLimiter takes (its own interface is
// unexported): a Client and an AutoPipeliner both are one.
type redisRateBackend interface {
	redis.Scripter
	Del(ctx context.Context, keys ...string) *redis.IntCmd
}

// peer is github.com/go-redis/redis_rate/v10, a GCRA in one script like our
// funnel: limit per second, burst = limit.
func peer(name string, rdb redisRateBackend, perSecond int) *contender {
	limit := redis_rate.PerSecond(perSecond)
	return &contender{name: name, prepare: func(ctx context.Context, keys int) (decideFunc, error) {
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
	name string
	new  func(c *redlimit.Client, name string) *redlimit.Limiter
}

var (
	tokenBucket   = algorithm{"TokenBucket", (*redlimit.Client).TokenBucket}
	funnel        = algorithm{"Funnel", (*redlimit.Client).Funnel}
	fixedWindow   = algorithm{"FixedWindow", (*redlimit.Client).FixedWindow}
	slidingWindow = algorithm{"SlidingWindow", (*redlimit.Client).SlidingWindow}
	algorithms    = []algorithm{tokenBucket, funnel, fixedWindow, slidingWindow}
)

// ours is one redlimit algorithm's Allow(ctx, 1) on a client made from rdb
// with opts. The handles carry cfg with WithDefault, which stores nothing;
// with storeVia set, cfg is instead stored with SetRate through that client
// before the measurement (the auto-pipeliner: 10,000 SetRate calls take a
// while one at a time) and the handles have no default.
func ours(name string, alg algorithm, rdb redis.Scripter, cfg redlimit.Config, storeVia redis.Scripter, opts ...redlimit.Option) *contender {
	c := &contender{name: name, ours: true}
	c.prepare = func(ctx context.Context, keys int) (decideFunc, error) {
		// A new Client each slice: a local deny cache must not carry
		// denials over from a database since flushed.
		client := redlimit.New(rdb, opts...)
		names := keyNames(alg.name, keys)
		limiters := make([]*redlimit.Limiter, keys)
		for i, n := range names {
			limiters[i] = alg.new(client, n).WithDefault(cfg)
		}
		if storeVia != nil {
			setter := redlimit.New(storeVia)
			err := parallel(ctx, 256, keys, func(i int) error {
				limiters[i] = alg.new(client, names[i])
				return alg.new(setter, names[i]).SetRate(ctx, cfg)
			})
			if err != nil {
				return nil, fmt.Errorf("SetRate: %w", err)
			}
		}
		if c.lease > 0 {
			for i, l := range limiters {
				limiters[i] = l.WithLease(redlimit.Lease{Time: c.lease})
			}
		}
		return func(ctx context.Context, key int) (bool, error) {
			r, err := limiters[key].Allow(ctx, 1)
			return r.Allowed, err
		}, nil
	}
	return c
}

// everyAlgorithm is ours for each algorithm, its name followed by suffix.
func everyAlgorithm(suffix string, rdb redis.Scripter, cfg redlimit.Config, storeVia redis.Scripter, opts ...redlimit.Option) []*contender {
	var out []*contender
	for _, alg := range algorithms {
		out = append(out, ours(alg.name+suffix, alg, rdb, cfg, storeVia, opts...))
	}
	return out
}

// interleaved lists a's contenders and b's alternately: a[0], b[0], a[1], …
func interleaved(a, b []*contender) []*contender {
	out := make([]*contender, 0, len(a)+len(b))
	for i := range max(len(a), len(b)) {
		if i < len(a) {
			out = append(out, a[i])
		}
		if i < len(b) {
			out = append(out, b[i])
		}
	}
	return out
}

func keyNames(kind string, keys int) []string {
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("bench:%s:%d", kind, i)
	}
	return names
}

// parallel runs do(0..n-1) on workers goroutines; each stops at its first error.
func parallel(ctx context.Context, workers, n int, do func(i int) error) error {
	var next atomic.Int64
	errs := make([]error, min(workers, n))
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && errs[w] == nil && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				errs[w] = do(i)
			}
		})
	}
	wg.Wait()
	return cmp.Or(errors.Join(errs...), ctx.Err())
}
