package redlimit

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/wire"
)

// Validate before writing: a script computes its whole decision and checks
// every value it will store before its first write, as Redis does not roll
// a script back when it raises. A request a state cannot hold exactly is
// ErrInvalidPermits, never ErrUnavailable, and leaves every key as it was;
// the limiter decides as before afterwards.

// A funnel's charge of a debt its TAT cannot hold (more than 2^52 µs ahead
// of now) is refused: on PerHour(7), 2^25 permits are 548 years; on
// PerSecond(10), 2^40 are 3,484 years. Before, the TAT passed 2^53 (or
// overflowed), the charge answered ErrUnexpectedReply or a negative
// ResetAfter, and every later call was ErrCorruptState; without a stored
// config the flat state's expiry made Redis refuse the SET, and the charge
// was ErrUnavailable, which WithFailOpen grants.
func TestChargePastWhatTheStateHolds(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		for _, c := range []struct {
			what    string
			cfg     Config
			stored  bool
			permits int64
		}{
			{"7 an hour, default", PerHour(7), false, 1 << 25},
			{"7 an hour, stored", PerHour(7), true, 1 << 25},
			{"10 a second, default", PerSecond(10), false, 1 << 40},
			{"10 a second, stored", PerSecond(10), true, 1 << 40},
			{"several rates: the hour's", PerSecond(10).And(PerHour(100)), false, 1 << 35},
			{"PerClient", Config{Type: PerClient, Rate: 7, Interval: time.Hour}, true, 1 << 25},
		} {
			t.Run(c.what, func(t *testing.T) {
				name := uniqueName(t)
				clk := newClock()
				l := newClient(rdb, clk, WithFailOpen()).Funnel(name).WithDefault(c.cfg)
				if c.stored {
					require.NoError(t, l.SetRate(ctx, c.cfg))
				}
				ok, err := l.TryAcquire(ctx, 1)
				require.NoError(t, err)
				require.True(t, ok)
				before := snapshot(t, rdb, name)
				_, err = l.Charge(ctx, c.permits)
				require.ErrorIs(t, err, ErrInvalidPermits)
				assert.NotErrorIs(t, err, ErrUnavailable, "bad input, not an outage: WithFailOpen must not grant it")
				assert.Equal(t, before, snapshot(t, rdb, name), "nothing written")
				r, err := l.Allow(ctx, 1)
				require.NoError(t, err, "the limiter decides as before")
				assert.True(t, r.Allowed)
				require.NoError(t, l.SetRate(ctx, c.cfg))
				clk.Add(100 * 365 * 24 * time.Hour)
				_, err = l.Allow(ctx, 1)
				require.NoError(t, err, "at any later time")
			})
		}
	})
}

// A charge up to the bound is a debt held exactly: on PerHour(7), 8 million
// permits are 130 years of draining, and the limiter says so to the µs.
func TestChargeUpToTheBound(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		l := newClient(rdb, clk).Funnel(uniqueName(t)).WithDefault(PerHour(7))
		const permits = 8_000_000
		r, err := l.Charge(ctx, permits)
		require.NoError(t, err)
		assert.True(t, r.Allowed)
		// Allow(1) fits when the TAT (8,000,000 intervals of 3,600 s / 7)
		// is within the burst, less the request, of now: after 7,999,994
		// intervals, rounded up to the µs.
		wait := time.Duration((7_999_994*3_600_000_000+6)/7) * time.Microsecond
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.Equal(t, wait, r.RetryAfter)
		clk.Add(wait - time.Microsecond)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "a µs before")
		clk.Add(time.Microsecond)
		r, err = l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "the debt drained")
	})
}

// Charges and reservations above what doubles hold exactly (2^53) are
// refused before they reach Redis; a sliding window's count and a token
// bucket's value are bounded as a funnel's TAT is.
func TestChargeBoundsEveryState(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		for _, a := range []algo{funnelAlgo, slidingWindowAlgo, tokenBucketAlgo} {
			l := a.new(newClient(rdb, newClock()), uniqueName(t)).WithDefault(Per(10, time.Hour))
			_, err := l.Charge(ctx, math.MaxInt64)
			assert.ErrorIs(t, err, ErrInvalidPermits, a.name)
			_, err = l.Reserve(ctx, math.MaxInt64)
			assert.ErrorIs(t, err, ErrInvalidPermits, a.name)
		}
		name := uniqueName(t)
		l := newClient(rdb, newClock()).SlidingWindow(name).WithDefault(Per(10, time.Hour))
		_, err := l.Charge(ctx, maxPermits)
		require.NoError(t, err, "2^53 - 1: the most a count holds")
		before := snapshot(t, rdb, name)
		_, err = l.Charge(ctx, 1)
		assert.ErrorIs(t, err, ErrInvalidPermits, "2^53")
		assert.Equal(t, before, snapshot(t, rdb, name), "nothing written")

		name = uniqueName(t)
		tb := newClient(rdb, newClock()).TokenBucket(name).WithDefault(Per(10, time.Hour))
		_, err = tb.Charge(ctx, 1)
		require.NoError(t, err)
		require.NoError(t, rdb.Set(ctx, tb.keys[1], -(1<<53)+5, redis.KeepTTL).Err())
		before = snapshot(t, rdb, name)
		_, err = tb.Charge(ctx, 10)
		assert.ErrorIs(t, err, ErrInvalidPermits, "a value below -2^53")
		assert.Equal(t, before, snapshot(t, rdb, name), "nothing written")
	})
}

// Every check that can refuse a request comes before the first write: a
// further rate's corrupt state, a calendar window the clocks disagree on,
// a request log or client registry of another type, each refused with
// every key as it was.
func TestRefusalsWriteNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		for _, c := range []struct {
			what  string
			make  func(c *Client, name string) *Limiter
			cfg   Config
			opts  []Option
			spoil func(l *Limiter)
			do    func(l *Limiter) error
			want  error
		}{
			{"a further rate's state corrupt", (*Client).Funnel, PerSecond(10).And(PerHour(100)), nil,
				func(l *Limiter) { rdb.HSet(ctx, l.Name(), "tat2", "x") },
				func(l *Limiter) error { _, err := l.Allow(ctx, 1); return err }, ErrCorruptState},
			{"a further rate's sliding state corrupt", (*Client).SlidingWindow, PerSecond(10).And(PerHour(100)), nil,
				func(l *Limiter) { rdb.HSet(ctx, l.Name(), "counts2", "1:x") },
				func(l *Limiter) error { _, err := l.Allow(ctx, 1); return err }, ErrCorruptState},
			{"the request log of another type", (*Client).FixedWindow, PerSecond(10), []Option{WithRetryWindow(time.Minute)},
				func(l *Limiter) { rdb.Set(ctx, wire.KeyOf(l.Name(), wire.SuffixRequests), "x", 0) },
				func(l *Limiter) error { _, err := l.Allow(ctx, 1); return err }, ErrCorruptState},
			{"a reservation's log of another type", (*Client).SlidingWindow, PerSecond(10), nil,
				func(l *Limiter) { rdb.Set(ctx, wire.KeyOf(l.Name(), wire.SuffixRequests), "x", 0) },
				func(l *Limiter) error { _, err := l.Reserve(ctx, 1); return err }, ErrCorruptState},
			{"the client registry of another type", (*Client).Funnel, Config{Type: PerClient, Rate: 10, Interval: time.Second}, nil,
				func(l *Limiter) { rdb.Set(ctx, wire.KeyOf(l.Name(), wire.SuffixClients), "x", 0) },
				func(l *Limiter) error { _, err := l.Allow(ctx, 1); return err }, ErrCorruptState},
			{"a token bucket's registry of another type", (*Client).TokenBucket, Config{Type: PerClient, Rate: 10, Interval: time.Second}, nil,
				func(l *Limiter) { rdb.Set(ctx, wire.KeyOf(l.Name(), wire.SuffixClients), "x", 0) },
				func(l *Limiter) error { _, err := l.Allow(ctx, 1); return err }, ErrCorruptState},
			{"a token bucket's further log corrupt", (*Client).TokenBucket, PerSecond(10).And(PerHour(100)), nil,
				func(l *Limiter) {
					rdb.ZAdd(ctx, wire.KeyOf(l.Name(), "grants"), redis.Z{Score: float64(epoch.UnixMilli() + 1), Member: "x"})
				},
				func(l *Limiter) error { _, err := l.Allow(ctx, 1); return err }, ErrCorruptState},
		} {
			t.Run(c.what, func(t *testing.T) {
				name := uniqueName(t)
				l := c.make(newClient(rdb, newClock(), c.opts...), name).WithDefault(c.cfg)
				require.NoError(t, l.SetRate(ctx, c.cfg))
				ok, err := l.TryAcquire(ctx, 1)
				require.NoError(t, err)
				require.True(t, ok)
				c.spoil(l)
				before := snapshot(t, rdb, name)
				assert.ErrorIs(t, c.do(l), c.want)
				assert.Equal(t, before, snapshot(t, rdb, name), "nothing written")
			})
		}
	})
}
