package redlimit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/wire"
)

// reserve reserves permits on l and checks they were all taken.
func reserve(t *testing.T, l *Limiter, permits int64, opts ...ReserveOption) Reservation {
	t.Helper()
	res, err := l.Reserve(context.Background(), permits, opts...)
	require.NoError(t, err)
	require.Equal(t, permits, res.Taken)
	return res
}

// settled settles res with actual (finally or not) and checks what it did.
func settled(t *testing.T, res Reservation, actual int64, final bool, want SettleResult, msgAndArgs ...any) {
	t.Helper()
	settle := res.SettlePartial
	if final {
		settle = res.Settle
	}
	got, err := settle(context.Background(), actual)
	require.NoError(t, err)
	assert.Equal(t, want, got, msgAndArgs...)
}

// A settle below the estimate gives back the difference, once: 8 reserved
// of 10, settled at 3, leave 7; the same settle again, a copy's, or a
// Release, give back nothing more.
func TestSettleBelowEstimateRefunds(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		l := a.limiter(t, rdb).WithDefault(tenPer10s)
		res := reserve(t, l, 8)
		settled(t, res, 3, true, SettleResult{Refunded: 5, Held: 3})
		assertAvailable(t, l, 7)
		copied := res
		settled(t, copied, 3, true, SettleResult{Held: 3}, "settled once")
		settled(t, res, 0, true, SettleResult{Held: 3})
		back, err := res.Release(ctx, 3)
		require.NoError(t, err)
		assert.Zero(t, back)
		assertAvailable(t, l, 7)
	})
}

// A settle above the estimate charges the difference where the grant
// counts: on 10 per 10 s, 4 reserved at 0 s and settled at 16 at 2 s. The
// funnel's TAT moves 12 s, to 16 s: a request for 1 waits until 7 s, and
// the funnel is empty at 16 s. The token bucket's record of the grant, at
// 0 s, and the sliding window's sub-window, [0 s, 1 s), hold 16: 6 owed
// until they leave at 10 s, when the limit is whole again. The fixed
// window holds no debt: it charges the 6 its window has room for.
func TestSettleAboveEstimateCharges(t *testing.T) {
	for _, tc := range []struct {
		a             algo
		charged, held int64
		retry, full   time.Duration
	}{
		{funnelAlgo, 12, 16, 5 * time.Second, 16 * time.Second},
		{tokenBucketAlgo, 12, 16, 8 * time.Second, 10 * time.Second},
		{slidingWindowAlgo, 12, 16, 8 * time.Second, 10 * time.Second},
		{fixedWindowAlgo, 6, 10, 8 * time.Second, 10 * time.Second},
	} {
		t.Run(tc.a.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
				ctx := context.Background()
				clk := newClock()
				l := tc.a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(tenPer10s)
				res := reserve(t, l, 4)
				clk.Add(2 * time.Second)
				settled(t, res, 16, true, SettleResult{Charged: tc.charged, Uncharged: 12 - tc.charged, Held: tc.held})
				r, err := l.Allow(ctx, 1)
				require.NoError(t, err)
				assert.False(t, r.Allowed)
				assert.Equal(t, tc.retry, r.RetryAfter)
				clk.Set(epoch.Add(2*time.Second + tc.retry - time.Millisecond))
				assertAvailable(t, l, 0, "1 ms before the debt has drained")
				clk.Set(epoch.Add(tc.full - time.Millisecond))
				n, err := l.AvailablePermits(ctx)
				require.NoError(t, err)
				assert.Less(t, n, int64(10))
				clk.Set(epoch.Add(tc.full))
				assertAvailable(t, l, 10, "every permit back")
			})
		})
	}
}

// A cost known once the grant's own window, sub-window, record or place in
// the funnel has ended is counted as a grant made then would be: in the
// current one. It is never forgiven for coming late; a late refund gives
// nothing back.
func TestSettleAfterItsWindow(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		t.Run("funnel", func(t *testing.T) {
			// 4 reserved at 0 s have drained at 4 s; at 6 s 3 more move
			// the TAT from 6 s to 9 s.
			clk := newClock()
			l := funnelAlgo.new(newClient(rdb, clk), uniqueName(t)).WithDefault(tenPer10s)
			res := reserve(t, l, 4)
			clk.Set(epoch.Add(6 * time.Second))
			settled(t, res, 7, true, SettleResult{Charged: 3, Held: 7})
			assertAvailable(t, l, 7)
			clk.Set(epoch.Add(9*time.Second - time.Millisecond))
			assertAvailable(t, l, 9)
			clk.Set(epoch.Add(9 * time.Second))
			assertAvailable(t, l, 10)
		})
		for _, a := range []algo{tokenBucketAlgo, slidingWindowAlgo} {
			t.Run(a.name, func(t *testing.T) {
				// 4 reserved at 0 s left at 10 s; at 11 s 3 more count from
				// 11 s, and leave at 21 s. (Without SettleWithin the
				// reservations could be settled only while they count.)
				clk := newClock()
				l := a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(tenPer10s)
				res := reserve(t, l, 4, SettleWithin(time.Minute))
				other := reserve(t, l, 2, SettleWithin(time.Minute))
				clk.Set(epoch.Add(11 * time.Second))
				settled(t, res, 7, true, SettleResult{Charged: 3, Held: 7})
				settled(t, other, 0, true, SettleResult{Held: 2}, "its grant no longer counts")
				assertAvailable(t, l, 7)
				clk.Set(epoch.Add(21*time.Second - time.Millisecond))
				assertAvailable(t, l, 7)
				clk.Set(epoch.Add(21 * time.Second))
				assertAvailable(t, l, 10)
			})
		}
		t.Run("fixed_window", func(t *testing.T) {
			// 4 and 3 reserved at 8 s in [0 s, 10 s); at 12 s, 5 more count
			// in [10 s, 20 s), and the 3 are not given back: their window
			// ended.
			clk := newClock()
			l := fixedWindowAlgo.new(newClient(rdb, clk), uniqueName(t)).WithDefault(tenPer10s)
			clk.Set(epoch.Add(8 * time.Second))
			res := reserve(t, l, 4)
			other := reserve(t, l, 3)
			clk.Set(epoch.Add(12 * time.Second))
			settled(t, res, 9, true, SettleResult{Charged: 5, Held: 9})
			back, err := other.Release(ctx, 3)
			require.NoError(t, err)
			assert.Zero(t, back)
			assertAvailable(t, l, 5)
			clk.Set(epoch.Add(20 * time.Second))
			assertAvailable(t, l, 10)
		})
	})
}

// Partial settles follow the running cost up, charging each step's
// difference once, and ask Redis only when the cost passes what the
// reservation holds: on 100 per 10 s, 10 reserved; 5 so far (within the
// estimate: no call), 15 (5 charged), 12 (an older report: nothing), 25
// (10 charged), then 30 to close (5 charged): 30 counted, 70 left. A
// settle after the close changes nothing.
func TestSettlePartialSumsExactly(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		log := &commandLog{}
		l := a.new(newClient(recorded(t, rdb, log), newClock()), uniqueName(t)).WithDefault(Per(100, 10*time.Second))
		res := reserve(t, l, 10)
		calls := func() int { log.mu.Lock(); defer log.mu.Unlock(); return log.counts["requests "+a.name] }
		before := calls()
		settled(t, res, 5, false, SettleResult{Held: 10})
		settled(t, res, 15, false, SettleResult{Charged: 5, Held: 15})
		settled(t, res, 12, false, SettleResult{Held: 15}, "an older report")
		settled(t, res, 25, false, SettleResult{Charged: 10, Held: 25})
		settled(t, res, 30, true, SettleResult{Charged: 5, Held: 30})
		assert.Equal(t, 3, calls()-before, "one request for each settle past what the reservation held")
		assertAvailable(t, l, 70)
		settled(t, res, 40, true, SettleResult{Uncharged: 10, Held: 30}, "closed")
		settled(t, res, 50, false, SettleResult{Uncharged: 20, Held: 30}, "closed")
		assertAvailable(t, l, 70)

		// Within the estimate, the close gives back what the last report
		// left unused; a close below a report is refused, with nothing
		// changed.
		res = reserve(t, l, 10)
		settled(t, res, 4, false, SettleResult{Held: 10})
		settled(t, res, 6, true, SettleResult{Refunded: 4, Held: 6})
		assertAvailable(t, l, 64)
		res = reserve(t, l, 10)
		settled(t, res, 7, false, SettleResult{Held: 10})
		got, err := res.Settle(context.Background(), 5)
		assert.ErrorIs(t, err, ErrInvalidPermits)
		assert.Equal(t, SettleResult{Held: 10}, got)
		assertAvailable(t, l, 54)
		back, err := res.Release(context.Background(), 10)
		require.NoError(t, err)
		assert.Equal(t, int64(3), back, "the 7 reported stay")
		assertAvailable(t, l, 57)
	})
}

// A reservation not settled within SettleWithin's time is a charge of what
// it holds: on 10 per 10 s, reservations of 3, 2, 1 and 2 made at 0 s with
// 5 s to settle. At 4.999 s the last gives back its 2; at 5 s a settle
// below, a settle above and a release change nothing in Redis and give
// back or charge nothing.
func TestSettleWithinLapses(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		l := a.new(newClient(rdb, clk), name).WithDefault(tenPer10s)
		within := SettleWithin(5 * time.Second)
		below, above, released, last := reserve(t, l, 3, within), reserve(t, l, 2, within), reserve(t, l, 1, within), reserve(t, l, 2, within)
		clk.Set(epoch.Add(5*time.Second - time.Millisecond))
		settled(t, last, 0, true, SettleResult{Refunded: 2})
		clk.Set(epoch.Add(5 * time.Second))
		before := snapshot(t, rdb, name)
		settled(t, below, 0, true, SettleResult{Held: 3})
		settled(t, above, 9, false, SettleResult{Uncharged: 7, Held: 2})
		back, err := released.Release(ctx, 1)
		require.NoError(t, err)
		assert.Zero(t, back)
		assert.Equal(t, before, snapshot(t, rdb, name), "nothing written")
		want := int64(4) // the 6 still count
		if a.name == funnelAlgo.name {
			want = 9 // the 6 drain until 6 s
		}
		assertAvailable(t, l, want)
	})
}

// MaxDebt caps what a settle above the reservation charges: on 10 per 10 s,
// 10 reserved with a cap of 3 and settled at 20 charge 3 (7 uncharged), so
// the next request waits for 13 permits to drain: the funnel's 4 s (13 s
// of TAT, 9 of them within its burst), the others' 10 s (the grant's
// record or sub-window leaves). A limiter owing more than the cap already
// takes less: 5 reserved with a cap of 9, then 12 charged by another, owe 7
// permits (at 0.5 s the funnel owes 6.5 s, 7 permits rounded up); a settle
// of 8 charges 2 of its 3.
func TestSettleMaxDebt(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		l := a.new(newClient(rdb, clk), name).WithDefault(tenPer10s)
		if !l.alg.Charges {
			before := snapshot(t, rdb, name)
			_, err := l.Reserve(ctx, 1, MaxDebt(3))
			assert.ErrorIs(t, err, ErrUnsupported, "a fixed window holds no debt")
			assert.Equal(t, before, snapshot(t, rdb, name), "nothing written")
			res := reserve(t, l, 6, MaxDebt(0))
			settled(t, res, 20, true, SettleResult{Charged: 4, Uncharged: 10, Held: 10})
			return
		}
		res := reserve(t, l, 10, MaxDebt(3))
		settled(t, res, 20, true, SettleResult{Charged: 3, Uncharged: 7, Held: 13})
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		wait := 10 * time.Second
		if a.name == funnelAlgo.name {
			wait = 4 * time.Second
		}
		assert.Equal(t, wait, r.RetryAfter)

		l = a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(tenPer10s)
		res = reserve(t, l, 5, MaxDebt(9))
		_, err = l.Charge(ctx, 12)
		require.NoError(t, err)
		clk.Add(500 * time.Millisecond)
		settled(t, res, 8, true, SettleResult{Charged: 2, Uncharged: 1, Held: 7})
	})
}

// A settle after whatever forgot the request log (Reset, SetRate with new
// rates) changes nothing: the state its grant was counted in is gone.
func TestSettleAfterResetOrNewRates(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		l := a.new(newClient(rdb, newClock()), name)
		require.NoError(t, l.SetRate(ctx, tenPer10s))
		first, second := reserve(t, l, 4), reserve(t, l, 4)
		require.NoError(t, l.Reset(ctx))
		before := snapshot(t, rdb, name)
		settled(t, first, 10, true, SettleResult{Uncharged: 6, Held: 4})
		settled(t, second, 8, false, SettleResult{Uncharged: 4, Held: 4})
		assert.Equal(t, before, snapshot(t, rdb, name), "nothing written after Reset")

		third := reserve(t, l, 4)
		require.NoError(t, l.SetRate(ctx, Per(20, 10*time.Second)))
		before = snapshot(t, rdb, name)
		settled(t, third, 0, true, SettleResult{Held: 4})
		assert.Equal(t, before, snapshot(t, rdb, name), "nothing written after new rates")
		want := int64(16)
		if a.name == funnelAlgo.name {
			want = 12 // its 4 s of TAT are 8 permits at the new rate
		}
		assertAvailable(t, l, want)
	})
}

// Bad input is an error, with nothing written.
func TestSettleRefusesBadInput(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		l := a.new(newClient(rdb, newClock()), name).WithDefault(tenPer10s)
		res := reserve(t, l, 4)
		before := snapshot(t, rdb, name)
		for _, tc := range []struct {
			what string
			call func() error
			want error
		}{
			{"Settle -1", func() error { _, err := res.Settle(ctx, -1); return err }, ErrInvalidPermits},
			{"SettlePartial -1", func() error { _, err := res.SettlePartial(ctx, -1); return err }, ErrInvalidPermits},
			{"Settle 2^53", func() error { _, err := res.Settle(ctx, maxPermits+1); return err }, ErrInvalidPermits},
			{"Release -1", func() error { _, err := res.Release(ctx, -1); return err }, ErrInvalidPermits},
			{"MaxDebt -1", func() error { _, err := l.Reserve(ctx, 1, MaxDebt(-1)); return err }, ErrInvalidPermits},
			{"SettleWithin 0", func() error { _, err := l.Reserve(ctx, 1, SettleWithin(0)); return err }, ErrInvalidConfig},
			{"SettleWithin -1s", func() error { _, err := l.Reserve(ctx, 1, SettleWithin(-time.Second)); return err }, ErrInvalidConfig},
			{"SettleWithin 200 years", func() error {
				_, err := l.Reserve(ctx, 1, SettleWithin(200*365*24*time.Hour))
				return err
			}, ErrInvalidConfig},
		} {
			assert.ErrorIs(t, tc.call(), tc.want, tc.what)
		}
		if l.alg.Records {
			_, err := res.Settle(ctx, maxLogRate+1)
			assert.ErrorIs(t, err, ErrInvalidPermits, "a record holds 4 bytes")
		}
		if l.alg.Own == wire.FieldBurst {
			// A debt past what the state holds exactly (a TAT 2^52 µs
			// ahead): refused by the script, before it writes.
			_, err := res.Settle(ctx, maxPermits)
			assert.ErrorIs(t, err, ErrInvalidPermits)
		}
		assert.Equal(t, before, snapshot(t, rdb, name), "nothing written")
		settled(t, res, 6, true, SettleResult{Charged: 2, Held: 6}, "the reservation is whole")
	})
}

// Settles of one reservation from many goroutines, and copies of it,
// count once: ten goroutines report running costs of 11 to 20 on 10
// reserved, then each closes at 20: 10 charged in all; on another
// reservation ten closes at 2 of 10 give back 8 in all.
func TestSettleConcurrently(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		l := a.limiter(t, rdb).WithDefault(Per(100, 10*time.Second))
		res := reserve(t, l, 10)
		var mu sync.Mutex
		var sum SettleResult
		var wg sync.WaitGroup
		for i := range int64(10) {
			wg.Go(func() {
				copied := res
				got, err := copied.SettlePartial(ctx, 11+i)
				assert.NoError(t, err)
				got2, err := copied.Settle(ctx, 20)
				assert.NoError(t, err)
				mu.Lock()
				sum.Charged += got.Charged + got2.Charged
				sum.Refunded += got.Refunded + got2.Refunded
				mu.Unlock()
			})
		}
		wg.Wait()
		assert.Equal(t, SettleResult{Charged: 10}, sum)
		assertAvailable(t, l, 80)

		res = reserve(t, l, 10)
		sum = SettleResult{}
		for range 10 {
			wg.Go(func() {
				got, err := res.Settle(ctx, 2)
				assert.NoError(t, err)
				mu.Lock()
				sum.Refunded += got.Refunded
				mu.Unlock()
			})
		}
		wg.Wait()
		assert.Equal(t, SettleResult{Refunded: 8}, sum)
		assertAvailable(t, l, 78)
	})
}

// A settle re-sent, as go-redis re-sends a script whose reply it did not
// read, counts once: its entry in the request log has moved on, and the
// run sent again says so. With every script run twice, a reservation of 4
// settled at 6, 9 then 12 (partly, then finally) counts 12, and each step
// reports its own; one settled at 1 gives back 3 (a release sent again
// reports nothing: its first run's reply is the one lost).
func TestSettleResentCountsOnce(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		twice := recorded(t, rdb, &commandLog{twice: true})
		name := uniqueName(t)
		l := a.new(newClient(twice, newClock(), WithRetryWindow(time.Minute)), name).WithDefault(Per(100, 10*time.Second))
		res := reserve(t, l, 4)
		want := func(charged, held int64) SettleResult {
			if !l.alg.Charges {
				// Its window's room may have capped what the first run
				// counted: how much is not known, and not reported.
				return SettleResult{Held: 4}
			}
			return SettleResult{Charged: charged, Held: held}
		}
		settled(t, res, 6, false, want(2, 6))
		settled(t, res, 9, false, want(3, 9))
		settled(t, res, 12, true, want(3, 12))
		assertAvailable(t, l, 88)
		res = reserve(t, l, 4)
		_, err := res.Settle(context.Background(), 1)
		require.NoError(t, err)
		assertAvailable(t, l, 87)
	})
}

// loseReply runs the first settle it sees, then reports its reply lost, as
// a read timeout would.
type loseReply struct {
	passHook
	mu   sync.Mutex
	lost int
}

func (h *loseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if r := requestsOf(cmd.Args()); err == nil && len(r) == 1 && r[0].op == string(wire.OpSettle) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.lost == 0 {
				h.lost++
				return errors.New("i/o timeout")
			}
		}
		return err
	}
}

// A settle whose reply is lost after Redis counted it is sent again before
// the next settle, and counts once: 4 reserved, 9 so far (counted, reply
// lost), then 10 to close: 6 charged in all, and reported. With MaxDebt,
// what the lost settle counted is not known, and not reported.
func TestSettleReplyLost(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, tc := range []struct {
			opts []ReserveOption
			want SettleResult
		}{
			{nil, SettleResult{Charged: 6, Held: 10}},
			{[]ReserveOption{MaxDebt(1000)}, SettleResult{Charged: 1, Held: 5}},
		} {
			c := cloneClient(t, rdb)
			hook := &loseReply{}
			c.AddHook(hook)
			l := newClient(c, newClock()).TokenBucket(uniqueName(t)).WithDefault(Per(100, 10*time.Second))
			res := reserve(t, l, 4, tc.opts...)
			_, err := res.SettlePartial(context.Background(), 9)
			require.ErrorIs(t, err, ErrUnavailable)
			require.Equal(t, 1, hook.lost)
			assertAvailable(t, l, 91, "counted, though its reply was lost")
			settled(t, res, 10, true, tc.want)
			assertAvailable(t, l, 90)
		}
	})
}

// With several rates, a settle charges each where its grant counts there,
// and MaxDebt caps it by the rate with the least room. On 10 per 10 s and
// 12 a minute, 4 reserved at 0 s and settled at 16 at 2 s charge 12 (a
// fixed window 6: its first rate's room): the minute's rate owes 4 until
// the grant leaves it at 60 s (the funnel: until its TAT of 80 s is within
// its burst's 60 s, one permit at 25 s). With a cap of 2, 4 reserved and
// settled at 20 at 10 s (when the first rate's grant has left it) charge
// 10, the room of the minute's rate (8 free, 2 owed); the funnel's rates
// both have 12 (4 s of its second's 20 s of TAT have drained).
func TestSettleSeveralRates(t *testing.T) {
	cfg := tenPer10s.And(Per(12, time.Minute))
	for _, tc := range []struct {
		a               algo
		charged, capped int64
		at20, whole     int64         // available at 20 s, and at freeAt
		freeAt          time.Duration // when the second rate's debt is paid
	}{
		{tokenBucketAlgo, 12, 10, 0, 10, 60 * time.Second},
		{slidingWindowAlgo, 12, 10, 0, 10, 60 * time.Second},
		{funnelAlgo, 12, 12, 0, 1, 25 * time.Second},
		{fixedWindowAlgo, 6, 0, 2, 10, 60 * time.Second},
	} {
		t.Run(tc.a.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
				clk := newClock()
				l := tc.a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(cfg)
				res := reserve(t, l, 4)
				clk.Set(epoch.Add(2 * time.Second))
				settled(t, res, 16, true, SettleResult{Charged: tc.charged, Uncharged: 12 - tc.charged, Held: 4 + tc.charged})
				clk.Set(epoch.Add(20 * time.Second))
				assertAvailable(t, l, tc.at20)
				clk.Set(epoch.Add(tc.freeAt - time.Millisecond))
				assertAvailable(t, l, tc.at20)
				clk.Set(epoch.Add(tc.freeAt))
				assertAvailable(t, l, tc.whole)
				if tc.capped == 0 {
					return // a fixed window takes no cap
				}

				clk.Set(epoch)
				l = tc.a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(cfg)
				res = reserve(t, l, 4, MaxDebt(2))
				clk.Set(epoch.Add(10 * time.Second))
				settled(t, res, 20, true, SettleResult{Charged: tc.capped, Uncharged: 16 - tc.capped, Held: 4 + tc.capped})
			})
		})
	}
}

// A PerClient limiter settles in the reservation's client's state only.
func TestSettlePerClient(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		cfg := tenPer10s
		cfg.Type = PerClient
		name := uniqueName(t)
		l := a.new(newClient(rdb, newClock(), WithClientID("a")), name).WithDefault(cfg)
		res := reserve(t, l, 4)
		settled(t, res, 6, true, SettleResult{Charged: 2, Held: 6})
		assertAvailable(t, l, 4)
		assertAvailable(t, l.AsClient("b"), 10)
		other := reserve(t, l, 3)
		settled(t, other, 1, true, SettleResult{Refunded: 2, Held: 1})
		assertAvailable(t, l, 3)
		clients, err := l.Clients(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"a"}, clients)
		deleted, err := l.Delete(ctx)
		require.NoError(t, err)
		assert.True(t, deleted)
		assert.Empty(t, limiterKeys(t, rdb, name), "the registry reached every key")
	})
}

// A request logged for less time (WithRetryWindow's second) leaves a
// reservation's longer time to settle in the log: the log's expiry is
// never lowered.
func TestSettleWithinKeepsTheLog(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		l := newClient(rdb, newClock(), WithRetryWindow(time.Second)).FixedWindow(uniqueName(t)).WithDefault(tenPer10s)
		reserve(t, l, 1, SettleWithin(10*time.Minute))
		ok, err := l.TryAcquire(ctx, 1)
		require.NoError(t, err)
		require.True(t, ok)
		ttl, err := rdb.PTTL(ctx, l.keys[l.alg.Requests()-1]).Result()
		require.NoError(t, err)
		assert.Greater(t, ttl, 9*time.Minute)
	})
}
