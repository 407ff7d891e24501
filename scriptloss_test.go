package redlimit

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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

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
func TestScriptLossStaggered(t *testing.T) {
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
// server: the bug TestScriptLossStaggered finds by chance, made certain.
func TestScriptLossSteps(t *testing.T) {
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
