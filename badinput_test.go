package redlimit

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every bad input gets its sentinel error and leaves the limiter's stored
// state byte for byte as it was.
func TestBadInputTable(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		setRate := func(cfg Config) func(*Limiter) error {
			return func(l *Limiter) error { return l.SetRate(ctx, cfg) }
		}
		// Each corrupt case breaks a healthy limiter in one way first.
		type breaker func(l *Limiter)
		hset := func(fields ...any) breaker {
			return func(l *Limiter) {
				if a.namesItself {
					fields = append(fields, "algorithm", a.name)
				}
				rdb.Del(ctx, l.Name())
				rdb.HSet(ctx, l.Name(), fields...)
			}
		}
		state := func(value string) breaker {
			return func(l *Limiter) { a.setState(rdb, l, value) }
		}
		// A client's own state key of the wrong type (the funnel and the
		// windows keep their Overall state in the config hash, whose wrong
		// type is a case of its own).
		clientState := func(l *Limiter) {
			require.NoError(t, l.SetRate(ctx, Config{Type: PerClient, Rate: 10, Interval: 10 * time.Second}))
			key := l.keys[len(l.keys)-len(l.alg.State)]
			rdb.Del(ctx, key)
			rdb.SAdd(ctx, key, "x")
		}
		allow := func(p int64) func(*Limiter) error {
			return func(l *Limiter) error { _, err := l.Allow(ctx, p); return err }
		}
		cases := []struct {
			what    string
			corrupt breaker
			call    func(*Limiter) error
			want    error
		}{
			{"Allow -1", nil, allow(-1), ErrInvalidPermits},
			{"Allow MinInt64", nil, allow(math.MinInt64), ErrInvalidPermits},
			{"TryAcquire -1", nil, func(l *Limiter) error { _, err := l.TryAcquire(ctx, -1); return err }, ErrInvalidPermits},
			{"Acquire -1", nil, func(l *Limiter) error { return l.Acquire(ctx, -1) }, ErrInvalidPermits},
			{"TryAcquireWithin -1", nil, func(l *Limiter) error { _, err := l.TryAcquireWithin(ctx, -1, time.Second); return err }, ErrInvalidPermits},
			{"Release -1", nil, func(l *Limiter) error { _, err := (Reservation{limiter: l, Taken: 1}).Release(ctx, -1); return err }, ErrInvalidPermits},
			{"TryAcquire above the limit", nil, func(l *Limiter) error { _, err := l.TryAcquire(ctx, 11); return err }, ErrPermitsExceedRate},
			{"TryAcquire MaxInt64", nil, func(l *Limiter) error { _, err := l.TryAcquire(ctx, math.MaxInt64); return err }, ErrPermitsExceedRate},
			{"Acquire above the limit", nil, func(l *Limiter) error { return l.Acquire(ctx, 1000) }, ErrPermitsExceedRate},
			{"rate 0", nil, setRate(Config{Rate: 0, Interval: time.Second}), ErrInvalidConfig},
			{"rate -1", nil, setRate(Config{Rate: -1, Interval: time.Second}), ErrInvalidConfig},
			{"rate MaxInt64", nil, setRate(Config{Rate: math.MaxInt64, Interval: time.Hour}), ErrInvalidConfig},
			{"rate finer than 1/µs", nil, setRate(Config{Rate: 1_000_001, Interval: time.Second}), ErrInvalidConfig},
			{"interval 0", nil, setRate(Config{Rate: 1}), ErrInvalidConfig},
			{"interval -1s", nil, setRate(Config{Rate: 1, Interval: -time.Second}), ErrInvalidConfig},
			{"interval 1µs", nil, setRate(Config{Rate: 1, Interval: time.Microsecond}), ErrInvalidConfig},
			{"interval 999µs", nil, setRate(Config{Rate: 1, Interval: 999 * time.Microsecond}), ErrInvalidConfig},
			{"interval 1.5ms", nil, setRate(Config{Rate: 1, Interval: 1500 * time.Microsecond}), ErrInvalidConfig},
			{"interval MaxInt64", nil, setRate(Config{Rate: 1, Interval: math.MaxInt64}), ErrInvalidConfig},
			{"keep-alive shorter than the interval", nil, setRate(Config{Rate: 1, Interval: time.Minute, KeepAlive: time.Second}), ErrInvalidConfig},
			{"keep-alive -1s", nil, setRate(Config{Rate: 1, Interval: time.Second, KeepAlive: -time.Second}), ErrInvalidConfig},
			{"keep-alive 1.5s and a bit", nil, setRate(Config{Rate: 1, Interval: time.Second, KeepAlive: 1500*time.Millisecond + 1}), ErrInvalidConfig},
			{"type 2", nil, setRate(Config{Type: 2, Rate: 1, Interval: time.Second}), ErrInvalidConfig},
			{"type -1", nil, setRate(Config{Type: -1, Rate: 1, Interval: time.Second}), ErrInvalidConfig},
			{"burst -1", nil, setRate(Config{Rate: 1, Interval: time.Second, Burst: -1}), ErrInvalidConfig},
			{"burst MaxInt64", nil, setRate(Config{Rate: 1, Interval: time.Second, Burst: math.MaxInt64}), ErrInvalidConfig},
			{"buckets -1", nil, setRate(Config{Rate: 1, Interval: time.Second, Buckets: -1}), ErrInvalidConfig},
			{"buckets 1001", nil, setRate(Config{Rate: 1, Interval: time.Hour, Buckets: 1001}), ErrInvalidConfig},
			{"more buckets than milliseconds", nil, setRate(Config{Rate: 1, Interval: 10 * time.Millisecond, Buckets: 11}), ErrInvalidConfig},
			{"TrySetRate invalid", nil, func(l *Limiter) error { _, err := l.TrySetRate(ctx, Config{}); return err }, ErrInvalidConfig},
			{"invalid default", nil, func(l *Limiter) error { _, err := l.WithDefault(Config{Rate: 1}).Allow(ctx, 1); return err }, ErrInvalidConfig},
			{"context already cancelled", nil, func(l *Limiter) error { _, err := l.Allow(cancelled, 1); return err }, context.Canceled},
			{"SetRate, context cancelled", nil, func(l *Limiter) error { return l.SetRate(cancelled, tenPer10s) }, context.Canceled},
			{"Delete, context cancelled", nil, func(l *Limiter) error { _, err := l.Delete(cancelled); return err }, context.Canceled},
			{"config of the wrong type", func(l *Limiter) { rdb.Del(ctx, l.Name()); rdb.SAdd(ctx, l.Name(), "x") }, allow(1), ErrCorruptState},
			{"SetRate over a config of the wrong type", func(l *Limiter) { rdb.Del(ctx, l.Name()); rdb.Set(ctx, l.Name(), "x", 0) }, setRate(tenPer10s), ErrCorruptState},
			{"non-numeric rate", hset("rate", "ten", "interval", "10000"), allow(1), ErrCorruptState},
			{"negative interval", hset("rate", "10", "interval", "-10000"), allow(1), ErrCorruptState},
			{"rate without interval", hset("rate", "10"), allow(1), ErrCorruptState},
			{"interval without rate", hset("interval", "10000"), allow(0), ErrCorruptState},
			{"fractional keep-alive", hset("rate", "10", "interval", "10000", "keepAliveTime", "0.5"), allow(1), ErrCorruptState},
			{"state of the wrong type", clientState, allow(1), ErrCorruptState},
			{"SetRate over state of the wrong type", clientState, setRate(Per(20, time.Second)), ErrCorruptState},
			{"garbage state", state("garbage"), allow(1), ErrCorruptState},
			{"another algorithm's config", func(l *Limiter) {
				rdb.HSet(ctx, l.Name(), "algorithm", otherThan(a).name)
			}, allow(1), ErrAlgorithmMismatch},
		}
		// Several rates that are not one limit (multirate_test.go).
		for _, c := range contradictingRates {
			cases = append(cases, struct {
				what    string
				corrupt breaker
				call    func(*Limiter) error
				want    error
			}{c.what, nil, setRate(c.cfg), ErrInvalidConfig})
		}
		cases = append(cases, []struct {
			what    string
			corrupt breaker
			call    func(*Limiter) error
			want    error
		}{
			{"TrySetRate, a duplicate interval", nil, func(l *Limiter) error { _, err := l.TrySetRate(ctx, PerSecond(1).And(PerSecond(2))); return err }, ErrInvalidConfig},
			{"a default of five rates", nil, func(l *Limiter) error {
				_, err := l.WithDefault(PerSecond(1).And(PerMinute(2), PerHour(3), Per(4, 2*time.Hour), Per(5, 3*time.Hour))).Allow(ctx, 1)
				return err
			}, ErrInvalidConfig},
		}...)
		for _, c := range a.corruptions(rdb) {
			cases = append(cases, struct {
				what    string
				corrupt breaker
				call    func(*Limiter) error
				want    error
			}{c.what, c.apply, allow(1), ErrCorruptState})
		}
		require.GreaterOrEqual(t, len(cases), 30)
		for _, c := range cases {
			clk := newClock()
			l := a.new(newClient(rdb, clk), uniqueName(t))
			require.NoError(t, l.SetRate(ctx, tenPer10s), c.what)
			_, err := l.Allow(ctx, 3)
			require.NoError(t, err, c.what)
			if c.corrupt != nil {
				c.corrupt(l)
			}
			before := snapshot(t, rdb, l.Name())
			err = c.call(l)
			assert.ErrorIs(t, err, c.want, c.what)
			assert.Equal(t, before, snapshot(t, rdb, l.Name()), "%s: state untouched", c.what)
		}
	})
}

// Names with spaces, binary bytes and hash tags are fine.
func TestUnusualNames(t *testing.T) {
	eachAlgorithm(t, func(t *testing.T, rdb redis.UniversalClient, a algo) {
		ctx := context.Background()
		for _, name := range []string{"a b c", "\x00\xff\x10bin", "{tag}rest", "ünïcødé", "x}{y}"} {
			l := a.new(newClient(rdb, newClock()), uniqueName(t)+name).WithDefault(Per(2, time.Minute))
			for i, want := range []bool{true, true, false} {
				ok, err := l.TryAcquire(ctx, 1)
				require.NoError(t, err, "%q", name)
				assert.Equal(t, want, ok, "%q attempt %d", name, i)
			}
			ok, err := l.Delete(ctx)
			require.NoError(t, err)
			assert.True(t, ok)
		}
	})
}

// Throttle's arguments and odd names are refused with errors about what the
// caller passed, never a number or a brace it did not.
func TestBadInputMessages(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := newClient(rdb, newClock())
		name := uniqueName(t)
		_, err := c.Throttle(ctx, name, math.MaxInt64, 10, time.Second, 1)
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.EqualError(t, err, "redlimit: invalid config: max burst 9223372036854775807 is too large")
		_, err = c.Throttle(ctx, name, -1, 10, time.Second, 1)
		assert.EqualError(t, err, "redlimit: invalid config: max burst -1 is negative")
		assert.Empty(t, limiterKeys(t, rdb, name), "nothing written")

		// Under a prefix, fullName puts the name in a hash tag: one that
		// starts with '}' closes it at once.
		_, err = New(rdb, WithPrefix("app:")).FixedWindow("}").WithDefault(tenPer10s).Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrInvalidName)
		assert.EqualError(t, err, `redlimit: invalid limiter name: "}": under a prefix a name cannot start with '}': its keys are named "app:{}}"…, whose "{}" is no hash tag`)
		// Braces the caller wrote are reported as written.
		_, err = New(rdb, WithPrefix("app:")).FixedWindow("a{}b").WithDefault(tenPer10s).Allow(ctx, 1)
		assert.EqualError(t, err, `redlimit: invalid limiter name: "app:a{}b": a '{' must open a non-empty hash tag`)
		// A '}' later in the name is part of the tag, and fine.
		l := New(rdb, WithPrefix("app:"), WithClock(newClock().Now)).FixedWindow(name + "}x").WithDefault(tenPer10s)
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		assert.True(t, r.Allowed)
		_, err = l.Delete(ctx)
		require.NoError(t, err)
	})
}
