package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// TestGetOnDefault: get on a limiter running on its handles' default (no
// config stored, as docs/concepts.md recommends) says what Redis holds for it,
// key by key, in the state's own terms, without the default: each
// algorithm's state, Overall and PerClient, one rate and two, on a fixed
// clock so that every number is exact (TTLs too on miniredis, whose clock
// stands still; a real server's run on while the test does). With --rate
// and --per it adds the permits those figures make. It writes nothing.
func TestGetOnDefault(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) // on every window's edge
	ms := base.UnixMilli()
	us := base.UnixMicro()
	at := base.Add(time.Second) // get's instant
	saved := usageTime
	usageTime = func(context.Context, redis.UniversalClient) (time.Time, error) { return at, nil }
	t.Cleanup(func() { usageTime = saved })
	type grant struct {
		client  string
		at      time.Duration
		permits int64
	}
	i64 := func(v int64) *int64 { return &v }
	tests := []struct {
		alg    string
		cfg    redlimit.Config
		grants []grant
		keys   func(prefix string) []heldKey
		lines  []string // in get's text
		usage  string   // with --rate and --per: the remaining line, or a client's
	}{
		{"funnel", redlimit.Per(10, 10*time.Second), []grant{{"", 0, 4}}, func(p string) []heldKey {
			return []heldKey{{Key: p + "{api}", Type: "string", TTLMS: 4000, Holds: "flat state",
				Rates: []rateHeld{{Rate: 1, TATUS: i64(us + 4_000_000), EmptyInMS: i64(3000)}}}}
		}, []string{"  PREFIX{api}  flat state; expires in 4s\n", "    rate 1: empty in 3s (TAT 1893456004000000 µs)\n"},
			"remaining  7 of 10; a permit is free now; full again in 3s"},
		{"fixed_window", redlimit.Per(10, 10*time.Second).And(redlimit.Per(100, time.Minute)), []grant{{"", 0, 3}}, func(p string) []heldKey {
			return []heldKey{{Key: p + "{api}", Type: "string", TTLMS: 60_000, Holds: "flat state", Rates: []rateHeld{
				{Rate: 1, WindowStartMS: i64(ms), Count: i64(3)}, {Rate: 2, WindowStartMS: i64(ms), Count: i64(3)}}}}
		}, []string{"    rate 1: 3 counted in the window from 2030-01-01T00:00:00.000Z (1s ago)\n",
			"    rate 2: 3 counted in the window from 2030-01-01T00:00:00.000Z (1s ago)\n"},
			"remaining  7 of 10; a permit is free now; full again in 59s; 10 per 10s binds"},
		{"sliding_window", redlimit.Per(10, 10*time.Second), []grant{{"", 0, 2}, {"", 2 * time.Second, 3}}, func(p string) []heldKey {
			return []heldKey{{Key: p + "{api}", Type: "string", TTLMS: 10_000, Holds: "flat state",
				Rates: []rateHeld{{Rate: 1, Count: i64(5), SubWindows: []subWindow{{ms, 2}, {ms + 2000, 3}}}}}}
		}, []string{"    rate 1: 5 counted in 2 sub-windows, from 2030-01-01T00:00:00.000Z (1s ago) to 2030-01-01T00:00:02.000Z (1s ahead)\n"},
			"remaining  5 of 10; a permit is free now; full again in 11s"},
		{"tokenbucket", redlimit.Per(10, 10*time.Second).And(redlimit.Per(20, time.Minute)), []grant{{"", 0, 2}, {"", 500 * time.Millisecond, 3}}, func(p string) []heldKey {
			return []heldKey{
				// Every key's TTL runs from the last grant, at 500ms. The
				// minute's records coalesce by slices of 60s/64: one record.
				{Key: p + "{api}", Type: "string", TTLMS: 60_000, Holds: "marker"},
				{Key: p + "{api}:value", Type: "string", TTLMS: 10_000, Holds: "value", Value: i64(5)},
				{Key: p + "{api}:permits", Type: "zset", TTLMS: 10_000, Holds: "permits log",
					Rates: []rateHeld{{Rate: 1, Count: i64(5), Records: new(2), OldestMS: i64(ms), NewestMS: i64(ms + 500)}}},
				{Key: p + "{api}:grants", Type: "zset", TTLMS: 60_000, Holds: "grants log",
					Rates: []rateHeld{{Rate: 2, Count: i64(5), Records: new(1), OldestMS: i64(ms + 500), NewestMS: i64(ms + 500)}}},
			}
		}, []string{"  PREFIX{api}  marker; expires in 1m0s\n", "    the algorithm's name: its state is in the keys below\n",
			"  PREFIX{api}:value  value; expires in 10s\n", "    5: the rate less the permits its log holds\n",
			"    rate 1: 5 permits in 2 records, the newest granted 500ms ago, the oldest 1s ago\n",
			"    rate 2: 5 permits in 1 record, granted 500ms ago\n"},
			"remaining  5 of 10; a permit is free now; full again in 59.5s; 10 per 10s binds"},
		{"funnel", redlimit.Config{Type: redlimit.PerClient, Rate: 10, Interval: 10 * time.Second}, []grant{{"alice", 0, 4}, {"bob", 0, 2}}, func(p string) []heldKey {
			return []heldKey{
				{Key: p + "{api}", Type: "string", TTLMS: 10_000, Holds: "marker"},
				{Key: p + "{api}:clients", Type: "zset", TTLMS: 10_000, Holds: "registry", Clients: []clientSeen{{"alice", ms}, {"bob", ms}}},
				{Key: p + "{api}:tat:alice", Type: "hash", TTLMS: 4000, Holds: "state", Client: "alice",
					Rates: []rateHeld{{Rate: 1, TATUS: i64(us + 4_000_000), EmptyInMS: i64(3000)}}},
				{Key: p + "{api}:tat:bob", Type: "hash", TTLMS: 2000, Holds: "state", Client: "bob",
					Rates: []rateHeld{{Rate: 1, TATUS: i64(us + 2_000_000), EmptyInMS: i64(1000)}}},
			}
		}, []string{"  PREFIX{api}:clients  registry; expires in 10s\n", "    alice  last granted 1s ago\n",
			"  PREFIX{api}:tat:bob  bob's state; expires in 2s\n", "    rate 1: empty in 1s (TAT 1893456002000000 µs)\n"},
			"  alice  7 of 10; a permit is free now; full again in 3s"},
	}
	eachServer(t, func(t *testing.T, s server) {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/%v", tt.alg, tt.cfg), func(t *testing.T) {
				prefix := newPrefix()
				for _, g := range tt.grants {
					now := base.Add(g.at)
					client := redlimit.New(s.rdb, redlimit.WithPrefix(prefix), redlimit.WithClientID(cmp.Or(g.client, "x")), redlimit.WithClock(func() time.Time { return now }))
					if ok, err := algorithmNamed(tt.alg)(client, "api").WithDefault(tt.cfg).TryAcquire(ctx, g.permits); !ok || err != nil {
						t.Fatalf("TryAcquire(%d): %v %v", g.permits, ok, err)
					}
				}
				before := snapshot(t, s, prefix)
				rep := s.get(t, prefix, "api")
				text := s.must(t, prefix, "get", "api")
				flags := []string{"api", "--rate", fmt.Sprint(tt.cfg.Rate), "--per", tt.cfg.Interval.String()}
				for _, r := range tt.cfg.More {
					flags = append(flags, "--and", fmt.Sprintf("%d/%v", r.Rate, r.Interval))
				}
				if tt.cfg.Type == redlimit.PerClient {
					flags = append(flags, "--per-client")
				}
				assumed := s.must(t, prefix, "get", flags...)
				if after := snapshot(t, s, prefix); !maps.Equal(before, after) {
					t.Errorf("keys changed:\nbefore %q\nafter  %q", before, after)
				}

				want := tt.keys(prefix)
				if rep.Held == nil {
					t.Fatalf("get: no held: %+v", rep)
				}
				got := rep.Held.Keys
				for i := range got {
					if i < len(want) && s.real {
						// The server's clock runs: its TTLs are what is left of the test's.
						if got[i].TTLMS <= want[i].TTLMS-5000 || got[i].TTLMS > want[i].TTLMS {
							t.Errorf("%s: ttl %dms, want %dms or a little less", got[i].Key, got[i].TTLMS, want[i].TTLMS)
						}
						got[i].TTLMS = want[i].TTLMS
					}
				}
				if !reflect.DeepEqual(got, want) {
					g, _ := json.MarshalIndent(got, "", " ")
					w, _ := json.MarshalIndent(want, "", " ")
					t.Errorf("held:\n%s\nwant:\n%s", g, w)
				}
				if rep.Algorithm != tt.alg || rep.Config != nil || rep.Usage != nil || rep.Shadow {
					t.Errorf("get: %+v", rep)
				}
				lines := append([]string{"algorithm  " + tt.alg + "\n",
					"config     none stored  (it runs on its handles' default: what Redis holds follows; --rate and --per give permits)\n",
					"\nHeld in Redis, in the state's own terms (no config stored: --rate and --per give permits):\n"}, tt.lines...)
				for _, line := range lines {
					if line = strings.ReplaceAll(line, "PREFIX", prefix); s.real && strings.Contains(line, "expires in") {
						continue // a real server's TTLs run
					}
					if !strings.Contains(text, line) {
						t.Errorf("get lacks %q:\n%s", line, text)
					}
				}
				if strings.Contains(text, "remaining") || strings.Contains(text, "of 10") {
					t.Errorf("get without the default shows permits:\n%s", text)
				}
				if !strings.Contains(assumed, tt.usage) || !strings.Contains(assumed, "Held in Redis") {
					t.Errorf("get with the default lacks %q, or the held state:\n%s", tt.usage, assumed)
				}
			})
		}
	})
}

// TestGetNothingHeld: get on a name with no config and no state says so
// plainly. With no key at all, as a name never used or an idle limiter on
// a default, it exits 3 (no such limiter), as it always has and scripts
// may rely on; with keys that hold no state (a registry whose clients are
// all full again, a request log), it shows them and exits 0.
func TestGetNothingHeld(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	saved := usageTime
	usageTime = func(context.Context, redis.UniversalClient) (time.Time, error) { return base.Add(time.Second), nil }
	t.Cleanup(func() { usageTime = saved })
	eachServer(t, func(t *testing.T, s server) {
		prefix := newPrefix()
		nothing := "nothing held in Redis for NAME: no stored config and no state; a limiter on a default keeps state only while it is in use"
		for _, json := range []bool{false, true} {
			args := []string{"idle"}
			if json {
				args = append(args, "--json")
			}
			code, stdout, stderr := s.command(t, prefix, "get", args...)
			want := fmt.Sprintf("(no key %s{idle}, nor any other of its keys): %s\n", prefix, strings.ReplaceAll(nothing, "NAME", "idle"))
			if code != exitNotFound || stdout != "" || !strings.HasPrefix(stderr, `redlimit get: no limiter "idle" in `) || !strings.HasSuffix(stderr, want) {
				t.Errorf("get of a name with no key: exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
		}

		s.rdb.ZAdd(ctx, prefix+"{gone}:clients", redis.Z{Score: float64(base.UnixMilli()), Member: "bob"})
		s.rdb.ZAdd(ctx, prefix+"{gone}:requests", redis.Z{Score: float64(base.UnixMilli() + 60_000), Member: "0123456789abcdef"})
		text := s.must(t, prefix, "get", "gone")
		for _, line := range []string{"algorithm  unknown (no config, and no state tells it)\n",
			"\n" + strings.ReplaceAll(nothing, "NAME", "gone") + ".\nIts keys left:\n",
			"  " + prefix + "{gone}:clients  registry; never expires\n    bob  last granted 1s ago\n",
			"  " + prefix + "{gone}:requests  request log; never expires\n"} {
			if !strings.Contains(text, line) {
				t.Errorf("get lacks %q:\n%s", line, text)
			}
		}
		rep := s.get(t, prefix, "gone")
		want := []heldKey{
			{Key: prefix + "{gone}:clients", Type: "zset", TTLMS: -1, Holds: "registry", Clients: []clientSeen{{"bob", base.UnixMilli()}}},
			{Key: prefix + "{gone}:requests", Type: "zset", TTLMS: -1, Holds: "request log"},
		}
		if rep.Algorithm != "" || rep.Config != nil || rep.TTLMS != -1 || rep.Held == nil || !reflect.DeepEqual(rep.Held.Keys, want) {
			t.Errorf("get --json: %+v, held %+v", rep, rep.Held)
		}
	})
}
