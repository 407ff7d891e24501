package redlimit

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inFlightHook ends the caller's context while its next EVALSHA is in
// flight, in one of the ways a caller goes away mid-decision.
type inFlightHook struct {
	passHook
	mu  sync.Mutex
	end func() // the caller's cancel, for the next EVALSHA only
	way inFlight
}

// inFlight is how a call's context ends while Redis is asked.
type inFlight struct {
	name string
	ran  bool  // the server runs the script (decides, and counts a grant) first
	err  error // what the call then ends with; nil: the context's error
	// wait: the call waits out its context's own end (a deadline) rather
	// than ending it.
	wait bool
}

var inFlightWays = []inFlight{
	// go-redis gives up waiting for a connection of its pool: nothing ran.
	{name: "waiting for a connection"},
	// The script ran, and its reply is lost with the caller.
	{name: "reply lost", ran: true},
	// The script ran, and the connection went down as the caller left.
	{name: "connection reset", ran: true, err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}},
}

// arm makes the next EVALSHA end its call's context with end, the way way says.
func (h *inFlightHook) arm(way inFlight, end func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.way, h.end = way, end
}

func (h *inFlightHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		way, end := h.way, h.end
		if cmd.Name() == "evalsha" {
			h.end = nil
		}
		h.mu.Unlock()
		if end == nil || cmd.Name() != "evalsha" {
			return next(ctx, cmd)
		}
		if way.ran {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		if !way.wait {
			end()
		}
		<-ctx.Done()
		err := way.err
		if err == nil {
			err = ctx.Err()
		}
		cmd.SetErr(err)
		return err
	}
}

// A caller that cancels while its script is in flight is not an outage: on
// a Client made WithFailOpen, every method that takes permits returns an
// error wrapping context.Canceled (never ErrUnavailable) and grants nothing,
// the observer sees no grant, and a breaker that opens at the first failure
// stays closed. A grant Redis made before the caller left stays counted: it
// can only under-admit. A deadline that passes while Redis is asked is still
// an outage: fail-open grants it, and it counts as the breaker's failure.
func TestCancelledInFlight(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		rdb = cloneClient(t, rdb)
		hook := &inFlightHook{}
		rdb.AddHook(hook)
		var mu sync.Mutex
		var seen []Decision
		c := newClient(rdb, newClock(), WithFailOpen(), WithBreaker(1, time.Hour), WithObserver(func(d Decision) {
			mu.Lock()
			seen = append(seen, d)
			mu.Unlock()
		}))
		l := a.new(c, uniqueName(t)).WithDefault(tenPer10s)
		ok, err := l.TryAcquire(context.Background(), 1)
		require.NoError(t, err)
		require.True(t, ok)

		calls := []struct {
			name string
			call func(ctx context.Context) (bool, error)
		}{
			{"Allow", func(ctx context.Context) (bool, error) { r, err := l.Allow(ctx, 1); return r.Allowed, err }},
			{"TryAcquire", func(ctx context.Context) (bool, error) { return l.TryAcquire(ctx, 1) }},
			{"Acquire", func(ctx context.Context) (bool, error) { err := l.Acquire(ctx, 1); return err == nil, err }},
			{"TryAcquireWithin", func(ctx context.Context) (bool, error) { return l.TryAcquireWithin(ctx, 1, time.Second) }},
		}
		ran := int64(0)
		for _, way := range inFlightWays {
			for _, call := range calls {
				ctx, cancel := context.WithCancel(context.Background())
				hook.arm(way, cancel)
				mu.Lock()
				seen = nil
				mu.Unlock()
				ok, err := call.call(ctx)
				cancel()
				what := way.name + ": " + call.name
				assert.False(t, ok, "%s: a caller that is gone is not granted", what)
				assert.ErrorIs(t, err, context.Canceled, what)
				assert.NotErrorIs(t, err, ErrUnavailable, "%s: not an outage", what)
				if way.err != nil {
					assert.ErrorIs(t, err, way.err, "%s: the cause is kept", what)
				}
				mu.Lock()
				require.Len(t, seen, 1, what)
				assert.False(t, seen[0].Result.Allowed, "%s: the observer sees no grant", what)
				assert.ErrorIs(t, seen[0].Err, context.Canceled, what)
				assert.NotErrorIs(t, seen[0].Err, ErrUnavailable, what)
				mu.Unlock()
				if way.ran {
					ran++
				}
			}
		}
		// Every call went to Redis (the breaker opens at one failure: none was
		// counted), and each script that ran counted its grant.
		r, err := l.Allow(context.Background(), 0)
		require.NoError(t, err)
		assert.Equal(t, 10-1-ran, r.Remaining, "the grants Redis made before their callers left stay counted")

		// A deadline that passes while Redis is asked is an outage.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		hook.arm(inFlight{name: "deadline", wait: true}, cancel)
		mu.Lock()
		seen = nil
		mu.Unlock()
		ok, err = l.TryAcquire(ctx, 1)
		assert.NoError(t, err)
		assert.True(t, ok, "fail-open grants a call Redis did not answer in time")
		mu.Lock()
		require.Len(t, seen, 1)
		assert.ErrorIs(t, seen[0].Err, ErrUnavailable)
		assert.ErrorIs(t, seen[0].Err, context.DeadlineExceeded)
		mu.Unlock()
		mu.Lock()
		seen = nil
		mu.Unlock()
		_, err = l.Allow(context.Background(), 0)
		assert.NoError(t, err, "fail-open")
		mu.Lock()
		require.Len(t, seen, 1)
		assert.ErrorIs(t, seen[0].Err, ErrBreakerOpen, "the deadline was the breaker's failure")
		mu.Unlock()
	})
}

// The way the issue met it: more callers than go-redis's pool has
// connections wait for one, and a caller that leaves while it waits is told
// context.Canceled, on a Client made WithFailOpen too. (The one connection
// is held here, so the call waits for as long as the test wants.)
func TestCancelledWaitingForConnection(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		plain, ok := rdb.(*redis.Client)
		if !ok {
			t.Skip("one connection pool: a plain client")
		}
		opts := plain.Options()
		opts.PoolSize, opts.ContextTimeoutEnabled, opts.PoolTimeout = 1, true, time.Minute
		one := redis.NewClient(opts)
		t.Cleanup(func() { one.Close() })
		for _, a := range algorithms {
			c := newClient(one, newClock(), WithFailOpen())
			l := a.new(c, uniqueName(t)).WithDefault(tenPer10s)
			require.NoError(t, l.Acquire(context.Background(), 1), a.name)
			held := one.Conn()
			require.NoError(t, held.Ping(context.Background()).Err())
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(20*time.Millisecond, cancel)
			r, err := l.Allow(ctx, 1)
			assert.ErrorIs(t, err, context.Canceled, a.name)
			assert.NotErrorIs(t, err, ErrUnavailable, a.name)
			assert.False(t, r.Allowed, "%s: not granted", a.name)
			require.NoError(t, held.Close())
			left, err := l.AvailablePermits(context.Background())
			require.NoError(t, err)
			assert.Equal(t, int64(9), left, "%s: nothing ran", a.name)
		}
	})
}

// A cancelled caller is told so, not answered from the local cache.
func TestCancelledLocalCache(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		l := a.new(newClient(rdb, newClock(), WithLocalCache(), WithFailOpen()), uniqueName(t)).WithDefault(Per(1, time.Minute))
		ctx := context.Background()
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		require.False(t, r.Allowed, "denied, and the denial cached")
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		r, err = l.Allow(cancelled, 1)
		assert.ErrorIs(t, err, context.Canceled)
		assert.False(t, r.Allowed)
		assert.False(t, errors.Is(err, ErrUnavailable))
	})
}
