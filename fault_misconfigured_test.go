package redlimit

// Misconfigured: an ACL that does not cover the limiter's keys or lacks a
// command the scripts run, scripting disabled, a wrong password. Refusals
// only an operator can fix are ErrMisconfigured, never failed open, and
// never open the breaker.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Refusals only an operator can fix are ErrMisconfigured, not outages: they
// are never failed open, and they do not open a breaker.
func TestMisconfiguredNeverFailsOpen(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	// A user limited to other keys than the limiters': whatever the key
	// layout, names outside svc:* give keys outside it. (REFERENCE.md §6: a
	// name inside it is not enough either, as the hash-tagged state keys
	// "{svc:…}:…" do not start with "svc:".)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "svc", "on", ">pw", "~svc:*", "+@all").Err())
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+@all", "-@scripting").Err())
	for _, tc := range []struct {
		name, user, password, refusal string
	}{
		{"key pattern", "svc", "pw", "NOPERM"},
		{"no scripting", "noscripts", "pw", "NOPERM"},
		{"wrong password", "svc", "wrong", "WRONGPASS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: tc.user, Password: tc.password})
			t.Cleanup(func() { rdb.Close() })
			var observed []error
			log := &commandLog{}
			rdb.AddHook(log)
			c := New(rdb, WithFailOpen(), WithBreaker(1, time.Hour), WithObserver(func(d Decision) { observed = append(observed, d.Err) }))
			for _, a := range algorithms {
				l := a.new(c, uniqueName(t)).WithDefault(tenPer10s)
				for range 2 {
					r, err := l.Allow(ctx, 1)
					assert.ErrorIs(t, err, ErrMisconfigured, a.name)
					assert.NotErrorIs(t, err, ErrUnavailable, "%s: not an outage", a.name)
					assert.ErrorContains(t, err, tc.refusal)
					assert.False(t, r.Allowed, "%s: never failed open", a.name)
				}
				_, err := l.Config(ctx)
				assert.ErrorIs(t, err, ErrMisconfigured, a.name)
			}
			assert.Len(t, observed, 2*len(algorithms))
			for _, err := range observed {
				assert.ErrorIs(t, err, ErrMisconfigured)
			}
			// A breaker that opens at the first failure stayed closed: every
			// call went to Redis. (A wrong password fails in the handshake,
			// before EVALSHA is sent.)
			if tc.refusal != "WRONGPASS" {
				assert.Equal(t, 3*len(algorithms), log.count("evalsha"), "every call reached Redis")
			}
		})
	}
}

// An ACL user that lacks one command the scripts run gets ErrMisconfigured,
// never failed open, whose message names the key and the command (Redis 7.2
// and later say it; on 7.0 and 6.2 the script's line tells it), and never
// says "corrupt". CI runs it on every server of its matrix.
func TestMisconfiguredACLLacksACommand(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	version := infoValue(t, admin, "server", "redis_version")
	for _, tc := range []struct {
		lacks  string
		window time.Duration
		call   func(l *Limiter) error
	}{
		// SetRate lists the registry of clients (ZRANGE).
		{"zrange", 0, func(l *Limiter) error { return l.SetRate(ctx, tenPer10s) }},
		// A decision with the request log adds its id (ZADD).
		{"zadd", 15 * time.Second, func(l *Limiter) error { _, err := l.WithDefault(tenPer10s).Allow(ctx, 1); return err }},
	} {
		user := "lacks" + tc.lacks
		require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", "-"+tc.lacks).Err())
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: "pw"})
		t.Cleanup(func() { rdb.Close() })
		c := New(rdb, WithFailOpen(), WithRetryWindow(tc.window))
		for _, a := range algorithms {
			err := tc.call(a.new(c, uniqueName(t)))
			what := version + " lacking " + tc.lacks + ": " + a.name
			require.ErrorIs(t, err, ErrMisconfigured, what)
			assert.NotErrorIs(t, err, ErrUnavailable, what)
			assert.NotErrorIs(t, err, ErrCorruptState, what)
			assert.NotContains(t, err.Error(), "corrupt", what)
			assert.Contains(t, strings.ToLower(err.Error()), tc.lacks, what)
			t.Logf("%s: %v", what, err)
		}
	}
}
