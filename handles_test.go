package redlimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// Services make a handle per request, c.Funnel(key).WithDefault(cfg), as
// httplimit's example does. A fresh handle must know what the last one
// learnt: on a PerClient limiter, a handle that did not would send the short
// key list, be told 'perclient' and send the call again, two EVALSHAs a
// request; and with a stored config it would send its default as 'default'
// rather than 'stored', the script then trying the wrong read first.
func TestFreshHandlesLearnFromTheirPredecessors(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		for _, withDefault := range []bool{false, true} {
			t.Run(fmt.Sprintf("default=%t", withDefault), func(t *testing.T) {
				ctx := context.Background()
				name := uniqueName(t)
				clk := newClock()
				log := &commandLog{}
				x := newClient(recorded(t, rdb, log), clk, WithClientID("x"))
				handle := func() *Limiter {
					if withDefault {
						return a.new(x, name).WithDefault(PerMinute(100)) // Overall: the stored config overrides it
					}
					return a.new(x, name)
				}
				y := a.new(newClient(rdb, clk, WithClientID("y")), name)
				require.NoError(t, y.SetRate(ctx, Config{Type: PerClient, Rate: 5, Interval: time.Minute}))
				loadScripts(t, rdb) // x's calls meet no NOSCRIPT

				for i := range 10 {
					ok, err := handle().TryAcquire(ctx, 1)
					require.NoError(t, err)
					assert.Equal(t, i < 5, ok, "x's request %d, each on a fresh handle", i)
				}
				assert.Equal(t, 11, log.count("evalsha"), "told once that the limiter is PerClient, for every handle after")
				if withDefault {
					want := []string{"default", "default"} // the short list, refused; the whole list, which finds the hash
					for range 9 {
						want = append(want, "stored")
					}
					assert.Equal(t, want, log.sourcesSent(), "later handles know the hash is there")
				}
				assertAvailable(t, y, 5, "x's grants counted against x alone")
			})
		}
	})
}

// The handles of one name on one Client are one handle, and so are those
// WithDefault makes of it with equal configs: making them costs nothing.
// Other configs, other clients' views (AsClient) and other algorithms get
// handles of their own, and still share what decisions learn.
func TestHandlesAreMadeOnce(t *testing.T) {
	c := New(redistest.Miniredis(t))
	cfg := PerSecond(10).And(PerMinute(100))
	l := c.Funnel("api")
	assert.Same(t, l, c.Funnel("api"))
	assert.NotSame(t, l, c.FixedWindow("api"), "another algorithm, another limiter")
	assert.NotSame(t, l, c.Funnel("other"))
	assert.Equal(t, "app:{api}", New(redistest.Miniredis(t), WithPrefix("app:")).Funnel("api").Name(), "each Client its own")

	d := l.WithDefault(cfg)
	assert.Same(t, d, c.Funnel("api").WithDefault(PerSecond(10).And(PerMinute(100))), "an equal config, made anew")
	assert.NotSame(t, d, l.AsClient("z").WithDefault(cfg), "another client's keys")
	for _, h := range []*Limiter{d, l.AsClient("z"), l.AsClient("z").WithDefault(cfg)} {
		assert.Same(t, l.family, h.family, "every handle on the limiter learns together")
	}
	assert.Same(t, d.family, l.AsClient("z").WithDefault(cfg).family)
	assert.NotSame(t, l.family, c.FixedWindow("api").family)

	invalid := l.WithDefault(Config{Rate: 0, Interval: time.Second})
	assert.ErrorIs(t, invalid.err, ErrInvalidConfig)
	assert.Same(t, d, l.WithDefault(cfg), "an invalid config is not kept: the kept handle stays")
	other := l.WithDefault(PerSecond(10).And(PerMinute(200)))
	assert.NotSame(t, d, other)
	assert.Same(t, other, l.WithDefault(PerSecond(10).And(PerMinute(200))), "the latest config is kept, one a name")
	assert.Same(t, d.family, other.family)

	// The caller's config may change once given; the handle's default
	// stays what it was given.
	mine := PerSecond(10).And(PerMinute(100))
	e := c.Funnel("mine").WithDefault(mine)
	mine.More[0].Rate = 50
	assert.Equal(t, int64(100), e.dflt.More[0].Rate)
	assert.Equal(t, "default 10 1000 0 0 0 0 100 60000 0 0", e.config)
	assert.NotSame(t, e, c.Funnel("mine").WithDefault(mine), "the changed config is another one")

	bad := c.Funnel("")
	assert.ErrorIs(t, bad.err, ErrInvalidName)
	assert.NotSame(t, bad, c.Funnel(""), "mistakes are not kept")
}

// A service making a limiter per user meets millions of names: the Client
// keeps at most maxFamilies, and the names in use stay.
func TestFamiliesAreBounded(t *testing.T) {
	c := New(redistest.Miniredis(t))
	hot, cold := c.TokenBucket("hot"), c.TokenBucket("cold")
	hot.family.perClient.Store(true)
	cold.family.perClient.Store(true)
	for i := range 2 * maxFamilies {
		c.TokenBucket(fmt.Sprint("user-", i))
		if i%1000 == 0 {
			require.Same(t, hot, c.TokenBucket("hot"), "in use, name %d", i)
		}
	}
	kept := familiesKept(c)
	assert.LessOrEqual(t, kept, maxFamilies, "of %d names", 2*maxFamilies+2)
	assert.Same(t, hot, c.TokenBucket("hot"))
	assert.True(t, c.TokenBucket("hot").family.perClient.Load(), "and what it learnt")
	assert.NotSame(t, cold, c.TokenBucket("cold"), "a name out of use is dropped")
	assert.False(t, c.TokenBucket("cold").family.perClient.Load(), "and what it learnt")
}

// A service walking its names in a cycle (the bench's 10,000 keys) keeps
// every family while they number up to twice a generation: none is made
// again.
func TestFamiliesKeepACycle(t *testing.T) {
	c := New(redistest.Miniredis(t))
	names := 2*familiesPerGeneration - 1
	first := make([]*Limiter, names)
	for i := range first {
		first[i] = c.Funnel(fmt.Sprint("key-", i))
	}
	for round := range 3 {
		for i := range first {
			if l := c.Funnel(fmt.Sprint("key-", i)); l != first[i] {
				t.Fatalf("round %d: key-%d was made again", round, i)
			}
		}
	}
}

// Handles made and used from many goroutines while the generations turn
// over are each their own name's (run with -race).
func TestHandlesConcurrently(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := New(redistest.Miniredis(t))
	cfg := PerMinute(100)
	names := 2 * maxFamilies
	wait := hammer(ctx, 4, func(g, n int) bool {
		name := fmt.Sprint("user-", (n*4+g)%names)
		l := c.Funnel(name).WithDefault(cfg)
		if l.Name() != name || l.keys[0] != name || l.config != "default 100 60000 0 0 0 0" {
			t.Errorf("%s: a handle on %s, %v", name, l.Name(), l.config)
			return true
		}
		if n%16 == 0 { // each decision runs the script in this process: a few
			if r, err := l.Allow(ctx, 1); err != nil || !r.Allowed {
				t.Errorf("%s: %+v, %v", name, r, err)
				return true
			}
		}
		return n == names
	})
	wait()
	assert.LessOrEqual(t, familiesKept(c), maxFamilies)
}

func familiesKept(c *Client) int {
	return c.families.Len()
}

// cannedReplies answers every EVALSHA with a decision's reply, allowed by
// a default (scripts/common.lua), without a server: what a decision costs
// the library and go-redis, the network aside. Decisions made one at a time
// go out alone, never batched.
type cannedReplies struct{ passHook }

// cannedReply is a lone decision's: a default reply (allowed, remaining,
// retry, reset), boxed once.
var cannedReply any = "d 1 99 0 0"

func (cannedReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c, ok := cmd.(*redis.Cmd)
		if !ok || cmd.Name() != "evalsha" {
			return next(ctx, cmd) // fails: nothing listens
		}
		c.SetVal(cannedReply)

		return nil
	}
}

func canned(t testing.TB) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"}) // never dialled: the hook answers
	rdb.AddHook(cannedReplies{})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// Allocations per decision: a handle made per request costs what a reused
// one does, and making it costs nothing. Canned, a decision costs go-redis
// its command and the library the command's arguments; against a real
// server, end to end, go-redis also allocates the reply, its boxing and
// three for the pool's check of the connection. (Not miniredis: it runs in
// the test process, and its Lua allocates a thousand times a call.) The
// token bucket's request ID adds its string and its boxing.
func TestDecisionAllocations(t *testing.T) {
	backends := []struct {
		name    string
		connect func(t *testing.T) *redis.Client
		// most allocations per decision, without and with a request ID
		most, withID float64
	}{
		{"canned", func(t *testing.T) *redis.Client { return canned(t) }, 2, 4},
		{"redis", func(t *testing.T) *redis.Client { return redistest.Shared(t).Client(t) }, 7, 9},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			rdb := b.connect(t)
			for _, a := range algorithms {
				t.Run(a.name, func(t *testing.T) {
					ctx := context.Background()
					c := New(rdb, WithPrefix("app:")) // Redis TIME, as in service
					name := uniqueName(t)
					cfg := PerHour(1 << 30)
					most := b.most
					if a.new(c, name).alg.Records {
						most = b.withID
					}
					decide := func(l *Limiter) {
						r, err := l.Allow(ctx, 1)
						if err != nil || !r.Allowed {
							t.Fatalf("Allow: %+v, %v", r, err)
						}
					}
					reused := a.new(c, name).WithDefault(cfg)
					decide(reused)
					perDecision := testing.AllocsPerRun(100, func() { decide(reused) })
					perRequest := testing.AllocsPerRun(100, func() { decide(a.new(c, name).WithDefault(cfg)) })
					t.Logf("allocations: %v a decision on a reused handle, %v on a handle per request", perDecision, perRequest)
					assert.LessOrEqual(t, perDecision, most, "a decision on a reused handle")
					assert.LessOrEqual(t, perRequest, most, "a decision on a handle per request")
					assert.Zero(t, testing.AllocsPerRun(100, func() { a.new(c, name).WithDefault(cfg) }), "making the handle")
				})
			}
		})
	}
}

// BenchmarkHandles compares a decision on a reused handle with one on a
// handle made per request, c.Funnel(key).WithDefault(cfg), against the test
// binary's redis-server.
func BenchmarkHandles(b *testing.B) {
	rdb := redistest.Shared(b).Client(b)
	ctx := context.Background()
	cfg := PerHour(1 << 30)
	for _, a := range algorithms {
		c := New(rdb)
		name := redistest.UniqueName(b, "handles-"+a.name)
		reused := a.new(c, name).WithDefault(cfg)
		for _, way := range []struct {
			name   string
			handle func() *Limiter
		}{
			{"reused", func() *Limiter { return reused }},
			{"per-request", func() *Limiter { return a.new(c, name).WithDefault(cfg) }},
		} {
			b.Run(a.name+"/"+way.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := way.handle().Allow(ctx, 1); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
