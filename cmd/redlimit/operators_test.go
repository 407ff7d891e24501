package main

import (
	"context"
	"errors"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// TestShadow: `shadow NAME on|off` turns a stored config's shadow mode on
// and off for every handle, as Limiter.SetShadow does; get and ls show it;
// it survives set and reset. A limiter on a default has no config to keep
// it, and says what to do; an in-flight limit has none; a name with no
// limiter exits 3.
func TestShadow(t *testing.T) {
	ctx := context.Background()
	eachServer(t, func(t *testing.T, s server) {
		for _, alg := range algorithms {
			t.Run(alg.name, func(t *testing.T) {
				prefix := newPrefix()
				s.must(t, prefix, "set", "api", "--rate", "2", "--per", "1h", "--algorithm", alg.name)
				l := alg.limiter(redlimit.New(s.rdb, redlimit.WithPrefix(prefix)), "api")
				if ok, err := l.TryAcquire(ctx, 2); !ok || err != nil {
					t.Fatalf("TryAcquire: %v %v", ok, err)
				}
				shadowed := func(want bool) {
					t.Helper()
					if rep := s.get(t, prefix, "api"); rep.Shadow != want {
						t.Errorf("get --json: shadow %v, want %v", rep.Shadow, want)
					}
					line := "shadow     off\n"
					if want {
						line = "shadow     on: every decision counted, every request granted (redlimit shadow api off to enforce)\n"
					}
					if text := s.must(t, prefix, "get", "api"); !strings.Contains(text, line) {
						t.Errorf("get lacks %q:\n%s", line, text)
					}
					if got := s.ls(t, prefix)["api"]; got.Shadow != want {
						t.Errorf("ls --json: %+v, want shadow %v", got, want)
					}
					if listed := s.must(t, prefix, "ls"); strings.HasSuffix(listed, "2 per 1h0m0s; shadow mode\n") != want {
						t.Errorf("ls: %q, want shadow mode %v", listed, want)
					}
					// What the services see: over the limit, granted in shadow mode only.
					r, err := l.Allow(ctx, 1)
					if err != nil || r.Allowed != want || r.Shadow != want {
						t.Errorf("Allow over the limit: %+v %v, want granted %v in shadow mode", r, err, want)
					}
				}
				shadowed(false)
				if out := s.must(t, prefix, "shadow", "api", "on"); out != "api: shadow mode on: every decision counted, every request granted\n" {
					t.Errorf("shadow on: %q", out)
				}
				shadowed(true)
				s.must(t, prefix, "set", "api", "--rate", "1", "--per", "1h")
				s.must(t, prefix, "reset", "api")
				if ok, err := l.TryAcquire(ctx, 1); !ok || err != nil {
					t.Fatalf("TryAcquire after reset: %v %v", ok, err)
				}
				if rep := s.get(t, prefix, "api"); !rep.Shadow {
					t.Errorf("set and reset ended shadow mode: %+v", rep)
				}
				if out := s.must(t, prefix, "shadow", "--", "api", "off"); out != "api: shadow mode off: the limit is enforced\n" {
					t.Errorf("shadow off: %q", out)
				}
				if r, err := l.Allow(ctx, 1); err != nil || r.Allowed || r.Shadow {
					t.Errorf("Allow after shadow off: %+v %v, want denied", r, err)
				}
			})
		}

		// On a default: no config to keep shadow mode in; nothing written.
		prefix := newPrefix()
		client := redlimit.New(s.rdb, redlimit.WithPrefix(prefix))
		if _, err := client.Funnel("dflt").WithDefault(redlimit.PerHour(5)).Allow(ctx, 1); err != nil {
			t.Fatal(err)
		}
		h, err := client.InFlight("jobs").WithDefault(redlimit.InFlightConfig{Limit: 2, TTL: time.Hour}).TryAcquire(ctx)
		if h == nil || err != nil {
			t.Fatalf("TryAcquire: %v %v", h, err)
		}
		t.Cleanup(func() { _ = h.Release(context.Background()) })
		before := snapshot(t, s, prefix)
		for _, tt := range []struct {
			args   []string
			code   int
			stderr string
		}{
			{[]string{"dflt", "on"}, exitFail, "redlimit shadow: dflt runs on its handles' default, with no config stored, and shadow mode is kept with a stored config: " +
				"store one first (redlimit set dflt --rate N --per D), or give the services' handles WithShadow\n"},
			{[]string{"jobs", "on"}, exitFail, "redlimit shadow: jobs is an in-flight limit: shadow is not supported for in-flight limits (an in-flight limit has no shadow mode)\n"},
			{[]string{"nope", "on"}, exitNotFound, `redlimit shadow: no limiter "nope" in `},
			{[]string{"dflt", "maybe"}, exitUsage, "redlimit shadow: want on or off, got \"maybe\"\nUsage: redlimit shadow [flags] NAME on|off\n"},
			{[]string{"dflt"}, exitUsage, "redlimit shadow: want 2 arguments, got 1\n"},
		} {
			code, stdout, stderr := s.command(t, prefix, "shadow", tt.args...)
			if code != tt.code || stdout != "" || !strings.HasPrefix(stderr, tt.stderr) {
				t.Errorf("shadow %v: exit %d, stdout %q, stderr %q\nwant exit %d, stderr %q", tt.args, code, stdout, stderr, tt.code, tt.stderr)
			}
		}
		if err := client.Funnel("dflt").SetShadow(ctx, true); !errors.Is(err, redlimit.ErrNotInitialized) {
			t.Errorf("the library's SetShadow on a default: %v, want ErrNotInitialized, as the command says", err)
		}
		if after := snapshot(t, s, prefix); !maps.Equal(before, after) {
			t.Errorf("keys changed:\nbefore %q\nafter  %q", before, after)
		}
	})
}

// TestResetAndExpireSayWhatTheyDo: redlimit -h, each command's -h and the
// command's README say what reset and expire do to an in-flight limit, and
// that is what they do: reset drops every hold and keeps the config (as it
// forgets a rate limiter's usage), expire refuses one (exit 1). -h used to
// say that both were for rate limiters only.
func TestResetAndExpireSayWhatTheyDo(t *testing.T) {
	ctx := context.Background()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, help, _ := runCommand(t, "-h")
	_, _, resetHelp := runCommand(t, "reset", "-h")
	_, _, expireHelp := runCommand(t, "expire", "-h")
	for _, tt := range []struct{ text, says string }{
		{help, "reset takes both kinds: a rate limiter forgets every client's usage, an\nin-flight limit drops every hold (InFlight.Reset); both keep their config."},
		{help, "expire is for rate limiters only: an in-flight limit's config never\nexpires, and each hold expires by itself (exit 1)."},
		{resetHelp, "For an in-flight limit, drops every hold and keeps its config\n(InFlight.Reset)"},
		{expireHelp, "Not for an in-flight limit: its\nconfig never expires, and each hold expires by itself."},
		{string(readme), "- **`reset NAME`** drops every hold and keeps the config\n  (`InFlight.Reset`)"},
		{string(readme), "**`expire`** refuses an\n  in-flight limit (exit 1)"},
	} {
		if !strings.Contains(tt.text, tt.says) {
			t.Errorf("lacks %q:\n%s", tt.says, tt.text)
		}
	}
	if strings.Contains(help, "reset and expire are for rate limiters") {
		t.Errorf("-h says reset is for rate limiters only:\n%s", help)
	}

	m := miniredis.RunT(t)
	s := server{flags: []string{"--redis", "redis://" + m.Addr()}}
	prefix := newPrefix()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	jobs := redlimit.New(rdb, redlimit.WithPrefix(prefix)).InFlight("jobs")
	cfg := redlimit.InFlightConfig{Limit: 1, TTL: time.Hour}
	if err := jobs.SetLimit(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	h, err := jobs.TryAcquire(ctx)
	if h == nil || err != nil {
		t.Fatalf("TryAcquire: %v %v", h, err)
	}
	t.Cleanup(func() { _ = h.Release(context.Background()) })
	if code, _, stderr := s.command(t, prefix, "expire", "jobs", "1m"); code != exitFail || !strings.Contains(stderr, "expire is not supported for in-flight limits") {
		t.Errorf("expire on an in-flight limit: exit %d %q", code, stderr)
	}
	if ttl := m.TTL(prefix + "{jobs}"); ttl != 0 {
		t.Errorf("expire gave the config a TTL: %v", ttl)
	}
	if out := s.must(t, prefix, "reset", "jobs"); out != "jobs: every hold dropped\n" {
		t.Errorf("reset: %q", out)
	}
	if holders, err := jobs.Holders(ctx); err != nil || len(holders) != 0 {
		t.Errorf("after reset: holders %v %v, want none", holders, err)
	}
	if got, err := jobs.Config(ctx); err != nil || got != cfg {
		t.Errorf("after reset: config %v %v, want %v kept", got, err, cfg)
	}
}
