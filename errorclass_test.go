package redlimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/evalsha"
	"github.com/redlimit/redlimit/internal/redistest"
)

// Every error reply of Redis is classed by its kind, wherever a script met
// it: at the top level, or passed on by a script as "corrupt <key>: <reply>".
func TestErrorClassOfReplies(t *testing.T) {
	ctx := context.Background()
	keys := []any{"svc:{x}", "{svc:{x}}:clients", "{svc:{x}}:requests"}
	trailer := " script: 880f195f5a99ec5a9fb74e0b1d0d615bd14f030a, on @user_script:1."
	for _, tc := range []struct {
		reply    string
		want     error
		contains []string // in the message
	}{
		// Redis 7.0 and 7.2 pcall replies passed on by the scripts.
		{"ERR REDLIMIT corrupt {svc:{x}}:requests: OOM command not allowed when used memory > 'maxmemory'." + trailer,
			ErrUnavailable, []string{"OOM command not allowed", "{svc:{x}}:requests"}},
		{"ERR REDLIMIT corrupt {svc:{x}}:clients: ERR The user executing the script can't run this command or subcommand" + trailer,
			ErrMisconfigured, []string{"{svc:{x}}:clients", "ACL LOG"}},
		{"ERR REDLIMIT corrupt {svc:{x}}:clients: ERR ACL failure in script: User svc has no permissions to run the 'zrange' command" + trailer,
			ErrMisconfigured, []string{"ZRANGE", "{svc:{x}}:clients"}},
		{"ERR REDLIMIT corrupt svc:{x}: WRONGTYPE Operation against a key holding the wrong kind of value" + trailer,
			ErrCorruptState, []string{"corrupt state: svc:{x}: WRONGTYPE"}},
		{"ERR REDLIMIT corrupt svc:{x}: LOADING Redis is loading the dataset in memory" + trailer, ErrUnavailable, []string{"LOADING"}},
		// Redis 6.2's.
		{"ERR Error running script (call to f_880f): @user_script:1: REDLIMIT corrupt {svc:{x}}:requests: @user_script: 1: -OOM command not allowed when used memory > 'maxmemory'.",
			ErrUnavailable, []string{"OOM command not allowed", "{svc:{x}}:requests"}},
		{"ERR Error running script (call to f_880f): @user_script:1: REDLIMIT corrupt {svc:{x}}:clients: @user_script: 876: The user executing the script can't run this command or subcommand",
			ErrMisconfigured, []string{"{svc:{x}}:clients", "ACL LOG"}},
		// miniredis's wording.
		{"ERR Error compiling script (new function): REDLIMIT corrupt svc:{x}: WRONGTYPE Operation against a key holding the wrong kind of value stack traceback: [G]: in function 'error'",
			ErrCorruptState, []string{"WRONGTYPE"}},
		// The scripts' own findings stay corrupt state.
		{"ERR REDLIMIT corrupt svc:{x}: field tat = \"x\"" + trailer, ErrCorruptState, []string{"field tat"}},
		{"ERR REDLIMIT corrupt svc:{x}: rate or interval missing" + trailer, ErrCorruptState, nil},
		// A key that is not the call's cannot make a finding pass for a reply.
		{"ERR REDLIMIT corrupt svc:{y}: OOM is in the name: field tat = \"x\"" + trailer, ErrCorruptState, nil},
		// Top-level replies.
		{"OOM command not allowed when used memory > 'maxmemory'." + trailer, ErrUnavailable, []string{"OOM"}},
		{"WRONGTYPE Operation against a key holding the wrong kind of value" + trailer, ErrCorruptState, nil},
		{"ERR ACL failure in script: User svc has no permissions to run the 'zadd' command" + trailer, ErrMisconfigured, nil},
		{"NOPERM User svc has no permissions to run the 'evalsha' command", ErrMisconfigured, nil},
		{"CROSSSLOT Keys in request don't hash to the same slot", ErrMisconfigured, nil},
	} {
		err := evalsha.Classify(ctx, fakeRefusal(tc.reply), keys)
		assert.ErrorIs(t, err, tc.want, tc.reply)
		for _, other := range []error{ErrUnavailable, ErrMisconfigured, ErrCorruptState} {
			if other != tc.want {
				assert.NotErrorIs(t, err, other, tc.reply)
			}
		}
		if tc.want != ErrCorruptState { // which says what it found, in the scripts' words
			var rerr redis.Error
			assert.ErrorAs(t, err, &rerr, "%s: the reply is kept as the cause", tc.reply)
			assert.NotContains(t, err.Error(), "corrupt", tc.reply)
		}
		for _, s := range tc.contains {
			assert.Contains(t, err.Error(), s, tc.reply)
		}
	}
}

// A full Redis (maxmemory, noeviction) is an outage for every algorithm,
// with the request log (WithRetryWindow) or without, Overall or PerClient,
// the rate stored or a default: ErrUnavailable with the OOM kept, never
// ErrCorruptState; WithFailOpen grants, and nothing is half-written.
func TestErrorClassFullRedis(t *testing.T) {
	ctx := context.Background()
	admin, rdb := ownServer(t)
	type pair struct {
		name         string
		closed, open *Limiter
	}
	var pairs []pair
	for _, window := range []time.Duration{0, 15 * time.Second} {
		closed, open := New(rdb, WithRetryWindow(window)), New(rdb, WithRetryWindow(window), WithFailOpen())
		for _, a := range algorithms {
			for _, cfg := range []Config{PerHour(10), {Type: PerClient, Rate: 10, Interval: time.Hour}} {
				what := a.name + "/" + cfg.Type.String() + "/retry window " + window.String()
				stored := uniqueName(t) + "-" + what + "-stored"
				require.NoError(t, a.new(closed, stored).SetRate(ctx, cfg))
				dflt := uniqueName(t) + "-" + what + "-default"
				pairs = append(pairs,
					pair{what + "/stored", a.new(closed, stored), a.new(open, stored)},
					pair{what + "/default", a.new(closed, dflt).WithDefault(cfg), a.new(open, dflt).WithDefault(cfg)})
			}
		}
	}
	for _, p := range pairs {
		for range 3 {
			ok, err := p.closed.TryAcquire(ctx, 1)
			require.NoError(t, err, p.name)
			require.True(t, ok, p.name)
		}
	}
	before := map[string]map[string]string{}
	for _, p := range pairs {
		before[p.name] = limiterDump(t, admin, p.closed)
	}
	setMaxmemory(t, admin, "noeviction", 1<<20)
	_, oom := fillUntilOOM(t, admin, 8<<20)
	require.True(t, oom)
	setMaxmemory(t, admin, "noeviction", -256<<10)
	t.Cleanup(func() { admin.ConfigSet(context.Background(), "maxmemory", "0") })

	for _, p := range pairs {
		ok, err := p.closed.TryAcquire(ctx, 1)
		assert.False(t, ok, p.name)
		assert.ErrorIs(t, err, ErrUnavailable, p.name)
		assert.NotErrorIs(t, err, ErrCorruptState, p.name)
		assert.ErrorContains(t, err, "OOM", "%s: the cause is kept", p.name)
		if err != nil {
			assert.NotContains(t, err.Error(), "corrupt", p.name)
		}
		ok, err = p.open.TryAcquire(ctx, 1)
		assert.NoError(t, err, p.name)
		assert.True(t, ok, "%s: fail-open grants", p.name)
		assert.Equal(t, before[p.name], limiterDump(t, admin, p.closed), "%s: nothing half-written", p.name)
	}
}

// An ACL user that lacks one command the scripts run gets ErrMisconfigured,
// never failed open, whose message names the key and the command (Redis 7.2
// and later say it; on 7.0 and 6.2 the script's line tells it), and never
// says "corrupt". CI runs it on every server of its matrix.
func TestErrorClassACL(t *testing.T) {
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
