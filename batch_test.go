package redlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/evalsha"
	"github.com/redlimit/redlimit/internal/redistest"
)

// batchGate is a hook that holds lone decisions (not a batch's call) while
// held, so that a test can queue requests behind them and see one batch
// form; and lets a test act just before a batch is sent. A batch waits
// until the held calls are answered: the first of them to return sends the
// batch, which would otherwise race the other to Redis.
type batchGate struct {
	passHook
	mu          sync.Mutex
	held        bool
	arrived     chan struct{}
	release     chan struct{}
	answered    sync.WaitGroup // the held calls
	beforeBatch func() error   // its error fails the batch's call
}

func newBatchGate() *batchGate {
	return &batchGate{held: true, arrived: make(chan struct{}, evalsha.BatchCalls), release: make(chan struct{})}
}

// isBatch reports whether cmd is a batch: a call of the decision script
// carrying more than one request.
func isBatch(cmd redis.Cmder) bool {
	return cmd.Name() == "evalsha" && len(requestsOf(cmd.Args())) > 1
}

func (g *batchGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "evalsha" {
			return next(ctx, cmd)
		}
		if isBatch(cmd) {
			g.answered.Wait()
			g.mu.Lock()
			before := g.beforeBatch
			g.mu.Unlock()
			if before != nil {
				if err := before(); err != nil {
					cmd.SetErr(err)
					return err
				}
			}
			return next(ctx, cmd)
		}
		g.mu.Lock()
		held := g.held
		if held {
			g.answered.Add(1)
		}
		g.mu.Unlock()
		if !held {
			return next(ctx, cmd)
		}
		defer g.answered.Done()
		g.arrived <- struct{}{}
		<-g.release
		return next(ctx, cmd)
	}
}

// open lets the held calls go, and every later one.
func (g *batchGate) open() {
	g.mu.Lock()
	g.held = false
	g.mu.Unlock()
	close(g.release)
}

// queued waits until the batcher of key holds n waiting requests.
func queued(t *testing.T, c *Client, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return c.transport.Queued(key) == n }, 10*time.Second, time.Millisecond, "requests queued")
}

// batchCase is one request of a batch: what it does to a Client's limiters.
type batchCase struct {
	name string
	do   func(ctx context.Context, c *Client, prefix string) (Result, error)
}

// mixedBatch is a batch of every kind a Client sends: each algorithm, a
// PerClient limiter, several rates, a peek, a release, charges, a request for more
// than the limit, a key holding another type, an uninitialised limiter, a
// stored config, Throttle.
func mixedBatch() []batchCase {
	perSecond := func(n int64) Config { return Config{Rate: n, Interval: time.Second} }
	allow := func(pick func(c *Client, name string) *Limiter, name string, cfg Config, permits int64) func(ctx context.Context, c *Client, prefix string) (Result, error) {
		return func(ctx context.Context, c *Client, prefix string) (Result, error) {
			return pick(c, prefix+name).WithDefault(cfg).Allow(ctx, permits)
		}
	}
	funnel := func(c *Client, n string) *Limiter { return c.Funnel(n) }
	bucket := func(c *Client, n string) *Limiter { return c.TokenBucket(n) }
	fixed := func(c *Client, n string) *Limiter { return c.FixedWindow(n) }
	sliding := func(c *Client, n string) *Limiter { return c.SlidingWindow(n) }
	two := perSecond(5).And(Config{Rate: 7, Interval: time.Minute})
	return []batchCase{
		{"funnel", allow(funnel, "f", perSecond(3), 1)},
		{"bucket", allow(bucket, "b", perSecond(3), 2)},
		{"fixed", allow(fixed, "x", perSecond(3), 1)},
		{"sliding", allow(sliding, "s", perSecond(3), 1)},
		{"funnel again", allow(funnel, "f", perSecond(3), 2)},
		{"funnel denied", allow(funnel, "f", perSecond(3), 1)},
		{"bucket peek", allow(bucket, "b", perSecond(3), 0)},
		{"fixed above limit", allow(fixed, "x", perSecond(3), 4)},
		{"several rates", allow(sliding, "m", two, 3)},
		{"several rates again", allow(sliding, "m", two, 3)},
		{"per client", allow(fixed, "p", Config{Rate: 2, Interval: time.Second, Type: PerClient}, 1)},
		{"wrong type", allow(funnel, "w", perSecond(3), 1)},
		{"not initialised", func(ctx context.Context, c *Client, prefix string) (Result, error) {
			return c.Funnel(prefix+"u").Allow(ctx, 1)
		}},
		{"reserve", func(ctx context.Context, c *Client, prefix string) (Result, error) {
			res, err := c.TokenBucket(prefix+"b").WithDefault(perSecond(3)).Reserve(ctx, 1)
			return res.Result, err
		}},
		{"bucket after reserve", allow(bucket, "b", perSecond(3), 2)},
		{"bucket charge", func(ctx context.Context, c *Client, prefix string) (Result, error) {
			return c.TokenBucket(prefix+"b").WithDefault(perSecond(3)).Charge(ctx, 4)
		}},
		{"bucket in debt", allow(bucket, "b", perSecond(3), 1)},
		{"sliding charge", func(ctx context.Context, c *Client, prefix string) (Result, error) {
			return c.SlidingWindow(prefix+"s").WithDefault(perSecond(3)).Charge(ctx, 5)
		}},
		{"stored config", func(ctx context.Context, c *Client, prefix string) (Result, error) {
			return c.SlidingWindow(prefix+"st").Allow(ctx, 2)
		}},
		{"per client bucket", allow(bucket, "pb", Config{Rate: 2, Interval: time.Second, Type: PerClient}, 1)},
		{"throttle", func(ctx context.Context, c *Client, prefix string) (Result, error) {
			r, err := c.Throttle(ctx, prefix+"th", 2, 5, time.Second, 2)
			return Result{Allowed: !r.Limited, Limit: r.Limit, Remaining: r.Remaining, RetryAfter: time.Duration(r.RetryAfter), ResetAfter: time.Duration(r.ResetAfter)}, err
		}},
	}
}

// The batch's answers are those of the same requests sent one by one, in
// the order they came, and each error is its own request's.
func TestBatchDecidesAsAlone(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		rdb := connect()
		clock := redistest.NewClock(time.Unix(1_800_000_000, 0))
		tag := redistest.UniqueName(t, "")
		batched, alone := "b{"+tag+"}", "a{"+tag+"}"
		for _, prefix := range []string{batched, alone} {
			// A key of the funnel's holding a list: WRONGTYPE inside the script.
			require.NoError(t, rdb.RPush(ctx, prefix+"w", "x").Err())
			require.NoError(t, New(rdb).SlidingWindow(prefix+"st").SetRate(ctx, Config{Rate: 5, Interval: time.Minute}))
		}
		cases := mixedBatch()

		// One by one, with batching off.
		lone := New(rdb, WithClock(clock.Now), WithoutBatching())
		want := make([]Result, 0, 2+len(cases))
		wantErr := make([]error, 0, 2+len(cases))
		for range 2 {
			r, err := cases[0].do(ctx, lone, alone)
			want, wantErr = append(want, r), append(wantErr, err)
		}
		for _, cs := range cases {
			r, err := cs.do(ctx, lone, alone)
			want, wantErr = append(want, r), append(wantErr, err)
		}

		// Batched: two lone calls held in flight, the rest queued behind
		// them one at a time (so in a known order), then all let go.
		gate := newBatchGate()
		hooked := cloneClient(t, rdb)
		hooked.AddHook(gate)
		c := New(hooked, WithClock(clock.Now))
		got := make([]Result, 2+len(cases))
		gotErr := make([]error, 2+len(cases))
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() { got[i], gotErr[i] = cases[0].do(ctx, c, batched) })
			<-gate.arrived
		}
		for i, cs := range cases {
			wg.Go(func() { got[2+i], gotErr[2+i] = cs.do(ctx, c, batched) })
			queued(t, c, batched, i+1)
		}
		gate.open()
		wg.Wait()
		if got[0].Remaining < got[1].Remaining {
			// The held two raced each other to Redis.
			got[0], got[1] = got[1], got[0]
		}

		names := append([]string{"lone 1", "lone 2"}, func() []string {
			var n []string
			for _, cs := range cases {
				n = append(n, cs.name)
			}
			return n
		}()...)
		for i, name := range names {
			require.Equal(t, want[i], got[i], name)
			require.Equal(t, errorKind(wantErr[i]), errorKind(gotErr[i]), "%s: %v / %v", name, wantErr[i], gotErr[i])
		}
		require.ErrorIs(t, gotErr[2+11], ErrCorruptState, "wrong type")
		require.ErrorIs(t, gotErr[2+12], ErrNotInitialized, "not initialised")
		calls, decisions := c.transport.BatchStatsOf(batched)
		require.Equal(t, int64(1), calls)
		require.Equal(t, int64(len(cases)), decisions)
	})
}

// errorKind is the sentinel an error wraps, for comparing two errors whose
// texts differ (a batch's name no script line).
func errorKind(err error) error {
	for _, kind := range []error{ErrCorruptState, ErrNotInitialized, ErrAlgorithmMismatch, ErrMisconfigured, ErrUnavailable, ErrUnexpectedReply, context.Canceled} {
		if errors.Is(err, kind) {
			return kind
		}
	}
	if err != nil {
		return fmt.Errorf("unclassified: %w", err)
	}
	return nil
}

// inOneBatch holds two calls of first in flight, queues each of reqs behind
// them in order, then lets them all go, so that reqs form one batch; ready
// runs while they wait. It returns when every call has returned.
func inOneBatch(t *testing.T, c *Client, gate *batchGate, key string, first func(), ready func(), reqs ...func()) {
	t.Helper()
	var wg sync.WaitGroup
	for range evalsha.BatchCalls {
		wg.Go(first)
		<-gate.arrived
	}
	for i, req := range reqs {
		wg.Go(req)
		queued(t, c, key, i+1)
	}
	if ready != nil {
		ready()
	}
	gate.open()
	wg.Wait()
}

// batchFixture is a Client whose lone calls a gate holds, and a limiter
// name in one slot.
func batchFixture(t *testing.T, connect func() redis.UniversalClient, opts ...Option) (c *Client, gate *batchGate, rdb redis.UniversalClient, name func(string) string) {
	rdb = connect()
	gate = newBatchGate()
	hooked := cloneClient(t, rdb)
	hooked.AddHook(gate)
	tag := redistest.UniqueName(t, "")
	return New(hooked, opts...), gate, rdb, func(n string) string { return n + "{" + tag + "}" }
}

// A caller whose context ends while it waits leaves the batch, and is not
// counted; one whose context ends once its batch is on its way returns at
// once with its context's error, and was counted, as a lone call that Redis
// ran before its caller left.
func TestBatchCallerLeaves(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		c, gate, _, name := batchFixture(t, connect)
		cfg := Config{Rate: 10, Interval: time.Hour}
		lim := func(n string) *Limiter { return c.FixedWindow(name(n)).WithDefault(cfg) }
		leaving, leavingCancel := context.WithCancel(ctx)
		sent, sentCancel := context.WithCancel(ctx)
		gate.beforeBatch = func() error {
			sentCancel()
			return nil
		}
		var leftErr, sentErr, goodErr error
		inOneBatch(t, c, gate, name("a"), func() { _, _ = lim("first").Allow(ctx, 1) },
			func() {
				leavingCancel()
				queued(t, c, name("a"), 2) // it has left
			},
			func() { _, goodErr = lim("good").Allow(ctx, 2) },
			func() { _, leftErr = lim("left").Allow(leaving, 3) },
			func() { _, sentErr = lim("sent").Allow(sent, 4) },
		)
		require.NoError(t, goodErr)
		require.ErrorIs(t, leftErr, context.Canceled)
		require.NotErrorIs(t, leftErr, ErrUnavailable)
		require.ErrorIs(t, sentErr, context.Canceled)
		for n, left := range map[string]int64{"first": 8, "good": 8, "left": 10, "sent": 6} {
			assertAvailable(t, lim(n), left, n)
		}
		calls, decisions := c.transport.BatchStats()
		require.Equal(t, [2]int64{1, 2}, [2]int64{calls, decisions}, "one batch of good and sent")
	})
}

// A server that lost its scripts (SCRIPT FLUSH, restart, failover) as a
// batch is sent: the batch script is loaded and the batch sent again, and
// each decision counts once.
func TestBatchNoScript(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		c, gate, rdb, name := batchFixture(t, connect)
		cfg := Config{Rate: 10, Interval: time.Hour}
		lim := func(n string) *Limiter { return c.Funnel(name(n)).WithDefault(cfg) }
		flushed := 0
		gate.beforeBatch = func() error {
			if flushed++; flushed == 1 {
				flush(t, rdb)
			}
			return nil
		}
		var errs [3]error
		inOneBatch(t, c, gate, name("a"), func() { _, _ = lim("first").Allow(ctx, 1) }, nil,
			func() { _, errs[0] = lim("a").Allow(ctx, 1) },
			func() { _, errs[1] = lim("b").Allow(ctx, 2) },
			func() { _, errs[2] = lim("a").Allow(ctx, 3) },
		)
		require.NoError(t, errors.Join(errs[:]...))
		require.Equal(t, 2, flushed, "the batch, NOSCRIPT, then the batch again")
		assertAvailable(t, lim("a"), 6, "a")
		assertAvailable(t, lim("b"), 8, "b")
	})
}

// flush empties every server's script cache.
func flush(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.ScriptFlush(ctx).Err() }))
		return
	}
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
}

// A batch whose call fails on the wire fails each of its requests with
// ErrUnavailable, and WithFailOpen grants each; the observer sees each.
func TestBatchFailsOnTheWire(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		for _, failOpen := range []bool{false, true} {
			t.Run(fmt.Sprintf("failOpen=%v", failOpen), func(t *testing.T) {
				ctx := context.Background()
				var mu sync.Mutex
				var seen []error
				opts := []Option{WithObserver(func(d Decision) {
					mu.Lock()
					defer mu.Unlock()
					seen = append(seen, d.Err)
				})}
				if failOpen {
					opts = append(opts, WithFailOpen())
				}
				c, gate, _, name := batchFixture(t, connect, opts...)
				lim := func(n string) *Limiter {
					return c.SlidingWindow(name(n)).WithDefault(Config{Rate: 10, Interval: time.Hour})
				}
				gate.beforeBatch = func() error { return errors.New("connection reset by peer") }
				var results [3]Result
				var errs [3]error
				reqs := make([]func(), 3)
				for i := range reqs {
					reqs[i] = func() { results[i], errs[i] = lim(fmt.Sprint(i)).Allow(ctx, 1) }
				}
				inOneBatch(t, c, gate, name("0"), func() { _, _ = lim("first").Allow(ctx, 1) }, nil, reqs...)
				for i := range reqs {
					if failOpen {
						require.NoError(t, errs[i])
						require.Equal(t, Result{Allowed: true, Reason: ReasonFailOpen}, results[i])
					} else {
						require.ErrorIs(t, errs[i], ErrUnavailable)
						require.False(t, results[i].Allowed)
					}
				}
				unavailable := 0
				for _, err := range seen {
					if errors.Is(err, ErrUnavailable) {
						unavailable++
					}
				}
				require.Equal(t, 3, unavailable, "the observer sees each request's error")
			})
		}
	})
}
