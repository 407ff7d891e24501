package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/wire"
)

// beating starts a Client in degraded mode whose clock stands at at, and
// waits for its first beat (sent when it is made). Its next is an hour
// away: the test's heartbeat key changes only as the test says.
func beating(t *testing.T, rdb redis.UniversalClient, prefix, id string, at time.Time) *redlimit.Client {
	t.Helper()
	c := redlimit.New(rdb, redlimit.WithPrefix(prefix), redlimit.WithClientID(id), redlimit.WithClock(func() time.Time { return at }),
		redlimit.WithDegraded(redlimit.Degraded{Heartbeat: time.Hour, Expire: 2 * time.Hour}))
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	for deadline := time.Now().Add(10 * time.Second); c.DegradedState().Beat.IsZero(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no first heartbeat", id)
		}
	}
	return c
}

// TestInstances: `instances` reads degraded mode's heartbeat key as the
// library writes it: off before any Client beats; then each instance, its
// client id, tag and last beat's age, live or not as the next beat would
// count it (within the Expire the key's TTL and the latest beat tell),
// how many share each id; get says what a limiter's share is. Nothing is
// written.
func TestInstances(t *testing.T) {
	ctx := context.Background()
	base := time.UnixMilli(1_893_456_000_000)
	saved := usageTime
	usageTime = func(context.Context, redis.UniversalClient) (time.Time, error) {
		return base.Add(10 * time.Second), nil
	}
	t.Cleanup(func() { usageTime = saved })
	const expire = 2 * time.Hour
	eachServer(t, func(t *testing.T, s server) {
		prefix := newPrefix()
		key := prefix + "redlimit:instances"
		if out := s.must(t, prefix, "instances"); out != "degraded mode  off  (no key "+key+": no Client under this prefix runs WithDegraded, or none has beaten within its Expire)\n" {
			t.Errorf("instances before any beat: %q", out)
		}
		var off instancesReport
		if err := json.Unmarshal([]byte(s.must(t, prefix, "instances", "--json")), &off); err != nil {
			t.Fatal(err)
		}
		if want := (instancesReport{Key: key, AsOf: "2030-01-01T00:00:10.000Z", Instances: []instanceJSON{}}); !equalJSON(off, want) {
			t.Errorf("instances --json before any beat: %+v, want %+v", off, want)
		}

		// batch beat first, 5s within the Expire of the latest beat (api's,
		// at base), so that no beat dropped it; 10s on, it is stale.
		beating(t, s.rdb, prefix, "batch", base.Add(-expire+5*time.Second))
		beating(t, s.rdb, prefix, "worker", base.Add(-time.Minute))
		beating(t, s.rdb, prefix, "api", base.Add(-30*time.Second))
		beating(t, s.rdb, prefix, "api", base)
		// Limiters, for get: the share of each rate, for an Overall limit;
		// a PerClient one is shared by the instances of one id.
		admin := redlimit.New(s.rdb, redlimit.WithPrefix(prefix))
		if err := admin.FixedWindow("api").SetRate(ctx, redlimit.PerSecond(10).And(redlimit.PerHour(1000))); err != nil {
			t.Fatal(err)
		}
		if err := admin.Funnel("burst").SetRate(ctx, redlimit.Config{Rate: 10, Interval: time.Second, Burst: 25, KeepAlive: time.Hour}); err != nil {
			t.Fatal(err)
		}
		perClient := redlimit.PerSecond(10)
		perClient.Type = redlimit.PerClient
		if err := admin.SlidingWindow("users").SetRate(ctx, perClient); err != nil {
			t.Fatal(err)
		}
		// The key's TTL 10s after the latest beat. On a real server it also
		// loses the milliseconds the test takes until the command reads it.
		if err := s.rdb.PExpire(ctx, key, expire-10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, s, prefix)

		var rep instancesReport
		if err := json.Unmarshal([]byte(s.must(t, prefix, "instances", "--json")), &rep); err != nil {
			t.Fatal(err)
		}
		wantExpire := expire.Milliseconds()
		if !rep.On || rep.Live != 3 || rep.Corrupt != "" || rep.ExpireMS > wantExpire || rep.ExpireMS < wantExpire-1000 ||
			rep.TTLMS != rep.ExpireMS-10_000 || !s.real && rep.ExpireMS != wantExpire {
			t.Errorf("instances --json: %+v, want on, 3 live, expire %dms", rep, wantExpire)
		}
		type seen struct {
			id          string
			beat, age   int64
			live        bool
			same        int
			tagIsMember bool
		}
		var got []seen
		for _, in := range rep.Instances {
			_, _, ok := wire.ParseHeartbeatMember(in.ClientID + " " + in.Tag)
			got = append(got, seen{in.ClientID, in.LastBeatMS, in.AgeMS, in.Live, in.SameID, ok && in.Member == ""})
		}
		ms := base.UnixMilli()
		want := []seen{
			{"api", ms, 10_000, true, 2, true},
			{"api", ms - 30_000, 40_000, true, 2, true},
			{"batch", ms - wantExpire + 5_000, wantExpire + 5_000, false, 0, true},
			{"worker", ms - 60_000, 70_000, true, 1, true},
		}
		if rep.Instances[0].Tag > rep.Instances[1].Tag {
			t.Errorf("instances not by client id, then tag: %+v", rep.Instances)
		}
		if got[0].beat < got[1].beat {
			got[0], got[1] = got[1], got[0] // the two api instances: which tag is whose is random
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("instances:\n%v\nwant\n%v", got, want)
		}

		text := s.must(t, prefix, "instances")
		flat := strings.Join(strings.Fields(text), " ")
		for _, line := range []string{
			"degraded mode on (key " + key + ", expires in 1h59m",
			"live 3 (in an outage each instance decides locally within ⌈L/3⌉ of a limit L) CLIENT ID INSTANCE LAST BEAT SAME ID",
			"api " + rep.Instances[0].Tag + " " + fmt.Sprint(time.Duration(rep.Instances[0].AgeMS)*time.Millisecond) + " ago 2 api",
			"batch " + rep.Instances[2].Tag + " 2h0m5s ago stale: not counted; the next beat drops it worker",
			"worker " + rep.Instances[3].Tag + " 1m10s ago 1",
		} {
			if !strings.Contains(flat, line) {
				t.Errorf("instances lacks %q:\n%s", line, text)
			}
		}
		if !s.real {
			want := "degraded mode  on      (key " + key + ", expires in 1h59m50s)\n" +
				"expire         2h0m0s  (an instance counts this long after its last beat: the key's TTL plus the latest beat's age)\n" +
				"live           3       (in an outage each instance decides locally within ⌈L/3⌉ of a limit L)\n" +
				"\n" +
				"CLIENT ID  INSTANCE          LAST BEAT   SAME ID\n" +
				"api        " + rep.Instances[0].Tag + "  " + fmt.Sprint(time.Duration(rep.Instances[0].AgeMS)*time.Millisecond) + " ago     2\n" +
				"api        " + rep.Instances[1].Tag + "  " + fmt.Sprint(time.Duration(rep.Instances[1].AgeMS)*time.Millisecond) + " ago     2\n" +
				"batch      " + rep.Instances[2].Tag + "  2h0m5s ago  stale: not counted; the next beat drops it\n" +
				"worker     " + rep.Instances[3].Tag + "  1m10s ago   1\n"
			if text != want {
				t.Errorf("instances:\n%s\nwant\n%s", text, want)
			}
		}

		for _, tt := range []struct {
			name  string
			share *redlimit.Config
			line  string
		}{
			{"api", new(redlimit.PerSecond(4).And(redlimit.PerHour(334))), "degraded   3 instances live (redlimit instances): in an outage each decides locally on 4 per 1s and 334 per 1h0m0s\n"},
			{"burst", &redlimit.Config{Rate: 4, Interval: time.Second, Burst: 9}, "degraded   3 instances live (redlimit instances): in an outage each decides locally on 4 per 1s, burst 9\n"},
			{"users", nil, "degraded   3 instances live (redlimit instances): in an outage each decides locally its own client's limit L within ⌈L/n⌉, n the instances of its client id (SAME ID)\n"},
		} {
			d := s.get(t, prefix, tt.name).Degraded
			if d == nil || d.Instances != 3 || (tt.share == nil) != (d.Share == nil) || tt.share != nil && !is(d.Share, *tt.share) {
				t.Errorf("get %s --json: degraded %+v, want 3 instances, share %v", tt.name, d, tt.share)
			}
			if text := s.must(t, prefix, "get", tt.name); !strings.Contains(text, tt.line) {
				t.Errorf("get %s lacks %q:\n%s", tt.name, tt.line, text)
			}
		}
		if after := snapshot(t, s, prefix); !maps.Equal(before, after) {
			t.Errorf("keys changed:\nbefore %q\nafter  %q", before, after)
		}

		// Not a heartbeat's key: said, exit 1.
		other := newPrefix()
		if err := s.rdb.Set(ctx, other+"redlimit:instances", "x", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr := s.command(t, other, "instances")
		if code != exitFail || stdout != "degraded mode  unknown  (key "+other+"redlimit:instances: a string, not a zset of instances)\n" || stderr != "" {
			t.Errorf("instances on a string: exit %d, %q %q", code, stdout, stderr)
		}
		if rep := s.get(t, prefix, "api"); rep.Degraded == nil {
			t.Errorf("get lost degraded mode: %+v", rep)
		}
	})
}

// equalJSON compares two values as JSON writes them.
func equalJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}
