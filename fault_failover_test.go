package redlimit

// The primary holding a limiter changes under load: a Sentinel failover, a
// Cluster failover, a Cluster slot moved to another primary (reshard), and a
// plain client left pointing at a former primary.

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sentinelRate is each limiter's limit, per hour. An hour is far longer than
// a run, so no permit comes back during one and the grants must add up to
// the limit exactly; and small enough that the funnel, which gives one permit
// back every Interval/Rate (12 s), gives none back in a run.
const sentinelRate = 300

// sentinelRun is one limiter under fire and what its callers saw.
type sentinelRun struct {
	algo    string
	limiter *Limiter
	mu      sync.Mutex
	grants  [][2]time.Time // when each granted call began and ended
	// deniedAfter is set once a caller was denied after the failover: from
	// then on the new primary holds the limiter's whole usage.
	deniedAfter atomic.Bool
}

func (r *sentinelRun) granted() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(len(r.grants))
}

// during counts the grants whose call overlapped [from, to].
func (r *sentinelRun) during(from, to time.Time) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, g := range r.grants {
		if !g[1].Before(from) && !g[0].After(to) {
			n++
		}
	}
	return n
}

// Sentinel's failover under load, for every algorithm, with the rate stored
// (SetRate: the config crosses the failover by replication) and as a default.
// Four callers per limiter (32 in all) take one permit about every 20 ms, so
// a limiter needs about 1.5 s to use up its limit: SENTINEL FAILOVER is sent
// once each has granted a tenth, and grants go on through the switch. Callers
// see no error but ErrUnavailable, the scripts are loaded on the new primary
// by the NOSCRIPT path, and it ends up counting the whole limit.
//
// Sentinel's failover does not pause the old primary: what it accepted that
// the replica had not read when it was promoted, and what it accepts
// afterwards until go-redis hears +switch-master (the sentinel polls the
// promoted replica's role once a second during a failover, so up to about a
// second), is lost when it becomes a replica. A grant the new primary never
// counted is granted again. The test measures those grants (beyond the
// limit), logs them, and checks they come from the switch: never more than
// were granted while Failover ran.
//
// With min-replicas-to-write 1 the old primary refuses writes (NOREPLICAS,
// so ErrUnavailable) as soon as the promoted replica drops its link, which
// leaves only what that replica had not read; the new primary refuses them
// too until the old one has become its replica.
func TestSentinelFailover(t *testing.T) {
	for _, minReplicas := range []int{0, 1} {
		t.Run("min-replicas-to-write="+strconv.Itoa(minReplicas), func(t *testing.T) {
			sentinelFailover(t, minReplicas)
		})
	}
}

func sentinelFailover(t *testing.T, minReplicas int) {
	ctx := context.Background()
	clearOfHourEdge(t)
	st := redistest.StartSentinel(t)
	replicaServer := st.Replica(t)
	replica := replicaServer.Client(t)
	for _, node := range []*redis.Client{st.Primary(t).Client(t), replica} {
		require.NoError(t, node.ConfigSet(ctx, "min-replicas-to-write", strconv.Itoa(minReplicas)).Err())
	}
	rdb := st.Client(t)
	client := New(rdb)
	cfg := PerHour(sentinelRate)
	var runs []*sentinelRun
	for _, a := range algorithms {
		stored := a.new(client, uniqueName(t)+"-"+a.name+"-stored")
		require.NoError(t, stored.SetRate(ctx, cfg))
		dflt := a.new(client, uniqueName(t)+"-"+a.name+"-default").WithDefault(cfg)
		runs = append(runs, &sentinelRun{algo: a.name + "/stored", limiter: stored}, &sentinelRun{algo: a.name + "/default", limiter: dflt})
	}
	// The script cache is not replicated (Redis 7.0+): the replica has no
	// script, so the first call of each algorithm on it after the failover
	// meets NOSCRIPT. Redis 6.2 replicates SCRIPT LOAD; there the replica's
	// cache is flushed, now and right before the failover, as a replica
	// restarted since the scripts were loaded has it.
	flushReplicaScripts := func() {
		if strings.HasPrefix(replicaServer.Version(), "6.") {
			// Replication is asynchronous: the replica must have every
			// SCRIPT LOAD sent so far before its cache is flushed.
			acked, err := rdb.Do(ctx, "WAIT", 1, 5000).Int()
			require.NoError(t, err)
			require.Equal(t, 1, acked, "the replica has read everything sent so far")
			require.NoError(t, replica.ScriptFlush(ctx).Err())
		}
		require.Equal(t, "0", infoValue(t, replica, "memory", "number_of_cached_scripts"), "the replica has no script before the failover")
	}
	flushReplicaScripts()

	var failedOver atomic.Bool
	var mu sync.Mutex
	var errs []error
	var calls atomic.Int64
	var wg sync.WaitGroup
	for _, r := range runs {
		for range 4 {
			wg.Go(func() {
				for !r.deniedAfter.Load() {
					after := failedOver.Load()
					began := time.Now()
					ok, err := r.limiter.TryAcquire(ctx, 1)
					calls.Add(1)
					switch {
					case err != nil:
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					case ok:
						r.mu.Lock()
						r.grants = append(r.grants, [2]time.Time{began, time.Now()})
						r.mu.Unlock()
					case after:
						r.deniedAfter.Store(true)
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
	}
	stopped := make(chan struct{})
	go func() {
		wg.Wait()
		close(stopped)
	}()
	require.Eventually(t, func() bool {
		for _, r := range runs {
			if r.granted() < sentinelRate/10 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "every limiter grants")
	before := make([]int64, len(runs))
	for i, r := range runs {
		before[i] = r.granted()
		require.Less(t, before[i], int64(sentinelRate), "%s used up its limit before the failover", r.algo)
	}
	flushReplicaScripts()
	start := time.Now()
	from, to := st.Failover(t)
	end := time.Now()
	failedOver.Store(true)
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("callers not all denied 20 s after the failover; %d errors, the last %v", len(errs), errs[max(len(errs)-3, 0):])
	}

	t.Logf("failover from %s to %s took %v; %d calls, %d errors", from.Addr(), to.Addr(), end.Sub(start).Round(time.Millisecond), calls.Load(), len(errs))
	for _, err := range errs {
		assert.ErrorIs(t, err, ErrUnavailable, "only ErrUnavailable surfaces during the switch")
	}
	var extra int64
	for i, r := range runs {
		n, err := r.limiter.AvailablePermits(ctx)
		require.NoError(t, err)
		assert.Zero(t, n, "%s: the new primary counts the whole limit as used", r.algo)
		g, window := r.granted(), r.during(start, end)
		t.Logf("%-22s %3d grants before the failover, %3d during it, %3d in all: %+d against the limit", r.algo, before[i], window, g, g-sentinelRate)
		assert.GreaterOrEqual(t, g, int64(sentinelRate), "%s: no permit is lost by the failover", r.algo)
		assert.LessOrEqual(t, g-sentinelRate, window, "%s: grants beyond the limit come from the switch", r.algo)
		extra += g - sentinelRate
	}
	t.Logf("grants the new primary never counted (unreplicated or taken on the old primary after the promotion): %d over %d limiters of %d", extra, len(runs), sentinelRate)

	newPrimary := to.Client(t)
	assert.NotEqual(t, "0", infoValue(t, newPrimary, "memory", "number_of_cached_scripts"), "the scripts were loaded on the new primary")
	assert.NotEmpty(t, infoValue(t, newPrimary, "errorstats", "errorstat_NOSCRIPT"), "by the NOSCRIPT path")
}

// A plain client pointed at a node that became a replica gets READONLY for
// every write: a decision that must write fails with ErrUnavailable and the
// cause, and grants nothing. go-redis retries READONLY (MaxRetries) first.
func TestSentinelFormerPrimaryRefuses(t *testing.T) {
	ctx := context.Background()
	clearOfHourEdge(t)
	st := redistest.StartSentinel(t)
	former := st.Primary(t)
	plain := former.Client(t)
	var limiters []*Limiter
	for _, a := range algorithms {
		l := a.new(New(plain), uniqueName(t)+"-"+a.name).WithDefault(PerHour(sentinelRate))
		ok, err := l.TryAcquire(ctx, 1)
		require.NoError(t, err)
		require.True(t, ok, "%s grants while its node is the primary", a.name)
		limiters = append(limiters, l)
	}
	from, _ := st.Failover(t)
	require.Same(t, former, from)

	for i, l := range limiters {
		ok, err := l.TryAcquire(ctx, 1)
		assert.False(t, ok, "%s: no grant on a replica", algorithms[i].name)
		assert.ErrorIs(t, err, ErrUnavailable, algorithms[i].name)
		assert.ErrorContains(t, err, "READONLY", "%s: the cause is kept", algorithms[i].name)
		r, err := l.Allow(ctx, 2)
		assert.ErrorIs(t, err, ErrUnavailable, algorithms[i].name)
		assert.Equal(t, Result{}, r, "%s: an error carries no result", algorithms[i].name)
	}
}

// clusterChange runs change on a dedicated cluster while 32 callers hammer
// one limiter of each algorithm whose keys live in slot, through one Client,
// so that their decisions go in batches. Each limiter grants
// 300 permits an hour, far fewer than asked for: every one must be granted,
// and not one more, across the change.
func clusterChange(t *testing.T, change func(c *redistest.Cluster, slot int)) {
	ctx := context.Background()
	cluster := redistest.StartCluster(t)
	rdb := cluster.Client(t)
	const slot, rate = 4242, 300
	var limiters []*Limiter
	client := New(rdb) // one Client: the callers' decisions go in batches of the slot
	for _, a := range algorithms {
		name := redistest.HashTagForSlot(slot) + a.name
		limiters = append(limiters, a.new(client, name).WithDefault(PerHour(rate)))
	}
	stop := make(chan struct{})
	granted, errs := hammerUntil(ctx, limiters, 32, stop)
	time.Sleep(300 * time.Millisecond)
	change(cluster, slot)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	seen := errs()
	t.Logf("%d grants, %d errors surfaced", granted.Load(), len(seen))
	for _, err := range seen {
		assert.ErrorIs(t, err, ErrUnavailable, "only documented errors surface: %v", err)
	}
	for _, l := range limiters {
		assertAvailable(t, l, 0, "%s: every permit was granted", l.Name())
	}
	assert.Equal(t, int64(rate*len(limiters)), granted.Load(), "exactly the limit, across the change")
	calls, decisions := client.transport.BatchStats()
	t.Logf("%d decisions in %d batches", decisions, calls)
	assert.NotZero(t, calls, "batches formed")
}

// The new primary after a failover has no scripts (the script cache is not
// replicated): calls reload them and go on.
func TestClusterFailoverUnderLoad(t *testing.T) {
	clusterChange(t, func(c *redistest.Cluster, slot int) {
		before := c.SlotOwner(t, slot)
		c.Failover(t, slot)
		require.NotEqual(t, before, c.SlotOwner(t, slot))
	})
}

// Moving the limiters' slot to another primary (MIGRATE, then ASK and MOVED
// redirections) keeps every decision exact.
func TestClusterReshardUnderLoad(t *testing.T) {
	clusterChange(t, func(c *redistest.Cluster, slot int) {
		before := c.SlotOwner(t, slot)
		c.MoveSlot(t, slot)
		require.NotEqual(t, before, c.SlotOwner(t, slot))
	})
}
