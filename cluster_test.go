package redlimit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// hammerUntil runs callers goroutines acquiring one permit at a time from
// every limiter until stop is closed, and returns the grants and every error
// seen.
func hammerUntil(ctx context.Context, limiters []*Limiter, callers int, stop <-chan struct{}) (granted *atomic.Int64, errs func() []error) {
	granted = &atomic.Int64{}
	var mu sync.Mutex
	var seen []error
	wait := hammer(ctx, callers, func(g, _ int) bool {
		select {
		case <-stop:
			return true
		default:
		}
		ok, err := limiters[g%len(limiters)].TryAcquire(ctx, 1)
		if err != nil {
			mu.Lock()
			seen = append(seen, err)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return false
		}
		if ok {
			granted.Add(1)
		}
		return false
	})
	return granted, func() []error {
		wait()
		return seen
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

// A limiter's keys all live in one slot, whatever its name.
func TestClusterKeysShareASlot(t *testing.T) {
	c := New(redis.NewClient(&redis.Options{}), WithClientID("c1"))
	for _, name := range []string{"plain", "{tag}x", "a{b}c", "x}{y}", "ünï"} {
		for _, a := range algorithms {
			l := a.new(c, name)
			slot := redistest.KeySlot(l.keys[0])
			for _, k := range append(l.keys, l.alg.StateKeys(l.Name(), "other")...) {
				assert.Equal(t, slot, redistest.KeySlot(k), "%s %q: %q", a.name, name, k)
			}
		}
	}
}
