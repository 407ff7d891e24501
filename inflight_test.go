package redlimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/wire"
)

// The in-flight limit on a controlled clock: exact holds, waits and
// expiries, on miniredis, real Redis and the Cluster (eachBackend).

// steadyInFlight returns an in-flight handle on a controlled clock whose
// holds do not refresh themselves: the tests refresh them by hand, so that
// a hold's expiry is exactly what they say.
func steadyInFlight(t *testing.T, rdb redis.UniversalClient, clk *clock, cfg InFlightConfig, opts ...Option) *InFlight {
	l := newClient(rdb, clk, opts...).InFlight(uniqueName(t))
	if cfg.Limit != 0 {
		l = l.WithDefault(cfg)
	}
	l.refreshEvery = -1
	return l
}

// holders lists l's live holds as id → TTL.
func holders(t *testing.T, l *InFlight) map[string]time.Duration {
	t.Helper()
	list, err := l.Holders(context.Background())
	require.NoError(t, err)
	m := map[string]time.Duration{}
	for _, h := range list {
		m[h.ID] = h.TTL
	}
	return m
}

// tryHold makes one attempt and requires it granted.
func tryHold(t *testing.T, l *InFlight) *Hold {
	t.Helper()
	h, err := l.TryAcquire(context.Background())
	require.NoError(t, err)
	require.NotNil(t, h, "granted")
	return h
}

// denied requires one attempt refused, with wait until the earliest hold expires.
func denied(t *testing.T, l *InFlight, wait time.Duration) {
	t.Helper()
	h, retry, err := l.try(context.Background(), l.newHoldID())
	require.NoError(t, err)
	require.Nil(t, h, "denied")
	assert.Equal(t, wait, retry, "until the earliest hold expires")
}

// A crashed holder's slot comes back once its TTL passes, to the
// millisecond; a refresh extends a hold by the TTL from its moment; a
// release frees the slot at once, and is idempotent; the crashed holder's
// own release and refresh then say it was lost.
func TestInFlightHoldsExpireRefreshAndRelease(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		l := steadyInFlight(t, rdb, clk, InFlightConfig{Limit: 2, TTL: 10 * time.Second})
		a := tryHold(t, l)
		assert.Equal(t, map[string]time.Duration{a.ID(): 10 * time.Second}, holders(t, l))
		clk.Add(time.Second)
		crashed := tryHold(t, l) // never refreshed nor released: its process died
		clk.Add(time.Second)
		denied(t, l, 8*time.Second) // a expires at 10s
		clk.Add(3 * time.Second)    // 5s
		require.NoError(t, a.Refresh(ctx))
		assert.Equal(t, map[string]time.Duration{a.ID(): 10 * time.Second, crashed.ID(): 6 * time.Second}, holders(t, l))
		clk.Add(5*time.Second + 999*time.Millisecond) // 10.999s
		denied(t, l, time.Millisecond)                // crashed expires at 11s
		clk.Add(time.Millisecond)                     // 11s: its slot is back
		c := tryHold(t, l)
		assert.Equal(t, map[string]time.Duration{a.ID(): 4 * time.Second, c.ID(): 10 * time.Second}, holders(t, l))

		assert.ErrorIs(t, crashed.Refresh(ctx), ErrHoldLost)
		select {
		case <-crashed.Lost():
		default:
			t.Fatal("Lost is closed once a refresh finds the hold gone")
		}
		assert.ErrorIs(t, crashed.Err(), ErrHoldLost)
		assert.ErrorIs(t, crashed.Release(ctx), ErrHoldLost, "its work ran without its slot for a while")

		require.NoError(t, a.Release(ctx))
		require.NoError(t, a.Release(ctx), "idempotent")
		assert.NoError(t, a.Err())
		select {
		case <-a.Lost():
			t.Fatal("a hold released in time is not lost")
		default:
		}
		assert.ErrorIs(t, a.Refresh(ctx), ErrHoldLost, "a released hold cannot be refreshed")
		assert.Equal(t, map[string]time.Duration{c.ID(): 10 * time.Second}, holders(t, l))
		d := tryHold(t, l) // a's slot, at once
		denied(t, l, 10*time.Second)
		require.NoError(t, c.Release(ctx))
		require.NoError(t, d.Release(ctx))
		assert.Empty(t, holders(t, l))
	})
}

// A hold that expired but was not swept yet (no acquire came since) is lost
// all the same: Release says so.
func TestInFlightReleaseAfterExpiryIsLost(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		l := steadyInFlight(t, rdb, clk, InFlightConfig{Limit: 1, TTL: time.Second})
		h := tryHold(t, l)
		clk.Add(time.Second)
		assert.ErrorIs(t, h.Release(context.Background()), ErrHoldLost)
		assert.ErrorIs(t, h.Err(), ErrHoldLost)
		assert.NoError(t, h.Release(context.Background()), "Redis answered: nothing more to do")
	})
}

// Lowering the limit evicts no one: the holds above it finish, refreshes
// still work, and acquires wait until fewer than the new limit remain.
// Raising it grants at once. A new TTL applies from a hold's next refresh.
func TestInFlightLimitChangesAtRuntime(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		l := steadyInFlight(t, rdb, clk, InFlightConfig{})
		require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: 3, TTL: 10 * time.Second}))
		held := []*Hold{tryHold(t, l), tryHold(t, l), tryHold(t, l)}
		denied(t, l, 10*time.Second)

		require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: 1, TTL: 30 * time.Second}))
		assert.Len(t, holders(t, l), 3, "no one evicted")
		clk.Add(time.Second)
		require.NoError(t, held[0].Refresh(ctx), "a hold above the limit still refreshes")
		assert.Equal(t, 30*time.Second, holders(t, l)[held[0].ID()], "with the TTL now in force")
		for i, h := range held {
			denied(t, l, 9*time.Second) // held[1] and held[2] expire at 10s
			require.NoError(t, h.Release(ctx), "hold %d", i)
		}
		h := tryHold(t, l) // none left: below the new limit
		assert.Equal(t, 30*time.Second, holders(t, l)[h.ID()])
		denied(t, l, 30*time.Second)

		require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: 3, TTL: 30 * time.Second}))
		tryHold(t, l)
		tryHold(t, l)
		denied(t, l, 30*time.Second)
	})
}

// Acquire waits until a slot is free: here until the only hold expires, at
// 300ms, looking again every 20ms (plus up to 5ms of jitter) and at that
// expiry. A context that ends first ends the wait.
func TestInFlightAcquireWaits(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		l := steadyInFlight(t, rdb, clk, InFlightConfig{Limit: 1, TTL: 300 * time.Millisecond})
		tryHold(t, l)
		start := clk.Now()
		h, err := l.Acquire(ctx)
		require.NoError(t, err)
		require.NotNil(t, h)
		waited := clk.Now().Sub(start)
		assert.GreaterOrEqual(t, waited, 300*time.Millisecond, "not before the hold expired")
		assert.Less(t, waited, 300*time.Millisecond+inFlightPoll+inFlightPoll/4, "at most a poll past it")

		gone, cancel := context.WithCancel(ctx)
		cancel()
		_, err = l.Acquire(gone)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Len(t, holders(t, l), 1, "a cancelled Acquire holds nothing")
	})
}

// The Acquires of one Client wait in line: only the first asks Redis while
// the limit is full, a release by this Client wakes it at once, and they
// get their holds in the order they came. A waiter whose context ends
// leaves the line without holding up the others.
func TestInFlightWaitersLineUp(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		const waiters = 16
		var tries atomic.Int64
		c := New(rdb, WithObserver(func(d Decision) { tries.Add(1) }))
		if p, ok := rdb.(prefixed); ok {
			c = New(rdb, WithPrefix(p.prefix), WithObserver(func(d Decision) { tries.Add(1) }))
		}
		name := uniqueName(t)
		l := c.InFlight(name).WithDefault(InFlightConfig{Limit: 1, TTL: time.Minute})
		first := tryHold(t, l)
		inLine := func() int { return c.lines.Waiting(l.name) }
		var order []int
		var mu sync.Mutex
		var wg sync.WaitGroup
		quitter, quit := context.WithCancel(ctx)
		for i := range waiters {
			wctx := ctx
			if i == 3 {
				wctx = quitter // leaves the line while others wait behind it
			}
			wg.Go(func() {
				h, err := l.Acquire(wctx)
				if i == 3 {
					assert.ErrorIs(t, err, context.Canceled)
					return
				}
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				assert.NoError(t, h.Release(ctx)) // the next one's turn, at once
			})
			require.Eventually(t, func() bool { return inLine() == i+1 }, 5*time.Second, time.Millisecond, "waiter %d in line", i)
		}
		quit()
		require.Eventually(t, func() bool { return inLine() == waiters-1 }, 5*time.Second, time.Millisecond)
		// Counted over the time that passed, however long the sleep took on
		// a starved CPU.
		start := time.Now()
		before := tries.Load()
		time.Sleep(250 * time.Millisecond)
		asked := tries.Load() - before
		took := time.Since(start)
		t.Logf("%d waiters asked Redis %d times in %v", waiters-1, asked, took.Round(time.Millisecond))
		assert.LessOrEqual(t, asked, int64(took/inFlightPoll+2), "only the first in line asks, every 20ms or so")
		assert.Positive(t, asked, "the first in line asks")
		require.NoError(t, first.Release(ctx))
		wg.Wait()
		want := []int{0, 1, 2}
		for i := 4; i < waiters; i++ {
			want = append(want, i)
		}
		assert.Equal(t, want, order, "first come, first served")
		assert.Zero(t, inLine(), "the line is gone")
		assert.Zero(t, c.lines.Len())
	})
}

// An Acquire whose context ends while it waits returns an error wrapping
// the context's, and takes nothing.
func TestInFlightAcquireDeadline(t *testing.T) {
	rdb := redistest.Miniredis(t)
	l := New(rdb).InFlight(uniqueName(t)).WithDefault(InFlightConfig{Limit: 1, TTL: time.Minute})
	l.refreshEvery = -1
	held := tryHold(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	h, err := l.Acquire(ctx)
	assert.Nil(t, h)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, []string{held.ID()}, keysOf(holders(t, l)))
}

func keysOf(m map[string]time.Duration) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// The config in force: the stored one, else the handle's default, else
// ErrNotInitialized. TrySetLimit stores only when none is; SetLimit always;
// Delete removes the config and the holds.
func TestInFlightConfig(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		bare := steadyInFlight(t, rdb, clk, InFlightConfig{})
		_, err := bare.Config(ctx)
		assert.ErrorIs(t, err, ErrNotInitialized)
		_, err = bare.TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrNotInitialized)

		dflt := InFlightConfig{Limit: 4, TTL: time.Minute}
		l := bare.WithDefault(dflt)
		cfg, err := l.Config(ctx)
		require.NoError(t, err)
		assert.Equal(t, dflt, cfg)

		stored := InFlightConfig{Limit: 1, TTL: 2 * time.Second}
		ok, err := l.TrySetLimit(ctx, stored)
		require.NoError(t, err)
		assert.True(t, ok)
		ok, err = l.TrySetLimit(ctx, InFlightConfig{Limit: 9, TTL: time.Second})
		require.NoError(t, err)
		assert.False(t, ok, "one is stored: kept")
		for _, h := range []*InFlight{bare, l} {
			cfg, err := h.Config(ctx)
			require.NoError(t, err)
			assert.Equal(t, stored, cfg, "the stored config wins over the default")
		}
		tryHold(t, l)
		denied(t, l, 2*time.Second) // limit 1, TTL 2s: the stored config, not the default

		existed, err := l.Delete(ctx)
		require.NoError(t, err)
		assert.True(t, existed)
		assert.Empty(t, holders(t, l), "the holds went with it")
		existed, err = l.Delete(ctx)
		require.NoError(t, err)
		assert.False(t, existed)
		cfg, err = l.Config(ctx)
		require.NoError(t, err)
		assert.Equal(t, dflt, cfg)
	})
}

// Reset drops every hold and keeps the config: the slots serve others at
// once, and a holder finds its hold lost on its next refresh or release. A
// rate limiter's name is not an in-flight limit's to reset.
func TestInFlightReset(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		l := steadyInFlight(t, rdb, clk, InFlightConfig{Limit: 2, TTL: time.Minute})
		require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: 2, TTL: time.Hour}))
		a, b := tryHold(t, l), tryHold(t, l)
		denied(t, l, time.Hour)
		dropped, err := l.Reset(ctx)
		require.NoError(t, err)
		assert.True(t, dropped)
		assert.Empty(t, holders(t, l))
		cfg, err := l.Config(ctx)
		require.NoError(t, err)
		assert.Equal(t, InFlightConfig{Limit: 2, TTL: time.Hour}, cfg, "the config stays")
		c := tryHold(t, l)
		assert.ErrorIs(t, a.Refresh(ctx), ErrHoldLost)
		assert.ErrorIs(t, b.Release(ctx), ErrHoldLost)
		assert.Equal(t, []string{c.ID()}, keysOf(holders(t, l)), "the slots served others at once")
		require.NoError(t, c.Release(ctx))
		_, err = l.Reset(ctx)
		require.NoError(t, err)
		dropped, err = l.Reset(ctx)
		require.NoError(t, err)
		assert.False(t, dropped, "nothing left to drop")

		name := uniqueName(t)
		require.NoError(t, newClient(rdb, clk).FixedWindow(name).SetRate(ctx, PerHour(5)))
		_, err = newClient(rdb, clk).InFlight(name).Reset(ctx)
		assert.ErrorIs(t, err, ErrAlgorithmMismatch)
	})
}

// Bad input is ErrInvalidConfig (or ErrInvalidName), and leaves the stored
// config as it was.
func TestInFlightBadInput(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Miniredis(t)
	c := New(rdb)
	l := c.InFlight(uniqueName(t))
	good := InFlightConfig{Limit: 5, TTL: time.Second}
	require.NoError(t, l.SetLimit(ctx, good))
	for _, bad := range []InFlightConfig{
		{Limit: 0, TTL: time.Second},
		{Limit: -1, TTL: time.Second},
		{Limit: wire.MaxInFlightLimit + 1, TTL: time.Second},
		{Limit: 1, TTL: 0},
		{Limit: 1, TTL: -time.Second},
		{Limit: 1, TTL: 999 * time.Microsecond},
		{Limit: 1, TTL: 1500 * time.Microsecond},
		{Limit: 1, TTL: 9 * time.Millisecond}, // its lease would end before its first refresh
		{Limit: 1, TTL: maxInterval + time.Millisecond},
	} {
		assert.ErrorIs(t, l.SetLimit(ctx, bad), ErrInvalidConfig, "%v", bad)
		_, err := l.TrySetLimit(ctx, bad)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%v", bad)
		_, err = c.InFlight(uniqueName(t)).WithDefault(bad).TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%v", bad)
		cfg, err := l.Config(ctx)
		require.NoError(t, err)
		assert.Equal(t, good, cfg, "untouched")
	}
	for _, name := range []string{"", "a{}b"} {
		_, err := c.InFlight(name).WithDefault(good).TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrInvalidName, "%q", name)
	}
	_, err := New(rdb, WithPrefix("p:")).InFlight("}x").Config(ctx)
	assert.ErrorIs(t, err, ErrInvalidName)
}

// A name is one limiter: an in-flight limit and a rate limiter never share
// it. Each refuses the other's keys with ErrAlgorithmMismatch, whichever
// came first, and writes nothing to them.
func TestInFlightAlgorithmMismatch(t *testing.T) {
	ctx := context.Background()
	cfg := InFlightConfig{Limit: 2, TTL: time.Second}
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newClient(rdb, newClock())
		for _, a := range algorithms {
			t.Run(a.name, func(t *testing.T) {
				// A stored rate config; then a default's state in the key
				// (a flat state, or the token bucket's marker).
				storedRate, rateState := uniqueName(t), uniqueName(t)
				require.NoError(t, a.new(c, storedRate).SetRate(ctx, PerMinute(10)))
				_, err := a.new(c, rateState).WithDefault(PerMinute(10)).Allow(ctx, 1)
				require.NoError(t, err)
				for _, name := range []string{storedRate, rateState} {
					l := c.InFlight(name).WithDefault(cfg)
					_, err := l.TryAcquire(ctx)
					assert.ErrorIs(t, err, ErrAlgorithmMismatch, "acquire on %s", name)
					assert.ErrorIs(t, l.SetLimit(ctx, cfg), ErrAlgorithmMismatch, "set on %s", name)
					_, err = l.Delete(ctx)
					assert.ErrorIs(t, err, ErrAlgorithmMismatch, "delete on %s", name)
				}
				got, err := a.new(c, storedRate).Config(ctx)
				require.NoError(t, err)
				assert.Equal(t, PerMinute(10), got, "the rate's config is untouched")
				r, err := a.new(c, rateState).WithDefault(PerMinute(10)).Allow(ctx, 0)
				require.NoError(t, err)
				assert.Equal(t, int64(9), r.Remaining, "the rate's state is untouched")

				// An in-flight limit's name, used by a rate limiter.
				inflight := uniqueName(t)
				require.NoError(t, c.InFlight(inflight).SetLimit(ctx, cfg))
				_, err = a.new(c, inflight).WithDefault(PerMinute(10)).Allow(ctx, 1)
				assert.ErrorIs(t, err, ErrAlgorithmMismatch)
				assert.ErrorIs(t, a.new(c, inflight).SetRate(ctx, PerMinute(10)), ErrAlgorithmMismatch)
				stored, err := c.InFlight(inflight).Config(ctx)
				require.NoError(t, err)
				assert.Equal(t, cfg, stored)
			})
		}
	})
}

// Keys the scripts did not write are ErrCorruptState, never a panic or a grant.
func TestInFlightCorruptState(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newClient(rdb, newClock())
		l := c.InFlight(uniqueName(t))
		conf, holds := l.keys[0].(string), l.keys[1].(string)
		require.NoError(t, rdb.HSet(ctx, conf, "limit", "ten", "ttl", "1000", "algorithm", wire.InFlightAlgorithm).Err())
		_, err := l.TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrCorruptState)
		require.NoError(t, rdb.HSet(ctx, conf, "limit", "10", "ttl", "0").Err())
		_, err = l.TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrCorruptState, "a ttl below 1ms")
		require.NoError(t, rdb.HSet(ctx, conf, "ttl", "1000").Err())
		require.NoError(t, rdb.Set(ctx, holds, "x", time.Minute).Err())
		_, err = l.TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrCorruptState, "holds in a string")
		_, err = l.Holders(ctx)
		assert.ErrorIs(t, err, ErrCorruptState)
		require.NoError(t, rdb.Del(ctx, holds).Err())
		tryHold(t, l)
	})
}

// Every key starts with the Client's prefix and shares one Cluster slot;
// the holds expire with the latest hold (the config, as a rate's, does not),
// and an operator can read each name. Releasing every hold leaves nothing
// that counts, and the key still expires.
func TestInFlightKeys(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		name := uniqueName(t)
		c := newClient(rdb, clk)
		l := c.InFlight(name)
		l.refreshEvery = -1
		require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: 3, TTL: 10 * time.Second}))
		a := tryHold(t, l)
		b := tryHold(t, l)
		require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: 3, TTL: 5 * time.Second}))
		tryHold(t, l) // a shorter TTL does not shorten the key's life

		conf, holds := wire.FullName(c.prefix, name), wire.KeyOf(wire.FullName(c.prefix, name), "holders")
		assert.ElementsMatch(t, []string{conf, holds}, limiterKeys(t, rdb, name))
		for _, k := range []string{conf, holds} {
			assert.True(t, strings.HasPrefix(k, c.prefix), "%q under the prefix", k)
			assert.Equal(t, redistest.KeySlot(conf), redistest.KeySlot(k), "%q in the config's slot", k)
		}
		raw := rdb
		if p, ok := rdb.(prefixed); ok {
			raw = p.UniversalClient
		}
		assert.Equal(t, time.Duration(-1), raw.PTTL(ctx, conf).Val(), "a config never expires")
		ttl := raw.PTTL(ctx, holds).Val()
		assert.Greater(t, ttl, 9*time.Second)
		assert.LessOrEqual(t, ttl, 10*time.Second)
		require.NoError(t, a.Release(ctx))
		require.NoError(t, b.Release(ctx))
		assert.Len(t, holders(t, l), 1)
		assert.Greater(t, raw.PTTL(ctx, holds).Val(), time.Duration(0), "still expiring")
	})
}

// go-redis re-sends a script whose reply it did not read: a re-run of an
// acquire takes one slot, and a re-run of a release answers as the first
// did (released, not lost). Here every EVALSHA runs twice.
func TestInFlightResentScriptsCountOnce(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		twice := recorded(t, rdb, &commandLog{twice: true})
		if p, ok := rdb.(prefixed); ok {
			twice = prefixed{twice, p.prefix}
		}
		l := steadyInFlight(t, twice, newClock(), InFlightConfig{Limit: 2, TTL: time.Minute})
		a, b := tryHold(t, l), tryHold(t, l)
		assert.Len(t, holders(t, l), 2)
		denied(t, l, time.Minute)
		require.NoError(t, a.Refresh(ctx))
		require.NoError(t, a.Release(ctx), "released, not lost")
		require.NoError(t, b.Release(ctx))
		assert.Empty(t, holders(t, l))
	})
}

// The observer sees each attempt as a decision of the algorithm inflight.
func TestInFlightObserved(t *testing.T) {
	var seen []Decision
	rdb := redistest.Miniredis(t)
	l := steadyInFlight(t, rdb, newClock(), InFlightConfig{Limit: 1, TTL: time.Second},
		WithObserver(func(d Decision) { seen = append(seen, d) }))
	tryHold(t, l)
	denied(t, l, time.Second)
	require.Len(t, seen, 2)
	for i, allowed := range []bool{true, false} {
		assert.Equal(t, l.Name(), seen[i].Limiter)
		assert.Equal(t, "inflight", seen[i].Algorithm)
		assert.Equal(t, allowed, seen[i].Result.Allowed)
		assert.Equal(t, int64(1), seen[i].Result.Limit)
	}
	assert.Equal(t, time.Second, seen[1].Result.RetryAfter)
}

// A Redis that cannot decide fails closed (ErrUnavailable), or with
// WithFailOpen grants a hold that holds no slot.
func TestInFlightUnavailable(t *testing.T) {
	ctx := context.Background()
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { down.Close() })
	cfg := InFlightConfig{Limit: 1, TTL: time.Second}
	_, err := New(down).InFlight("x").WithDefault(cfg).TryAcquire(ctx)
	assert.ErrorIs(t, err, ErrUnavailable)
	h, err := New(down, WithFailOpen()).InFlight("x").WithDefault(cfg).TryAcquire(ctx)
	require.NoError(t, err)
	require.NotNil(t, h)
	assert.NoError(t, h.Refresh(ctx))
	assert.NoError(t, h.Release(ctx))
}

// Waiters in line on a Redis that does not answer do not wait for each
// other's timeouts: the first call to fail lets every waiter ask for
// itself. Eight Acquires on a server that never replies, each call timing
// out after 300ms: once the first call fails, the other seven ask at once,
// their calls overlapping (in line, no two would), and all end in about two
// timeouts (in line, they would take eight), failing closed, or granted
// open with WithFailOpen. The overlap is measured from each call's own span
// (the observer's), which a starved CPU only lengthens.
func TestInFlightWaitersOnADeadRedis(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() }) // accepted, never answered
		}
	}()
	stalled := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ReadTimeout: 300 * time.Millisecond, PoolSize: 16})
	t.Cleanup(func() { stalled.Close() })
	for _, open := range []bool{false, true} {
		var mu sync.Mutex
		var calls [][2]int64 // each attempt's span, µs
		opts := []Option{WithObserver(func(d Decision) {
			end := time.Now()
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, [2]int64{end.Add(-d.Latency).UnixMicro(), end.UnixMicro()})
		})}
		if open {
			opts = append(opts, WithFailOpen())
		}
		l := New(stalled, opts...).InFlight(uniqueName(t)).WithDefault(InFlightConfig{Limit: 1, TTL: time.Minute})
		start := time.Now()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				h, err := l.Acquire(context.Background())
				if open {
					assert.NoError(t, err)
					assert.NotNil(t, h)
				} else {
					assert.ErrorIs(t, err, ErrUnavailable)
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		overlap := mostOverlapping(calls)
		t.Logf("fail-open %v: 8 waiters done in %v, %d calls at once", open, took.Round(time.Millisecond), overlap)
		assert.Len(t, calls, 8, "fail-open %v: one call each", open)
		assert.Equal(t, 7, overlap, "fail-open %v: after the first failed, the other seven asked at once", open)
		assert.Less(t, took, 8*300*time.Millisecond, "fail-open %v: not one timeout after another", open)
	}
}

// A Hold refreshes itself every TTL/3 while held, on a timer of its own: a
// hold of a 600ms TTL held for 1.4s (past two TTLs) is renewed to 600ms at
// each 200ms and not between, is still live, and is released in time. Once
// its hold is gone from Redis (the limit deleted), its next refresh finds
// out: Lost closes at that refresh, 200ms later, and Err says the hold was
// dropped. On a controlled clock whose timers fire as the test moves it
// (timerClock), so that a starved CPU cannot make a refresh late.
func TestInFlightAutomaticRefresh(t *testing.T) {
	ctx := context.Background()
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		tc := newTimerClock()
		l := timedInFlight(connect(), tc, uniqueName(t), InFlightConfig{Limit: 1, TTL: 600 * time.Millisecond})
		h := tryHold(t, l)
		for i := range 7 {
			tc.Add(100 * time.Millisecond)
			assert.Equal(t, 500*time.Millisecond, holders(t, l)[h.ID()], "tick %d: not refreshed between ticks", i)
			tc.Add(100 * time.Millisecond)
			assert.Equal(t, 600*time.Millisecond, holders(t, l)[h.ID()], "tick %d: refreshed at the tick", i)
		}
		assert.NoError(t, h.Err())
		require.NoError(t, h.Release(ctx))

		h = tryHold(t, l)
		_, err := l.Delete(ctx)
		require.NoError(t, err)
		tc.Add(199 * time.Millisecond)
		assert.True(t, believes(h), "no refresh yet")
		tc.Add(time.Millisecond)
		assert.False(t, believes(h), "the refresh found it gone")
		assert.ErrorIs(t, h.Err(), ErrHoldLost)
		assert.ErrorContains(t, h.Err(), "dropped by Reset or Delete")
		assert.ErrorIs(t, h.Release(ctx), ErrHoldLost)
	})
}

// In-flight limits across processes: 3 processes (this test binary run
// again as an "inflight" child: startChild) × 64 goroutines take, use and release holds of
// one limit of 10 on miniredis, a real redis-server and the Cluster,
// deciding on Redis TIME. Two goroutines of each hold for 1.2s, past the
// TTL of 1s, so that only their refreshes keep their slots; the others for
// 1 to 4ms. Mid-run the parent kills one process with SIGKILL while it
// holds. Proven:
//   - never more than 10 held: by a sampler listing the live holds as fast
//     as it can, and by the surviving processes' own holds, each from the
//     moment its grant came back to the moment its release was sent (inside
//     its life in Redis), swept over time;
//   - demand exceeded the limit: the sampler saw all 10 held;
//   - the killed process's holds stay counted until their TTL passes, then
//     are gone (0 leaked), and their slots serve the survivors (10 held
//     again after);
//   - no hold was lost (its Release says so) and nothing is left at the end.

const (
	inflightProcesses  = 3
	inflightGoroutines = 64
	inflightLimit      = 10
	inflightTTL        = time.Second
	inflightLongWork   = 1200 * time.Millisecond // past the TTL: refreshed twice or more
)

// inflightSpec tells a child where to hold, and when.
type inflightSpec struct {
	Addrs    []string `json:"addrs"`
	Cluster  bool     `json:"cluster"`
	Name     string   `json:"name"`
	ClientID string   `json:"client_id"` // its holds' ids start with it
	Start    int64    `json:"start"`     // Unix µs: every child begins then...
	Stop     int64    `json:"stop"`      // ...and asks for no hold after this
}

// inflightReport is what a child says of its run.
type inflightReport struct {
	Holds  [][2]int64 `json:"holds"` // each hold: µs its grant came back, µs its release was sent
	Errors []string   `json:"errors"`
}

// inflightChild is a child of TestInFlightAcrossProcesses: it holds as its
// inflightSpec says and reports an inflightReport.
func inflightChild(t *testing.T, raw []byte) any {
	var spec inflightSpec
	decodeSpec(t, raw, &spec)
	var rdb redis.UniversalClient
	if spec.Cluster {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: spec.Addrs, PoolSize: inflightGoroutines})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: spec.Addrs[0], PoolSize: inflightGoroutines})
	}
	defer rdb.Close()
	ctx := context.Background()
	l := New(rdb, WithClientID(spec.ClientID)).InFlight(spec.Name) // the parent stored its config
	_, err := l.Holders(ctx)                                       // loads the script and the slots
	require.NoError(t, err)
	time.Sleep(time.Until(time.UnixMicro(spec.Start)))
	stop, cancel := context.WithDeadline(ctx, time.UnixMicro(spec.Stop))
	defer cancel()

	var mu sync.Mutex
	var report inflightReport
	hammer(stop, inflightGoroutines, func(g, _ int) bool {
		h, err := l.Acquire(stop)
		if stop.Err() != nil {
			if h != nil {
				err = h.Release(ctx)
			}
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				mu.Lock()
				report.Errors = append(report.Errors, err.Error())
				mu.Unlock()
			}
			return true
		}
		if err != nil {
			mu.Lock()
			report.Errors = append(report.Errors, err.Error())
			mu.Unlock()
			return false
		}
		granted := time.Now().UnixMicro()
		work := time.Millisecond + rand.N(3*time.Millisecond)
		if g%32 == 0 {
			work = inflightLongWork
		}
		time.Sleep(work)
		releasing := time.Now().UnixMicro()
		err = h.Release(ctx)
		mu.Lock()
		defer mu.Unlock()
		report.Holds = append(report.Holds, [2]int64{granted, releasing})
		if err != nil {
			report.Errors = append(report.Errors, err.Error())
		}
		return false
	})()
	return report
}

// inflightSample is what the sampler saw at one moment, between from and
// to: when its call was sent and answered.
type inflightSample struct {
	from, to time.Time
	held     int
	victim   int // of them, the killed process's
}

func TestInFlightAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes for ~12s")
	}
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, connect func() redis.UniversalClient) {
		rdb := connect()
		var addrs []string
		switch r := rdb.(type) {
		case *redis.Client:
			addrs = []string{r.Options().Addr}
		case *redis.ClusterClient:
			addrs = r.Options().Addrs
		}
		_, cluster := rdb.(*redis.ClusterClient)
		inflightAcrossProcesses(t, rdb, addrs, cluster)
	})
}

func inflightAcrossProcesses(t *testing.T, rdb redis.UniversalClient, addrs []string, cluster bool) {
	ctx := context.Background()
	name := uniqueName(t)
	l := New(rdb).InFlight(name)
	require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: inflightLimit, TTL: inflightTTL}))

	start := time.Now().Add(time.Second) // the children's start-up, before it
	kill := start.Add(700 * time.Millisecond)
	stop := kill.Add(inflightTTL + time.Second)
	victimID := "victim-" + randomHex(4)
	// Past the run, the kill and the checks: a bound for children stuck.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	children := make([]*child, inflightProcesses)
	for p := range children {
		id := fmt.Sprintf("survivor%d-%s", p, randomHex(4))
		if p == 0 {
			id = victimID
		}
		children[p] = startChild(cctx, t, "inflight", inflightSpec{Addrs: addrs, Cluster: cluster, Name: name, ClientID: id,
			Start: start.UnixMicro(), Stop: stop.UnixMicro()})
	}

	// The sampler lists the live holds until the children are done.
	var samples []inflightSample
	sampled := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-done:
				return
			default:
			}
			from := time.Now()
			list, err := l.Holders(ctx)
			if err != nil {
				t.Errorf("sampler: %v", err)
				return
			}
			s := inflightSample{from: from, to: time.Now(), held: len(list)}
			for _, h := range list {
				if strings.HasPrefix(h.ID, victimID+":") {
					s.victim++
				}
			}
			samples = append(samples, s)
		}
	}()

	// Kill the victim while it holds: two holds or more, so that it still
	// holds one by the time SIGKILL lands (it holds one at almost every
	// moment).
	time.Sleep(time.Until(kill))
	for deadline := time.Now().Add(time.Second); ; {
		if len(victimHolds(t, l, victimID)) >= 2 || time.Now().After(deadline) {
			break
		}
	}
	children[0].kill(t)
	// A call the victim sent before it died (a release, an acquire) may
	// still run after it: a server on a loaded machine (miniredis, in this
	// process) reads it late. Its holds are what two listings 50ms apart
	// agree on; their TTLs are as of a moment between killed and listed.
	var killed, listed time.Time
	var leaked map[string]time.Duration
	for i, before := 0, map[string]time.Duration(nil); ; i, before = i+1, leaked {
		killed = time.Now()
		leaked = victimHolds(t, l, victimID)
		listed = time.Now()
		if i > 0 && slices.Equal(slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(leaked))) {
			break
		}
		require.Less(t, i, 20, "the dead victim's holds keep changing")
		time.Sleep(50 * time.Millisecond)
	}
	require.NotEmpty(t, leaked, "the victim held when it was killed")
	first, last := inflightTTL, time.Duration(0)
	for _, ttl := range leaked {
		first, last = min(first, ttl), max(last, ttl)
	}
	counted := killed.Add(first - 50*time.Millisecond) // until then, every one still counts
	// Still counted until their TTL passes: no one reclaims them early. A
	// hold listed with ttl left after killed lasts in Redis at least until
	// killed + ttl; a listing answered before then must show it (one that a
	// starved CPU answered later proves nothing of it).
	time.Sleep(time.Until(counted))
	still := victimHolds(t, l, victimID)
	answered := time.Now()
	for id, ttl := range leaked {
		if answered.Before(killed.Add(ttl - 2*time.Millisecond)) {
			assert.Contains(t, still, id, "a dead holder's hold counts until its TTL passes")
		} else {
			t.Logf("%s: listed %v after the kill, past its TTL of %v: not checked", id, answered.Sub(killed), ttl)
		}
	}
	// ...and gone from Redis once it has: swept by the survivors' acquires.
	reclaimed := listed.Add(last + 50*time.Millisecond)
	time.Sleep(time.Until(reclaimed))
	for id := range leaked {
		require.Eventually(t, func() bool { return rdb.ZScore(ctx, l.keys[1].(string), id).Err() == redis.Nil }, time.Second, time.Millisecond,
			"%s swept from Redis", id)
	}

	var report inflightReport
	for p, c := range children[1:] {
		var child inflightReport
		require.NoError(t, c.report(&child), "child %d", p+1)
		report.Holds = append(report.Holds, child.Holds...)
		report.Errors = append(report.Errors, child.Errors...)
	}
	close(done)
	<-sampled
	assert.Empty(t, report.Errors, "no errors, no hold lost")

	most, mostAfter, mostAfterKill := 0, 0, 0
	for _, s := range samples {
		most = max(most, s.held)
		if s.from.After(killed) && s.to.Before(counted) {
			mostAfterKill = max(mostAfterKill, s.held-s.victim)
		}
		if s.from.After(reclaimed) && s.to.Before(stop.Add(-100*time.Millisecond)) {
			mostAfter = max(mostAfter, s.held)
			assert.Zero(t, s.victim, "no hold of the dead process after its TTL")
		}
	}
	overlap := mostOverlapping(report.Holds)
	t.Logf("%d holds by the survivors, at most %d at once; %d samples, at most %d held; the victim's %d leaked holds (%v to %v left) counted until their TTL, then gone; survivors held at most %d while they counted, %d after",
		len(report.Holds), overlap, len(samples), most, len(leaked), first, last, mostAfterKill, mostAfter)
	assert.LessOrEqual(t, overlap, inflightLimit, "the survivors' holds never overlapped beyond the limit")
	assert.Equal(t, inflightLimit, most, "never more than the limit, and demand reached it")
	assert.LessOrEqual(t, mostAfterKill, inflightLimit-len(leaked), "the dead holds kept their slots")
	assert.Equal(t, inflightLimit, mostAfter, "their slots came back")

	assert.Empty(t, victimHolds(t, l, victimID))
	assert.Empty(t, holders(t, l), "nothing held at the end: 0 leaked")
}

// victimHolds lists the live holds of the process whose client ID is id, or nil.
func victimHolds(t *testing.T, l *InFlight, id string) map[string]time.Duration {
	var m map[string]time.Duration
	for hid, ttl := range holders(t, l) {
		if strings.HasPrefix(hid, id+":") {
			if m == nil {
				m = map[string]time.Duration{}
			}
			m[hid] = ttl
		}
	}
	return m
}

// mostOverlapping returns the most intervals [from, to) that overlap at any moment.
func mostOverlapping(intervals [][2]int64) int {
	type edge struct {
		at    int64
		delta int
	}
	edges := make([]edge, 0, 2*len(intervals))
	for _, iv := range intervals {
		edges = append(edges, edge{iv[0], 1}, edge{iv[1], -1})
	}
	// Ends before starts at one instant: [a, b) and [b, c) do not overlap.
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
	most, n := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// The ACL of docs/operations.md is enough for every in-flight operation:
// the script calls only commands the rate limiters' call too
// (TestLeastPrivilegeACL checks that it lists exactly those of every
// script, this one's included).
func TestInFlightLeastPrivilegeACL(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	args := []any{"ACL", "SETUSER", "svc-limiter", "reset"}
	for _, r := range readmeACL(t) {
		args = append(args, strings.ReplaceAll(r, "PASSWORD", "pw"))
	}
	require.NoError(t, srv.Client(t).Do(ctx, args...).Err())
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "svc-limiter", Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	l := New(rdb, WithPrefix("svc:")).InFlight("acl")
	l.refreshEvery = -1
	cfg := InFlightConfig{Limit: 1, TTL: time.Minute}
	require.NoError(t, l.SetLimit(ctx, cfg))
	_, err := l.TrySetLimit(ctx, cfg)
	require.NoError(t, err)
	_, err = l.Config(ctx)
	require.NoError(t, err)
	h, err := l.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, h.Refresh(ctx))
	full, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	require.Nil(t, full)
	_, err = l.Holders(ctx)
	require.NoError(t, err)
	require.NoError(t, h.Release(ctx))
	_, err = l.Delete(ctx)
	require.NoError(t, err)
	tryHold(t, l.WithDefault(cfg))
}
