package redlimit

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/inflight"
	"github.com/redlimit/redlimit/internal/redistest"
)

// A Hold's lease, on a controlled clock whose timers fire at exact instants:
// a holder cut off from Redis gives its hold up on its own clock, before
// Redis can hand the slot on, whether or not a refresh hangs.

// timerClock is a controlled clock with timers, for InFlight.afterFunc: Add
// moves it on, firing each timer that falls due on the way at its own
// instant, in order. A timer's func runs on a goroutine of its own, and Add
// waits until it returns, or parks: blocks in a call the test holds (parked
// receives then), so that a hung refresh does not hang the test.
type timerClock struct {
	*clock
	parked <-chan struct{} // nil: wait for every func to return

	mu      sync.Mutex
	timers  []*clockTimer
	set     int // timers ever set, to fire those due at one instant in order
	running sync.WaitGroup
}

type clockTimer struct {
	at  time.Time
	seq int
	f   func()
}

func newTimerClock() *timerClock { return &timerClock{clock: newClock()} }

// AfterFunc is InFlight.afterFunc on this clock.
func (c *timerClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &clockTimer{at: c.Now().Add(d), seq: c.set, f: f}
	c.set++
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.timers, t)
		if i >= 0 {
			c.timers = slices.Delete(c.timers, i, i+1)
		}
		return i >= 0
	}
}

// Add moves the clock on by d, firing the timers due on the way.
func (c *timerClock) Add(d time.Duration) { c.To(c.Now().Add(d)) }

// To moves the clock on to end, firing the timers due on the way.
func (c *timerClock) To(end time.Time) {
	for {
		t := c.next(end)
		if t == nil {
			break
		}
		if t.at.After(c.Now()) {
			c.clock.Set(t.at)
		}
		done := make(chan struct{})
		c.running.Go(func() {
			defer close(done)
			t.f()
		})
		select {
		case <-done:
		case <-c.parked:
		}
	}
	c.clock.Set(end)
}

// next takes out the earliest timer due by end, or returns nil.
func (c *timerClock) next(end time.Time) *clockTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := -1
	for j, t := range c.timers {
		if !t.at.After(end) && (i < 0 || t.at.Before(c.timers[i].at) || t.at.Equal(c.timers[i].at) && t.seq < c.timers[i].seq) {
			i = j
		}
	}
	if i < 0 {
		return nil
	}
	t := c.timers[i]
	c.timers = slices.Delete(c.timers, i, i+1)
	return t
}

// Settle waits until every func a timer started has returned (a parked one
// once the test lets its call go).
func (c *timerClock) Settle() { c.running.Wait() }

// timedInFlight returns a handle on the in-flight limit name, through rdb, on
// tc: its holds refresh themselves (every TTL/3) and keep their lease on
// tc's timers. A zero cfg gives no default.
func timedInFlight(rdb redis.UniversalClient, tc *timerClock, name string, cfg InFlightConfig) *InFlight {
	c := newClient(rdb, tc.clock)
	c.sleep = func(ctx context.Context, d time.Duration) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		tc.Add(d)
		return nil
	}
	l := c.InFlight(name)
	if cfg.Limit != 0 {
		l = l.WithDefault(cfg)
	}
	l.afterFunc = tc.AfterFunc
	return l
}

// hangingRefreshes is a go-redis hook that, once armed, holds every refresh
// of a hold (an EVALSHA of the in-flight script's refresh op) until the test
// lets it go (let): before it reaches Redis, or, with ran, after Redis ran
// it, its reply held. Let nil lets it through; an error fails it. As a hung
// connection does with go-redis's defaults, a held call ignores its
// context, unless ctxEnds. Calls still held when the test ends fail. Every
// other command passes through.
type hangingRefreshes struct {
	passHook
	ran, ctxEnds bool
	armed        atomic.Bool
	held         chan struct{} // one send per call it holds
	let          chan error
	ended        chan struct{} // closed when the test ends
	waiting      atomic.Int64  // calls held now
}

func newHangingRefreshes(t *testing.T, ran bool) *hangingRefreshes {
	h := &hangingRefreshes{ran: ran, held: make(chan struct{}, 16), let: make(chan error), ended: make(chan struct{})}
	t.Cleanup(func() { close(h.ended) })
	return h
}

// letGo ends one held call with err (nil: it goes through).
func (h *hangingRefreshes) letGo(t *testing.T, err error) {
	t.Helper()
	select {
	case h.let <- err:
	case <-time.After(10 * time.Second):
		t.Fatal("no refresh held")
	}
}

func (h *hangingRefreshes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		// evalsha sha numkeys keys... op now hold config
		n, _ := args[min(2, len(args)-1)].(int)
		if cmd.Name() != "evalsha" || !h.armed.Load() || len(args) <= 3+n || args[3+n] != inflight.OpRefresh {
			return next(ctx, cmd)
		}
		var err error
		if h.ran {
			err = next(ctx, cmd)
		}
		h.waiting.Add(1)
		defer h.waiting.Add(-1)
		h.held <- struct{}{}
		var ctxDone <-chan struct{}
		if h.ctxEnds {
			ctxDone = ctx.Done()
		}
		select {
		case <-h.ended:
			cmd.SetErr(errHung)
			return errHung
		case e := <-h.let:
			switch {
			case e != nil:
				cmd.SetErr(e)
				return e
			case !h.ran:
				return next(ctx, cmd)
			}
			return err
		case <-ctxDone:
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
	}
}

// errHung is a network failure for hangingRefreshes to end a held call with.
var errHung = errors.New("i/o timeout (the test's)")

// believes reports whether h's holder believes it holds: neither Err nor
// Lost says otherwise.
func believes(h *Hold) bool {
	select {
	case <-h.Lost():
		return false
	default:
		return h.Err() == nil
	}
}

// Two holders of an in-flight limit of 1, with docs/inflight.md's TTL of
// 30s: the first is cut off from Redis (its refreshes hang), the second
// waits for the slot. Holder 1 renewed at 10s (a refresh that succeeded), so Redis
// keeps its hold until 40s; its lease ends at 10s + 30s − (30s/10 + 2ms) =
// 36.998s. Stepping the clock every 250ms and at each instant that counts:
// holder 1 believes it holds until 36.998s and never after, though its
// refresh of 20s still hangs; holder 2 is refused until 40s and granted at
// 40s; at no instant do both believe they hold.
//
// When the hung refresh had run in Redis (its reply late: Redis keeps the
// hold until 50s), the reply that comes after 36.998s does not bring the
// hold back, and the slot it kept is given back at 40s, when it would have
// come back had that refresh never reached Redis.
func TestInFlightLeaseTwoHolders(t *testing.T) {
	const ttl = 30 * time.Second
	at := func(d time.Duration) time.Time { return epoch.Add(d) }
	giveUp := at(10*time.Second + ttl - (ttl/10 + 2*time.Millisecond)) // 36.998s
	expiry := at(10*time.Second + ttl)                                 // 40s
	for _, ran := range []bool{false, true} {
		t.Run(map[bool]string{false: "never reached Redis", true: "ran, its reply late"}[ran], func(t *testing.T) {
			eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
				ctx := context.Background()
				tc := newTimerClock()
				hang := newHangingRefreshes(t, ran)
				tc.parked = hang.held
				name := uniqueName(t)
				cfg := InFlightConfig{Limit: 1, TTL: ttl}
				hooked := cloneClient(t, rdb)
				hooked.AddHook(hang)
				first := timedInFlight(hooked, tc, name, cfg)
				second := timedInFlight(rdb, tc, name, cfg)

				h1 := tryHold(t, first)
				tc.Add(10 * time.Second) // the first refresh gets through
				assert.Equal(t, map[string]time.Duration{h1.ID(): ttl}, holders(t, second))
				hang.armed.Store(true)
				tc.Add(10 * time.Second) // 20s: the second hangs
				require.Equal(t, int64(1), hang.waiting.Load(), "the refresh of 20s hangs")
				redisKeeps := expiry
				if ran {
					redisKeeps = at(20*time.Second + ttl)
				}

				instants := []time.Time{giveUp.Add(-time.Millisecond), giveUp, expiry.Add(-time.Millisecond), expiry}
				for d := 20 * time.Second; d <= 41*time.Second; d += 250 * time.Millisecond {
					instants = append(instants, at(d))
				}
				slices.SortFunc(instants, func(a, b time.Time) int { return a.Compare(b) })
				instants = slices.Compact(instants)
				var h2 *Hold
				var lostWith error
				for _, now := range instants {
					if ran && now.After(giveUp) && lostWith == nil {
						// The late reply: it succeeds, after holder 1 gave up.
						require.False(t, believes(h1), "%v: holder 1 gave up at 36.998s", now.Sub(epoch))
						lostWith = h1.Err()
						hang.letGo(t, nil)
						tc.Settle()
						assert.Equal(t, lostWith, h1.Err(), "a late refresh does not bring the hold back")
						assert.False(t, believes(h1))
					}
					tc.To(now)
					step := now.Sub(epoch)
					b1 := believes(h1)
					assert.Equal(t, now.Before(giveUp), b1, "%v: holder 1 believes it holds until 36.998s and never after", step)
					if h2 == nil {
						var wait time.Duration
						var err error
						h2, wait, err = second.try(ctx, second.newHoldID())
						require.NoError(t, err)
						if h2 == nil {
							assert.Equal(t, redisKeeps.Sub(now), wait, "%v: refused until holder 1's hold expires", step)
						}
					}
					assert.Equal(t, !now.Before(expiry), h2 != nil, "%v: holder 2 is granted at 40s, not before", step)
					require.False(t, b1 && h2 != nil && believes(h2), "%v: both believe they hold", step)
				}
				require.NotNil(t, h2)
				assert.ErrorIs(t, h1.Err(), ErrHoldLost)
				t.Logf("holder 1: %v", h1.Err())
				if !ran {
					hang.letGo(t, errHung) // the hung refresh fails at last
				}
				tc.Settle()
				assert.ErrorIs(t, h1.Release(ctx), ErrHoldLost)
				assert.True(t, believes(h2), "holder 2 keeps the slot")
				assert.Equal(t, []string{h2.ID()}, keysOf(holders(t, second)))
				require.NoError(t, h2.Release(ctx))
			})
		})
	}
}

// The lease on the real clock, Redis deciding on its own TIME: a holder
// whose refreshes hang (600ms TTL, each refresh held until its context
// ends) has Lost closed by its own timer, not before its lease ends, and
// reports the hold lost (Err) by the time a second holder has been granted
// its slot. Asserted as an order of events, which a starved CPU cannot
// reverse: holder 2's grant comes after Redis's expiry of holder 1's hold,
// itself after holder 1's lease ran out.
func TestInFlightLeaseRealClock(t *testing.T) {
	const ttl = 600 * time.Millisecond
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, connect func() redis.UniversalClient) {
		ctx := context.Background()
		name := uniqueName(t)
		cfg := InFlightConfig{Limit: 1, TTL: ttl}
		hooked := connect()
		hang := newHangingRefreshes(t, false)
		hang.ctxEnds = true // each refresh fails at its deadline, and the next is sent
		hang.armed.Store(true)
		hooked.AddHook(hang)
		done := make(chan struct{})
		t.Cleanup(func() { close(done) })
		go func() { // the hook's signals: no one waits for them here
			for {
				select {
				case <-hang.held:
				case <-done:
					return
				}
			}
		}()
		first := New(hooked).InFlight(name).WithDefault(cfg)
		second := New(connect()).InFlight(name).WithDefault(cfg)

		sent := time.Now()
		h1 := tryHold(t, first)
		lost := h1.Lost() // the channel, taken now: closed by the timer, not by a look
		var h2 *Hold
		for deadline := time.Now().Add(10 * time.Second); h2 == nil; time.Sleep(5 * time.Millisecond) {
			var err error
			h2, err = second.TryAcquire(ctx)
			require.NoError(t, err)
			require.False(t, time.Now().After(deadline), "holder 2 never granted")
		}
		assert.ErrorIs(t, h1.Err(), ErrHoldLost, "holder 1 knows by the time holder 2 holds")
		select {
		case <-lost:
		case <-time.After(5 * time.Second):
			t.Fatal("Lost not closed")
		}
		assert.GreaterOrEqual(t, time.Since(sent), ttl-ttl/10-2*time.Millisecond, "not before its lease ran out")
		t.Logf("holder 1: %v", h1.Err())
		require.NoError(t, h2.Release(ctx))
	})
}

// A new TTL (SetLimit) applies from each hold's next refresh, and a
// refresh never brings a hold's expiry in Redis forward. Here 30s, then 60s
// from the refresh of 10s (Redis keeps the hold until 70s, the lease runs to
// 10s + 60s − 6.002s = 63.998s), then 6s from the refresh of 30s: the hold
// refreshes every 2s from then on, Redis keeps it until 70s all the same,
// and so the lease still ends at 63.998s when the refreshes hang from 32s.
// A second holder is granted at 70s.
func TestInFlightLeaseFollowsTTLChanges(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		tc := newTimerClock()
		hang := newHangingRefreshes(t, false)
		tc.parked = hang.held
		hooked := cloneClient(t, rdb)
		hooked.AddHook(hang)
		name := uniqueName(t)
		l := timedInFlight(hooked, tc, name, InFlightConfig{})
		other := timedInFlight(rdb, tc, name, InFlightConfig{})
		require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: 1, TTL: 30 * time.Second}))
		h := tryHold(t, l) // Redis keeps it until 30s, the lease runs to 26.998s
		require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: 1, TTL: time.Minute}))
		tc.Add(10 * time.Second)
		assert.Equal(t, time.Minute, holders(t, l)[h.ID()], "a longer TTL from the next refresh")
		require.NoError(t, l.SetLimit(ctx, InFlightConfig{Limit: 1, TTL: 6 * time.Second}))
		tc.Add(20 * time.Second) // 30s, the next refresh (every 20s, a third of 60s)
		assert.Equal(t, 40*time.Second, holders(t, l)[h.ID()], "a refresh never brings an expiry forward")
		tc.Add(time.Second)
		assert.Equal(t, 39*time.Second, holders(t, l)[h.ID()], "no refresh at 31s")
		hang.armed.Store(true)
		tc.Add(time.Second) // 32s: a refresh, 2s after the last, hangs
		require.Equal(t, int64(1), hang.waiting.Load(), "refreshed every 2s, a third of 6s")

		tc.To(epoch.Add(63997 * time.Millisecond))
		assert.True(t, believes(h))
		tc.To(epoch.Add(63998 * time.Millisecond))
		assert.False(t, believes(h), "lost at 10s + 60s − (6s + 2ms)")
		assert.Equal(t, 6002*time.Millisecond, holders(t, l)[h.ID()], "Redis keeps it until 70s")
		denied(t, other, 6002*time.Millisecond)
		tc.To(epoch.Add(70 * time.Second))
		tryHold(t, other)
		hang.letGo(t, errHung)
		tc.Settle()
	})
}

// Refreshes that fail (Redis gone) lose the hold when its lease ends, on the
// Client's clock: 30s − (3s + 2ms) after the last renewal, and not a moment
// before; the error says why.
func TestInFlightRefreshFailuresLoseTheHold(t *testing.T) {
	mr := redistest.Miniredis(t)
	flaky := redis.NewClient(&redis.Options{Addr: mr.Options().Addr, MaxRetries: -1})
	t.Cleanup(func() { flaky.Close() })
	tc := newTimerClock()
	l := timedInFlight(flaky, tc, uniqueName(t), InFlightConfig{Limit: 1, TTL: 30 * time.Second})
	h := tryHold(t, l)
	flaky.Close() // every refresh fails from now on
	tc.Add(10 * time.Second)
	tc.Add(10 * time.Second)
	tc.To(epoch.Add(26997 * time.Millisecond))
	assert.NoError(t, h.Err(), "two refreshes failed, the lease runs on")
	tc.To(epoch.Add(26998 * time.Millisecond))
	select {
	case <-h.Lost():
		assert.ErrorIs(t, h.Err(), ErrHoldLost)
		assert.True(t, errors.Is(h.Err(), redis.ErrClosed), "it says why: %v", h.Err())
	default:
		t.Fatal("Lost not closed when the lease ran out")
	}
}

// A hold dropped by Reset or Delete says so, on its refresh and on its
// release, and one that expired in Redis before its lease ran out (Redis's
// clock ahead of the holder's) says that: neither is taken for the other.
func TestInFlightDroppedHoldSaysSo(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, c := range []struct {
			name string
			drop func(l *InFlight, h *Hold)
			want string
		}{
			{"reset", func(l *InFlight, _ *Hold) { _, err := l.Reset(ctx); require.NoError(t, err) }, "dropped by Reset or Delete"},
			{"delete", func(l *InFlight, _ *Hold) { _, err := l.Delete(ctx); require.NoError(t, err) }, "dropped by Reset or Delete"},
			{"expired in Redis", func(l *InFlight, h *Hold) {
				raw := rdb
				if p, ok := rdb.(prefixed); ok {
					raw = p.UniversalClient
				}
				past := float64(l.client.now().UnixMilli() - 1)
				require.NoError(t, raw.ZAdd(ctx, l.keys[1].(string), redis.Z{Score: past, Member: h.ID()}).Err())
			}, "had expired in Redis"},
		} {
			for _, op := range []string{"refresh", "release"} {
				t.Run(c.name+"/"+op, func(t *testing.T) {
					l := steadyInFlight(t, rdb, newClock(), InFlightConfig{Limit: 2, TTL: time.Hour})
					h := tryHold(t, l)
					c.drop(l, h)
					var err error
					if op == "refresh" {
						err = h.Refresh(ctx)
					} else {
						err = h.Release(ctx)
					}
					assert.ErrorIs(t, err, ErrHoldLost)
					assert.ErrorContains(t, err, c.want)
					assert.Equal(t, err, h.Err())
					t.Log(err)
				})
			}
		}
	})
}
