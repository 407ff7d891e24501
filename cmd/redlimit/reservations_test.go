package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// TestReservations: get lists a limiter's open reservations, the request
// log's entries, soonest to expire first, each with the time left to
// release or settle it, and ls counts them; a settle that charges more
// keeps its entry (renamed) and its time, a release removes it, and an
// entry past its time is no longer open though the log still holds it.
// For each algorithm, with a stored config and on a default; nothing is
// written.
func TestReservations(t *testing.T) {
	ctx := context.Background()
	base := time.UnixMilli(1_893_456_000_000)
	now := base.Add(time.Second)
	saved := usageTime
	usageTime = func(context.Context, redis.UniversalClient) (time.Time, error) { return now, nil }
	t.Cleanup(func() { usageTime = saved })
	eachServer(t, func(t *testing.T, s server) {
		for _, alg := range algorithms {
			for _, stored := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/stored=%v", alg.name, stored), func(t *testing.T) {
					now = base.Add(time.Second)
					prefix := newPrefix()
					client := redlimit.New(s.rdb, redlimit.WithPrefix(prefix), redlimit.WithClock(func() time.Time { return base }))
					l := alg.limiter(client, "api")
					if stored {
						if err := l.SetRate(ctx, redlimit.PerHour(10)); err != nil {
							t.Fatal(err)
						}
					} else {
						l = l.WithDefault(redlimit.PerHour(10))
					}
					if stored { // on a default, no key yet: get exits 3
						if rep := s.get(t, prefix, "api"); rep.Reservations == nil || rep.Reservations.Open != 0 || len(rep.Reservations.Listed) != 0 {
							t.Errorf("get before any reservation: %+v", rep.Reservations)
						}
					}
					// One to settle within 5 minutes; one as long as its grant
					// counts: the hour.
					soon, err := l.Reserve(ctx, 3, redlimit.SettleWithin(5*time.Minute))
					if err != nil || soon.Taken != 3 {
						t.Fatalf("Reserve: %+v %v", soon, err)
					}
					late, err := l.Reserve(ctx, 2)
					if err != nil || late.Taken != 2 {
						t.Fatalf("Reserve: %+v %v", late, err)
					}
					log := prefix + "{api}:requests"
					ids := func() []string {
						t.Helper()
						z, err := s.rdb.ZRangeWithScores(ctx, log, 0, -1).Result()
						if err != nil {
							t.Fatal(err)
						}
						var ids []string
						for _, e := range z {
							ids = append(ids, e.Member.(string))
						}
						return ids // by score: soonest to expire first
					}
					logged := ids()
					if len(logged) != 2 {
						t.Fatalf("request log %v: want the two reservations", logged)
					}
					check := func(want ...reservationJSON) {
						t.Helper()
						got := s.get(t, prefix, "api").Reservations
						if got == nil || got.Key != log || got.Open != int64(len(want)) || !slices.Equal(got.Listed, want) || got.Corrupt != "" {
							t.Errorf("get --json: reservations %+v, want %v", got, want)
						}
						text := s.must(t, prefix, "get", "api")
						reserved := fmt.Sprintf("reserved   %d open in %s (listed below)\n", len(want), log)
						if strings.Contains(text, reserved) != (len(want) > 0) || strings.Contains(text, "reserved ") != (len(want) > 0) {
							t.Errorf("get: want %q (or none for none):\n%s", reserved, text)
						}
						section := ""
						if len(want) > 0 {
							section = "\nReserved, by time left to release or settle (the request log's ids: a lease's block is one; under WithRetryWindow, so is every recent grant):\n"
							for _, e := range want {
								section += fmt.Sprintf("  %s  %v left\n", e.ID, time.Duration(e.TTLMS)*time.Millisecond)
							}
							if !strings.HasSuffix(text, section) {
								t.Errorf("get does not end in %q:\n%s", section, text)
							}
						}
						line := s.ls(t, prefix)["api"]
						if line.Reserved != int64(len(want)) {
							t.Errorf("ls --json: %+v, want %d reserved", line, len(want))
						}
						listed := s.must(t, prefix, "ls")
						if suffix := fmt.Sprintf("; %d reserved\n", len(want)); strings.HasSuffix(listed, suffix) != (len(want) > 0) {
							t.Errorf("ls: %q, want it to end in %q: %v", listed, suffix, len(want) > 0)
						}
					}
					before := snapshot(t, s, prefix)
					check(reservationJSON{logged[0], 5*60_000 - 1000}, reservationJSON{logged[1], 3_600_000 - 1000})
					if after := snapshot(t, s, prefix); !maps.Equal(before, after) {
						t.Errorf("keys changed:\nbefore %q\nafter  %q", before, after)
					}

					// A settle above the estimate moves its entry to a new id,
					// with its time; a release removes the other's.
					if r, err := soon.Settle(ctx, 4); err != nil || r.Charged != 1 {
						t.Fatalf("Settle: %+v %v", r, err)
					}
					moved := ids()
					if len(moved) != 2 || moved[0] == logged[0] || moved[1] != logged[1] {
						t.Fatalf("request log %v after the settle, was %v: want the first renamed", moved, logged)
					}
					check(reservationJSON{moved[0], 5*60_000 - 1000}, reservationJSON{logged[1], 3_600_000 - 1000})
					if back, err := late.Release(ctx, 2); err != nil || back != 2 {
						t.Fatalf("Release: %d %v", back, err)
					}
					check(reservationJSON{moved[0], 5*60_000 - 1000})

					// Past its time the entry is no longer open, though the
					// log keeps it until a later request clears it.
					now = base.Add(5 * time.Minute)
					check()
					if left := ids(); !slices.Equal(left, moved[:1]) {
						t.Errorf("request log %v, want %v kept", left, moved[:1])
					}
				})
			}
		}
	})
}
