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
	logged := cloneClient(t, rdb)
	log := &commandLog{}
	logged.AddHook(log)
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
		granted, errs := hammer(ctx, limiters, callers, stop)
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
