package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// Tests never run on a terminal, whatever go test's stdin is: delete needs
// --yes (TestDeleteAsks answers as a terminal would).
func init() { terminalInput = func() (io.Reader, bool) { return nil, false } }

// server is one backend the admin commands are tested on.
type server struct {
	flags []string // how the command names it
	rdb   redis.UniversalClient
	real  bool // a redis-server: DUMP and PEXPIRETIME work on every type
}

// eachServer runs f on miniredis, a real redis-server and a real Redis
// Cluster; the real ones skip without redis-server unless
// REDLIMIT_REQUIRE_REDIS=1.
func eachServer(t *testing.T, f func(t *testing.T, s server)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		f(t, server{[]string{"--redis", "redis://" + m.Addr()}, rdb, false})
	})
	t.Run("redis", func(t *testing.T) {
		s := redistest.Shared(t)
		f(t, server{[]string{"--redis", "redis://" + s.Addr()}, s.Client(t), true})
	})
	t.Run("cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts a six-node Redis Cluster")
		}
		c := redistest.SharedCluster(t)
		f(t, server{[]string{"--cluster", strings.Join(c.Addrs(), ",")}, c.Client(t), true})
	})
}

// command runs `redlimit CMD --redis … --prefix PREFIX args…`.
func (s server) command(t *testing.T, prefix, cmd string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	all := append([]string{cmd}, s.flags...)
	if prefix != "" {
		all = append(all, "--prefix", prefix)
	}
	return runCommand(t, append(all, args...)...)
}

// must runs a command that should succeed and returns its output.
func (s server) must(t *testing.T, prefix, cmd string, args ...string) string {
	t.Helper()
	code, stdout, stderr := s.command(t, prefix, cmd, args...)
	if code != exitOK {
		t.Fatalf("redlimit %s %s: exit %d\n%s%s", cmd, strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

func (s server) get(t *testing.T, prefix, name string, args ...string) limiterReport {
	t.Helper()
	var rep limiterReport
	if err := json.Unmarshal([]byte(s.must(t, prefix, "get", append([]string{"--json", name}, args...)...)), &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// ls returns ls --json's lines by name.
func (s server) ls(t *testing.T, prefix string, args ...string) map[string]lsLine {
	t.Helper()
	lines := map[string]lsLine{}
	for _, text := range strings.Split(strings.TrimSpace(s.must(t, prefix, "ls", append([]string{"--json"}, args...)...)), "\n") {
		if text == "" {
			continue
		}
		var l lsLine
		if err := json.Unmarshal([]byte(text), &l); err != nil {
			t.Fatalf("%v: %q", err, text)
		}
		if _, dup := lines[l.Name]; dup {
			t.Errorf("ls listed %s twice", l.Name)
		}
		lines[l.Name] = l
	}
	return lines
}

func newPrefix() string { return uniqueName("t") + ":" }

// is reports whether got is cfg, as get and ls write it.
func is(got *configJSON, cfg redlimit.Config) bool {
	return got != nil && reflect.DeepEqual(*got, *toJSON(cfg))
}

// TestAdmin takes a limiter of each algorithm through every admin command.
func TestAdmin(t *testing.T) {
	ctx := context.Background()
	eachServer(t, func(t *testing.T, s server) {
		for _, alg := range algorithms {
			t.Run(alg.name, func(t *testing.T) {
				prefix := newPrefix()
				code, _, stderr := s.command(t, prefix, "set", "api", "--rate", "10", "--per", "1h")
				if code != exitUsage || !strings.Contains(stderr, "give the --algorithm its services use") {
					t.Errorf("set on a new name without --algorithm: exit %d\n%s", code, stderr)
				}
				s.must(t, prefix, "set", "api", "--rate", "10", "--per", "1h", "--algorithm", alg.name)
				l := alg.limiter(redlimit.New(s.rdb, redlimit.WithPrefix(prefix)), "api")
				if ok, err := l.TryAcquire(ctx, 3); !ok || err != nil {
					t.Fatalf("TryAcquire: %v %v", ok, err)
				}

				rep := s.get(t, prefix, "api")
				want := redlimit.PerHour(10)
				if rep.Algorithm != alg.name || rep.Key != prefix+"{api}" || !is(rep.Config, want) || rep.TTLMS != -1 {
					t.Errorf("get: %+v, config %+v", rep, rep.Config)
				}
				if u := rep.Usage; u == nil || u.Limit != 10 || u.Remaining != 7 || u.RetryAfterMS != 0 || u.ResetAfterMS <= 0 || u.ResetAfterMS > 3_600_000 {
					t.Errorf("usage %+v, want 7 of 10 remaining", rep.Usage)
				}
				text := s.must(t, prefix, "get", "api")
				for _, line := range []string{"algorithm  " + alg.name, "config     10 per 1h0m0s  (stored)", "expires    never", "remaining  7 of 10; a permit is free now; full again in"} {
					if !strings.Contains(text, line) {
						t.Errorf("get lacks %q:\n%s", line, text)
					}
				}
				if got := s.ls(t, prefix); len(got) != 1 || got["api"].Algorithm != alg.name || !is(got["api"].Config, want) {
					t.Errorf("ls: %+v", got)
				}
				if out := s.must(t, prefix, "ls"); strings.Join(strings.Fields(out), " ") != "api "+alg.name+" 10 per 1h0m0s" {
					t.Errorf("ls: %q", out)
				}

				out := s.must(t, prefix, "set", "api", "--rate", "20", "--per", "1h", "--if-absent")
				if cfg, err := l.Config(ctx); !strings.Contains(out, "keeps the config stored already: 10 per 1h0m0s") || err != nil || !reflect.DeepEqual(cfg, redlimit.PerHour(10)) {
					t.Errorf("set --if-absent on a stored config: %q; now %v %v", out, cfg, err)
				}
				s.must(t, prefix, "set", "--rate", "20", "--per", "1h", "api") // flags before or after NAME
				if cfg, err := l.Config(ctx); err != nil || !reflect.DeepEqual(cfg, redlimit.PerHour(20)) {
					t.Errorf("after set: %v %v", cfg, err)
				}
				other := "funnel"
				if alg.name == other {
					other = "tokenbucket"
				}
				code, _, stderr = s.command(t, prefix, "set", "api", "--rate", "20", "--per", "1h", "--algorithm", other)
				if code != exitFail || !strings.Contains(stderr, "api is a "+alg.name+" limiter, not a "+other+": delete it first") {
					t.Errorf("set with another algorithm: exit %d\n%s", code, stderr)
				}

				s.must(t, prefix, "expire", "api", "10m")
				if ttl := s.get(t, prefix, "api").TTLMS; ttl <= 590_000 || ttl > 600_000 {
					t.Errorf("ttl after expire 10m: %dms", ttl)
				}
				s.must(t, prefix, "reset", "api")
				if u := s.get(t, prefix, "api").Usage; u == nil || u.Remaining != 20 {
					t.Errorf("after reset: %+v", u)
				}

				code, _, stderr = s.command(t, prefix, "delete", "api") // tests are not on a terminal
				if code != exitUsage || !strings.Contains(stderr, "confirm with --yes") {
					t.Errorf("delete without --yes: exit %d\n%s", code, stderr)
				}
				s.get(t, prefix, "api") // still there
				s.must(t, prefix, "delete", "--yes", "api")
				for _, args := range [][]string{{"get", "api"}, {"delete", "--yes", "api"}, {"reset", "api"}, {"expire", "api", "1m"}} {
					code, _, stderr := s.command(t, prefix, args[0], args[1:]...)
					if code != exitNotFound || !strings.Contains(stderr, `no limiter "api"`) {
						t.Errorf("%v after delete: exit %d\n%s", args, code, stderr)
					}
				}
				if keys := keysUnder(t, s.rdb, prefix); len(keys) != 0 {
					t.Errorf("keys left: %v", keys)
				}
			})
		}
	})
}

// TestGetWritesNothing: get and ls leave every key as it was, byte for byte
// and with the same expiry, for each algorithm, Overall and PerClient,
// stored or on a default.
func TestGetWritesNothing(t *testing.T) {
	ctx := context.Background()
	eachServer(t, func(t *testing.T, s server) {
		for _, alg := range algorithms {
			for _, perClient := range []bool{false, true} {
				for _, stored := range []bool{true, false} {
					t.Run(fmt.Sprintf("%s/per-client=%v/stored=%v", alg.name, perClient, stored), func(t *testing.T) {
						prefix := newPrefix()
						cfg := redlimit.PerHour(10)
						if perClient {
							cfg.Type = redlimit.PerClient
						}
						for i, id := range []string{"alice", "bob"} {
							l := alg.limiter(redlimit.New(s.rdb, redlimit.WithPrefix(prefix), redlimit.WithClientID(id)), "api")
							if stored {
								if err := l.SetRate(ctx, cfg); err != nil {
									t.Fatal(err)
								}
							} else {
								l = l.WithDefault(cfg)
							}
							if ok, err := l.TryAcquire(ctx, int64(3-i)); !ok || err != nil {
								t.Fatalf("TryAcquire: %v %v", ok, err)
							}
						}
						before := snapshot(t, s, prefix)

						assume := []string{"--rate", "10", "--per", "1h"}
						if perClient {
							assume = append(assume, "--per-client")
						}
						rep := s.get(t, prefix, "api")
						s.must(t, prefix, "get", "api")
						text := s.must(t, prefix, "get", append([]string{"api"}, assume...)...)
						assumed := s.get(t, prefix, "api", assume...)
						s.must(t, prefix, "ls")
						s.ls(t, prefix)

						after := snapshot(t, s, prefix)
						if len(before) == 0 || !maps.Equal(before, after) {
							t.Errorf("keys changed:\nbefore %q\nafter  %q", before, after)
						}

						// What get saw.
						if rep.Algorithm != alg.name {
							t.Errorf("algorithm %q", rep.Algorithm)
						}
						if stored != (rep.Config != nil) || stored && !is(rep.Config, cfg) {
							t.Errorf("config %+v", rep.Config)
						}
						if !stored && (rep.Usage != nil || !is(assumed.Assumed, cfg)) {
							t.Errorf("without a stored config: usage %+v, assumed %+v", rep.Usage, assumed.Assumed)
						}
						if !perClient {
							if u := assumed.Usage; u == nil || u.Remaining != 10-3-2 || len(assumed.Clients) != 0 {
								t.Errorf("usage %+v, clients %+v: want 5 of 10 remaining", u, assumed.Clients)
							}
							return
						}
						want := []limitUsage{{Client: "alice", Limit: 10, Remaining: 7}, {Client: "bob", Limit: 10, Remaining: 8}}
						if assumed.Usage != nil || len(assumed.Clients) != 2 {
							t.Fatalf("usage %+v, clients %+v", assumed.Usage, assumed.Clients)
						}
						for _, line := range []string{"2 clients (PerClient):", "  alice  7 of 10; a permit is free now; full again in", "  bob    8 of 10; a permit is free now"} {
							if !strings.Contains(text, line) {
								t.Errorf("get lacks %q:\n%s", line, text)
							}
						}
						for i, c := range assumed.Clients {
							if c.Client != want[i].Client || c.Limit != want[i].Limit || c.Remaining != want[i].Remaining || c.ResetAfterMS <= 0 {
								t.Errorf("client %d: %+v, want %+v", i, c, want[i])
							}
						}
						if !stored && (len(rep.Clients) != 2 || rep.Clients[0].Client != "alice" || rep.Clients[0].Limit != -1) {
							t.Errorf("clients without a config: %+v", rep.Clients)
						}
					})
				}
			}
		}
	})
}

// snapshot reads every key under prefix: its type, contents and absolute
// expiry. On a real server, DUMP gives the exact bytes and PEXPIRETIME the
// expiry; miniredis dumps only strings, and its TTLs stand still unless a
// test moves its clock, so PTTL is exact there.
func snapshot(t *testing.T, s server, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	snap := map[string]string{}
	for _, key := range keysUnder(t, s.rdb, prefix) {
		typ := s.rdb.Type(ctx, key).Val()
		var v string
		switch typ {
		case "string":
			v = s.rdb.Get(ctx, key).Val()
		case "hash":
			h := s.rdb.HGetAll(ctx, key).Val()
			v = fmt.Sprint(h) // fmt sorts map keys
		case "zset":
			v = fmt.Sprint(s.rdb.ZRangeWithScores(ctx, key, 0, -1).Val())
		}
		expiry := s.rdb.PTTL(ctx, key).Val().String()
		if s.real {
			v += " dump " + strconv.Quote(s.rdb.Dump(ctx, key).Val())
			at, err := s.rdb.Do(ctx, "PEXPIRETIME", key).Int64()
			if err != nil {
				// Redis 6.2 has no PEXPIRETIME, and PTTL moves between two snapshots.
				t.Skipf("no exact expiry to compare: PEXPIRETIME: %v", err)
			}
			expiry = strconv.FormatInt(at, 10)
		}
		snap[key] = typ + " " + v + " expiry " + expiry
	}
	return snap
}

// keysUnder lists the keys under prefix, on every primary of a Cluster.
func keysUnder(t *testing.T, rdb redis.UniversalClient, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	var keys []string
	var mu sync.Mutex // a Cluster's primaries are scanned concurrently
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, globEscape(prefix)+"*", 100).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, scan)
	} else {
		err = scan(ctx, rdb.(*redis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

// TestLs: every kind of limiter ls should list, and the keys it should not.
func TestLs(t *testing.T) {
	ctx := context.Background()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	eachServer(t, func(t *testing.T, s server) {
		prefix := newPrefix()
		client := redlimit.New(s.rdb, redlimit.WithPrefix(prefix), redlimit.WithClientID("host:1"))
		stored := map[string]struct {
			l   *redlimit.Limiter
			cfg redlimit.Config
		}{
			"a":      {client.FixedWindow("a"), redlimit.PerHour(10)},
			"b":      {client.SlidingWindow("b"), redlimit.Config{Rate: 5, Interval: time.Minute, Buckets: 6}},
			"c":      {client.Funnel("c"), redlimit.Config{Type: redlimit.PerClient, Rate: 2, Interval: time.Second, Burst: 3}},
			"d":      {client.TokenBucket("d"), redlimit.Config{Rate: 7, Interval: time.Hour, KeepAlive: 2 * time.Hour}},
			"{g}:h":  {client.TokenBucket("{g}:h"), redlimit.PerHour(1)},
			"user:1": {client.FixedWindow("user:1"), redlimit.PerMinute(60)},
			"user:2": {client.FixedWindow("user:2"), redlimit.PerMinute(60)},
			"cal":    {client.FixedWindow("cal"), redlimit.PerMinute(5).And(redlimit.PerMonthFrom(100, berlin, 31))},
		}
		for _, x := range stored {
			if err := x.l.SetRate(ctx, x.cfg); err != nil {
				t.Fatal(err)
			}
			if _, err := x.l.TryAcquire(ctx, 1); err != nil { // state keys too: :value, :permits, :tat:host:1, :clients
				t.Fatal(err)
			}
		}
		// On a default: a fixed window counts in its hash, so ls shows it;
		// a token bucket keeps no hash.
		for _, l := range []*redlimit.Limiter{client.FixedWindow("e"), client.TokenBucket("f")} {
			if _, err := l.WithDefault(redlimit.PerHour(3)).TryAcquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
		s.rdb.HSet(ctx, prefix+"{junk}", "foo", "bar") // a hash that is no limiter's
		s.rdb.Set(ctx, prefix+"{str}", "x", time.Hour)

		got := s.ls(t, prefix)
		names := slices.Sorted(func(yield func(string) bool) {
			for n := range got {
				if !yield(n) {
					return
				}
			}
		})
		// f, a token bucket on a default, is listed by its state keys.
		if want := []string{"a", "b", "c", "cal", "d", "e", "f", "user:1", "user:2", "{g}:h"}; !slices.Equal(names, want) {
			t.Errorf("ls: %q, want %q", names, want)
		}
		for name, x := range stored {
			if l := got[name]; !is(l.Config, x.cfg) || l.Key != x.l.Name() {
				t.Errorf("%s: %+v, config %+v", name, l, l.Config)
			}
		}
		if got["c"].Algorithm != "funnel" || got["b"].Algorithm != "sliding_window" || got["d"].Algorithm != "tokenbucket" {
			t.Errorf("algorithms: %+v", got)
		}
		if e := got["e"]; e.Algorithm != "fixed_window" || e.Config != nil {
			t.Errorf("e: %+v", e)
		}
		if out, want := s.must(t, prefix, "ls", "cal"), "5 per 1m0s and 100 per month from day 31 in Europe/Berlin"; !strings.Contains(out, want) {
			t.Errorf("ls cal: %q, want %q in it", out, want)
		}
		if out := s.must(t, prefix, "ls", "e"); !strings.Contains(out, "none stored (runs on its handles' default)") {
			t.Errorf("ls e: %q", out)
		}
		// get finds the token bucket without a hash.
		if rep := s.get(t, prefix, "f"); rep.Algorithm != "tokenbucket" || rep.Config != nil {
			t.Errorf("get f: %+v", rep)
		}

		if got := s.ls(t, prefix, "user:*"); len(got) != 2 || got["user:1"].Name == "" || got["user:2"].Name == "" {
			t.Errorf("ls user:*: %+v", got)
		}
		if got := s.ls(t, prefix, "--count", "1"); len(got) != 10 {
			t.Errorf("ls --count 1: %d limiters, want 10", len(got))
		}
	})
}

// TestRedisson: a token bucket written by Redisson (redistest.WriteRedisson,
// as in the library's TestWeReadRedissons) shows and changes
// like one of ours, and stays in Redisson's layout.
func TestRedisson(t *testing.T) {
	ctx := context.Background()
	eachServer(t, func(t *testing.T, s server) {
		name := uniqueName("redisson-")
		redistest.WriteRedisson(ctx, s.rdb, name, s.rdb.Time(ctx).Val())

		rep := s.get(t, "", name)
		if rep.Algorithm != "tokenbucket" || rep.Key != name || !is(rep.Config, redlimit.Per(5, 10*time.Second)) {
			t.Errorf("get: %+v, config %+v", rep, rep.Config)
		}
		if u := rep.Usage; u == nil || u.Remaining != 2 || u.Limit != 5 || u.ResetAfterMS < 8000 || u.ResetAfterMS > 9000 {
			t.Errorf("usage: %+v, want 2 of 5, full in 9s", rep.Usage)
		}
		if got := s.ls(t, "", name); got[name].Algorithm != "tokenbucket" || got[name].Config == nil || got[name].Config.Rate != 5 {
			t.Errorf("ls: %+v", got)
		}

		s.must(t, "", "set", name, "--rate", "8", "--per", "10s")
		want := map[string]string{"rate": "8", "interval": "10000", "type": "0", "keepAliveTime": "0"}
		if h := s.rdb.HGetAll(ctx, name).Val(); !maps.Equal(h, want) {
			t.Errorf("hash after set: %v, want Redisson's %v", h, want)
		}
		if u := s.get(t, "", name).Usage; u == nil || u.Remaining != 5 {
			t.Errorf("after set: %+v, want 8-3 = 5", u)
		}
		s.must(t, "", "delete", "--yes", name)
		if n := s.rdb.Exists(ctx, name, "{"+name+"}:value", "{"+name+"}:permits").Val(); n != 0 {
			t.Errorf("%d keys left", n)
		}
	})
}

// TestDeleteAsks: on a terminal, delete asks and only "y" deletes.
func TestDeleteAsks(t *testing.T) {
	m := miniredis.RunT(t)
	s := server{flags: []string{"--redis", "redis://" + m.Addr()}}
	prefix := newPrefix()
	s.must(t, prefix, "set", "api", "--rate", "1", "--per", "1s", "--algorithm", "funnel")
	answer := "n\n"
	saved := terminalInput
	terminalInput = func() (io.Reader, bool) { return strings.NewReader(answer), true }
	t.Cleanup(func() { terminalInput = saved })

	code, stdout, _ := s.command(t, prefix, "delete", "api")
	if code != exitFail || !strings.Contains(stdout, "Delete the funnel limiter api (key "+prefix+"{api}) and all its usage? [y/N] Nothing deleted.") || !m.Exists(prefix+"{api}") {
		t.Errorf("answered n: exit %d %q", code, stdout)
	}
	answer = "y\n"
	if code, stdout, _ := s.command(t, prefix, "delete", "api"); code != exitOK || m.Exists(prefix+"{api}") {
		t.Errorf("answered y: exit %d %q", code, stdout)
	}

	// An in-flight limit: its holds go too.
	s.must(t, prefix, "set", "jobs", "--limit", "2", "--ttl", "1m")
	answer = "n\n"
	code, stdout, _ = s.command(t, prefix, "delete", "jobs")
	if want := "Delete the in-flight limit jobs (key " + prefix + "{jobs}) and all its holds? [y/N] Nothing deleted.\n"; code != exitFail || stdout != want || !m.Exists(prefix+"{jobs}") {
		t.Errorf("answered n: exit %d %q, want %q", code, stdout, want)
	}
	answer = "yes\n"
	if code, stdout, _ := s.command(t, prefix, "delete", "jobs"); code != exitOK || m.Exists(prefix+"{jobs}") {
		t.Errorf("answered yes: exit %d %q", code, stdout)
	}
}

func TestAdminCommandLine(t *testing.T) {
	m := miniredis.RunT(t)
	r := "redis://" + m.Addr()
	tests := []struct {
		args     []string
		code     int
		inOutput string
	}{
		{[]string{"get", "api"}, exitUsage, "name the Redis holding the limiters"},
		{[]string{"get", "--redis", r}, exitUsage, "want one NAME, got 0"},
		{[]string{"get", "--redis", r, "a", "b"}, exitUsage, "want one NAME, got 2"},
		{[]string{"get", "--redis", r, "-h"}, exitOK, "It writes nothing"},
		{[]string{"get", "--redis", r, "nope"}, exitNotFound, `no limiter "nope"`},
		{[]string{"get", "--redis", r, "--json", "nope"}, exitNotFound, `no limiter "nope"`},
		{[]string{"get", "--redis", r, "a{"}, exitUsage, "invalid limiter name"},
		{[]string{"get", "--redis", "redis://127.0.0.1:1", "api"}, exitFail, "cannot reach"},
		{[]string{"get", "--sentinel", "127.0.0.1:1", "api"}, exitUsage, "--sentinel and --master go together"},
		{[]string{"ls", "--redis", r, "--cluster", "x:1"}, exitUsage, "cannot be used together"},
		{[]string{"ls", "--redis", r, "a", "b"}, exitUsage, "want at most one PATTERN"},
		{[]string{"ls", "--redis", r, "--count", "0"}, exitUsage, "--count 0"},
		{[]string{"set", "--redis", r, "api", "--rate", "1"}, exitUsage, "--per is required"},
		{[]string{"set", "--redis", r, "api", "--per", "1s"}, exitUsage, "--rate is required"},
		{[]string{"set", "--redis", r, "api", "--rate", "1", "--per", "0s"}, exitUsage, "invalid config"},
		{[]string{"get", "--redis", r, "api", "--rate", "1"}, exitUsage, "--per is required"},
		{[]string{"set", "--redis", r, "api"}, exitUsage, "want --rate and --per, or --limit and --ttl"},
		{[]string{"set", "--redis", r, "api", "--rate", "1", "--per", "1s", "--algorithm", "leaky"}, exitUsage, `unknown algorithm "leaky"`},
		{[]string{"set", "--redis", r, "api", "--rate", "1", "--per", "1s", "--algorithm", "fixed_window", "--burst", "5"}, exitUsage, "only a funnel has a burst"},
		{[]string{"set", "--redis", r, "api", "--rate", "1", "--per", "1s", "--json"}, exitUsage, "flag provided but not defined: -json"},
		{[]string{"set", "--redis", r, "rates", "--rate", "1", "--per", "1s", "--and", "100"}, exitUsage, "want N/PERIOD, such as 1000/1h"},
		{[]string{"set", "--redis", r, "rates", "--rate", "1", "--per", "1s", "--and", "x/1h"}, exitUsage, `rate "x" is not an integer`},
		{[]string{"set", "--redis", r, "rates", "--rate", "1", "--per", "1s", "--and", "100/soon"}, exitUsage, `period "soon"`},
		{[]string{"set", "--redis", r, "rates", "--rate", "1", "--per", "1s", "--and", "100/1h,size=3"}, exitUsage, `unknown option "size=3"`},
		{[]string{"set", "--redis", r, "rates", "--rate", "1", "--per", "1s", "--and", "100/1h,burst=many"}, exitUsage, `burst "many" is not an integer`},
		{[]string{"set", "--redis", r, "rates", "--rate", "10", "--per", "1s", "--and", "5/1m"}, exitUsage, "5 per 1m0s grants no more than 10 per 1s"},
		{[]string{"set", "--redis", r, "rates", "--rate", "10", "--per", "1s", "--and", "100/1h,burst=5", "--algorithm", "fixed_window"}, exitUsage, "only a funnel has a burst"},
		// In-flight limits: --limit and --ttl go together, and with no rate flag.
		{[]string{"set", "--redis", r, "jobs", "--limit", "5"}, exitUsage, "--ttl is required with --limit"},
		{[]string{"set", "--redis", r, "jobs", "--ttl", "5s"}, exitUsage, "--limit is required with --ttl"},
		{[]string{"set", "--redis", r, "jobs", "--algorithm", "inflight"}, exitUsage, "want --limit and --ttl"},
		{[]string{"set", "--redis", r, "jobs", "--limit", "0", "--ttl", "5s"}, exitUsage, "redlimit set: invalid config: limit 0 is outside 1..100000\n"},
		{[]string{"set", "--redis", r, "jobs", "--limit", "100001", "--ttl", "5s"}, exitUsage, "limit 100001 is outside 1..100000"},
		{[]string{"set", "--redis", r, "jobs", "--limit", "5", "--ttl", "1500us"}, exitUsage, "ttl 1.5ms is not a whole number of milliseconds"},
		{[]string{"set", "--redis", r, "jobs", "--limit", "5", "--ttl", "0s"}, exitUsage, "ttl 0s is below 1ms"},
		{[]string{"set", "--redis", r, "jobs", "--limit", "five", "--ttl", "5s"}, exitUsage, `invalid value "five" for flag -limit`},
		{[]string{"set", "--redis", r, "jobs", "--limit", "5", "--ttl", "5s", "--rate", "3"}, exitUsage, "--limit is an in-flight limit's, --rate a rate limiter's: give one or the other"},
		{[]string{"set", "--redis", r, "jobs", "--ttl", "5s", "--and", "5/1h"}, exitUsage, "--ttl is an in-flight limit's, --and a rate limiter's"},
		{[]string{"set", "--redis", r, "jobs", "--limit", "5", "--ttl", "5s", "--per-client"}, exitUsage, "--limit is an in-flight limit's, --per-client a rate limiter's"},
		{[]string{"set", "--redis", r, "jobs", "--rate", "1", "--per", "1s", "--algorithm", "inflight"}, exitUsage, "--algorithm inflight takes --limit and --ttl, not --rate"},
		{[]string{"set", "--redis", r, "jobs", "--limit", "5", "--ttl", "5s", "--algorithm", "funnel"}, exitUsage, "--limit is an in-flight limit's: --algorithm funnel takes --rate and --per"},
		{[]string{"set", "--redis", r, "jobs", "--limit", "5", "--ttl", "5s", "--algorithm", "leaky"}, exitUsage, `unknown algorithm "leaky": want one of fixed_window, sliding_window, tokenbucket, funnel, inflight`},
		{[]string{"set", "--redis", r, "--limit", "5", "--ttl", "5s", "a{"}, exitUsage, "invalid limiter name"},
		{[]string{"expire", "--redis", r, "api"}, exitUsage, "want 2 arguments, got 1"},
		{[]string{"expire", "--redis", r, "api", "0"}, exitUsage, "to delete, use redlimit delete"},
		{[]string{"expire", "--redis", r, "api", "soon"}, exitUsage, `DURATION "soon"`},
		{[]string{"expire", "--redis", r, "api", "1m"}, exitNotFound, `no limiter "api"`},
		{[]string{"reset", "--redis", r, "--", "-api"}, exitNotFound, `no limiter "-api"`},
		{[]string{"delete", "--redis", r, "--yes", "api"}, exitNotFound, `no limiter "api"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCommand(t, tt.args...)
			if code != tt.code || !strings.Contains(stdout+stderr, tt.inOutput) {
				t.Errorf("exit %d, want %d; output should contain %q:\n%s%s", code, tt.code, tt.inOutput, stdout, stderr)
			}
		})
	}
	m.Set("str", "x")
	if code, _, stderr := runCommand(t, "get", "--redis", r, "str"); code != exitFail || !strings.Contains(stderr, "str is a string, not a limiter's hash") {
		t.Errorf("get on a string: exit %d %s", code, stderr)
	}
}

// TestAdminOnSentinel: the commands find the primary through the sentinels.
func TestAdminOnSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and three sentinels")
	}
	sen := redistest.StartSentinel(t)
	s := server{flags: []string{"--sentinel", strings.Join(sen.SentinelAddrs(), ","), "--master", redistest.SentinelMaster}, rdb: sen.Client(t), real: true}
	prefix := newPrefix()
	s.must(t, prefix, "set", "api", "--rate", "4", "--per", "1m", "--algorithm", "sliding_window", "--buckets", "6")
	if rep := s.get(t, prefix, "api"); rep.Config == nil || rep.Config.Buckets != 6 || rep.Usage == nil || rep.Usage.Remaining != 4 {
		t.Errorf("get: %+v", rep)
	}
	if got := s.ls(t, prefix); len(got) != 1 || got["api"].Algorithm != "sliding_window" {
		t.Errorf("ls: %+v", got)
	}
	// The sentinels as one URL, as go-redis's ParseFailoverURL reads it.
	addrs := sen.SentinelAddrs()
	url := "redis://" + addrs[0] + "?master_name=" + redistest.SentinelMaster
	for _, addr := range addrs[1:] {
		url += "&addr=" + addr
	}
	s.flags = []string{"--sentinel", url}
	if got := s.ls(t, prefix); len(got) != 1 || got["api"].Algorithm != "sliding_window" {
		t.Errorf("ls with --sentinel %s: %+v", url, got)
	}
	s.must(t, prefix, "delete", "--yes", "api")
}

// TestAddressForms: --redis and --cluster take host:port as well as a URL
// (the issue's --redis localhost:6399 failed with "invalid URL scheme").
func TestAddressForms(t *testing.T) {
	eachServer(t, func(t *testing.T, s server) {
		switch addr := s.flags[1]; s.flags[0] {
		case "--redis":
			s.flags[1] = strings.TrimPrefix(addr, "redis://")
		case "--cluster":
			seeds := strings.Split(addr, ",")
			s.flags[1] = "redis://" + seeds[0] + "?addr=" + strings.Join(seeds[1:], "&addr=")
		}
		prefix := newPrefix()
		s.must(t, prefix, "set", "api", "--rate", "4", "--per", "1m", "--algorithm", "funnel")
		if rep := s.get(t, prefix, "api"); rep.Config == nil || rep.Config.Rate != 4 {
			t.Errorf("get with %v: %+v", s.flags, rep)
		}
	})
}

// TestLsMillionKeys: ls over many limiters, on a server of its own,
// answers every one; never calls KEYS; SCANs with COUNT, each call short;
// with --scan-order, streams (its first line comes out while most of the
// keyspace is still to scan) and holds one batch in memory, not every
// name; sorted (the default), holds a few megabytes of lines, spilling
// sorted runs to disk, and prints every line in order. 200,000 keys by
// default, to spare shared CI cores; REDLIMIT_LS_KEYS=1000000 for the
// million the issue names.
func TestLsMillionKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a redis-server with hashes")
	}
	n := 200_000
	if s := os.Getenv("REDLIMIT_LS_KEYS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 10_000 {
			t.Fatalf("REDLIMIT_LS_KEYS=%q: want a number of at least 10000", s)
		}
	}
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	start := time.Now()
	// Names of about 200 bytes: held all at once, n of them would weigh
	// n × (200 + a 16-byte header), over 43 MB at 200,000.
	fill := redis.NewScript(`for i = ARGV[1], ARGV[2] do
  redis.call('HSET', 'm:{' .. string.rep('n', 190) .. i .. '}', 'rate', '10', 'interval', '60000')
end
return 1`)
	for from := 1; from <= n; from += 50_000 {
		if err := fill.Run(ctx, rdb, nil, from, min(from+50_000-1, n)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d hashes written in %v", n, time.Since(start).Round(time.Millisecond))
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	// The live heap, measured from inside ls's writes: ls waits for them,
	// so the collector sees what it holds, not what it is allocating.
	liveHeap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	base := liveHeap()
	var peak uint64
	out := &lineCounter{every: n / 10, sample: func(lines int) {
		if lines == 0 { // the SCANs so far, when the first line comes out
			c := scanCalls(t, rdb)
			scansAtFirstLine = &c
			return
		}
		peak = max(peak, liveHeap())
	}}
	scansAtFirstLine = nil
	start = time.Now()
	var errOut strings.Builder
	code := run(ctx, []string{"ls", "--scan-order", "--redis", "redis://" + srv.Addr(), "--prefix", "m:"}, out, &errOut)
	elapsed := time.Since(start)
	if code != exitOK || out.n != n {
		t.Fatalf("exit %d, %d lines, want %d: %s", code, out.n, n, errOut.String())
	}
	grew := int64(peak) - int64(base)
	t.Logf("ls: %d limiters in %v; live heap peaked %.1f MB above its start", n, elapsed.Round(time.Millisecond), float64(grew)/(1<<20))
	if grew > 16<<20 {
		t.Errorf("heap grew by %d MB listing the limiters: it should hold one batch", grew>>20)
	}

	stats := rdb.Info(ctx, "commandstats").Val()
	if strings.Contains(stats, "cmdstat_keys:") {
		t.Errorf("ls called KEYS:\n%s", stats)
	}
	scans := scanCalls(t, rdb)
	if scans < n/2000 {
		t.Errorf("%d SCAN calls for %d keys: want about one per thousand", scans, n)
	}
	if scansAtFirstLine == nil || *scansAtFirstLine > scans/10 {
		t.Errorf("the first line came after %v of %d SCAN calls: ls should print as it scans", scansAtFirstLine, scans)
	}
	// Time in Redis per call, averaged: what ls costs other clients. A
	// KEYS takes them all in one call: hundreds of milliseconds at a million.
	// (SLOWLOG, per call, also counts the moments a busy machine takes the
	// CPU from Redis.)
	for _, cmd := range []string{"scan", "hmget"} {
		m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=\d+,usec=\d+,usec_per_call=([\d.]+)`).FindStringSubmatch(stats)
		if m == nil {
			t.Fatalf("no %s in commandstats:\n%s", cmd, stats)
		}
		if us, _ := strconv.ParseFloat(m[1], 64); us > 20_000 {
			t.Errorf("%s: %.0fµs per call", cmd, us)
		} else {
			t.Logf("%s: %.0fµs per call in Redis", cmd, us)
		}
	}

	// Sorted: the heap sampled at each spill, at its fullest, and as the
	// merge writes.
	peak = 0
	spills := 0
	spillHook = func() { spills++; peak = max(peak, liveHeap()) }
	t.Cleanup(func() { spillHook = nil })
	sorted := &lineCounter{every: n / 10, ordered: true, sample: func(lines int) {
		if lines > 0 {
			peak = max(peak, liveHeap())
		}
	}}
	start = time.Now()
	code = run(ctx, []string{"ls", "--redis", "redis://" + srv.Addr(), "--prefix", "m:"}, sorted, &errOut)
	elapsed = time.Since(start)
	if code != exitOK || sorted.n != n || sorted.disorder != 0 {
		t.Fatalf("exit %d, %d lines (%d out of order), want %d in order: %s", code, sorted.n, sorted.disorder, n, errOut.String())
	}
	grew = int64(peak) - int64(base)
	t.Logf("ls, sorted: %d limiters in %v, %d runs spilled; live heap peaked %.1f MB above its start", n, elapsed.Round(time.Millisecond), spills, float64(grew)/(1<<20))
	if spills == 0 || grew > 16<<20 {
		t.Errorf("%d runs spilled, heap grew by %d MB: ls should hold a few MB of lines", spills, grew>>20)
	}
}

// scansAtFirstLine is how many SCANs Redis had answered when ls wrote its first line.
var scansAtFirstLine *int

func scanCalls(t *testing.T, rdb *redis.Client) int {
	m := regexp.MustCompile(`cmdstat_scan:calls=(\d+)`).FindStringSubmatch(rdb.Info(context.Background(), "commandstats").Val())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// lineCounter counts the lines written to it, and keeps none. It calls
// sample before the first line, and whenever the count passes a multiple of every.
// With ordered, it counts the lines that come before the one written
// before them (disorder), keeping that one.
type lineCounter struct {
	n, every int
	sample   func(lines int)

	ordered       bool
	last, partial []byte
	disorder      int
}

func (c *lineCounter) Write(p []byte) (int, error) {
	if c.n == 0 {
		c.sample(0)
	}
	if c.ordered {
		rest := append(c.partial, p...)
		for {
			line, after, found := bytes.Cut(rest, []byte{'\n'})
			if !found {
				break
			}
			if bytes.Compare(c.last, line) > 0 {
				c.disorder++
			}
			c.last, rest = append(c.last[:0], line...), after
		}
		c.partial = append(c.partial[:0:0], rest...)
	}
	before := c.n
	c.n += bytes.Count(p, []byte{'\n'})
	if c.n/c.every > before/c.every {
		c.sample(c.n)
	}
	return len(p), nil
}

// TestSeveralRates: set stores further rates (--and), get and ls show them
// and write nothing, and get names the rate its numbers are of.
func TestSeveralRates(t *testing.T) {
	ctx := context.Background()
	eachServer(t, func(t *testing.T, s server) {
		for _, alg := range algorithms {
			t.Run(alg.name, func(t *testing.T) {
				prefix := newPrefix()
				// Each algorithm's own option on the further rate too.
				option, day, dayLimit := "", redlimit.Per(5, 24*time.Hour), int64(5)
				switch alg.name {
				case "funnel":
					option, day.Burst, dayLimit = ",burst=4", 4, 4
				case "sliding_window":
					option, day.Buckets = ",buckets=4", 4
				}
				s.must(t, prefix, "set", "api", "--rate", "3", "--per", "1h", "--and", "5/24h"+option, "--algorithm", alg.name)
				want := redlimit.PerHour(3).And(day)
				l := alg.limiter(redlimit.New(s.rdb, redlimit.WithPrefix(prefix)), "api")
				if cfg, err := l.Config(ctx); err != nil || !reflect.DeepEqual(cfg, want) {
					t.Fatalf("stored %v %v, want %v", cfg, err, want)
				}
				if ok, err := l.TryAcquire(ctx, 3); !ok || err != nil {
					t.Fatalf("TryAcquire: %v %v", ok, err)
				}

				before := snapshot(t, s, prefix)
				// The hour has none left, the day some: the hour binds.
				rep := s.get(t, prefix, "api")
				text := s.must(t, prefix, "get", "api")
				lines := s.ls(t, prefix)
				listed := s.must(t, prefix, "ls")
				if after := snapshot(t, s, prefix); len(before) == 0 || !maps.Equal(before, after) {
					t.Errorf("keys changed:\nbefore %q\nafter  %q", before, after)
				}
				if !is(rep.Config, want) || !is(lines["api"].Config, want) || len(rep.Config.More) != 1 {
					t.Errorf("get %+v, ls %+v: want %v", rep.Config, lines["api"].Config, want)
				}
				if u := rep.Usage; u == nil || u.Bound != 0 || u.Limit != 3 || u.Remaining != 0 || u.RetryAfterMS <= 0 {
					t.Errorf("usage %+v: want 0 of 3 left, bound by the hour", u)
				}
				if wantLine := "api " + alg.name + " " + want.String(); strings.Join(strings.Fields(listed), " ") != wantLine {
					t.Errorf("ls: %q, want %q", listed, wantLine)
				}
				for _, line := range []string{"config     " + want.String() + "  (stored)", "remaining  0 of 3; next permit in ", "; 3 per 1h0m0s binds\n"} {
					if !strings.Contains(text, line) {
						t.Errorf("get lacks %q:\n%s", line, text)
					}
				}

				// A new interval starts that rate afresh; the day keeps its
				// usage, and now binds with the fewest permits left. The
				// token bucket keeps every rate's usage: its logs hold each
				// grant's time, which counts under any interval.
				s.must(t, prefix, "set", "api", "--rate", "3", "--per", "30m", "--and", "5/24h"+option)
				bound, limit, left, binds := 1, dayLimit, dayLimit-3, day.String()
				if alg.name == "tokenbucket" {
					bound, limit, left, binds = 0, 3, 0, "3 per 30m0s"
				}
				if u := s.get(t, prefix, "api").Usage; u == nil || u.Bound != bound || u.Limit != limit || u.Remaining != left {
					t.Errorf("usage %+v: want %d of %d left, bound by rate %d", u, left, limit, bound)
				}
				if text := s.must(t, prefix, "get", "api"); !strings.Contains(text, "; "+binds+" binds\n") {
					t.Errorf("get does not say %s binds:\n%s", binds, text)
				}
			})
		}

		// A further rate ls cannot read is corrupt, as the scripts find it.
		prefix := newPrefix()
		s.rdb.HSet(ctx, prefix+"{bad}", "rate", "1", "interval", "1000", "algorithm", "funnel", "more", "5 60000 0")
		if l := s.ls(t, prefix)["bad"]; l.Corrupt != `field more = "5 60000 0"` || l.Config != nil {
			t.Errorf("ls of a corrupt more: %+v", l)
		}
	})
}

// Calendar quotas from the command line: --per and --and take a calendar
// period as Calendar writes it; get and ls print it; an algorithm with no
// windows refuses it, storing nothing.
func TestCalendarRates(t *testing.T) {
	ctx := context.Background()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	eachServer(t, func(t *testing.T, s server) {
		prefix := newPrefix()
		s.must(t, prefix, "set", "api", "--rate", "10", "--per", "1s", "--and", "10000/month:31:America/New_York", "--algorithm", "fixed_window")
		want := redlimit.PerSecond(10).And(redlimit.PerMonthFrom(10000, ny, 31))
		l := redlimit.New(s.rdb, redlimit.WithPrefix(prefix)).FixedWindow("api")
		if cfg, err := l.Config(ctx); err != nil || cfg.String() != want.String() {
			t.Fatalf("stored %v %v, want %v", cfg, err, want)
		}
		if text := s.must(t, prefix, "get", "api"); !strings.Contains(text, "10 per 1s and 10000 per month from day 31 in America/New_York  (stored)") {
			t.Errorf("get:\n%s", text)
		}
		if rep := s.get(t, prefix, "api"); rep.Config == nil || len(rep.Config.More) != 1 || rep.Config.More[0].Calendar.String() != "month from day 31 in America/New_York" {
			t.Errorf("get --json: %+v", rep.Config)
		}
		s.must(t, prefix, "set", "daily", "--rate", "100", "--per", "day:0:Europe/Berlin", "--algorithm", "fixed_window")
		if listed := s.must(t, prefix, "ls", "daily"); !strings.Contains(listed, "100 per day in Europe/Berlin") {
			t.Errorf("ls: %q", listed)
		}
		for _, args := range [][]string{
			{"set", "f", "--rate", "100", "--per", "day:0:Europe/Berlin", "--algorithm", "funnel"},
			{"set", "g", "--rate", "100", "--per", "day:0:Mars/Olympus"},
			{"set", "h", "--rate", "1", "--per", "1s", "--and", "5/month:32:UTC", "--algorithm", "fixed_window"},
		} {
			if code, _, _ := s.command(t, prefix, args[0], args[1:]...); code == exitOK {
				t.Errorf("%q: accepted", args)
			}
		}
		if got := s.ls(t, prefix); len(got) != 2 {
			t.Errorf("ls: %d limiters, want 2 (nothing stored for the refused)", len(got))
		}
	})
}

// TestStringOwner: the command tells which algorithm wrote a string at a
// limiter's key (a flat state, one part per rate, or a marker) as the
// library does: ls lists it under the one algorithm whose handle reads it
// without refusing it (ErrNotInitialized: a string, no config), and lists
// nothing when every handle refuses it; get agrees. The command used to
// read flat states with patterns of its own, which took "1,2,3", ";",
// "1 2;3" and "1:2;3" for no algorithm's where the scripts see a funnel's,
// a fixed window's and a sliding window's (corrupt ones, which a decision
// then refuses), and "funnel:1893456000000000" for a funnel's, which the
// scripts refuse outright.
func TestStringOwner(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	s := server{[]string{"--redis", "redis://" + m.Addr()}, rdb, false}
	for value, want := range map[string]string{
		"1700000000000000": "funnel", "1700000000000000;1700000000600000": "funnel", ";1700000000600000": "funnel",
		"1700000000000000,2": "funnel", "1700000000000000,2;1700000000600000": "funnel", "1,2,3": "funnel",
		"1700000000000000,0,1": "funnel", "1700000000000000,2,1;1700000000600000": "funnel", "1,2,1,1": "funnel", // a charge's debt
		"1699999200000 3": "fixed_window", "1699999200000 5;1699999200000 1": "fixed_window",
		"1699999200000:3,1000:2": "sliding_window", "1699999200000:3;": "sliding_window",
		"": "", ";": "funnel", "x": "", "1 2;3": "fixed_window", "1;2 3": "fixed_window", "1:2;3": "sliding_window", "1;x": "",
		"tokenbucket": "tokenbucket", "funnel": "funnel", "sliding_window": "sliding_window", "fixed_window": "fixed_window",
		"funnel:1893456000000000": "", "tokenbucket2": "",
	} {
		prefix := newPrefix()
		rdb.Set(ctx, prefix+"{x}", value, 0)
		library := ""
		for _, alg := range algorithms {
			_, err := alg.limiter(redlimit.New(rdb, redlimit.WithPrefix(prefix)), "x").Config(ctx)
			if errors.Is(err, redlimit.ErrNotInitialized) {
				if library != "" {
					t.Errorf("%q: both %s and %s read it", value, library, alg.name)
				}
				library = alg.name
			}
		}
		if library != want {
			t.Errorf("%q: the library reads it as %q's, want %q", value, library, want)
		}
		if got := s.ls(t, prefix)["x"].Algorithm; got != library {
			t.Errorf("%q: ls lists it as %q's, the library reads it as %q's", value, got, library)
		}
		code, stdout, stderr := s.command(t, prefix, "get", "--json", "x")
		var rep limiterReport
		_ = json.Unmarshal([]byte(stdout), &rep)
		if library == "" && (code != exitFail || !strings.Contains(stderr, "is a string, not a limiter's hash or flat state")) ||
			library != "" && (code != exitOK || rep.Algorithm != library) {
			t.Errorf("%q: get: exit %d, algorithm %q\n%s", value, code, rep.Algorithm, stderr)
		}
	}
}

// TestGetNextPermit: get's retry_after_ms is the wait for one permit, to the
// millisecond, and reset_after_ms the wait until the limiter is full; both
// at exact instants (the limiters decide on a fixed clock, and get reports
// as of one), for each algorithm, Overall and PerClient. The case is
// the token bucket's: 499ms to the next permit, 4999ms to full, where get
// used to report the reset as retry_after_ms.
func TestGetNextPermit(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) // on every window's edge
	type grant struct {
		at      time.Duration
		permits int64
	}
	tests := []struct {
		alg          string
		grants       []grant
		at           time.Duration // get's instant
		retry, reset int64         // ms
	}{
		// 1 then 9 of 10 per 5s: the first comes back 5s after it was
		// granted, the last 5s after it.
		{"tokenbucket", []grant{{0, 1}, {4500 * time.Millisecond, 9}}, 4501 * time.Millisecond, 499, 4999},
		// The window ends at 5s: every permit comes back then.
		{"fixed_window", []grant{{time.Second, 10}}, 4501 * time.Millisecond, 499, 499},
		// A funnel of 10 drains one every 500ms: full at 0s, it has one
		// again at 0.5s, and is empty at 5s.
		{"funnel", []grant{{0, 10}}, 200 * time.Millisecond, 300, 4800},
		// Buckets of 500ms: the 4 of the 1s bucket leave the sum at 6s, the
		// 6 of the 3s bucket at 8s.
		{"sliding_window", []grant{{time.Second, 4}, {3 * time.Second, 6}}, 4501 * time.Millisecond, 1499, 3499},
	}
	eachServer(t, func(t *testing.T, s server) {
		for _, tt := range tests {
			for _, perClient := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/per-client=%v", tt.alg, perClient), func(t *testing.T) {
					prefix := newPrefix()
					now := base
					client := redlimit.New(s.rdb, redlimit.WithPrefix(prefix), redlimit.WithClientID("alice"), redlimit.WithClock(func() time.Time { return now }))
					l := algorithmNamed(tt.alg)(client, "api")
					cfg := redlimit.Per(10, 5*time.Second)
					if perClient {
						cfg.Type = redlimit.PerClient
					}
					if err := l.SetRate(ctx, cfg); err != nil {
						t.Fatal(err)
					}
					for _, g := range tt.grants {
						now = base.Add(g.at)
						if ok, err := l.TryAcquire(ctx, g.permits); !ok || err != nil {
							t.Fatalf("TryAcquire(%d) at %v: %v %v", g.permits, g.at, ok, err)
						}
					}
					now = base.Add(tt.at)
					saved := usageTime
					usageTime = func(context.Context, redis.UniversalClient) (time.Time, error) { return now, nil }
					t.Cleanup(func() { usageTime = saved })

					rep := s.get(t, prefix, "api")
					u := rep.Usage
					if perClient {
						if len(rep.Clients) != 1 || rep.Usage != nil {
							t.Fatalf("usage %+v, clients %+v: want alice's", rep.Usage, rep.Clients)
						}
						u = &rep.Clients[0]
					}
					if u == nil || u.Remaining != 0 || u.Limit != 10 || u.RetryAfterMS != tt.retry || u.ResetAfterMS != tt.reset {
						t.Errorf("usage %+v: want 0 of 10, retry after %dms, reset after %dms", u, tt.retry, tt.reset)
					}
					if want := now.Format(asOfLayout); rep.AsOf != want {
						t.Errorf("as_of %q, want %q", rep.AsOf, want)
					}
					line := fmt.Sprintf("0 of 10; next permit in %v; full again in %v", time.Duration(tt.retry)*time.Millisecond, time.Duration(tt.reset)*time.Millisecond)
					if text := s.must(t, prefix, "get", "api"); !strings.Contains(text, line) {
						t.Errorf("get lacks %q:\n%s", line, text)
					}
					// The library's own wait for one permit, at the same instant.
					if r, err := l.Allow(ctx, 1); err != nil || r.Allowed || ms(r.RetryAfter) != tt.retry {
						t.Errorf("Allow(1): %+v %v: want denied, retry after %dms", r, err, tt.retry)
					}
				})
			}
		}
	})
}

// TestLsDefaults: limiters running on a default are listed by whatever key
// they have: the issue's `ls --prefix pc:` printed nothing for 10 of them.
// Each algorithm Overall (a flat state, or the token bucket's :value) and
// PerClient (the :clients registry); a marker (a string naming the
// algorithm) and a flat state, as the scripts write them;
// a registry whose clients are all full again is counted, not listed.
func TestLsDefaults(t *testing.T) {
	ctx := context.Background()
	eachServer(t, func(t *testing.T, s server) {
		prefix := newPrefix()
		client := redlimit.New(s.rdb, redlimit.WithPrefix(prefix), redlimit.WithClientID("alice"))
		want := map[string]string{}
		for i, alg := range algorithms {
			for j, cfg := range []redlimit.Config{redlimit.PerHour(3), {Type: redlimit.PerClient, Rate: 3, Interval: time.Hour}} {
				name := fmt.Sprintf("pc:%d", 2*i+j)
				if _, err := alg.limiter(client, name).WithDefault(cfg).TryAcquire(ctx, 1); err != nil {
					t.Fatal(err)
				}
				want[name] = alg.name
			}
		}
		// State from before markers (or Redisson's): a token bucket's
		// (pc:4) and a PerClient funnel's (pc:7) state keys alone.
		for _, name := range []string{"pc:4", "pc:7"} {
			if key := prefix + "{" + name + "}"; s.rdb.Type(ctx, key).Val() == "string" {
				s.rdb.Del(ctx, key)
			}
			if n := s.rdb.Exists(ctx, prefix+"{"+name+"}").Val(); n != 0 {
				t.Fatalf("%s has a key of its own", name)
			}
		}
		s.rdb.Set(ctx, prefix+"{pc:8}", "sliding_window", time.Hour)
		s.rdb.Set(ctx, prefix+"{pc:9}", "1893456000000000", time.Hour)
		// A flat state tagged with its algorithm's name is no algorithm's:
		// the scripts refuse it (TestStringOwner).
		s.rdb.Set(ctx, prefix+"{pc:tagged}", "funnel:1893456000000000", time.Hour)
		want["pc:8"], want["pc:9"] = "sliding_window", "funnel"
		s.rdb.ZAdd(ctx, prefix+"{gone}:clients", redis.Z{Score: 1, Member: "bob"})

		for _, pattern := range []string{"pc:*", ""} {
			args := []string{}
			if pattern != "" {
				args = append(args, pattern)
			}
			got := s.ls(t, prefix, args...)
			algs := map[string]string{}
			for name, l := range got {
				algs[name] = l.Algorithm
				if l.Config != nil || l.Key != prefix+"{"+name+"}" {
					t.Errorf("%s: %+v", name, l)
				}
			}
			if !maps.Equal(algs, want) {
				t.Errorf("ls %q: %v\nwant %v", pattern, algs, want)
			}
		}
		code, stdout, stderr := s.command(t, prefix, "ls")
		if code != exitOK || strings.Count(stdout, "none stored (runs on its handles' default)") != 10 ||
			!strings.Contains(stderr, "1 more names have only a PerClient registry") {
			t.Errorf("ls: exit %d\n%s%s", code, stdout, stderr)
		}
		if rep := s.get(t, prefix, "pc:8"); rep.Algorithm != "sliding_window" {
			t.Errorf("get of a marker: %+v", rep)
		}
	})
}

// TestInFlightAdmin takes in-flight limits through every admin command: one
// stored with set, one on its handles' default known only by its holds. The
// holds are taken and the reports made on one fixed clock, so that every
// hold's time left is exact.
func TestInFlightAdmin(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	saved := usageTime
	usageTime = func(context.Context, redis.UniversalClient) (time.Time, error) { return base.Add(2 * time.Second), nil }
	t.Cleanup(func() { usageTime = saved })
	eachServer(t, func(t *testing.T, s server) {
		prefix := newPrefix()
		// An hour's TTL: no hold refreshes itself (every TTL/3) while the
		// test runs, so that the keys stay as they were between snapshots.
		if out := s.must(t, prefix, "set", "jobs", "--limit", "3", "--ttl", "1h"); out != "jobs: inflight now 3 in flight, TTL 1h0m0s\n" {
			t.Errorf("set: %q", out)
		}
		acquire := func(l *redlimit.InFlight) *redlimit.Hold {
			t.Helper()
			h, err := l.TryAcquire(ctx)
			if h == nil || err != nil {
				t.Fatalf("TryAcquire: %v %v", h, err)
			}
			t.Cleanup(func() { _ = h.Release(context.Background()) }) // stops its refreshes
			return h
		}
		clock := redlimit.WithClock(func() time.Time { return base })
		instance := func(id string) *redlimit.Client {
			return redlimit.New(s.rdb, redlimit.WithPrefix(prefix), redlimit.WithClientID(id), clock)
		}
		holds := []*redlimit.Hold{acquire(instance("api-2").InFlight("jobs")), acquire(instance("api-1").InFlight("jobs"))}
		other := acquire(instance("worker").InFlight("reports").WithDefault(redlimit.InFlightConfig{Limit: 4, TTL: time.Hour}))
		ids := []string{holds[0].ID(), holds[1].ID()}
		slices.Sort(ids) // get lists holders by id: api-1's first
		before := snapshot(t, s, prefix)

		text := s.must(t, prefix, "get", "jobs")
		want := "limiter    jobs  (key " + prefix + "{jobs})\n" +
			"algorithm  inflight\n" +
			"config     3 in flight, TTL 1h0m0s  (stored)\n" +
			"held       2 of 3; 1 free\n" +
			"\n" +
			"2 holders, by id:\n" +
			"  " + ids[0] + "  59m58s left\n" +
			"  " + ids[1] + "  59m58s left\n"
		if text != want {
			t.Errorf("get:\n%s\nwant:\n%s", text, want)
		}
		var rep inFlightReport
		if err := json.Unmarshal([]byte(s.must(t, prefix, "get", "--json", "jobs")), &rep); err != nil {
			t.Fatal(err)
		}
		wantRep := inFlightReport{Name: "jobs", Key: prefix + "{jobs}", Algorithm: "inflight", InFlight: &inFlightJSON{Limit: 3, TTLMS: 3_600_000},
			AsOf: "2030-01-01T00:00:02.000Z", Held: 2, Holders: []holderJSON{{ids[0], 3_598_000}, {ids[1], 3_598_000}}}
		if !reflect.DeepEqual(rep, wantRep) {
			t.Errorf("get --json: %+v\nwant %+v", rep, wantRep)
		}
		text = s.must(t, prefix, "get", "reports")
		want = "limiter    reports  (key " + prefix + "{reports})\n" +
			"algorithm  inflight\n" +
			"config     none stored  (it runs on its handles' default)\n" +
			"held       1\n" +
			"\n" +
			"1 holder, by id:\n" +
			"  " + other.ID() + "  59m58s left\n"
		if text != want {
			t.Errorf("get on a default:\n%s\nwant:\n%s", text, want)
		}

		// ls lists both: one by its hash, one by its holds alone.
		listed := s.must(t, prefix, "ls")
		lines := strings.Split(strings.TrimSuffix(listed, "\n"), "\n") // by name
		wantLines := []string{
			"jobs                      inflight        3 in flight, TTL 1h0m0s; 2 held",
			"reports                   inflight        none stored (runs on its handles' default); 1 held",
		}
		if !slices.Equal(lines, wantLines) {
			t.Errorf("ls:\n%s\nwant:\n%s", listed, strings.Join(wantLines, "\n"))
		}
		for pattern, want := range map[string]string{
			"jobs":    `{"name":"jobs","key":"` + prefix + `{jobs}","algorithm":"inflight","config":null,"inflight":{"limit":3,"ttl_ms":3600000},"held":2}` + "\n",
			"reports": `{"name":"reports","key":"` + prefix + `{reports}","algorithm":"inflight","config":null,"held":1}` + "\n",
		} {
			if got := s.must(t, prefix, "ls", "--json", pattern); got != want {
				t.Errorf("ls --json %s: %s\nwant %s", pattern, got, want)
			}
		}
		if after := snapshot(t, s, prefix); len(before) == 0 || !maps.Equal(before, after) {
			t.Errorf("get and ls changed keys:\nbefore %q\nafter  %q", before, after)
		}

		// set: --if-absent keeps the stored config; a lower limit keeps the holds.
		if out := s.must(t, prefix, "set", "jobs", "--limit", "9", "--ttl", "1h", "--if-absent"); out != "jobs: inflight keeps the config stored already: 3 in flight, TTL 1h0m0s\n" {
			t.Errorf("set --if-absent: %q", out)
		}
		s.must(t, prefix, "set", "--limit", "1", "--ttl", "1h", "jobs") // flags before or after NAME
		if text := s.must(t, prefix, "get", "jobs"); !strings.Contains(text, "\nheld       2 of 1; none free\n") {
			t.Errorf("get after lowering the limit:\n%s", text)
		}
		if out := s.must(t, prefix, "set", "fresh", "--limit", "5", "--ttl", "30s", "--if-absent"); out != "fresh: inflight now 5 in flight, TTL 30s\n" {
			t.Errorf("set --if-absent on a new name: %q", out)
		}
		if cfg, err := instance("x").InFlight("fresh").Config(ctx); err != nil || cfg != (redlimit.InFlightConfig{Limit: 5, TTL: 30 * time.Second}) {
			t.Errorf("fresh: %v %v", cfg, err)
		}

		// What does not go with an in-flight limit, and a rate limiter's name.
		s.must(t, prefix, "set", "api", "--rate", "10", "--per", "1h", "--algorithm", "funnel")
		for _, tt := range []struct {
			args   []string
			code   int
			stderr string
		}{
			{[]string{"set", "jobs", "--rate", "10", "--per", "1h"}, exitFail,
				"redlimit set: jobs is an in-flight limit, not a rate limiter: set it with --limit and --ttl, or delete it first (redlimit delete) to make it a rate limiter\n"},
			{[]string{"set", "api", "--limit", "2", "--ttl", "1m"}, exitFail,
				"redlimit set: api is a funnel limiter, not an in-flight limit: delete it first (redlimit delete) to make it one\n"},
			{[]string{"get", "jobs", "--rate", "10", "--per", "1h"}, exitUsage,
				"redlimit get: jobs is an in-flight limit: --rate is a rate limiter's flag\n"},
			{[]string{"expire", "jobs", "10m"}, exitFail,
				"redlimit expire: jobs is an in-flight limit: expire is not supported for in-flight limits (the config never expires, and each hold expires by itself, TTL after it was taken or last refreshed)\n"},
			{[]string{"delete", "jobs"}, exitUsage, "redlimit delete: not a terminal: confirm with --yes\n"},
		} {
			code, stdout, stderr := s.command(t, prefix, tt.args[0], tt.args[1:]...)
			if code != tt.code || stdout != "" || stderr != tt.stderr {
				t.Errorf("%v: exit %d, stdout %q\nstderr %q\nwant exit %d, stderr %q", tt.args, code, stdout, stderr, tt.code, tt.stderr)
			}
		}
		if cfg, err := instance("x").InFlight("jobs").Config(ctx); err != nil || cfg != (redlimit.InFlightConfig{Limit: 1, TTL: time.Hour}) {
			t.Errorf("jobs after the refusals: %v %v", cfg, err)
		}

		// reset drops the holds and keeps the config: a holder finds out at
		// its next refresh.
		queue := instance("api-3").InFlight("queue")
		if err := queue.SetLimit(ctx, redlimit.InFlightConfig{Limit: 1, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		stuck := acquire(queue)
		for _, want := range []string{"queue: every hold dropped\n", "queue: no hold to drop\n"} {
			if out := s.must(t, prefix, "reset", "queue"); out != want {
				t.Errorf("reset queue: %q, want %q", out, want)
			}
		}
		if err := stuck.Refresh(ctx); !errors.Is(err, redlimit.ErrHoldLost) {
			t.Errorf("a hold's refresh after reset: %v, want ErrHoldLost", err)
		}
		if cfg, err := queue.Config(ctx); err != nil || cfg != (redlimit.InFlightConfig{Limit: 1, TTL: time.Hour}) {
			t.Errorf("queue after reset: %v %v", cfg, err)
		}

		// delete drops the config and the holds: a holder finds out at its next refresh.
		for _, name := range []string{"jobs", "reports", "fresh", "api", "queue"} {
			if out := s.must(t, prefix, "delete", "--yes", name); out != name+": deleted\n" {
				t.Errorf("delete %s: %q", name, out)
			}
		}
		if err := holds[0].Refresh(ctx); !errors.Is(err, redlimit.ErrHoldLost) {
			t.Errorf("a hold's refresh after delete: %v, want ErrHoldLost", err)
		}
		for _, args := range [][]string{{"get", "jobs"}, {"delete", "--yes", "jobs"}, {"reset", "reports"}, {"expire", "reports", "1m"}} {
			code, _, stderr := s.command(t, prefix, args[0], args[1:]...)
			name := "jobs"
			if args[0] == "reset" || args[0] == "expire" {
				name = "reports"
			}
			if code != exitNotFound || !strings.Contains(stderr, `no limiter "`+name+`"`) {
				t.Errorf("%v after delete: exit %d\n%s", args, code, stderr)
			}
		}
		if keys := keysUnder(t, s.rdb, prefix); len(keys) != 0 {
			t.Errorf("keys left: %v", keys)
		}
	})
}

// TestLsInFlightCorrupt: an in-flight limit whose config or holds the
// library would refuse is listed as corrupt, and ls goes on.
func TestLsInFlightCorrupt(t *testing.T) {
	ctx := context.Background()
	eachServer(t, func(t *testing.T, s server) {
		prefix := newPrefix()
		s.rdb.HSet(ctx, prefix+"{zero}", "limit", "0", "ttl", "1000", "algorithm", "inflight")
		s.rdb.HSet(ctx, prefix+"{nottl}", "limit", "2", "algorithm", "inflight")
		s.rdb.HSet(ctx, prefix+"{str}", "limit", "2", "ttl", "1000", "algorithm", "inflight")
		s.rdb.Set(ctx, prefix+"{str}:holders", "x", time.Hour)
		got := s.ls(t, prefix)
		// The holds of str cannot be counted; its config was read.
		want := map[string]lsLine{
			"zero":  {Corrupt: "fields limit = 0, ttl = 1000: invalid config: limit 0 is outside 1..100000", Held: new(0)},
			"nottl": {Corrupt: "field ttl missing", Held: new(0)},
			"str": {Corrupt: "corrupt state: " + prefix + "{str}:holders: WRONGTYPE Operation against a key holding the wrong kind of value (ZRANGEBYSCORE)",
				InFlight: &inFlightJSON{Limit: 2, TTLMS: 1000}},
		}
		for name, w := range want {
			w.Name, w.Key, w.Algorithm = name, prefix+"{"+name+"}", "inflight"
			if l := got[name]; !reflect.DeepEqual(l, w) {
				t.Errorf("%s: %+v, want %+v", name, l, w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("ls: %+v", got)
		}
		if out := s.must(t, prefix, "ls", "zero"); out != "zero                      inflight        corrupt: fields limit = 0, ttl = 1000: invalid config: limit 0 is outside 1..100000; 0 held\n" {
			t.Errorf("ls zero: %q", out)
		}
	})
}
