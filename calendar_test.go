package redlimit

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // the zones below, whatever the machine has

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

// allow asks l for permits and returns the Result, failing on an error.
func allow(t *testing.T, l *Limiter, permits int64) Result {
	t.Helper()
	r, err := l.Allow(context.Background(), permits)
	require.NoError(t, err)
	return r
}

// A daily quota in New York across both of 2026's clock changes: each day
// grants its Limit from local midnight to the next, 23 hours long on 8 March
// and 25 on 1 November, and a denial waits exactly until that midnight.
func TestCalendarDay(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ny := zone(t, "America/New_York")
		clk := newClock()
		c := newClient(rdb, clk)
		l := c.FixedWindow(uniqueName(t)).WithDefault(PerDay(3, ny))
		for _, day := range []struct {
			date   time.Time
			length time.Duration
		}{
			{time.Date(2026, 3, 7, 0, 0, 0, 0, ny), 24 * time.Hour},
			{time.Date(2026, 3, 8, 0, 0, 0, 0, ny), 23 * time.Hour},
			{time.Date(2026, 3, 9, 0, 0, 0, 0, ny), 24 * time.Hour},
			{time.Date(2026, 11, 1, 0, 0, 0, 0, ny), 25 * time.Hour},
			{time.Date(2026, 11, 2, 0, 0, 0, 0, ny), 24 * time.Hour},
		} {
			clk.Set(day.date.Add(2 * time.Hour))
			for i := range int64(3) {
				r := allow(t, l, 1)
				assert.Equal(t, Result{Allowed: true, Limit: 3, Remaining: 2 - i, ResetAfter: day.length - 2*time.Hour, Window: day.length}, r, "%v", day.date)
			}
			r := allow(t, l, 1)
			assert.Equal(t, Result{Limit: 3, RetryAfter: day.length - 2*time.Hour, ResetAfter: day.length - 2*time.Hour, Window: day.length}, r,
				"%v: denied until the next local midnight", day.date)
			// The count expires with its day (Redis's own clock runs its TTL).
			ttl := rdb.PTTL(context.Background(), l.Name()).Val()
			assert.InDelta(t, day.length-2*time.Hour, ttl, float64(time.Second), "%v: the state expires at midnight", day.date)
			clk.Set(day.date.Add(day.length - time.Millisecond))
			assert.False(t, allow(t, l, 1).Allowed, "%v: still the same day", day.date)
			clk.Set(day.date.Add(day.length))
			assert.Equal(t, int64(3), allow(t, l, 0).Remaining, "%v: the next day grants its Limit", day.date)
		}
	})
}

// Amman's clocks went back from 01:00 +03 to 00:00 +02 at 22:00 UTC on 28
// October 2021: midnight came twice, east of UTC. The 29th began at the
// first and lasted 25 hours, so a request at the first 00:30 counts in the
// 29th, not in the 28th, and its day resets at the 30th's midnight, 24½
// hours on; the second 00:30 is the same day.
func TestCalendarRepeatedMidnight(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		amman := zone(t, "Asia/Amman")
		clk := newClock()
		l := newClient(rdb, clk).FixedWindow(uniqueName(t)).WithDefault(PerDay(2, amman))
		// Noon on the 28th (09:00 UTC): its day runs to the first midnight, 21:00 UTC.
		clk.Set(time.Date(2021, 10, 28, 9, 0, 0, 0, time.UTC))
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 12 * time.Hour, Window: 24 * time.Hour}, allow(t, l, 2))
		assert.False(t, allow(t, l, 1).Allowed, "the 28th's are taken")

		clk.Set(time.Date(2021, 10, 28, 21, 30, 0, 0, time.UTC)) // 00:30 +03
		day := 25 * time.Hour
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: day - 30*time.Minute, Window: day}, allow(t, l, 1),
			"the first 00:30 is the 29th's")
		ttl := rdb.PTTL(context.Background(), l.Name()).Val()
		assert.InDelta(t, day-30*time.Minute, ttl, float64(time.Second), "the state expires at the 30th's midnight")
		clk.Set(time.Date(2021, 10, 28, 22, 30, 0, 0, time.UTC)) // 00:30 +02
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: day - 90*time.Minute, Window: day}, allow(t, l, 1),
			"the second 00:30 is the same day")
		assert.Equal(t, Result{Limit: 2, RetryAfter: day - 90*time.Minute, ResetAfter: day - 90*time.Minute, Window: day}, allow(t, l, 1))

		clk.Set(time.Date(2021, 10, 29, 22, 0, 0, 0, time.UTC)) // midnight of the 30th, +02
		assert.Equal(t, int64(2), allow(t, l, 0).Remaining, "the 30th grants its Limit")
	})
}

// A monthly quota from a billing day of the 31st, with a rate per second
// beside it: each month's window starts on the 31st or, in a shorter month,
// on its last day, at Berlin's midnight; both rates hold, and the answer
// says which one bound it.
func TestCalendarMonthWithRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		berlin := zone(t, "Europe/Berlin")
		clk := newClock()
		c := newClient(rdb, clk)
		cfg := PerSecond(2).And(PerMonthFrom(5, berlin, 31))
		l := c.FixedWindow(uniqueName(t)).WithDefault(cfg)
		// 30 January 2028, noon: the window from 31 December to 31 January.
		clk.Set(time.Date(2028, 1, 30, 12, 0, 0, 0, berlin))
		month := 31 * 24 * time.Hour
		left := time.Date(2028, 1, 31, 0, 0, 0, 0, berlin).Sub(clk.Now())
		// Each rate's reset: the second's window, the month's.
		quotas := func(second, month time.Duration) []Quota {
			return []Quota{{Limit: 2, Window: time.Second, ResetAfter: second}, {Limit: 5, Window: 31 * 24 * time.Hour, ResetAfter: month}}
		}
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: left, Window: time.Second, Bound: 0, Quotas: quotas(time.Second, left)}, allow(t, l, 1))
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: left, Window: time.Second, Bound: 0, Quotas: quotas(time.Second, left)}, allow(t, l, 1))
		assert.Equal(t, Result{Limit: 2, RetryAfter: time.Second, ResetAfter: left, Window: time.Second, Bound: 0, Quotas: quotas(time.Second, left)}, allow(t, l, 1),
			"the rate per second denies")
		clk.Add(time.Second)
		left -= time.Second
		assert.True(t, allow(t, l, 2).Allowed)
		clk.Add(time.Second)
		left -= time.Second
		assert.True(t, allow(t, l, 1).Allowed)
		r := allow(t, l, 1)
		assert.Equal(t, Result{Limit: 5, RetryAfter: left, ResetAfter: left, Window: month, Bound: 1, Quotas: quotas(time.Second, left)}, r,
			"the month's 5 are taken: denied until the 31st")
		// February 2028 has 29 days: its window runs from 29 February to 31 March.
		clk.Set(time.Date(2028, 2, 28, 23, 59, 56, 0, berlin))
		febWindow := time.Date(2028, 2, 29, 0, 0, 0, 0, berlin).Sub(time.Date(2028, 1, 31, 0, 0, 0, 0, berlin))
		r = allow(t, l, 1)
		assert.Equal(t, []Quota{{Limit: 2, Window: time.Second, ResetAfter: time.Second}, {Limit: 5, Window: febWindow, ResetAfter: 4 * time.Second}}, r.Quotas,
			"31 January to 29 February")
		clk.Add(time.Second)
		assert.True(t, allow(t, l, 2).Allowed)
		clk.Add(time.Second)
		assert.True(t, allow(t, l, 2).Allowed)
		clk.Add(time.Second)
		assert.Equal(t, Result{Limit: 5, RetryAfter: time.Second, ResetAfter: time.Second, Window: febWindow, Bound: 1,
			Quotas: []Quota{{Limit: 2, Window: time.Second}, {Limit: 5, Window: febWindow, ResetAfter: time.Second}}}, allow(t, l, 1),
			"5 since 31 January: the second's window holds nothing yet")
		clk.Set(time.Date(2028, 2, 29, 0, 0, 0, 0, berlin))
		r = allow(t, l, 1)
		march := time.Date(2028, 3, 31, 0, 0, 0, 0, berlin).Sub(clk.Now()) // 31 days less DST's hour
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: march, Window: time.Second, Bound: 0,
			Quotas: []Quota{{Limit: 2, Window: time.Second, ResetAfter: time.Second}, {Limit: 5, Window: march, ResetAfter: march}}}, r, "a new window on 29 February")
		assert.Equal(t, 31*24*time.Hour-time.Hour, march)
	})
}

// A stored calendar quota reaches a handle that knows nothing of it: its
// first decision is told which windows to send and is sent again, and the
// family sends them from then on. A new rate with another calendar is
// learnt the same way, and Config reads back what was stored.
func TestCalendarStored(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		kolkata, lordHowe := zone(t, "Asia/Kolkata"), zone(t, "Australia/Lord_Howe")
		clk := newClock()
		clk.Set(time.Date(2026, 10, 3, 23, 0, 0, 0, lordHowe)) // the night before Lord Howe's clocks go forward half an hour
		name := uniqueName(t)
		admin := newClient(rdb, clk).FixedWindow(name)
		cfg := PerDay(2, lordHowe)
		require.NoError(t, admin.SetRate(ctx, cfg))
		got, err := admin.Config(ctx)
		require.NoError(t, err)
		assert.True(t, cfg.equal(got), "%v read back as %v", cfg, got)
		assert.Equal(t, "2 per day in Australia/Lord_Howe", got.String())

		l := newClient(rdb, clk).FixedWindow(name) // no default: the stored config only
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: time.Hour, Window: 24 * time.Hour}, allow(t, l, 1))
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: time.Hour, Window: 24 * time.Hour}, allow(t, l, 1))
		assert.False(t, allow(t, l, 1).Allowed)
		clk.Set(time.Date(2026, 10, 4, 0, 0, 0, 0, lordHowe))
		assert.Equal(t, Result{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 23*time.Hour + 30*time.Minute, Window: 23*time.Hour + 30*time.Minute},
			allow(t, l, 1), "a day of 23½ hours")

		// Another rate, another calendar: the handle learns it on its next call.
		// SetRate keeps the usage of a limiter of one rate (the day's 1,
		// counted at 4 October's midnight in Lord Howe, which falls in
		// Kolkata's week from Monday 28 September: 4 October is a Sunday).
		week := PerWeek(3, kolkata, time.Monday)
		require.NoError(t, admin.SetRate(ctx, week))
		r := allow(t, l, 1)
		weekEnd := time.Date(2026, 10, 5, 0, 0, 0, 0, kolkata)
		assert.Equal(t, Result{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: weekEnd.Sub(clk.Now()), Window: 7 * 24 * time.Hour}, r)
		assert.True(t, allow(t, l, 1).Allowed)
		assert.False(t, allow(t, l, 1).Allowed)
		clk.Set(weekEnd)
		assert.Equal(t, int64(3), allow(t, l, 0).Remaining, "Monday in Kolkata")
		got, err = l.Config(ctx)
		require.NoError(t, err)
		assert.True(t, week.equal(got), "%v read back as %v", week, got)
	})
}

// Calendar windows are a fixed window's: the other algorithms refuse them,
// and a bad zone or day is refused before anything is stored.
func TestCalendarRefused(t *testing.T) {
	ctx := context.Background()
	berlin := zone(t, "Europe/Berlin")
	c := newClient(redistest.Miniredis(t), newClock())
	for _, a := range algorithms {
		l := a.new(c, uniqueName(t))
		if a.name == "fixed_window" {
			require.NoError(t, l.Validate(PerDay(1, berlin)))
			continue
		}
		assert.ErrorIs(t, l.SetRate(ctx, PerDay(1, berlin)), ErrInvalidConfig, a.name)
		assert.ErrorIs(t, l.SetRate(ctx, PerSecond(1).And(PerMonth(10, berlin))), ErrInvalidConfig, a.name)
		_, err := l.WithDefault(PerWeek(1, berlin, time.Monday)).Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrInvalidConfig, a.name)
		_, err = l.Config(ctx)
		assert.ErrorIs(t, err, ErrNotInitialized, "%s: nothing stored", a.name)
	}
	l := c.FixedWindow(uniqueName(t))
	for _, cfg := range []Config{PerDay(1, time.Local), PerDay(1, nil), PerMonthFrom(1, berlin, 0), PerMonthFrom(1, berlin, 32),
		PerDay(1, time.FixedZone("Mars", 3600)), {Rate: 1, Interval: 24 * time.Hour, Calendar: Calendar{Period: Daily, Location: berlin}}} {
		assert.ErrorIs(t, l.SetRate(ctx, cfg), ErrInvalidConfig, "%+v", cfg)
	}
	_, err := l.Config(ctx)
	assert.ErrorIs(t, err, ErrNotInitialized, "nothing stored")
}

// Windows sent for a clock a whole window away from Redis's: the script
// refuses to count in a window it cannot place.
func TestCalendarClockSkew(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		clk := newClock()
		l := newClient(rdb, clk).FixedWindow(uniqueName(t)).WithDefault(PerDay(5, time.UTC))
		clk.Set(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
		require.True(t, allow(t, l, 1).Allowed)
		// The windows of 1 June go on being sent (as by a client whose clock
		// stayed there) while the decision's clock is three days on.
		l.calendars = l.calendars.Pinned(clk.Now())
		clk.Set(time.Date(2026, 6, 4, 12, 0, 0, 0, time.UTC))
		_, err := l.Allow(context.Background(), 1)
		assert.ErrorIs(t, err, ErrClockSkew)
		assert.NotErrorIs(t, err, ErrUnavailable, "not an outage: never granted open")
	})
}

// 64 callers, batched, on one daily quota and on a PerClient one: each
// grants its Limit exactly.
func TestCalendarConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		kolkata := zone(t, "Asia/Kolkata")
		clk := newClock()
		clk.Set(time.Date(2026, 2, 28, 23, 0, 0, 0, kolkata))
		c := newClient(rdb, clk)
		overall := c.FixedWindow(uniqueName(t)).WithDefault(PerDay(100, kolkata))
		perClient := PerMonth(10, kolkata)
		perClient.Type = PerClient
		clients := c.FixedWindow(uniqueName(t)).WithDefault(perClient)
		var granted, grantedA, grantedB atomic.Int64
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Go(func() {
				for range 5 {
					if allow(t, overall, 1).Allowed {
						granted.Add(1)
					}
					id, n := "a", &grantedA
					if i%2 == 1 {
						id, n = "b", &grantedB
					}
					if allow(t, clients.AsClient(id), 1).Allowed {
						n.Add(1)
					}
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int64(100), granted.Load())
		assert.Equal(t, int64(10), grantedA.Load())
		assert.Equal(t, int64(10), grantedB.Load())
		clk.Set(time.Date(2026, 3, 1, 0, 0, 0, 0, kolkata))
		assert.Equal(t, int64(10), allow(t, clients.AsClient("a"), 0).Remaining, "March")
		assert.Equal(t, int64(100), allow(t, overall, 0).Remaining, "1 March")
	})
}

// Every window of four zones' calendars over 2026–2028 that a clock change,
// a month's end or 29 February shapes, through Redis: each grants exactly
// its Limit from its local start, denies one more until its end (RetryAfter
// to the ms), and is full again at its end. The edges expected are worked
// out here without Calendar: local midnight by time.Date (none of these
// zones skips midnight), a billing day clamped to the month's length.
func TestCalendarEveryWindow(t *testing.T) {
	type window struct{ start, end time.Time }
	daysIn := func(y int, m time.Month) int { return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day() }
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, name := range []string{"America/New_York", "Europe/Berlin", "Asia/Kolkata", "Australia/Lord_Howe"} {
			loc := zone(t, name)
			midnight := func(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, loc) }
			// The days whose length is not 24 hours, and those around them,
			// and around 29 February 2028 and each year's end; the weeks of
			// other than 7 × 24 hours, and the one that holds 29 February.
			var days, weeks []window
			for d := midnight(2026, 1, 1); d.Year() < 2029; d = d.AddDate(0, 0, 1) {
				next := d.AddDate(0, 0, 1)
				if next.Sub(d) != 24*time.Hour || d.Month() == 2 && d.Day() >= 28 || d.Month() == 12 && d.Day() == 31 {
					days = append(days, window{d.AddDate(0, 0, -1), d}, window{d, next}, window{next, next.AddDate(0, 0, 1)})
				}
				if d.Weekday() == time.Monday {
					if end := d.AddDate(0, 0, 7); end.Sub(d) != 7*24*time.Hour || d.Year() == 2028 && d.Month() == 2 && d.Day() >= 23 {
						weeks = append(weeks, window{d, end})
					}
				}
			}
			// Each day once, in order: a window visited again after a later
			// one would count in the later one (windows never go back).
			slices.SortFunc(days, func(a, b window) int { return a.start.Compare(b.start) })
			days = slices.CompactFunc(days, func(a, b window) bool { return a.start.Equal(b.start) })
			var months, billing []window
			for y := 2026; y <= 2028; y++ {
				for m := time.January; m <= time.December; m++ {
					months = append(months, window{midnight(y, m, 1), midnight(y, m+1, 1)})
					billing = append(billing, window{midnight(y, m, min(31, daysIn(y, m))), midnight(y, m+1, min(31, daysIn(y, m+1)))})
				}
			}
			for _, tc := range []struct {
				cfg     Config
				windows []window
			}{
				{PerDay(4, loc), days},
				{PerWeek(4, loc, time.Monday), weeks},
				{PerMonth(4, loc), months},
				{PerMonthFrom(4, loc, 31), billing},
			} {
				clk := newClock()
				l := newClient(rdb, clk).FixedWindow(uniqueName(t)).WithDefault(tc.cfg)
				if tc.cfg.Calendar.Period != Monthly {
					require.NotEmpty(t, tc.windows, tc.cfg)
				}
				for _, w := range tc.windows {
					length := w.end.Sub(w.start)
					clk.Set(w.start)
					assert.Equal(t, Result{Allowed: true, Limit: 4, Remaining: 0, ResetAfter: length, Window: length}, allow(t, l, 4),
						"%v from %v", tc.cfg, w.start)
					assert.Equal(t, Result{Limit: 4, RetryAfter: length, ResetAfter: length, Window: length}, allow(t, l, 1),
						"%v from %v: none more", tc.cfg, w.start)
					clk.Set(w.end.Add(-time.Millisecond))
					assert.Equal(t, time.Millisecond, allow(t, l, 1).RetryAfter, "%v: still %v's window", tc.cfg, w.start)
					clk.Set(w.end)
					assert.Equal(t, int64(4), allow(t, l, 0).Remaining, "%v: full again at %v", tc.cfg, w.end)
				}
			}
		}
	})
}

// A calendar field that no client wrote is corrupt state: a rate the config
// does not have, a zone that does not load, or garbage.
func TestCalendarCorrupt(t *testing.T) {
	eachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		for _, field := range []string{"2=day:0:UTC", "1=day:0:Mars/Olympus", "1=fortnight:0:UTC", "x"} {
			clk, name := newClock(), uniqueName(t)
			l := newClient(rdb, clk).FixedWindow(name)
			require.NoError(t, l.SetRate(ctx, PerDay(5, time.UTC)))
			require.NoError(t, rdb.HSet(ctx, l.Name(), "calendar", field).Err())
			_, err := l.Allow(ctx, 1)
			assert.ErrorIs(t, err, ErrCorruptState, field)
			_, err = newClient(rdb, clk).FixedWindow(name).Config(ctx)
			assert.ErrorIs(t, err, ErrCorruptState, "%s: Config", field)
		}
	})
}
