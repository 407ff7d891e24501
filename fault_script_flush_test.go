package redlimit

// The script cache emptied (SCRIPT FLUSH, as after a restart or a
// failover; on a Cluster, shard by shard): EVALSHA answers NOSCRIPT, the
// library reloads with SCRIPT LOAD (once for callers that meet it together)
// and decides; no caller ever sees NOSCRIPT.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func scriptFlush(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	if p, ok := rdb.(prefixed); ok {
		rdb = p.UniversalClient
	}
	if c, ok := rdb.(*redis.ClusterClient); ok {
		require.NoError(t, c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return n.ScriptFlush(ctx).Err() }))
		return
	}
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
}

// After SCRIPT FLUSH (as after a restart or a failover) EVALSHA answers
// NOSCRIPT; the runtime reloads with SCRIPT LOAD, never EVAL, and retries once.
func TestScriptFlushReloads(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		log := &commandLog{}
		logged := recorded(t, rdb, log)
		l := a.new(newClient(logged, newClock()), uniqueName(t)).WithDefault(tenPer10s)
		for range 2 {
			scriptFlush(t, rdb)
			ok, err := l.TryAcquire(ctx, 1)
			require.NoError(t, err)
			assert.True(t, ok)
		}
		sent := log.sent()
		assert.Contains(t, sent, "script load")
		for _, name := range sent {
			assert.NotEqual(t, "eval", name, "never EVAL: %v", sent)
		}
		assertAvailable(t, l, 8)
	})
}

// Callers that meet NOSCRIPT together share one SCRIPT LOAD.
func TestScriptFlushReloadIsSingleFlight(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		if _, ok := rdb.(*redis.Client); !ok {
			t.Skip("one server: a cluster loads every shard in one ScriptLoad")
		}
		for _, batching := range []bool{false, true} {
			t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
				ctx := context.Background()
				log := &commandLog{}
				logged := recorded(t, rdb, log)
				var opts []Option
				if !batching {
					opts = append(opts, WithoutBatching())
				}
				c := newClient(logged, newClock(), opts...)
				l := c.FixedWindow(uniqueName(t)).WithDefault(Per(1000, time.Minute))
				scriptFlush(t, rdb)       // whatever other tests loaded on the server
				_, err := l.Allow(ctx, 1) // loaded once
				require.NoError(t, err)
				loaded := log.count("script load " + scripts.Decide.SHA)
				scriptFlush(t, rdb)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for range 32 {
					wg.Go(func() {
						<-start
						_, err := l.Allow(ctx, 1)
						assert.NoError(t, err)
					})
				}
				close(start)
				wg.Wait()
				if !batching {
					assert.Equal(t, 2, log.count("script load"), "one load before the flush, one after: %v", log.sent())
					return
				}
				// The first callers go alone, the others in batches, all
				// through the one decision script: loaded once after the
				// flush.
				assert.Equal(t, loaded+1, log.count("script load "+scripts.Decide.SHA), "one load after the flush: %v", log.sent())
			})
		}
	})
}

func TestScriptFlushUnderLoad(t *testing.T) {
	t.Run("alone", func(t *testing.T) { scriptFlushUnderLoad(t, false) })
	t.Run("batched", func(t *testing.T) { scriptFlushUnderLoad(t, true) })
}

func scriptFlushUnderLoad(t *testing.T, batching bool) {
	b := newFaultBed(t, &redis.Options{})
	ctx := context.Background()
	var opts []Option
	if !batching {
		opts = append(opts, WithoutBatching())
	}
	runs := countingRuns(t, New(b.rdb, opts...))
	wait := faultHammer(t, runs, faultWorkers, untilDenied)
	flushes := 0
	for _, at := range []int64{faultCapacity / 5, faultCapacity / 2} {
		waitProgress(t, runs, at)
		require.NoError(t, b.admin.ScriptFlush(ctx).Err())
		flushes++
	}
	wait()

	assertExact(t, b.admin, runs)
	for _, r := range runs {
		t.Logf("%s: %d grants, %d denials", r.algo.name, r.granted.Load(), r.denied.Load())
	}
	// One load on the fresh server, then one per flush: callers that met
	// NOSCRIPT together share one (Transport.reload), whatever the
	// algorithm: every decision, lone or batched, runs the one script.
	loads := b.wire.count("script load " + scripts.Decide.SHA)
	t.Logf("%d SCRIPT LOAD", loads)
	assert.Equal(t, 1+flushes, loads, "reloaded once after each flush")
	assert.Zero(t, b.wire.count("eval"), "the library never asks for EVAL")
	assert.Zero(t, b.wire.wrote("eval"), "no EVAL was written to a socket")
}

// primaryClients returns the ClusterClient's connection to each primary,
// ordered by address so that a run flushes them in a fixed order.
func primaryClients(t *testing.T, rdb *redis.ClusterClient) []*redis.Client {
	t.Helper()
	var mu sync.Mutex
	var nodes []*redis.Client
	require.NoError(t, rdb.ForEachMaster(context.Background(), func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, n)
		return nil
	}))
	slices.SortFunc(nodes, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	return nodes
}

// An operator running SCRIPT FLUSH node by node (or a rolling restart) empties
// the script caches of a Cluster's shards at different moments. A caller's
// NOSCRIPT may then come from a flush that happened after another caller's
// SCRIPT LOAD reached that shard, so that load cannot count for it. Callers
// must never see NOSCRIPT: Redis is up throughout. It was intermittent, so the
// flush is staggered many times over, with pauses from a couple of
// milliseconds (flushes land while a load is on its way) to tens (one lands
// after every load has finished).
func TestScriptFlushStaggered(t *testing.T) {
	const runs, perAlgorithm, rate, callers = 16, 6, 1000, 32
	cluster := redistest.SharedCluster(t)
	rdb := cluster.Client(t)
	ctx := context.Background()
	primaries := primaryClients(t, rdb)
	require.Len(t, primaries, 3)
	log := &commandLog{}
	logged := recorded(t, rdb, log)
	// One Client for every run, as in a service: its single-flight record of
	// the last load carries over from one run's flushes to the next.
	c := newClient(logged, newClock()) // the clock stands still: every permit counts
	// Scripts loaded before the first run: every load counted below answers a flush.
	for _, a := range algorithms {
		_, err := a.new(c, "scriptloss-warm").WithDefault(PerHour(rate)).Allow(ctx, 0)
		require.NoError(t, err)
	}
	noScript := 0
	for run := range runs {
		pause := []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond}[run%4]
		var limiters []*Limiter
		for i, a := range algorithms {
			for j := range perAlgorithm {
				// Slots spread evenly over the 16384, so each algorithm has
				// limiters on every primary.
				slot := (j*16384/perAlgorithm + run*331 + i*17) % 16384
				name := fmt.Sprintf("%sscriptloss-%d-%x", redistest.HashTagForSlot(slot), run, rand.Uint32())
				limiters = append(limiters, a.new(c, name).WithDefault(PerHour(rate)))
			}
		}
		loadsBefore := log.count("script load")
		stop := make(chan struct{})
		granted, errs := hammerUntil(ctx, limiters, callers, stop)
		time.Sleep(20 * time.Millisecond)
		for _, p := range primaries {
			require.NoError(t, p.ScriptFlush(ctx).Err())
			time.Sleep(pause)
		}
		time.Sleep(20 * time.Millisecond)
		close(stop)
		seen := errs()
		loads := log.count("script load") - loadsBefore

		used := int64(0)
		for _, l := range limiters {
			n, err := l.AvailablePermits(ctx)
			require.NoError(t, err)
			used += rate - n
		}
		for _, err := range seen {
			if strings.Contains(err.Error(), "NOSCRIPT") {
				noScript++
			}
		}
		t.Logf("run %d, pause %v: %d grants, %d errors, %d SCRIPT LOAD", run, pause, granted.Load(), len(seen), loads)
		assert.Empty(t, seen, "run %d: Redis was up: no error may surface", run)
		assert.Equal(t, used, granted.Load(), "run %d: every grant counted once in Redis", run)
		// A load reaches every shard, so three flushes need three loads per
		// script (fewer when a flush lands before a load does). A second one
		// for a flush is sent only when a shard lost the script while a load
		// was on its way (Client.reload); without single-flight each of the
		// 32 callers would send its own.
		assert.LessOrEqual(t, loads, 2*len(primaries)*len(algorithms), "run %d: single-flight", run)
	}
	t.Logf("%d runs: %d NOSCRIPT errors surfaced", runs, noScript)
}

// holdHook holds the first EVALSHA sent with a held context until release is
// closed, so that other calls, loads and flushes can happen while it is on
// its way; after a SCRIPT LOAD it runs afterLoad, if set, once.
type holdHook struct {
	passHook
	held, release chan struct{}
	once          sync.Once
	afterLoad     func()
	loadOnce      sync.Once
}

type holdKey struct{}

func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && ctx.Value(holdKey{}) != nil {
			h.once.Do(func() {
				close(h.held)
				<-h.release
			})
		}
		err := next(ctx, cmd)
		if args := cmd.Args(); cmd.Name() == "script" && fmt.Sprint(args[1]) == "load" && h.afterLoad != nil {
			h.loadOnce.Do(h.afterLoad)
		}
		return err
	}
}

// The two ways a retry met NOSCRIPT again, each played step by step on one
// server: the bug TestScriptFlushStaggered finds by chance, made certain.
func TestScriptFlushSteps(t *testing.T) {
	servers := map[string]func(t *testing.T) *redis.Client{
		"miniredis": func(t *testing.T) *redis.Client { return redistest.Miniredis(t) },
		"redis":     func(t *testing.T) *redis.Client { return redistest.Shared(t).Client(t) },
	}
	for backend, server := range servers {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			admin := server(t)
			// setup returns a limiter whose script the server has just lost,
			// and the SCRIPT LOADs sent from then on.
			setup := func(t *testing.T) (*Limiter, *holdHook, func() int) {
				rdb := redis.NewClient(admin.Options())
				t.Cleanup(func() { rdb.Close() })
				hook := &holdHook{held: make(chan struct{}), release: make(chan struct{})}
				log := &commandLog{}
				rdb.AddHook(log)
				rdb.AddHook(hook)
				l := New(rdb).FixedWindow(uniqueName(t)).WithDefault(Per(100, time.Hour))
				_, err := l.Allow(ctx, 0) // loaded
				require.NoError(t, err)
				require.NoError(t, admin.ScriptFlush(ctx).Err())
				before := log.count("script load")
				return l, hook, func() int { return log.count("script load") - before }
			}

			// A caller's EVALSHA is on its way while another caller meets
			// NOSCRIPT and loads; the server is flushed again after that
			// load and before the first EVALSHA arrives. The first caller's
			// NOSCRIPT comes after a load that completed after it was sent,
			// which it used to take as its cure.
			t.Run("flushed after another's load", func(t *testing.T) {
				l, hook, loads := setup(t)
				done := make(chan error)
				go func() {
					_, err := l.Allow(context.WithValue(ctx, holdKey{}, true), 1)
					done <- err
				}()
				<-hook.held
				_, err := l.Allow(ctx, 1) // NOSCRIPT, loads, granted
				require.NoError(t, err)
				require.NoError(t, admin.ScriptFlush(ctx).Err())
				close(hook.release)
				assert.NoError(t, <-done)
				assert.Equal(t, 2, loads(), "the other caller's, and one for the second flush")
			})

			// The server is flushed between a caller's own load and its retry.
			t.Run("flushed after its own load", func(t *testing.T) {
				l, hook, loads := setup(t)
				close(hook.release)
				hook.afterLoad = func() { require.NoError(t, admin.ScriptFlush(ctx).Err()) }
				_, err := l.Allow(ctx, 1)
				assert.NoError(t, err)
				assert.Equal(t, 2, loads(), "one for each flush")
			})
		})
	}
}
