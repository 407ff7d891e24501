package redlimit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/wire"
)

// Hostile tests of leased handles (lease.go), from a review that tried to
// break what the bound at the top of lease.go, and docs/leases.md,
// promise: each comment tells the failure the test found (all fixed since),
// and the test asserts the promise.

// A fixed window with several rates: a block taken at 0.9 s must not be
// used past the first rate's window end at 1 s, or the second [1 s, 2 s)
// grants more than its 10. The reply's ResetAfter is the latest of the
// rates' (the minute's), so the block's end is taken from the wrong window.
func TestLeaseAttackSeveralRatesBlockCrossesWindow(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		cfg := PerSecond(10).And(PerMinute(1000))
		l := newClient(rdb, clk).FixedWindow(name).WithDefault(cfg).WithLease(Lease{Time: time.Second, Share: 1})
		other := newClient(rdb, clk).FixedWindow(name).WithDefault(cfg)
		clk.Add(900 * time.Millisecond)
		for range 2 {
			require.True(t, allow(t, l, 1).Allowed)
		}
		require.Equal(t, int64(10), l.LeaseStats().Taken, "1, then the 9 that fit of the second")
		clk.Add(100 * time.Millisecond) // 1 s: the second's next window
		ok, err := other.TryAcquire(ctx, 10)
		require.NoError(t, err)
		require.True(t, ok, "the new second's 10")
		r := allow(t, l, 1)
		assert.False(t, r.Allowed, "the second [1 s, 2 s) granted 10 already; reason %v", r.Reason)
	})
}

// A refund after SetRate turned the limiter PerClient gives back into the
// client's own new state permits that were counted in the Overall state:
// the client is then granted more than its limit in one window.
func TestLeaseAttackRefundAfterPerClientSwitch(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		admin, l := blockOut(t, rdb, clk, name, WithClientID("a"))
		clk.Add(time.Millisecond) // the switch comes after the take, on any clock
		require.NoError(t, admin.SetRate(ctx, Config{Rate: 10, Interval: time.Second, Type: PerClient}))
		a := newClient(rdb, clk, WithClientID("a")).FixedWindow(name)
		ok, err := a.TryAcquire(ctx, 10)
		require.NoError(t, err)
		require.True(t, ok, "client a's 10 in its own new state")
		require.NoError(t, l.Close(ctx)) // gives back the block's 49, counted Overall
		assert.Equal(t, int64(0), l.LeaseStats().Returned, "none of the 49 was counted in client a's state")
		ok, err = a.TryAcquire(ctx, 1)
		require.NoError(t, err)
		assert.False(t, ok, "client a was granted its 10 in this window already")
	})
}

// A refund after Reset or Delete gives back permits they forgot already,
// taking them from grants made since: after the Reset the limiter then
// grants more than its limit (a refund, however late, should free only
// what is still counted of its own grant). The token bucket gives nothing
// back, and holds.
func TestLeaseAttackRefundAfterReset(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		for _, forget := range []string{"reset", "delete"} {
			t.Run(forget, func(t *testing.T) {
				ctx := context.Background()
				clk := newClock()
				name := uniqueName(t)
				l := a.new(newClient(rdb, clk), name).WithDefault(a.counting(100)).WithLease(Lease{Time: time.Second, Share: 0.5})
				other := a.new(newClient(rdb, clk), name).WithDefault(a.counting(100))
				for range 2 {
					require.True(t, allow(t, l, 1).Allowed)
				}
				require.Equal(t, int64(51), l.LeaseStats().Taken, "1, then a block of 50")
				clk.Add(time.Millisecond) // forgotten after the take, on any clock
				if forget == "reset" {
					require.NoError(t, other.Reset(ctx))
				} else {
					_, err := other.Delete(ctx)
					require.NoError(t, err)
				}
				ok, err := other.TryAcquire(ctx, 3)
				require.NoError(t, err)
				require.True(t, ok)
				require.NoError(t, l.Close(ctx))
				assert.Equal(t, int64(0), l.LeaseStats().Returned, "%s forgot the block's 49 already", forget)
				assert.Equal(t, int64(97), available(t, other), "the 3 granted since count")
			})
		}
	})
}

// A leased handle's local denial outlived its own Reset, SetRate and
// Release: it kept denying, without asking Redis, for the whole RetryAfter
// Redis gave (here an hour), though its lease time is a second.
// WithLocalCache drops its denials on this Client's Reset, SetRate and
// Release; docs/leases.md says SetRate reaches a leased handle within Time.
func TestLeaseAttackDenialOutlivesOwnChanges(t *testing.T) {
	for _, change := range []string{"reset", "setrate", "release"} {
		t.Run(change, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
				ctx := context.Background()
				clk := newClock()
				l := newClient(rdb, clk).FixedWindow(uniqueName(t)).WithDefault(Per(10, time.Hour)).WithLease(Lease{Time: time.Second})
				res, err := l.Reserve(ctx, 5) // decided in Redis, as every reservation
				require.NoError(t, err)
				require.True(t, res.Allowed)
				for range 5 {
					require.True(t, allow(t, l, 1).Allowed)
				}
				r := allow(t, l, 1)
				require.False(t, r.Allowed)
				require.Equal(t, time.Hour, r.RetryAfter, "the window's end")
				switch change {
				case "reset":
					require.NoError(t, l.Reset(ctx))
				case "setrate":
					require.NoError(t, l.SetRate(ctx, Per(100, time.Hour)))
				case "release":
					back, err := res.Release(ctx, 5)
					require.NoError(t, err)
					require.Equal(t, int64(5), back)
				}
				clk.Add(2 * time.Second) // past the lease time too
				r = allow(t, l, 1)
				assert.True(t, r.Allowed, "after %s; reason %v, retry %v", change, r.Reason, r.RetryAfter)
			})
		})
	}
}

// After SetRate lowers the limit, the next take is sized by the old
// limit's share (the handle knows no other yet): it took the whole new
// limit, 10, where the cap is 5 of 10, so one instance held it all. A
// block above the cap of the limits Redis answered with goes back at once,
// the caller's permit aside.
func TestLeaseAttackBlockCapAfterLowerRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		admin := newClient(rdb, clk).FixedWindow(name)
		require.NoError(t, admin.SetRate(ctx, PerSecond(1000)))
		l := newClient(rdb, clk).FixedWindow(name).WithLease(Lease{Time: 100 * time.Millisecond, Share: 0.5})
		for range 201 {
			require.True(t, allow(t, l, 1).Allowed)
		}
		require.Equal(t, int64(201), l.LeaseStats().Taken, "1, then a block of 200, all used")
		require.NoError(t, admin.SetRate(ctx, PerSecond(10)))
		clk.Add(time.Second) // the next window
		require.True(t, allow(t, l, 1).Allowed)
		assert.Equal(t, LeaseStats{Calls: 4, Taken: 211, Used: 202, Returned: 9}, l.LeaseStats(), "10 taken, 9 given back")
		assert.Equal(t, int64(9), available(t, admin), "all but the caller's 1")
		require.True(t, allow(t, l, 1).Allowed)
		assert.Equal(t, int64(216), l.LeaseStats().Taken, "then a block within the cap: 5")
		assert.Equal(t, int64(4), available(t, admin))
	})
}

// A refund after SetRate added a rate gives back, in the new rate's state,
// permits that were never counted there (the block was taken before it
// existed), taking them from others' grants: the minute then grants more
// than its 120.
func TestLeaseAttackRefundIntoAddedRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		admin, l := blockOut(t, rdb, clk, uniqueName(t))
		clk.Add(time.Millisecond) // the rate is added after the take, on any clock
		require.NoError(t, admin.SetRate(ctx, PerSecond(100).And(PerMinute(120))))
		ok, err := admin.TryAcquire(ctx, 40)
		require.NoError(t, err)
		require.True(t, ok, "the second has 49 left, the new minute 120")
		require.NoError(t, l.Close(ctx))
		clk.Add(time.Second)
		ok, err = admin.TryAcquire(ctx, 70)
		require.NoError(t, err)
		require.True(t, ok)
		// The minute counted 40, then 70: 10 left (the second, 30).
		assert.Equal(t, int64(10), available(t, admin))
	})
}

// holdTake is a go-redis hook that, while hold is set, holds each lease
// take (the script's op lease) until release: with ran, after Redis ran
// it (its caller may have left by then), else before sending it.
type holdTake struct {
	passHook
	hold    atomic.Bool
	ran     bool
	arrived chan struct{}
	release chan struct{}
}

func newHoldTake(ran bool) *holdTake {
	return &holdTake{ran: ran, arrived: make(chan struct{}, 1), release: make(chan struct{})}
}

func (h *holdTake) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if r := requestsOf(args); !h.hold.Load() || len(r) != 1 || r[0].op != string(wire.OpReserve) {
			return next(ctx, cmd)
		}
		h.arrived <- struct{}{}
		if !h.ran {
			<-h.release
			return next(ctx, cmd)
		}
		err := next(ctx, cmd)
		<-h.release
		return err
	}
}

// useFirstBlocks has l, on a fixed window of 100 a second with Share 0.5,
// take 1 and then a block of 50, and use them all: 51 counted, none held.
func useFirstBlocks(t *testing.T, l *Limiter) {
	t.Helper()
	for range 51 {
		require.True(t, allow(t, l, 1).Allowed)
	}
	require.Equal(t, LeaseStats{Calls: 2, Taken: 51, Used: 51}, l.LeaseStats())
}

// A caller whose context ends while its take is in flight, after Redis
// counted the take: the block (49, the caller's 1 and 48 more) is counted
// in Redis and held by no one, lost to every instance until the window
// ends (here 1 s, though the lease time is 100 ms). A caller that wanted 1
// permit loses up to a block's cap; under deadlines, when Redis is slow,
// many do.
func TestLeaseAttackCancelledTakeLosesBlock(t *testing.T) {
	clk := newClock()
	srv := redistest.Miniredis(t)
	rdb := redis.NewClient(srv.Options())
	defer rdb.Close()
	h := newHoldTake(true)
	rdb.AddHook(h)
	name := "x"
	l := newClient(rdb, clk).FixedWindow(name).WithDefault(PerSecond(100)).WithLease(Lease{Time: 100 * time.Millisecond, Share: 0.5})
	useFirstBlocks(t, l)

	h.hold.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.Allow(ctx, 1)
		done <- err
	}()
	<-h.arrived
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		close(h.release)
		t.Fatal("the caller did not leave when its context ended")
	}
	h.hold.Store(false)
	close(h.release) // the take, counted in Redis, returns after its caller left

	require.NoError(t, l.Close(context.Background()))
	other := newClient(rdb, clk).FixedWindow(name).WithDefault(PerSecond(100))
	assert.Equal(t, int64(49), available(t, other), "the 51 used count; the 49 taken for a caller that left do not")
}

// Close while a take is in flight returns before that take's block exists,
// and the block goes back later, from a goroutine: a service that closes
// its Client on shutdown and exits loses it. Close should wait for the
// take and give back its block.
func TestLeaseAttackCloseDuringTake(t *testing.T) {
	clk := newClock()
	srv := redistest.Miniredis(t)
	rdb := redis.NewClient(srv.Options())
	defer rdb.Close()
	h := newHoldTake(false)
	rdb.AddHook(h)
	l := newClient(rdb, clk).FixedWindow("x").WithDefault(PerSecond(100)).WithLease(Lease{Time: time.Second, Share: 0.5})
	useFirstBlocks(t, l)

	h.hold.Store(true)
	allowed := make(chan Result, 1)
	go func() {
		r, err := l.Allow(context.Background(), 1)
		assert.NoError(t, err)
		allowed <- r
	}()
	<-h.arrived
	returned := make(chan int64, 1)
	go func() {
		assert.NoError(t, l.Close(context.Background()))
		returned <- l.LeaseStats().Returned
	}()
	select {
	case <-returned:
		// Close returned with the take still held: what it saw is checked below.
		close(h.release)
		assert.Fail(t, "Close returned before the take in flight ended")
	case <-time.After(time.Second):
		close(h.release)
		assert.Equal(t, int64(48), <-returned, "the take's 49 less the caller's 1, given back before Close returned")
	}
	assert.True(t, (<-allowed).Allowed)
}

// On the real clock, callers race each other, the blocks' timers, each
// handle's Close (twice) and the Client's: no window grants more than its
// limit (1,000, below demand), and once all is closed every permit not
// granted is back, none twice (10,000, above demand, so that blocks are
// held when the handles close; a double refund would show as more
// available than that).
func TestLeaseAttackRaceCloseAndAllow(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, limit := range []int64{1000, 10_000} {
			ctx := context.Background()
			c := New(rdb)
			if p, ok := rdb.(prefixed); ok {
				c = New(rdb, WithPrefix(p.prefix))
			}
			name := uniqueName(t)
			cfg := Per(limit, 24*time.Hour)
			handles := []*Limiter{
				c.FixedWindow(name).WithDefault(cfg).WithLease(Lease{Time: 5 * time.Millisecond}),
				c.FixedWindow(name).WithDefault(cfg).WithLease(Lease{Time: 20 * time.Millisecond, Share: 0.3}),
			}
			var granted atomic.Int64
			wait := hammer(ctx, 8, func(g, n int) bool {
				if n == 150 && g < 2 {
					assert.NoError(t, handles[g].Close(ctx))
				}
				r, err := handles[g%2].Allow(ctx, 1+int64(n%3))
				assert.NoError(t, err)
				if r.Allowed {
					granted.Add(1 + int64(n%3))
				}
				return n == 300
			})
			wait()
			assert.NoError(t, c.Close(ctx))
			assert.NoError(t, handles[0].Close(ctx))
			t.Logf("limit %d: granted %d; %+v, %+v", limit, granted.Load(), handles[0].LeaseStats(), handles[1].LeaseStats())
			assert.LessOrEqual(t, granted.Load(), limit)
			assert.Eventually(t, func() bool { return available(t, handles[0]) == limit-granted.Load() }, 5*time.Second, 10*time.Millisecond,
				"limit %d, granted %d", limit, granted.Load())
		}
	})
}

// A funnel's refund takes back only what has not drained of its grant,
// but reckons the grant as draining from its own time, while the funnel
// queues it after the permits before it: a block of 5 taken at 0 behind 5
// others' drains from 0.5 s to 1 s, so at 0.3 s nothing of it has drained
// and its 4 unused should all come back. Only 2 do: the other 2 are lost
// until 0.8 s, past the lease time (under-admission, not over).
func TestLeaseAttackFunnelRefundBehindOthers(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		l := newClient(rdb, clk).Funnel(name).WithDefault(PerSecond(10))
		ok, err := l.TryAcquire(ctx, 5)
		require.NoError(t, err)
		require.True(t, ok)
		b := leaseOf(t, l, 5, 1)
		require.Equal(t, int64(5), b.Size)
		clk.Add(300 * time.Millisecond)
		r, _, err := l.ask(ctx, request{op: opRelease, permits: 4, id: b.ID, grantAt: b.At, grantSize: 5})
		require.NoError(t, err)
		assert.Equal(t, int64(4), r.Remaining, "none of the block's 5 has drained")
		assert.Equal(t, int64(7), available(t, l), "as if the block were 1: 3 pending at 0.3 s")
	})
}

// blockOut stores PerSecond(100) on the fixed window name, and has a
// handle of a Client made with opts lease from it (Time 1 s, Share 0.5): a
// take of 1, then a block of 50, 49 of it held. It returns the limiter as
// the admin sees it, and the leased handle.
func blockOut(t *testing.T, rdb redis.UniversalClient, clk *clock, name string, opts ...Option) (admin, l *Limiter) {
	t.Helper()
	admin = newClient(rdb, clk).FixedWindow(name)
	require.NoError(t, admin.SetRate(context.Background(), PerSecond(100)))
	l = newClient(rdb, clk, opts...).FixedWindow(name).WithLease(Lease{Time: time.Second, Share: 0.5})
	for range 2 {
		require.True(t, allow(t, l, 1).Allowed)
	}
	require.Equal(t, int64(51), l.LeaseStats().Taken, "1, then a block of 50 (half of 100)")
	return admin, l
}
