package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A charge past the limit is a debt that the next requests wait out exactly:
// on 10 per 10 s, 5 taken at 0 s and 20 charged at 5 s leave 15 owed; the
// 5 come back at 10 s (still 10 owed) and the 20 at 15 s, so a request at
// 5 s waits exactly 10 s, is denied until then, and is granted then.
func TestChargeIsADebt(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, make := range []func(c *Client, name string) *Limiter{(*Client).TokenBucket, (*Client).SlidingWindow} {
			ctx := context.Background()
			clk := newClock()
			l := make(newClient(rdb, clk), uniqueName(t)).WithDefault(tenPer10s)
			t.Run(l.alg.Name, func(t *testing.T) {
				ok, err := l.TryAcquire(ctx, 5)
				require.NoError(t, err)
				require.True(t, ok)
				clk.Add(5 * time.Second)
				r, err := l.Charge(ctx, 20)
				require.NoError(t, err)
				assert.True(t, r.Allowed, "a charge is always taken")
				assert.Equal(t, int64(0), r.Remaining, "in debt")
				r, err = l.Allow(ctx, 1)
				require.NoError(t, err)
				assert.False(t, r.Allowed)
				assert.Equal(t, 10*time.Second, r.RetryAfter, "the debt drains as the charge's permits come back, at 15 s")
				assert.Equal(t, int64(0), r.Remaining)
				clk.Add(5 * time.Second)
				r, err = l.Allow(ctx, 1)
				require.NoError(t, err)
				assert.False(t, r.Allowed, "at 10 s the first 5 are back, and 10 still owed")
				assert.Equal(t, 5*time.Second, r.RetryAfter)
				clk.Add(5*time.Second - time.Millisecond)
				ok, err = l.TryAcquire(ctx, 1)
				require.NoError(t, err)
				assert.False(t, ok, "1 ms before the debt has drained")
				clk.Add(time.Millisecond)
				r, err = l.Allow(ctx, 1)
				require.NoError(t, err)
				assert.True(t, r.Allowed, "the debt has drained")
				assert.Equal(t, int64(9), r.Remaining)

				// A reservation after a debt gives back as after any grant: 6
				// reserved, 6 given back, and the limit is as it was.
				res, err := l.Reserve(ctx, 6)
				require.NoError(t, err)
				require.True(t, res.Allowed)
				back, err := res.Release(ctx, 6)
				require.NoError(t, err)
				assert.Equal(t, int64(6), back)
				n, err := l.AvailablePermits(ctx)
				require.NoError(t, err)
				assert.Equal(t, int64(9), n)
			})
		}
	})
}

// A funnel's debt drains at its rate, to the µs: on 10 per 10 s (burst 10),
// 5 taken at 0 s have drained at 5 s, when 20 are charged: the funnel is
// then 10 s past full, and a request for 1 waits 11 s.
func TestChargeFunnelDebt(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		name := uniqueName(t)
		l := newClient(rdb, clk).Funnel(name).WithDefault(tenPer10s)
		ok, err := l.TryAcquire(ctx, 5)
		require.NoError(t, err)
		require.True(t, ok)
		clk.Add(5 * time.Second)
		r, err := l.Charge(ctx, 20)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 10, ResetAfter: 20 * time.Second, Window: 10 * time.Second}, r, "20 s until empty, nothing left")
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, Result{Limit: 10, RetryAfter: 11 * time.Second, ResetAfter: 20 * time.Second, Window: 10 * time.Second}, r)
		clk.Add(11*time.Second - time.Millisecond)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.Equal(t, time.Millisecond, r.RetryAfter, "the debt is not forgiven at a full funnel")
		clk.Add(time.Millisecond)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 10, ResetAfter: 10 * time.Second, Window: 10 * time.Second}, r, "drained: granted, full again")

		// A reservation released after a debt: at 30 s the funnel is
		// empty; 6 reserved and given back leave it empty again.
		clk.Set(epoch.Add(30 * time.Second))
		res, err := l.Reserve(ctx, 6)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		back, err := res.Release(ctx, 6)
		require.NoError(t, err)
		assert.Equal(t, int64(6), back)
		n, err := l.AvailablePermits(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(10), n)
	})
}

// Charge is offered where a debt is exact (not by a fixed window), and refuses bad input, leaving
// the state as it was.
func TestChargeRefuses(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		name := uniqueName(t)
		l := a.new(newClient(rdb, newClock()), name).WithDefault(tenPer10s)
		ok, err := l.TryAcquire(ctx, 3)
		require.NoError(t, err)
		require.True(t, ok)
		before := snapshot(t, rdb, name)
		_, err = l.Charge(ctx, 20)
		if !l.alg.Charges {
			assert.ErrorIs(t, err, ErrUnsupported, "a %s cannot hold a debt exactly", a.name)
			assert.Equal(t, before, snapshot(t, rdb, name), "nothing written")
			return
		}
		require.NoError(t, err)
		before = snapshot(t, rdb, name)
		_, err = l.Charge(ctx, -1)
		assert.ErrorIs(t, err, ErrInvalidPermits)
		if l.alg.Records {
			_, err = l.Charge(ctx, maxLogRate+1)
			assert.ErrorIs(t, err, ErrInvalidPermits, "a record holds 4 bytes")
		}
		assert.Equal(t, before, snapshot(t, rdb, name), "nothing written")
	})
	assert.Equal(t, []bool{true, true, false, true}, []bool{wire.TokenBucket.Charges, wire.Funnel.Charges, wire.FixedWindow.Charges, wire.SlidingWindow.Charges})
}
