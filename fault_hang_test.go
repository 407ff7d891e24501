package redlimit

// Redis hangs: paused (CLIENT PAUSE) past a caller's deadline, or stalled
// (DEBUG SLEEP) past go-redis's ReadTimeout, so that it re-sends scripts the
// server runs twice.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A hung Redis under a caller's deadline is an outage, not "no permit in
// time": the error is both ErrUnavailable and the context's, and WithFailOpen
// grants. ContextTimeoutEnabled makes go-redis give up at the deadline; without
// it the call waits out ReadTimeout and its retries (see docs/operations.md).
func TestHangPastDeadline(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	var mu sync.Mutex
	var observed []error
	closed := New(rdb)
	open := New(rdb, WithFailOpen(), WithObserver(func(d Decision) {
		mu.Lock()
		observed = append(observed, d.Err)
		mu.Unlock()
	}))
	type handles struct{ closed, open *Limiter }
	var limiters []handles
	for _, a := range algorithms {
		name := uniqueName(t) + "-" + a.name
		h := handles{a.new(closed, name).WithDefault(tenPer10s), a.new(open, name).WithDefault(tenPer10s)}
		for _, l := range []*Limiter{h.closed, h.open} {
			ok, err := l.TryAcquire(ctx, 1) // scripts loaded, connections made: the pause is all that is left
			require.NoError(t, err)
			require.True(t, ok)
		}
		limiters = append(limiters, h)
	}
	mu.Lock()
	observed = nil
	mu.Unlock()
	// The pause outlives the test: the server is killed at cleanup.
	require.NoError(t, srv.Client(t).Do(ctx, "CLIENT", "PAUSE", "6000", "ALL").Err())

	const deadline = 200 * time.Millisecond
	var wg sync.WaitGroup
	for _, h := range limiters {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			began := time.Now()
			ok, err := h.closed.TryAcquire(ctx, 1)
			took := time.Since(began)
			assert.False(t, ok, "%s: fails closed", h.closed.Name())
			assert.ErrorIs(t, err, ErrUnavailable, "%s: Redis could not decide", h.closed.Name())
			assert.ErrorIs(t, err, context.DeadlineExceeded, "%s: because the deadline came first", h.closed.Name())
			assert.GreaterOrEqual(t, took, deadline)
			assert.Less(t, took, deadline+time.Second, "%s: go-redis gave up at the deadline", h.closed.Name())
		})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			ok, err := h.open.TryAcquire(ctx, 1)
			assert.NoError(t, err)
			assert.True(t, ok, "%s: fails open", h.open.Name())
		})
	}
	wg.Wait()
	require.Len(t, observed, len(algorithms), "the observer is told of each fail-open")
	for _, err := range observed {
		assert.ErrorIs(t, err, ErrUnavailable)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	}
}

func TestHangStallUnderLoad(t *testing.T) {
	t.Run("alone", func(t *testing.T) { hangStall(t, false) })
	t.Run("batched", func(t *testing.T) { hangStall(t, true) })
}

func hangStall(t *testing.T, batching bool) {
	// go-redis gives up reading after ReadTimeout, closes the connection and
	// sends the script again on another (MaxRetries): the server, stalled in
	// DEBUG SLEEP, may run both copies, or have run the first and held its
	// reply. A retry needs an idle connection: a new one starts with HELLO,
	// which the stalled server cannot answer in time either, and go-redis
	// does not retry a handshake that timed out (the call fails with "i/o
	// timeout"). So the pool is first filled with idle connections, eight for
	// each call in flight, far more than the three tries that span the stall,
	// as this machine's hiccups can stretch it. Four workers per limiter: a
	// herd of retries much larger, under -race on two cores, keeps timing out
	// at 200ms well after the stall.
	const workers = 4
	inFlight := len(algorithms) * workers
	b := newFaultBed(t, &redis.Options{ReadTimeout: 200 * time.Millisecond, MaxRetries: 8, PoolSize: 10 * inFlight})
	ctx := context.Background()
	opts := []Option{WithRetryWindow(15 * time.Second)}
	if !batching {
		opts = append(opts, WithoutBatching())
	}
	runs := countingRuns(t, New(b.rdb, opts...))
	b.warm(t, runs)
	var conns []*redis.Conn // each holds a connection of the pool until Close
	for tries := 0; len(conns) < 8*inFlight && tries < 16*inFlight; tries++ {
		c := b.rdb.Conn()
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close() // a handshake that outlasted 200ms on this busy machine
			continue
		}
		conns = append(conns, c)
	}
	require.Len(t, conns, 8*inFlight)
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	wait := faultHammer(t, runs, workers, untilDenied)
	waitProgress(t, runs, faultCapacity/4)
	require.GreaterOrEqual(t, b.rdb.PoolStats().IdleConns, uint32(6*inFlight))
	stalled := time.Now()
	require.NoError(t, b.admin.Do(ctx, "DEBUG", "SLEEP", "0.5").Err())
	require.GreaterOrEqual(t, time.Since(stalled), 500*time.Millisecond)
	wait()

	assertExact(t, b.admin, runs)
	asked, written, ran := b.evalshas(t)
	t.Logf("EVALSHA: %d asked, %d written (%d re-sent), %d run by the server (%d more than asked)", asked, written, written-asked, ran, ran-asked)
	total := 0
	for _, r := range runs {
		// Its requests, alone or in batches: a batch re-sent re-sends each.
		key := "requests " + r.algo.name
		resent := b.wire.wrote(key) - b.wire.count(key)
		total += resent
		t.Logf("%s: %d grants, %d denials, %d requests re-sent", r.algo.name, r.granted.Load(), r.denied.Load(), resent)
		if !batching {
			assert.Positive(t, resent, "%s: go-redis re-sent scripts whose reply it did not read", r.algo.name)
		}
	}
	// Batched, the few calls in flight during the stall hold whichever
	// requests came: some are re-sent, not always of every algorithm.
	assert.Positive(t, total, "go-redis re-sent scripts whose reply it did not read")
	assert.Greater(t, ran, asked, "the server ran some requests more than once: the counts above prove each counted once")
}
