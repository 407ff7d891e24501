package redlimit

import (
	"testing"
	"time"
	_ "time/tzdata" // the zones below are Go's own, not whatever the machine's zoneinfo holds

	"github.com/redlimit/redlimit/internal/calendar"
	"github.com/redlimit/redlimit/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Calendar's own checks and its text form; the windows themselves are
// internal/calendar's, and tested there.

// calendarZone loads a zone from Go's embedded database.
func calendarZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

// TestCalendarPeriods: Calendar.rule converts a Period by its value.
func TestCalendarPeriods(t *testing.T) {
	assert.Equal(t, calendar.Daily, calendar.Period(Daily))
	assert.Equal(t, calendar.Weekly, calendar.Period(Weekly))
	assert.Equal(t, calendar.Monthly, calendar.Period(Monthly))
}

func TestCalendarValidate(t *testing.T) {
	ny := calendarZone(t, "America/New_York")
	for _, tc := range []struct {
		name string
		cal  Calendar
		why  string // part of the error; "" for a valid calendar
	}{
		{"daily UTC", Calendar{Period: Daily, Location: time.UTC}, ""},
		{"daily New York", Calendar{Period: Daily, Location: ny}, ""},
		{"weekly from Saturday", Calendar{Period: Weekly, Location: ny, Weekday: time.Saturday}, ""},
		{"weekly from Sunday", Calendar{Period: Weekly, Location: ny, Weekday: time.Sunday}, ""},
		{"monthly from the 1st", Calendar{Period: Monthly, Location: ny, Day: 1}, ""},
		{"monthly from the 31st", Calendar{Period: Monthly, Location: ny, Day: 31}, ""},

		{"no period", Calendar{Location: ny}, "unknown calendar period 0"},
		{"period 4", Calendar{Period: Monthly + 1, Location: ny, Day: 1}, "unknown calendar period 4"},
		{"nil location", Calendar{Period: Daily}, "needs a time zone"},
		{"time.Local", Calendar{Period: Daily, Location: time.Local}, "time.Local"},
		{"a zone named Local", Calendar{Period: Daily, Location: time.FixedZone("Local", 0)}, "time.Local"},
		{"weekday on a daily quota", Calendar{Period: Daily, Location: ny, Weekday: time.Monday}, "only a weekly quota"},
		{"weekday on a monthly quota", Calendar{Period: Monthly, Location: ny, Weekday: time.Monday, Day: 1}, "only a weekly quota"},
		{"weekday 7", Calendar{Period: Weekly, Location: ny, Weekday: 7}, "unknown weekday 7"},
		{"weekday -1", Calendar{Period: Weekly, Location: ny, Weekday: -1}, "unknown weekday -1"},
		{"day on a daily quota", Calendar{Period: Daily, Location: ny, Day: 5}, "only a monthly quota"},
		{"day on a weekly quota", Calendar{Period: Weekly, Location: ny, Day: 5}, "only a monthly quota"},
		{"day 0", Calendar{Period: Monthly, Location: ny}, "outside 1..31"},
		{"day 32", Calendar{Period: Monthly, Location: ny, Day: 32}, "outside 1..31"},
		{"day -1", Calendar{Period: Monthly, Location: ny, Day: -1}, "outside 1..31"},
		// The zone's name goes into the spec, which ':' and ',' delimit.
		{"a name with a colon", Calendar{Period: Daily, Location: time.FixedZone("UTC+01:00", 3600)}, `time zone "UTC+01:00"`},
		{"a name with a comma", Calendar{Period: Daily, Location: time.FixedZone("a,b", 0)}, `time zone "a,b"`},
		{"a name no instance can load", Calendar{Period: Daily, Location: time.FixedZone("Mars/Olympus_Mons", 0)}, `time zone "Mars/Olympus_Mons": `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cal.validate()
			if tc.why == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.why)
		})
	}
}

// TestCalendarValidateZoneMatchesItsName: the scripts' windows come from
// the zone loaded by name (internal/calendar parses the spec), so a Location that
// only borrows a loadable name would have its windows silently moved. A
// fixed +01:00 named "CET" gets CET's summer time: its daily windows would
// start at 22:00 UTC from April to October, not 23:00.
func TestCalendarValidateZoneMatchesItsName(t *testing.T) {
	for _, loc := range []*time.Location{
		time.FixedZone("CET", 3600),
		time.FixedZone("UTC", 3600),
		time.FixedZone("Europe/Berlin", 0),
	} {
		t.Run(loc.String(), func(t *testing.T) {
			err := Calendar{Period: Daily, Location: loc}.validate()
			assert.ErrorIs(t, err, ErrInvalidConfig, "a fixed zone under a loadable name is another zone")
		})
	}
}

func TestCalendarValidateConfig(t *testing.T) {
	const day = 24 * time.Hour
	berlin := calendarZone(t, "Europe/Berlin")
	// Interval is the longest window: a day or a week an hour longer where
	// clocks go back, a month of 31 days the same.
	assert.Equal(t, 25*time.Hour, PerDay(10, berlin).Interval)
	assert.Equal(t, 7*day+time.Hour, PerWeek(10, berlin, time.Monday).Interval)
	assert.Equal(t, 31*day+time.Hour, PerMonth(10, berlin).Interval)
	assert.Equal(t, 31*day+time.Hour, PerMonthFrom(10, berlin, 15).Interval)

	assert.Equal(t, Config{Type: Overall, Rate: 10, Interval: 25 * time.Hour, Calendar: Calendar{Period: Daily, Location: berlin}}, PerDay(10, berlin))
	assert.Equal(t, Calendar{Period: Weekly, Location: berlin, Weekday: time.Sunday}, PerWeek(10, berlin, time.Sunday).Calendar)
	assert.Equal(t, Calendar{Period: Monthly, Location: berlin, Day: 1}, PerMonth(10, berlin).Calendar)
	assert.Equal(t, Calendar{Period: Monthly, Location: berlin, Day: 15}, PerMonthFrom(10, berlin, 15).Calendar)

	for _, c := range []Config{PerDay(10, berlin), PerWeek(10, berlin, time.Monday), PerMonthFrom(10, berlin, 31),
		PerDay(10, berlin).And(PerMonth(100, berlin))} {
		assert.NoError(t, c.validate(), "%v", c)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		why  string
	}{
		{"a daily rate per 24h", Config{Type: Overall, Rate: 10, Interval: day, Calendar: Calendar{Period: Daily, Location: berlin}}, "longest window"},
		{"a weekly rate per 7 days", Config{Type: Overall, Rate: 10, Interval: 7 * day, Calendar: Calendar{Period: Weekly, Location: berlin, Weekday: time.Monday}}, "longest window"},
		{"a monthly rate per 31 days", Config{Type: Overall, Rate: 10, Interval: 31 * day, Calendar: Calendar{Period: Monthly, Location: berlin, Day: 1}}, "longest window"},
		{"the calendar itself", PerMonthFrom(10, berlin, 32), "outside 1..31"},
		{"a further rate's calendar checked too", PerDay(10, berlin).And(PerMonthFrom(100, time.Local, 1)), "time.Local"},
		{"two daily rates", PerDay(10, berlin).And(PerDay(20, time.UTC)), "two rates per 25h0m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.validate()
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.why)
		})
	}
}

func TestCalendarSpec(t *testing.T) {
	berlin, kolkata := calendarZone(t, "Europe/Berlin"), calendarZone(t, "Asia/Kolkata")
	for _, tc := range []struct {
		cal  Calendar
		spec string
	}{
		{Calendar{Period: Daily, Location: time.UTC}, "day:0:UTC"},
		{Calendar{Period: Daily, Location: berlin}, "day:0:Europe/Berlin"},
		{Calendar{Period: Weekly, Location: berlin, Weekday: time.Sunday}, "week:0:Europe/Berlin"},
		{Calendar{Period: Weekly, Location: kolkata, Weekday: time.Saturday}, "week:6:Asia/Kolkata"},
		{Calendar{Period: Monthly, Location: kolkata, Day: 1}, "month:1:Asia/Kolkata"},
		{Calendar{Period: Monthly, Location: berlin, Day: 31}, "month:31:Europe/Berlin"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			text, err := tc.cal.MarshalText()
			require.NoError(t, err)
			assert.Equal(t, tc.spec, string(text))
			var got Calendar
			require.NoError(t, got.UnmarshalText(text))
			assert.True(t, got.equal(tc.cal), "parsed %+v", got)
			// What equal compares, field by field: the zone loaded anew under its name.
			assert.Equal(t, tc.cal.Period, got.Period)
			assert.Equal(t, tc.cal.Weekday, got.Weekday)
			assert.Equal(t, tc.cal.Day, got.Day)
			assert.Equal(t, tc.cal.Location.String(), got.Location.String())
		})
	}

	// equal tells calendars apart on each field.
	daily := Calendar{Period: Daily, Location: berlin}
	assert.True(t, daily.equal(Calendar{Period: Daily, Location: calendarZone(t, "Europe/Berlin")}), "two loads of one zone")
	assert.False(t, daily.equal(Calendar{Period: Daily, Location: kolkata}))
	assert.False(t, daily.equal(Calendar{Period: Weekly, Location: berlin}))
	assert.False(t, daily.equal(Calendar{}))
	assert.True(t, Calendar{}.equal(Calendar{}))
	assert.False(t, Calendar{Period: Monthly, Location: berlin, Day: 30}.equal(Calendar{Period: Monthly, Location: berlin, Day: 31}))
	assert.False(t, Calendar{Period: Weekly, Location: berlin, Weekday: time.Monday}.equal(Calendar{Period: Weekly, Location: berlin}))

	for _, spec := range []string{
		"day", "day:0", "day::UTC", "day:x:UTC", "year:0:UTC", ":0:UTC",
		"day:1:UTC",    // an anchor on a daily calendar
		"day:00:UTC",   // not as spec writes it
		"month:+5:UTC", // the same
		"week:7:UTC", "week:-1:UTC", "month:0:UTC", "month:32:UTC",
		"day:0:", "day:0:Local", "day:0:Mars/Olympus_Mons", "day:0:Europe/Berlin ", " day:0:UTC",
		"month:31:Europe/Berlin,2=day:0:UTC",
	} {
		var c Calendar
		assert.ErrorIs(t, c.UnmarshalText([]byte(spec)), ErrInvalidConfig, "UnmarshalText(%q)", spec)
	}
	// Empty text is no calendar, and no calendar writes none.
	c := Calendar{Period: Daily, Location: berlin}
	require.NoError(t, c.UnmarshalText(nil))
	assert.Equal(t, Calendar{}, c)
	text, err := Calendar{}.MarshalText()
	require.NoError(t, err)
	assert.Empty(t, text)
}

func TestCalendarSpecList(t *testing.T) {
	berlin := calendarZone(t, "Europe/Berlin")
	const spec = "1=day:0:UTC,2=month:31:Europe/Berlin"
	// Config.calendars writes what calendar.ParseList reads (internal/calendar's TestCalendarSpecList).
	assert.Equal(t, spec, wire.EncodeCalendars(PerDay(10, time.UTC).And(PerMonthFrom(100, berlin, 31)).calendars()))
	assert.Equal(t, "2=week:1:Europe/Berlin", wire.EncodeCalendars(PerHour(10).And(PerWeek(100, berlin, time.Monday)).calendars()))
	assert.Empty(t, PerHour(10).calendars())
	rates, ok := calendar.ParseList(spec)
	require.True(t, ok)
	require.Len(t, rates, 2)
	assert.True(t, calendarOf(rates[0].Rule).equal(Calendar{Period: Daily, Location: time.UTC}), "%+v", rates[0].Rule)
	assert.True(t, calendarOf(rates[1].Rule).equal(Calendar{Period: Monthly, Location: berlin, Day: 31}), "%+v", rates[1].Rule)
}
