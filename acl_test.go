package redlimit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// readmeACL returns the rules of the ACL SETUSER line for the library
// (prefix svc:) that docs/operations.md gives: the least a limiter's Redis
// user needs.
func readmeACL(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile("docs/operations.md")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^ACL SETUSER svc-limiter (.*)$`).FindSubmatch(readme)
	require.NotNil(t, m, "docs/operations.md holds the library's ACL SETUSER line")
	return strings.Fields(string(m[1]))
}

// aclSweep runs every operation of every algorithm, as several rates,
// PerClient and WithRetryWindow use them, on one client, and returns the
// first error with what was being done.
func aclSweep(ctx context.Context, rdb redis.Scripter, name string) (string, error) {
	retry := New(rdb, WithPrefix("svc:"), WithRetryWindow(time.Minute), WithClientID("c1"))
	plain := New(rdb, WithPrefix("svc:"), WithClientID("c1"))
	for _, a := range algorithms {
		for _, v := range []struct {
			what string
			c    *Client
			cfg  Config
		}{
			{"default", plain, PerMinute(10)},
			{"several rates", plain, PerMinute(10).And(PerHour(100))},
			{"retry window", retry, PerMinute(10)},
			{"per client", plain, func() Config { c := PerMinute(10); c.Type = PerClient; return c }()},
		} {
			l := a.new(v.c, name+"-"+a.name+"-"+strings.ReplaceAll(v.what, " ", "-")).WithDefault(a.tune(v.cfg, 10, 10))
			steps := []struct {
				op  string
				run func() error
			}{
				{"Allow", func() error { _, err := l.Allow(ctx, 1); return err }},
				{"AvailablePermits", func() error { _, err := l.AvailablePermits(ctx); return err }},
				{"Reserve and Release", func() error { return reserveAndRelease(ctx, l) }},
				{"TrySetRate", func() error { _, err := l.TrySetRate(ctx, a.tune(v.cfg, 10, 10)); return err }},
				{"SetRate", func() error { return l.SetRate(ctx, a.tune(v.cfg, 10, 10)) }},
				{"Config", func() error { _, err := l.Config(ctx); return err }},
				{"Allow stored", func() error { _, err := l.Allow(ctx, 2); return err }},
				{"Allow denied", func() error { _, err := l.Allow(ctx, 10); return err }},
				{"Reserve and Release stored", func() error { return reserveAndRelease(ctx, l) }},
				{"Clients", func() error { _, err := l.Clients(ctx); return err }},
				{"Expire", func() error { _, err := l.Expire(ctx, time.Hour); return err }},
				{"RemainTimeToLive", func() error { _, err := l.RemainTimeToLive(ctx); return err }},
				{"ExpireAt", func() error { _, err := l.ExpireAt(ctx, time.Now().Add(time.Hour)); return err }},
				{"ClearExpire", func() error { _, err := l.ClearExpire(ctx); return err }},
				{"Reset", func() error { return l.Reset(ctx) }},
				{"Delete", func() error { _, err := l.Delete(ctx); return err }},
				{"Allow after Delete", func() error { _, err := l.Allow(ctx, 1); return err }},
				{"Delete again", func() error { _, err := l.Delete(ctx); return err }},
			}
			for _, s := range steps {
				if err := s.run(); err != nil {
					return a.name + " " + v.what + " " + s.op, err
				}
			}
		}
	}
	if _, err := New(rdb, WithPrefix("svc:")).Throttle(ctx, name+"-throttle", 4, 1, time.Second, 1); err != nil {
		return "Throttle", err
	}
	return "", nil
}

// allScripts is the source of every script file.
func allScripts(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob("scripts/*.lua")
	require.NoError(t, err)
	var all strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		all.Write(b)
	}
	return all.String()
}

// The ACL of docs/operations.md is enough for every operation, and each
// command it allows is needed: without it some operation fails with
// ErrMisconfigured, never with another error and never granting, and the
// error names the command Redis refused.
func TestLeastPrivilegeACL(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	rules := readmeACL(t)
	require.Contains(t, rules, "~svc:*", "the ACL covers the prefix's keys")

	asUser := func(t *testing.T, rules []string) *redis.Client {
		t.Helper()
		args := []any{"ACL", "SETUSER", "svc-limiter", "reset"}
		for _, r := range rules {
			args = append(args, strings.ReplaceAll(r, "PASSWORD", "pw"))
		}
		require.NoError(t, admin.Do(ctx, args...).Err())
		require.NoError(t, admin.ScriptFlush(ctx).Err()) // the user loads them: SCRIPT LOAD is needed too
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "svc-limiter", Password: "pw", MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}

	// docs/operations.md names exactly the commands the scripts call.
	var want []string
	for _, m := range regexp.MustCompile(`redis\.p?call\('([A-Z]+)'`).FindAllStringSubmatch(allScripts(t), -1) {
		want = append(want, "+"+strings.ToLower(m[1]))
	}
	want = append(want, "+evalsha", "+script|load")
	var got []string
	for _, r := range rules {
		if strings.HasPrefix(r, "+") {
			got = append(got, r)
		}
	}
	slices.Sort(want)
	assert.Equal(t, slices.Compact(want), slices.Sorted(slices.Values(got)), "the documented ACL allows the commands the scripts call")

	op, err := aclSweep(ctx, asUser(t, rules), "acl")
	require.NoError(t, err, "with the documented ACL: %s", op)

	for i, r := range rules {
		command, ok := strings.CutPrefix(r, "+")
		if !ok || command == "@connection" {
			continue
		}
		t.Run("without "+command, func(t *testing.T) {
			less := append(append([]string{}, rules[:i]...), rules[i+1:]...)
			op, err := aclSweep(ctx, asUser(t, less), "acl-"+strings.ReplaceAll(command, "|", "-"))
			require.Error(t, err, "every operation passed without %s: docs/operations.md asks for a command nothing uses", command)
			assert.ErrorIs(t, err, ErrMisconfigured, "%s", op)
			assert.False(t, errors.Is(err, ErrCorruptState), "%s: %v", op, err)
			// Redis 6.2 names a subcommand's command only ('script').
			parent, _, _ := strings.Cut(command, "|")
			names := regexp.MustCompile(`\b(` + regexp.QuoteMeta(command) + `|` + regexp.QuoteMeta(parent) + `)\b`)
			assert.Regexp(t, names, strings.ToLower(err.Error()), "%s: the error names the command", op)
		})
	}
}

// reserveAndRelease reserves a permit of l and gives it back.
func reserveAndRelease(ctx context.Context, l *Limiter) error {
	res, err := l.Reserve(ctx, 1)
	if err != nil {
		return err
	}
	_, err = res.Release(ctx, 1)
	return err
}
