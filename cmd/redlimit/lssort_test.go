package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/wire"
)

// TestLsSorted: ls prints its lines by name (byte order), text and JSON,
// whatever SCAN's order and however many primaries hold them; with lines
// spilled to sorted runs on disk, the same bytes; with --scan-order, the
// same lines in SCAN's order. A Cluster spreads these names over its three
// primaries.
func TestLsSorted(t *testing.T) {
	ctx := context.Background()
	eachServer(t, func(t *testing.T, s server) {
		prefix := newPrefix()
		client := redlimit.New(s.rdb, redlimit.WithPrefix(prefix))
		var names []string
		for i := range 40 {
			name := fmt.Sprintf("n%02d:%c", (i*17)%40, 'a'+rune(i%26))
			names = append(names, name)
			switch i % 4 {
			case 0: // stored
				if err := client.FixedWindow(name).SetRate(ctx, redlimit.PerHour(int64(i+1))); err != nil {
					t.Fatal(err)
				}
			case 1: // on a default: a flat state
				if _, err := client.Funnel(name).WithDefault(redlimit.PerHour(5)).Allow(ctx, 1); err != nil {
					t.Fatal(err)
				}
			case 2: // on a default: the token bucket's :value
				if _, err := client.TokenBucket(name).WithDefault(redlimit.PerHour(5)).Allow(ctx, 1); err != nil {
					t.Fatal(err)
				}
			case 3:
				if err := client.InFlight(name).SetLimit(ctx, redlimit.InFlightConfig{Limit: 3, TTL: time.Minute}); err != nil {
					t.Fatal(err)
				}
			}
		}
		slices.Sort(names)
		order := func(out string, json bool) []string {
			var got []string
			for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
				if json {
					var l lsLine
					if err := jsonUnmarshal(line, &l); err != nil {
						t.Fatal(err)
					}
					got = append(got, l.Name)
				} else {
					got = append(got, strings.Fields(line)[0])
				}
			}
			return got
		}
		text, js := s.must(t, prefix, "ls"), s.must(t, prefix, "ls", "--json")
		for _, out := range []struct {
			out  string
			json bool
		}{{text, false}, {js, true}} {
			if got := order(out.out, out.json); !slices.Equal(got, names) {
				t.Errorf("ls (json %v): %q\nwant %q", out.json, got, names)
			}
		}
		// Spilled: a run every few lines.
		saved := runBytes
		runBytes = 300
		t.Cleanup(func() { runBytes = saved })
		if out := s.must(t, prefix, "ls"); out != text {
			t.Errorf("ls, spilled:\n%s\nwant\n%s", out, text)
		}
		if out := s.must(t, prefix, "ls", "--json"); out != js {
			t.Errorf("ls --json, spilled:\n%s\nwant\n%s", out, js)
		}
		if out := s.must(t, prefix, "ls", "n1*"); out != strings.Join(slices.DeleteFunc(strings.SplitAfter(text, "\n"), func(l string) bool { return !strings.HasPrefix(l, "n1") }), "") {
			t.Errorf("ls n1*:\n%s", out)
		}
		runBytes = saved
		got := order(s.must(t, prefix, "ls", "--scan-order"), false)
		slices.Sort(got)
		if !slices.Equal(got, names) {
			t.Errorf("ls --scan-order: %q\nwant %q", got, names)
		}
	})
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// TestLayoutInverses: the layout's inverses ls relies on (internal/wire's
// LimiterKey and NameOf) give back what KeyOf and FullName made, for names
// with and without a tag of their own, with and without a prefix; and no
// other key of a limiter reads as a limiter's own. (Under a prefix with a
// tag, a name ending in a suffix, such as x:value, is another limiter's
// key too: prefix{tag}:x:value is x's token bucket value. NameOf takes it
// for the state key, and ls does not list such a name.)
func TestLayoutInverses(t *testing.T) {
	for _, prefix := range []string{"", "svc:", "a{b}:"} {
		for _, name := range []string{"api", "user:42", "{g}:h", "x:tat", "a:b:c"} {
			full := wire.FullName(prefix, name)
			if strings.Contains(prefix, "{") && strings.HasSuffix(name, ":tat") {
				if _, ok := wire.NameOf(prefix, full); ok {
					t.Errorf("NameOf(%q, %q) took it for a limiter's own key", prefix, full)
				}
				continue
			}
			if got, ok := wire.NameOf(prefix, full); !ok || wire.FullName(prefix, got) != full {
				t.Errorf("NameOf(%q, %q) = %q, %v: want a name whose key is %q", prefix, full, got, ok, full)
			}
			for _, suffix := range wire.Suffixes() {
				for _, key := range []string{wire.KeyOf(full, suffix), wire.KeyOf(full, suffix) + ":client-1"} {
					if got, ok := wire.NameOf(prefix, key); ok && strings.Contains(full, "{") {
						t.Errorf("NameOf(%q, %q) = %q: a state key read as a limiter's own", prefix, key, got)
					}
				}
				if got, ok := wire.LimiterKey(wire.KeyOf(full, suffix), suffix); !ok || wire.KeyOf(got, suffix) != wire.KeyOf(full, suffix) {
					t.Errorf("LimiterKey(%q) = %q, %v", wire.KeyOf(full, suffix), got, ok)
				}
			}
		}
	}
	if _, ok := wire.NameOf("svc:", "other:{api}"); ok {
		t.Error("NameOf: a key outside the prefix read as a limiter's")
	}
}
