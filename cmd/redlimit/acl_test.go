package main

import (
	"context"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// The ACL for the command (docs/operations.md) is enough for every admin
// command, on every algorithm, running on a default (ls finds it by its
// keys) and with a stored config; and each command it adds to the
// library's is needed.
func TestLeastPrivilegeACL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and sweeps every admin command once per ACL command")
	}
	readme, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ACL SETUSER svc-cli (.*)$`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("docs/operations.md holds no `ACL SETUSER svc-cli` line")
	}
	rules := strings.Fields(string(m[1]))
	lib := regexp.MustCompile(`(?m)^ACL SETUSER svc-limiter (.*)$`).FindSubmatch(readme)
	if lib == nil {
		t.Fatal("docs/operations.md holds no `ACL SETUSER svc-limiter` line")
	}
	libRules := map[string]bool{}
	for _, r := range strings.Fields(string(lib[1])) {
		libRules[r] = true
	}

	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	sweep := func(t *testing.T, rules []string) (string, string, bool) {
		t.Helper()
		args := []any{"ACL", "SETUSER", "svc-cli", "reset"}
		for _, r := range rules {
			args = append(args, strings.ReplaceAll(r, "PASSWORD", "pw"))
		}
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		s := server{flags: []string{"--redis", "redis://svc-cli:" + url.QueryEscape("pw") + "@" + srv.Addr()}}
		for _, alg := range algorithms {
			prefix := "svc:" + uniqueName("acl") + ":"
			// A limiter on a default, written by the library as an admin,
			// with a reservation open; an instance in degraded mode.
			l := alg.limiter(redlimit.New(admin, redlimit.WithPrefix(prefix)), "dflt").WithDefault(redlimit.PerHour(10))
			if _, err := l.Reserve(ctx, 1); err != nil {
				t.Fatal(err)
			}
			beating(t, admin, prefix, "api", time.Now())
			for _, cmd := range [][]string{
				{"ls"}, {"get", "dflt"}, {"instances"},
				{"set", "api", "--rate", "10", "--per", "1h", "--algorithm", alg.name},
				{"ls"}, {"get", "api"}, {"shadow", "api", "on"}, {"shadow", "api", "off"},
				{"expire", "api", "10m"}, {"reset", "api"}, {"delete", "--yes", "api"},
			} {
				code, stdout, stderr := s.command(t, prefix, cmd[0], cmd[1:]...)
				if code != exitOK {
					return alg.name + " " + strings.Join(cmd, " "), stdout + stderr, false
				}
			}
		}
		// An in-flight limit: one on a default with a hold (ls and get
		// count holds through the library's script), one set here.
		prefix := "svc:" + uniqueName("acl") + ":"
		h, err := redlimit.New(admin, redlimit.WithPrefix(prefix)).InFlight("dflt").WithDefault(redlimit.InFlightConfig{Limit: 2, TTL: time.Minute}).TryAcquire(ctx)
		if h == nil || err != nil {
			t.Fatalf("TryAcquire: %v %v", h, err)
		}
		defer h.Release(ctx)
		for _, cmd := range [][]string{
			{"ls"}, {"get", "dflt"},
			{"set", "jobs", "--limit", "2", "--ttl", "1m"}, {"ls"}, {"get", "jobs"}, {"delete", "--yes", "jobs"}, {"delete", "--yes", "dflt"},
		} {
			code, stdout, stderr := s.command(t, prefix, cmd[0], cmd[1:]...)
			if code != exitOK {
				return "inflight " + strings.Join(cmd, " "), stdout + stderr, false
			}
		}
		return "", "", true
	}
	if op, out, ok := sweep(t, rules); !ok {
		t.Fatalf("with the documented ACL, %s failed:\n%s", op, out)
	}
	for i, r := range rules {
		if !strings.HasPrefix(r, "+") || libRules[r] {
			continue
		}
		t.Run("without "+r[1:], func(t *testing.T) {
			less := append(append([]string{}, rules[:i]...), rules[i+1:]...)
			if _, _, ok := sweep(t, less); ok {
				t.Errorf("every admin command passed without %s: docs/operations.md asks for a command the CLI does not use", r)
			}
		})
	}
}
