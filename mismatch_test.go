package redlimit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One name, two algorithms: whichever holds the name first, a handle of
// another algorithm never counts against its state, nor next to it (which
// would double the limit, as a rolling deploy that changes the algorithm
// does): every call of the second fails with ErrAlgorithmMismatch naming
// both, and leaves the first's state as it was, stored config or not.
// Defaults only, each of the 12 ordered pairs: a flat state names its
// algorithm by its shape, and a state elsewhere (the token bucket's, any
// PerClient state) by a marker in the limiter's key (scripts/common.lua).
func TestMismatchDefaults(t *testing.T) {
	perClient := Config{Type: PerClient, Rate: 5, Interval: time.Minute}
	variants := []struct {
		name string
		cfg  Config
	}{
		{"overall", PerMinute(5)},
		{"per-client", perClient},
		{"rates", PerMinute(5).And(PerHour(20))},
		{"per-client-rates", perClient.And(PerHour(20))},
	}
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, v := range variants {
			for _, a := range algorithms {
				for _, b := range algorithms {
					if a.name == b.name {
						continue
					}
					t.Run(v.name+"/"+a.name+"-then-"+b.name, func(t *testing.T) {
						ctx := context.Background()
						clk := newClock()
						name := uniqueName(t)
						c := newClient(rdb, clk, WithClientID("c1"))
						first := a.new(c, name).WithDefault(v.cfg)
						takeAll(t, first, 5)
						before := snapshot(t, rdb, name)
						require.NotEmpty(t, before)
						want := fmt.Sprintf("holds a %s state, not %s", a.name, b.name)
						for _, client := range []string{"c1", "c2"} {
							second := b.new(newClient(rdb, clk, WithClientID(client)), name).WithDefault(v.cfg)
							assertMismatch(t, second, want)
						}
						assert.Equal(t, before, snapshot(t, rdb, name), "the first algorithm's state untouched")
						assertAvailable(t, first, 0, "the first handle still counts its own: all taken")
						r, err := first.Allow(ctx, 1)
						require.NoError(t, err)
						assert.False(t, r.Allowed)

						// Delete through the first handle removes every key,
						// the marker too, and the name is free again.
						ok, err := first.Delete(ctx)
						require.NoError(t, err)
						assert.True(t, ok)
						assert.Empty(t, limiterKeys(t, rdb, name))
						second := b.new(c, name).WithDefault(v.cfg)
						takeAll(t, second, 5)
						assertMismatch(t, a.new(c, name).WithDefault(v.cfg), fmt.Sprintf("holds a %s state, not %s", b.name, a.name))
					})
				}
			}
		}
	})
}

// takeAll takes n permits from l one by one, each granted, and the next
// denied.
func takeAll(t *testing.T, l *Limiter, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		r, err := l.Allow(ctx, 1)
		require.NoError(t, err)
		require.True(t, r.Allowed, "grant %d", i)
		require.Equal(t, int64(n-1-i), r.Remaining)
	}
	r, err := l.Allow(ctx, 1)
	require.NoError(t, err)
	require.False(t, r.Allowed)
}

// assertMismatch checks that every call of l fails with
// ErrAlgorithmMismatch saying want, and none is granted.
func assertMismatch(t *testing.T, l *Limiter, want string) {
	t.Helper()
	ctx := context.Background()
	check := func(op string, err error) {
		t.Helper()
		if assert.ErrorIs(t, err, ErrAlgorithmMismatch, op) {
			assert.Contains(t, err.Error(), want, op)
		}
	}
	for _, permits := range []int64{1, 0, 5} {
		r, err := l.Allow(ctx, permits)
		check(fmt.Sprintf("Allow(%d)", permits), err)
		assert.False(t, r.Allowed, "Allow(%d)", permits)
	}
	ok, err := l.TryAcquire(ctx, 1)
	check("TryAcquire", err)
	assert.False(t, ok)
	_, err = l.AvailablePermits(ctx)
	check("AvailablePermits", err)
	_, err = l.Reserve(ctx, 1)
	check("Reserve", err)
	check("Reset", l.Reset(ctx))
	check("SetRate", l.SetRate(ctx, PerMinute(5)))
	ok, err = l.TrySetRate(ctx, PerMinute(5))
	check("TrySetRate", err)
	assert.False(t, ok)
	_, err = l.Config(ctx)
	check("Config", err)
}

// A stored config names its algorithm as it always has: the other
// algorithms' handles, with a default or without, fail with
// ErrAlgorithmMismatch and leave it and its state as they were.
func TestMismatchStoredConfig(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, a := range algorithms {
			for _, b := range algorithms {
				if a.name == b.name {
					continue
				}
				t.Run(a.name+"-then-"+b.name, func(t *testing.T) {
					ctx := context.Background()
					clk := newClock()
					name := uniqueName(t)
					c := newClient(rdb, clk)
					first := a.new(c, name)
					require.NoError(t, first.SetRate(ctx, PerMinute(5)))
					takeAll(t, first, 5)
					before := snapshot(t, rdb, name)
					want := fmt.Sprintf("holds a %s config, not %s", a.name, b.name)
					assertMismatch(t, b.new(c, name).WithDefault(PerMinute(5)), want)
					_, err := b.new(c, name).Allow(ctx, 1)
					assert.ErrorIs(t, err, ErrAlgorithmMismatch)
					assert.Equal(t, before, snapshot(t, rdb, name))
					assertAvailable(t, first, 0)
				})
			}
		}
	})
}

// Throttle keeps a funnel's state as a field of the key's hash, without a
// config: the other algorithms' defaults see it, and Throttle sees theirs.
func TestMismatchThrottle(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		c := newClient(rdb, clk)
		for _, b := range algorithms {
			if b.name == funnelAlgo.name {
				continue
			}
			t.Run(b.name, func(t *testing.T) {
				name := uniqueName(t)
				r, err := c.Throttle(ctx, name, 4, 5, time.Minute, 5)
				require.NoError(t, err)
				require.False(t, r.Limited)
				before := snapshot(t, rdb, name)
				assertMismatch(t, b.new(c, name).WithDefault(PerMinute(5)), "holds a funnel state, not "+b.name)
				assert.Equal(t, before, snapshot(t, rdb, name))

				other := uniqueName(t)
				takeAll(t, b.new(c, other).WithDefault(PerMinute(5)), 5)
				before = snapshot(t, rdb, other)
				_, err = c.Throttle(ctx, other, 4, 5, time.Minute, 1)
				assert.ErrorIs(t, err, ErrAlgorithmMismatch)
				assert.Contains(t, err.Error(), "holds a "+b.name+" state, not funnel")
				assert.Equal(t, before, snapshot(t, rdb, other))
			})
		}
	})
}

// A flat state as the scripts before markers wrote it (their format, which
// has not changed) still decides, to the permit, and names its algorithm to
// the others; a token bucket's state from then, without its marker, gets
// one on its next decision, a denial too.
func TestMismatchStateFromBefore(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		c := newClient(rdb, clk)
		ms, us := clk.Now().UnixMilli(), clk.Now().UnixMicro()
		old := map[string]string{
			// 3 of 10 per 10s taken at the epoch.
			"funnel":         fmt.Sprint(us + 3_000_000),
			"fixed_window":   fmt.Sprintf("%d 3", ms),
			"sliding_window": fmt.Sprintf("%d:3", ms),
		}
		for _, a := range algorithms {
			t.Run(a.name, func(t *testing.T) {
				name := uniqueName(t)
				l := a.new(c, name).WithDefault(tenPer10s)
				if a.name == tokenBucketAlgo.name {
					for range 3 {
						ok, err := l.TryAcquire(ctx, 1)
						require.NoError(t, err)
						require.True(t, ok)
					}
					require.Equal(t, "tokenbucket", rdb.Get(ctx, l.Name()).Val(), "the marker")
					require.Equal(t, 10*time.Second, rdb.PTTL(ctx, l.Name()).Val().Round(time.Second), "expiring with the state")
					rdb.Del(ctx, l.Name()) // as the scripts before markers left it
				} else {
					require.NoError(t, rdb.Set(ctx, l.Name(), old[a.name], 10*time.Second).Err())
				}
				r, err := l.Allow(ctx, 7)
				require.NoError(t, err)
				assert.Equal(t, Result{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: map[string]time.Duration{
					"tokenbucket": 10 * time.Second, "funnel": 10 * time.Second, "fixed_window": 10 * time.Second, "sliding_window": 10 * time.Second,
				}[a.name], Window: 10 * time.Second}, r)
				for _, b := range algorithms {
					if b.name != a.name {
						assertMismatch(t, b.new(c, name).WithDefault(tenPer10s), fmt.Sprintf("holds a %s state, not %s", a.name, b.name))
					}
				}
				if a.name != tokenBucketAlgo.name {
					return
				}
				// Its marker lost again, a denial puts it back.
				rdb.Del(ctx, l.Name())
				r, err = l.Allow(ctx, 1)
				require.NoError(t, err)
				assert.False(t, r.Allowed)
				assert.Equal(t, "tokenbucket", rdb.Get(ctx, l.Name()).Val())
			})
		}
	})
}

// SetRate through the right algorithm turns a marker into the config hash,
// keeping the usage; Reset and Delete remove it.
func TestMarkerAdmin(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		clk := newClock()
		for _, a := range algorithms {
			for _, cfg := range []Config{tenPer10s, {Type: PerClient, Rate: 10, Interval: 10 * time.Second}} {
				t.Run(a.name+"/"+strings.ToLower(cfg.Type.String()), func(t *testing.T) {
					c := newClient(rdb, clk, WithClientID("c1"))
					name := uniqueName(t)
					l := a.new(c, name).WithDefault(cfg)
					_, err := l.Allow(ctx, 3)
					require.NoError(t, err)
					if cfg.Type == PerClient || a.name == tokenBucketAlgo.name {
						assert.Equal(t, a.name, rdb.Get(ctx, l.Name()).Val(), "the marker")
					}
					assertConfig(t, l, cfg, "no config stored: the default")
					require.NoError(t, a.new(c, name).SetRate(ctx, cfg))
					assert.Equal(t, "hash", rdb.Type(ctx, l.Name()).Val())
					assertAvailable(t, l, 7, "the usage kept")
					require.NoError(t, l.Reset(ctx))
					assertAvailable(t, l, 10)

					m := a.new(c, uniqueName(t)).WithDefault(cfg)
					_, err = m.Allow(ctx, 3)
					require.NoError(t, err)
					require.NoError(t, m.Reset(ctx))
					assert.Empty(t, limiterKeys(t, rdb, m.Name()), "Reset leaves no key")
					ok, err := m.TrySetRate(ctx, cfg)
					require.NoError(t, err)
					assert.True(t, ok)
				})
			}
		}
	})
}
