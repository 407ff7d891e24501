package calendar

import (
	"strconv"
	"testing"
	"time"
	_ "time/tzdata" // the zones below are Go's own, not whatever the machine's zoneinfo holds

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The expected instants in this file are worked out by hand from the zones'
// rules, in UTC, never by the code under test:
//
//	America/New_York     EST -5, EDT -4; 2026: Mar 8 02:00 -> 03:00, Nov 1 02:00 -> 01:00; 2027: Mar 14; 2028: Mar 12
//	Europe/Berlin        CET +1, CEST +2; at 01:00 UTC on 2026-03-29, 2026-10-25, 2027-03-28, 2028-03-26
//	Asia/Kolkata         +5:30 all year
//	Australia/Lord_Howe  +10:30, +11 in summer; 2026: Apr 5 02:00 -> 01:30, Oct 4 02:00 -> 02:30; 2027: Apr 4
//	America/Santiago     -4, -3 in summer; 2026: Apr 5 00:00 -03 -> Apr 4 23:00 -04, Sep 6 00:00 -04 -> 01:00 -03 (no midnight)
//	America/Havana       CST -5, CDT -4; 2026: Mar 8 00:00 -> 01:00 (no midnight), Nov 1 01:00 -> 00:00 (midnight twice)
//
// 2026-01-01 is a Thursday, 2027-01-01 a Friday, 2028-01-01 a Saturday.

// calendarZone loads a zone from Go's embedded database.
func calendarZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

func utcAt(y int, m time.Month, d, hour, minute int) time.Time {
	return time.Date(y, m, d, hour, minute, 0, 0, time.UTC)
}

// windowCase asks for the window holding at, and expects [start, end) of
// length long (the length is said again so a row reads as the day it tests).
type windowCase struct {
	name       string
	cal        Rule
	at         time.Time
	start, end time.Time
	long       time.Duration
}

func checkWindows(t *testing.T, cases []windowCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.long, tc.end.Sub(tc.start), "the row's own arithmetic")
			start, end := tc.cal.Window(tc.at)
			assert.Equal(t, tc.start, start.UTC(), "start")
			assert.Equal(t, tc.end, end.UTC(), "end")
		})
	}
}

func TestCalendarWindowDaily(t *testing.T) {
	day := func(name string) Rule { return Rule{Period: Daily, Location: calendarZone(t, name)} }
	ny, berlin, kolkata := day("America/New_York"), day("Europe/Berlin"), day("Asia/Kolkata")
	lordHowe, santiago, havana := day("Australia/Lord_Howe"), day("America/Santiago"), day("America/Havana")
	checkWindows(t, []windowCase{
		// New York: the days clocks change are 23 and 25 hours.
		{"NY/2026-03-07 ordinary", ny, utcAt(2026, 3, 7, 17, 0), utcAt(2026, 3, 7, 5, 0), utcAt(2026, 3, 8, 5, 0), 24 * time.Hour},
		{"NY/2026-03-08 spring 01:59:59 EST", ny, utcAt(2026, 3, 8, 6, 59).Add(59 * time.Second), utcAt(2026, 3, 8, 5, 0), utcAt(2026, 3, 9, 4, 0), 23 * time.Hour},
		{"NY/2026-03-08 spring 03:00 EDT", ny, utcAt(2026, 3, 8, 7, 0), utcAt(2026, 3, 8, 5, 0), utcAt(2026, 3, 9, 4, 0), 23 * time.Hour},
		{"NY/2026-03-08 spring last ns", ny, utcAt(2026, 3, 9, 4, 0).Add(-time.Nanosecond), utcAt(2026, 3, 8, 5, 0), utcAt(2026, 3, 9, 4, 0), 23 * time.Hour},
		{"NY/2026-03-09 first instant", ny, utcAt(2026, 3, 9, 4, 0), utcAt(2026, 3, 9, 4, 0), utcAt(2026, 3, 10, 4, 0), 24 * time.Hour},
		{"NY/2026-11-01 fall 01:30 EDT", ny, utcAt(2026, 11, 1, 5, 30), utcAt(2026, 11, 1, 4, 0), utcAt(2026, 11, 2, 5, 0), 25 * time.Hour},
		{"NY/2026-11-01 fall 01:30 EST", ny, utcAt(2026, 11, 1, 6, 30), utcAt(2026, 11, 1, 4, 0), utcAt(2026, 11, 2, 5, 0), 25 * time.Hour},
		{"NY/2026-11-01 fall last ns", ny, utcAt(2026, 11, 2, 5, 0).Add(-time.Nanosecond), utcAt(2026, 11, 1, 4, 0), utcAt(2026, 11, 2, 5, 0), 25 * time.Hour},
		{"NY/2026-11-02 first instant", ny, utcAt(2026, 11, 2, 5, 0), utcAt(2026, 11, 2, 5, 0), utcAt(2026, 11, 3, 5, 0), 24 * time.Hour},

		// Berlin: the changes at 01:00 UTC on the last Sundays of March and October.
		{"Berlin/2026-03-28 ordinary", berlin, utcAt(2026, 3, 28, 12, 0), utcAt(2026, 3, 27, 23, 0), utcAt(2026, 3, 28, 23, 0), 24 * time.Hour},
		{"Berlin/2026-03-29 spring at the change", berlin, utcAt(2026, 3, 29, 1, 0), utcAt(2026, 3, 28, 23, 0), utcAt(2026, 3, 29, 22, 0), 23 * time.Hour},
		{"Berlin/2026-10-25 fall 02:30 CEST", berlin, utcAt(2026, 10, 25, 0, 30), utcAt(2026, 10, 24, 22, 0), utcAt(2026, 10, 25, 23, 0), 25 * time.Hour},
		{"Berlin/2026-10-25 fall 02:30 CET", berlin, utcAt(2026, 10, 25, 1, 30), utcAt(2026, 10, 24, 22, 0), utcAt(2026, 10, 25, 23, 0), 25 * time.Hour},
		{"Berlin/2026-10-26 ordinary", berlin, utcAt(2026, 10, 26, 12, 0), utcAt(2026, 10, 25, 23, 0), utcAt(2026, 10, 26, 23, 0), 24 * time.Hour},

		// Kolkata: no clock changes, a half-hour offset; its days are 24 hours on every date.
		{"Kolkata/2026-03-08", kolkata, utcAt(2026, 3, 8, 12, 0), utcAt(2026, 3, 7, 18, 30), utcAt(2026, 3, 8, 18, 30), 24 * time.Hour},
		{"Kolkata/2026-03-08 last ns", kolkata, utcAt(2026, 3, 8, 18, 30).Add(-time.Nanosecond), utcAt(2026, 3, 7, 18, 30), utcAt(2026, 3, 8, 18, 30), 24 * time.Hour},
		{"Kolkata/2026-03-09 first instant", kolkata, utcAt(2026, 3, 8, 18, 30), utcAt(2026, 3, 8, 18, 30), utcAt(2026, 3, 9, 18, 30), 24 * time.Hour},
		{"Kolkata/2026-10-25", kolkata, utcAt(2026, 10, 25, 1, 0), utcAt(2026, 10, 24, 18, 30), utcAt(2026, 10, 25, 18, 30), 24 * time.Hour},

		// Lord Howe: the clocks move by half an hour.
		{"LordHowe/2026-04-05 fall 01:45 +11", lordHowe, utcAt(2026, 4, 4, 14, 45), utcAt(2026, 4, 4, 13, 0), utcAt(2026, 4, 5, 13, 30), 24*time.Hour + 30*time.Minute},
		{"LordHowe/2026-04-05 fall 01:45 +10:30", lordHowe, utcAt(2026, 4, 4, 15, 15), utcAt(2026, 4, 4, 13, 0), utcAt(2026, 4, 5, 13, 30), 24*time.Hour + 30*time.Minute},
		{"LordHowe/2026-07-01 ordinary", lordHowe, utcAt(2026, 7, 1, 0, 0), utcAt(2026, 6, 30, 13, 30), utcAt(2026, 7, 1, 13, 30), 24 * time.Hour},
		{"LordHowe/2026-10-04 spring", lordHowe, utcAt(2026, 10, 4, 0, 0), utcAt(2026, 10, 3, 13, 30), utcAt(2026, 10, 4, 13, 0), 23*time.Hour + 30*time.Minute},
		{"LordHowe/2027-04-04 fall", lordHowe, utcAt(2027, 4, 4, 0, 0), utcAt(2027, 4, 3, 13, 0), utcAt(2027, 4, 4, 13, 30), 24*time.Hour + 30*time.Minute},

		// Santiago: in April the hour before midnight comes twice, and that
		// whole second hour is still April 4th; in September midnight does
		// not exist and the 6th begins at 01:00 -03.
		{"Santiago/2026-04-04 second 23:30", santiago, utcAt(2026, 4, 5, 3, 30), utcAt(2026, 4, 4, 3, 0), utcAt(2026, 4, 5, 4, 0), 25 * time.Hour},
		{"Santiago/2026-04-05", santiago, utcAt(2026, 4, 5, 4, 0), utcAt(2026, 4, 5, 4, 0), utcAt(2026, 4, 6, 4, 0), 24 * time.Hour},
		{"Santiago/2026-09-05", santiago, utcAt(2026, 9, 5, 12, 0), utcAt(2026, 9, 5, 4, 0), utcAt(2026, 9, 6, 4, 0), 24 * time.Hour},
		{"Santiago/2026-09-05 last ns", santiago, utcAt(2026, 9, 6, 4, 0).Add(-time.Nanosecond), utcAt(2026, 9, 5, 4, 0), utcAt(2026, 9, 6, 4, 0), 24 * time.Hour},
		{"Santiago/2026-09-06 no midnight", santiago, utcAt(2026, 9, 6, 4, 0), utcAt(2026, 9, 6, 4, 0), utcAt(2026, 9, 7, 3, 0), 23 * time.Hour},

		// Havana: March skips midnight; November repeats the hour after it,
		// and the day begins at the first of its two midnights.
		{"Havana/2026-03-07", havana, utcAt(2026, 3, 7, 17, 0), utcAt(2026, 3, 7, 5, 0), utcAt(2026, 3, 8, 5, 0), 24 * time.Hour},
		{"Havana/2026-03-08 no midnight", havana, utcAt(2026, 3, 8, 5, 0), utcAt(2026, 3, 8, 5, 0), utcAt(2026, 3, 9, 4, 0), 23 * time.Hour},
		{"Havana/2026-11-01 first 00:30", havana, utcAt(2026, 11, 1, 4, 30), utcAt(2026, 11, 1, 4, 0), utcAt(2026, 11, 2, 5, 0), 25 * time.Hour},
		{"Havana/2026-11-01 second 00:30", havana, utcAt(2026, 11, 1, 5, 30), utcAt(2026, 11, 1, 4, 0), utcAt(2026, 11, 2, 5, 0), 25 * time.Hour},
	})
}

// TestCalendarWindowMidnight pins midnight where time.Date alone is wrong or
// needs normalising: a skipped midnight, for which time.Date answers 23:00
// of the day before, and days past the month's end.
func TestCalendarWindowMidnight(t *testing.T) {
	cal := func(name string) Rule { return Rule{Period: Daily, Location: calendarZone(t, name)} }
	for _, tc := range []struct {
		name string
		cal  Rule
		y    int
		m    time.Month
		d    int
		want time.Time
	}{
		{"Santiago 2026-09-06 begins at 01:00 -03", cal("America/Santiago"), 2026, 9, 6, utcAt(2026, 9, 6, 4, 0)},
		{"Havana 2026-03-08 begins at 01:00 CDT", cal("America/Havana"), 2026, 3, 8, utcAt(2026, 3, 8, 5, 0)},
		{"Havana 2026-11-01 first of two midnights", cal("America/Havana"), 2026, 11, 1, utcAt(2026, 11, 1, 4, 0)},
		{"Santiago 2026-04-05 after the repeated hour", cal("America/Santiago"), 2026, 4, 5, utcAt(2026, 4, 5, 4, 0)},
		{"NY 2026-02-29 is March 1st", cal("America/New_York"), 2026, 2, 29, utcAt(2026, 3, 1, 5, 0)},
		{"Berlin 2026-12-32 is 2027-01-01", cal("Europe/Berlin"), 2026, 12, 32, utcAt(2026, 12, 31, 23, 0)},
		{"Kolkata 2026-01-00 is 2025-12-31", cal("Asia/Kolkata"), 2026, 1, 0, utcAt(2025, 12, 30, 18, 30)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.cal.begins(dateOf(tc.y, tc.m, tc.d)).UTC())
		})
	}
}

// TestCalendarWindowSkippedDate: Samoa skipped 2011-12-30 entirely (from
// 23:59:59 -10 on the 29th to 00:00 +14 on the 31st, at 10:00 UTC on the
// 30th). The 29th lasts 24 hours, and a day that never was begins where the
// next one does (not at the next date with the same day of the month,
// 2012-01-30).
func TestCalendarWindowSkippedDate(t *testing.T) {
	apia := Rule{Period: Daily, Location: calendarZone(t, "Pacific/Apia")}
	assert.Equal(t, utcAt(2011, 12, 30, 10, 0), apia.begins(dateOf(2011, 12, 30)).UTC(), "midnight of the skipped date")
	checkWindows(t, []windowCase{
		{"Apia/2011-12-29", apia, utcAt(2011, 12, 29, 22, 0), utcAt(2011, 12, 29, 10, 0), utcAt(2011, 12, 30, 10, 0), 24 * time.Hour},
		{"Apia/2011-12-31", apia, utcAt(2011, 12, 30, 22, 0), utcAt(2011, 12, 30, 10, 0), utcAt(2011, 12, 31, 10, 0), 24 * time.Hour},
	})
}

func TestCalendarWindowMonthly(t *testing.T) {
	month := func(name string, day int) Rule {
		return Rule{Period: Monthly, Location: calendarZone(t, name), Day: day}
	}
	const day = 24 * time.Hour
	nyFirst, utcFirst, lordHoweFirst := month("America/New_York", 1), month("UTC", 1), month("Australia/Lord_Howe", 1)
	berlin31, utc31, ny29 := month("Europe/Berlin", 31), month("UTC", 31), month("America/New_York", 29)
	kolkata30, santiago6 := month("Asia/Kolkata", 30), month("America/Santiago", 6)
	checkWindows(t, []windowCase{
		// From the 1st: a month that holds a clock change is an hour short or long.
		{"NY/March 2026 loses an hour", nyFirst, utcAt(2026, 3, 15, 16, 0), utcAt(2026, 3, 1, 5, 0), utcAt(2026, 4, 1, 4, 0), 31*day - time.Hour},
		{"NY/November 2026 gains one", nyFirst, utcAt(2026, 11, 15, 17, 0), utcAt(2026, 11, 1, 4, 0), utcAt(2026, 12, 1, 5, 0), 30*day + time.Hour},
		{"NY/the 1st's first instant", nyFirst, utcAt(2026, 4, 1, 4, 0), utcAt(2026, 4, 1, 4, 0), utcAt(2026, 5, 1, 4, 0), 30 * day},
		{"UTC/February 2026", utcFirst, utcAt(2026, 2, 10, 0, 0), utcAt(2026, 2, 1, 0, 0), utcAt(2026, 3, 1, 0, 0), 28 * day},
		{"UTC/February 2028 (leap)", utcFirst, utcAt(2028, 2, 29, 23, 59), utcAt(2028, 2, 1, 0, 0), utcAt(2028, 3, 1, 0, 0), 29 * day},
		{"LordHowe/April 2026 gains half an hour", lordHoweFirst, utcAt(2026, 4, 10, 0, 0), utcAt(2026, 3, 31, 13, 0), utcAt(2026, 4, 30, 13, 30), 30*day + 30*time.Minute},

		// Billing on the 31st: a shorter month starts on its last day.
		{"Berlin31/February 2028 starts on the 29th", berlin31, utcAt(2028, 2, 29, 11, 0), utcAt(2028, 2, 28, 23, 0), utcAt(2028, 3, 30, 22, 0), 31*day - time.Hour},
		{"Berlin31/2028-02-28 is January's", berlin31, utcAt(2028, 2, 28, 11, 0), utcAt(2028, 1, 30, 23, 0), utcAt(2028, 2, 28, 23, 0), 29 * day},
		{"Berlin31/February 2027 starts on the 28th", berlin31, utcAt(2027, 2, 28, 11, 0), utcAt(2027, 2, 27, 23, 0), utcAt(2027, 3, 30, 22, 0), 31*day - time.Hour},
		{"Berlin31/March 2026 starts on the 31st", berlin31, utcAt(2026, 3, 30, 22, 0), utcAt(2026, 3, 30, 22, 0), utcAt(2026, 4, 29, 22, 0), 30 * day},
		{"Berlin31/a ns before March 31st is February's", berlin31, utcAt(2026, 3, 30, 22, 0).Add(-time.Nanosecond), utcAt(2026, 2, 27, 23, 0), utcAt(2026, 3, 30, 22, 0), 31*day - time.Hour},
		{"Berlin31/April 2026 starts on the 30th", berlin31, utcAt(2026, 4, 30, 10, 0), utcAt(2026, 4, 29, 22, 0), utcAt(2026, 5, 30, 22, 0), 31 * day},
		{"UTC31/December into January", utc31, utcAt(2026, 12, 31, 12, 0), utcAt(2026, 12, 31, 0, 0), utcAt(2027, 1, 31, 0, 0), 31 * day},
		{"UTC31/2026-01-01 is December 2025's", utc31, utcAt(2026, 1, 1, 0, 0), utcAt(2025, 12, 31, 0, 0), utcAt(2026, 1, 31, 0, 0), 31 * day},

		// Billing on the 29th and the 30th.
		{"NY29/February 2027 starts on the 28th", ny29, utcAt(2027, 2, 28, 17, 0), utcAt(2027, 2, 28, 5, 0), utcAt(2027, 3, 29, 4, 0), 29*day - time.Hour},
		{"NY29/2027-02-27 is January's", ny29, utcAt(2027, 2, 27, 17, 0), utcAt(2027, 1, 29, 5, 0), utcAt(2027, 2, 28, 5, 0), 30 * day},
		{"NY29/a ns before 2028-02-29 is January's", ny29, utcAt(2028, 2, 29, 5, 0).Add(-time.Nanosecond), utcAt(2028, 1, 29, 5, 0), utcAt(2028, 2, 29, 5, 0), 31 * day},
		{"NY29/2028-02-29 (leap) starts February's", ny29, utcAt(2028, 2, 29, 5, 0), utcAt(2028, 2, 29, 5, 0), utcAt(2028, 3, 29, 4, 0), 29*day - time.Hour},
		{"Kolkata30/February 2026 starts on the 28th", kolkata30, utcAt(2026, 2, 28, 6, 30), utcAt(2026, 2, 27, 18, 30), utcAt(2026, 3, 29, 18, 30), 30 * day},
		{"Kolkata30/mid-January is December 2025's", kolkata30, utcAt(2026, 1, 15, 6, 30), utcAt(2025, 12, 29, 18, 30), utcAt(2026, 1, 29, 18, 30), 31 * day},

		// Billing on a day whose midnight Santiago skips: September's
		// window starts at 01:00 -03 on the 6th, and 23:59:59 -04 on the 5th is August's.
		{"Santiago6/2026-09-05 23:59:59 is August's", santiago6, utcAt(2026, 9, 6, 3, 59).Add(59 * time.Second), utcAt(2026, 8, 6, 4, 0), utcAt(2026, 9, 6, 4, 0), 31 * day},
		{"Santiago6/September 2026", santiago6, utcAt(2026, 9, 6, 4, 0), utcAt(2026, 9, 6, 4, 0), utcAt(2026, 10, 6, 3, 0), 30*day - time.Hour},
	})
}

func TestCalendarWindowWeekly(t *testing.T) {
	week := func(name string, first time.Weekday) Rule {
		return Rule{Period: Weekly, Location: calendarZone(t, name), Weekday: first}
	}
	const day = 24 * time.Hour
	nyMonday, nySunday := week("America/New_York", time.Monday), week("America/New_York", time.Sunday)
	berlinMonday, kolkataSaturday := week("Europe/Berlin", time.Monday), week("Asia/Kolkata", time.Saturday)
	lordHoweSunday, santiagoSunday := week("Australia/Lord_Howe", time.Sunday), week("America/Santiago", time.Sunday)
	checkWindows(t, []windowCase{
		// 2026-03-08, a Sunday, loses an hour in New York.
		{"NY Monday/the week ending with the change", nyMonday, utcAt(2026, 3, 8, 16, 0), utcAt(2026, 3, 2, 5, 0), utcAt(2026, 3, 9, 4, 0), 7*day - time.Hour},
		{"NY Monday/its first instant", nyMonday, utcAt(2026, 3, 9, 4, 0), utcAt(2026, 3, 9, 4, 0), utcAt(2026, 3, 16, 4, 0), 7 * day},
		{"NY Sunday/the week starting with the change", nySunday, utcAt(2026, 3, 14, 16, 0), utcAt(2026, 3, 8, 5, 0), utcAt(2026, 3, 15, 4, 0), 7*day - time.Hour},
		{"NY Sunday/Saturday 23:59:59 EST is the week before", nySunday, utcAt(2026, 3, 8, 4, 59).Add(59 * time.Second), utcAt(2026, 3, 1, 5, 0), utcAt(2026, 3, 8, 5, 0), 7 * day},
		{"NY Sunday/the week of November's change", nySunday, utcAt(2026, 11, 4, 12, 0), utcAt(2026, 11, 1, 4, 0), utcAt(2026, 11, 8, 5, 0), 7*day + time.Hour},
		{"Berlin Monday/the week ending 2026-10-25", berlinMonday, utcAt(2026, 10, 25, 12, 0), utcAt(2026, 10, 18, 22, 0), utcAt(2026, 10, 25, 23, 0), 7*day + time.Hour},
		{"Kolkata Saturday/across the new year", kolkataSaturday, utcAt(2026, 1, 1, 0, 0), utcAt(2025, 12, 26, 18, 30), utcAt(2026, 1, 2, 18, 30), 7 * day},
		{"LordHowe Sunday/the week of October's change", lordHoweSunday, utcAt(2026, 10, 6, 0, 0), utcAt(2026, 10, 3, 13, 30), utcAt(2026, 10, 10, 13, 0), 7*day - 30*time.Minute},
		{"Santiago Sunday/a week starting with no midnight", santiagoSunday, utcAt(2026, 9, 6, 4, 0), utcAt(2026, 9, 6, 4, 0), utcAt(2026, 9, 13, 3, 0), 7*day - time.Hour},
		{"Santiago Sunday/the week before", santiagoSunday, utcAt(2026, 9, 6, 4, 0).Add(-time.Nanosecond), utcAt(2026, 8, 30, 4, 0), utcAt(2026, 9, 6, 4, 0), 7 * day},
	})
}

// TestCalendarWindowWalk steps through three years in every zone and period
// and checks what must hold of any window: it holds the instant, it is its
// own start's window, windows tile time with no gap or overlap, it starts at
// the first instant of a local date (00:00, or the end of a gap that skips
// it) on the period's anchor, and it is no longer than the rate's Interval.
func TestCalendarWindowWalk(t *testing.T) {
	const day = 24 * time.Hour
	zones := []string{"UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata", "Australia/Lord_Howe",
		"America/Santiago", "America/Havana", "Africa/Cairo", "Atlantic/Azores"}
	type period struct {
		name     string
		cal      Rule
		shortest time.Duration
		windows  int // from the one holding 2026-01-01 00:00 to the one holding 2028-12-31 23:59
	}
	for _, name := range zones {
		loc := calendarZone(t, name)
		periods := []period{
			// 2026 through 2028: 365 + 365 + 366 days.
			{"day", Rule{Period: Daily, Location: loc}, 23 * time.Hour, 1096},
			// Monday 2025-12-29 through Sunday 2028-12-31: 1,099 days, 157 weeks.
			{"week from Monday", Rule{Period: Weekly, Location: loc, Weekday: time.Monday}, 7*day - time.Hour, 157},
			// Sunday 2025-12-28 through Sunday 2028-12-31: 1,100 days, 157 weeks and the one starting on the last day.
			{"week from Sunday", Rule{Period: Weekly, Location: loc, Weekday: time.Sunday}, 7*day - time.Hour, 158},
			// Thursday 2026-01-01 starts a week; 2028-12-28 the last: 1,092 days later.
			{"week from Thursday", Rule{Period: Weekly, Location: loc, Weekday: time.Thursday}, 7*day - time.Hour, 157},
			{"month from the 1st", Rule{Period: Monthly, Location: loc, Day: 1}, 28*day - time.Hour, 36},
			// December 2025's window holds the start, then one per month.
			{"month from the 29th", Rule{Period: Monthly, Location: loc, Day: 29}, 28*day - time.Hour, 37},
			{"month from the 30th", Rule{Period: Monthly, Location: loc, Day: 30}, 28*day - time.Hour, 37},
			{"month from the 31st", Rule{Period: Monthly, Location: loc, Day: 31}, 28*day - time.Hour, 37},
		}
		for _, p := range periods {
			t.Run(name+"/"+p.name, func(t *testing.T) {
				require.NoError(t, p.cal.Validate())
				walkWindows(t, p.cal, p.shortest, p.windows)
			})
		}
	}
}

func walkWindows(t *testing.T, c Rule, shortest time.Duration, want int) {
	t.Helper()
	loc := c.Location
	// Every zone walked has a midnight on these two dates.
	from, to := time.Date(2026, 1, 1, 0, 0, 0, 0, loc), time.Date(2029, 1, 1, 0, 0, 0, 0, loc)
	// Shorter than any window, so no window is stepped over, and at odd
	// minutes and seconds, so the steps land at ever other times of day.
	const step = 7*time.Hour + 13*time.Minute + 17*time.Second
	windows := 0
	var prevStart, prevEnd time.Time
	for at := from; at.Before(to); at = at.Add(step) {
		start, end := c.Window(at)
		if at.Before(start) || !at.Before(end) {
			t.Fatalf("window(%v) = [%v, %v) does not hold it", at.In(loc), start.In(loc), end.In(loc))
		}
		if c.Period == Daily && !sameDate(at.In(loc), start.In(loc)) {
			t.Fatalf("window(%v) starts on another date, at %v", at.In(loc), start.In(loc))
		}
		if start.Equal(prevStart) && end.Equal(prevEnd) {
			continue
		}
		if windows > 0 && !start.Equal(prevEnd) {
			t.Fatalf("window(%v) = [%v, %v) does not follow [%v, %v)", at.In(loc), start.In(loc), end.In(loc), prevStart.In(loc), prevEnd.In(loc))
		}
		windows++
		prevStart, prevEnd = start, end
		checkWindow(t, c, start, end, shortest)
	}
	assert.Equal(t, want, windows, "windows from %v to %v", from, to)
}

// checkWindow checks one window [start, end) of c on its own.
func checkWindow(t *testing.T, c Rule, start, end time.Time, shortest time.Duration) {
	t.Helper()
	loc := c.Location
	fail := func(format string, a ...any) {
		t.Helper()
		t.Fatalf("window [%v, %v): "+format, append([]any{start.In(loc), end.In(loc)}, a...)...)
	}
	if s, e := c.Window(start); !s.Equal(start) || !e.Equal(end) {
		fail("window(start) = [%v, %v)", s.In(loc), e.In(loc))
	}
	if s, _ := c.Window(end); !s.Equal(end) {
		fail("window(end) starts at %v", s.In(loc))
	}
	if _, e := c.Window(start.Add(-time.Nanosecond)); !e.Equal(start) {
		fail("the window before ends at %v", e.In(loc))
	}
	if long := end.Sub(start); long < shortest || long > c.Longest() {
		fail("lasts %v, outside %v..%v", long, shortest, c.Longest())
	}
	// The first instant of a local date: the instant before is on an
	// earlier date, and the clock reads 00:00 unless a change skipped it.
	local, before := start.In(loc), start.Add(-time.Nanosecond).In(loc)
	if sameDate(local, before) {
		fail("the instant before, %v, is on the same date", before)
	}
	_, offsetBefore := before.Zone()
	_, offset := local.Zone()
	if h, m, s := local.Clock(); (h != 0 || m != 0 || s != 0 || local.Nanosecond() != 0) && offset == offsetBefore {
		fail("starts at %02d:%02d:%02d with no clock change", h, m, s)
	}
	// The end is the first instant of the period's next date.
	y, m, d := local.Date()
	switch c.Period {
	case Daily:
		d++
	case Weekly:
		if local.Weekday() != c.Weekday {
			fail("starts on a %v", local.Weekday())
		}
		d += 7
	case Monthly:
		if last := daysIn(y, m); d != min(c.Day, last) {
			fail("starts on day %d of a %d-day month", d, last)
		}
		m++
		d = min(c.Day, daysIn(y, m))
	}
	next := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	if !sameDate(end.In(loc), next) {
		fail("ends on %v, want %v", end.In(loc).Format(time.DateOnly), next.Format(time.DateOnly))
	}
}

func sameDate(a, b time.Time) bool {
	ay, am, ad := a.Date()
	by, bm, bd := b.Date()
	return ay == by && am == bm && ad == bd
}

// daysIn is the length of month m (which may be 13: January next year).
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// msAt is midnight UTC of a date in Unix milliseconds, as arg writes it.
func msAt(y int, m time.Month, d int) string {
	return strconv.FormatInt(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).UnixMilli(), 10)
}

// TestCalendarSpec: Spec writes what Parse reads (the package redlimit's
// TestCalendarSpec checks the same through Calendar's MarshalText), and
// Parse refuses anything Spec would not write.
func TestCalendarSpec(t *testing.T) {
	berlin, kolkata := calendarZone(t, "Europe/Berlin"), calendarZone(t, "Asia/Kolkata")
	for _, tc := range []struct {
		rule Rule
		spec string
	}{
		{Rule{Period: Daily, Location: time.UTC}, "day:0:UTC"},
		{Rule{Period: Daily, Location: berlin}, "day:0:Europe/Berlin"},
		{Rule{Period: Weekly, Location: berlin, Weekday: time.Sunday}, "week:0:Europe/Berlin"},
		{Rule{Period: Weekly, Location: kolkata, Weekday: time.Saturday}, "week:6:Asia/Kolkata"},
		{Rule{Period: Monthly, Location: kolkata, Day: 1}, "month:1:Asia/Kolkata"},
		{Rule{Period: Monthly, Location: berlin, Day: 31}, "month:31:Europe/Berlin"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			assert.Equal(t, tc.spec, tc.rule.Spec())
			got, ok := Parse(tc.spec)
			require.True(t, ok)
			// Field by field: the zone loaded anew under its name.
			assert.Equal(t, tc.rule.Period, got.Period)
			assert.Equal(t, tc.rule.Weekday, got.Weekday)
			assert.Equal(t, tc.rule.Day, got.Day)
			assert.Equal(t, tc.rule.Location.String(), got.Location.String())
		})
	}

	for _, spec := range []string{
		"", "day", "day:0", "day::UTC", "day:x:UTC", "year:0:UTC", ":0:UTC",
		"day:1:UTC",    // an anchor on a daily calendar
		"day:00:UTC",   // not as spec writes it
		"month:+5:UTC", // the same
		"week:7:UTC", "week:-1:UTC", "month:0:UTC", "month:32:UTC",
		"day:0:", "day:0:Local", "day:0:Mars/Olympus_Mons", "day:0:Europe/Berlin ", " day:0:UTC",
		"month:31:Europe/Berlin,2=day:0:UTC",
	} {
		_, ok := Parse(spec)
		assert.False(t, ok, "Parse(%q)", spec)
	}
}

// TestCalendarSpecList: ParseList reads the field calendar that the package
// redlimit's Config.calendars writes (its TestCalendarSpecList), and
// NewSet refuses what ParseList refuses.
func TestCalendarSpecList(t *testing.T) {
	const spec = "1=day:0:UTC,2=month:31:Europe/Berlin"
	rates, ok := ParseList(spec)
	require.True(t, ok)
	require.Len(t, rates, 2)
	assert.Equal(t, 1, rates[0].Place)
	assert.Equal(t, "day:0:UTC", rates[0].Rule.Spec(), "%+v", rates[0].Rule)
	assert.Equal(t, 2, rates[1].Place)
	assert.Equal(t, "month:31:Europe/Berlin", rates[1].Rule.Spec(), "%+v", rates[1].Rule)

	for _, bad := range []string{
		"", ",", "1=day:0:UTC,", ",1=day:0:UTC", "day:0:UTC", "1:day:0:UTC", "x=day:0:UTC",
		"0=day:0:UTC", "5=day:0:UTC", "-1=day:0:UTC", // places are 1..4
		"1=year:0:UTC", "1=day:0:UTC,2=month:32:Europe/Berlin", "1=day:0:UTC;2=month:31:Europe/Berlin",
	} {
		_, ok := ParseList(bad)
		assert.False(t, ok, "ParseList(%q)", bad)
		_, ok = NewSet(bad)
		assert.False(t, ok, "NewSet(%q)", bad)
	}
}

func TestCalendarArg(t *testing.T) {
	ny := calendarZone(t, "America/New_York")
	const spec = "1=day:0:America/New_York"
	s, ok := NewSet(spec)
	require.True(t, ok)

	// At noon on 2026-03-08, the 23-hour day: the days before, of and after
	// start at 2026-03-07 05:00 UTC (1772841600 s + 5 h, 2026-03-07 being
	// 20,519 days after 1970-01-01), 2026-03-08 05:00, 2026-03-09 04:00 and
	// 2026-03-10 04:00 UTC.
	noon := time.Date(2026, 3, 8, 12, 0, 0, 0, ny)
	const noonArg = spec + " 1772859600000 1772946000000 1773028800000 1773115200000"
	assert.Equal(t, noonArg, s.Arg(noon))
	cached := s.edges.Load()
	require.NotNil(t, cached)
	assert.Equal(t, utcAt(2026, 3, 8, 5, 0), cached.from.UTC())
	assert.Equal(t, utcAt(2026, 3, 9, 4, 0), cached.to.UTC())

	// Anywhere in the same day: the same arg, not worked out again.
	for _, now := range []time.Time{utcAt(2026, 3, 8, 5, 0), utcAt(2026, 3, 9, 4, 0).Add(-time.Millisecond), noon.Add(time.Hour)} {
		assert.Equal(t, noonArg, s.Arg(now), "at %v", now)
		assert.Same(t, cached, s.edges.Load(), "at %v", now)
	}

	// At the day's end, the next day's edges: through 2026-03-11 04:00 UTC.
	next := utcAt(2026, 3, 9, 4, 0)
	assert.Equal(t, spec+" 1772946000000 1773028800000 1773115200000 1773201600000", s.Arg(next))
	assert.NotSame(t, cached, s.edges.Load())
	// A clock that goes back, to 2026-03-07 23:59:59.999 EST, has the day before's.
	assert.Equal(t, spec+" 1772773200000 1772859600000 1772946000000 1773028800000", s.Arg(utcAt(2026, 3, 8, 5, 0).Add(-time.Millisecond)))
}

// TestCalendarArgSeveralRates: the arg holds each rate's edges, and stays
// good while the clock is in every rate's current window: from the latest
// start to the earliest end.
func TestCalendarArgSeveralRates(t *testing.T) {
	const spec = "1=week:1:UTC,3=month:1:UTC"
	s, ok := NewSet(spec)
	require.True(t, ok)

	// At 2026-03-31 12:00 UTC, a Tuesday: the weeks from Mondays 03-23,
	// 03-30, 04-06 and 04-13; the months from 02-01, 03-01, 04-01, 05-01.
	now := utcAt(2026, 3, 31, 12, 0)
	want := spec +
		" " + msAt(2026, 3, 23) + " " + msAt(2026, 3, 30) + " " + msAt(2026, 4, 6) + " " + msAt(2026, 4, 13) +
		" " + msAt(2026, 2, 1) + " " + msAt(2026, 3, 1) + " " + msAt(2026, 4, 1) + " " + msAt(2026, 5, 1)
	assert.Equal(t, want, s.Arg(now))
	cached := s.edges.Load()
	// Good from the week's start to the month's end.
	assert.Equal(t, utcAt(2026, 3, 30, 0, 0), cached.from.UTC())
	assert.Equal(t, utcAt(2026, 4, 1, 0, 0), cached.to.UTC())
	assert.Equal(t, want, s.Arg(utcAt(2026, 3, 30, 0, 0)))
	assert.Same(t, cached, s.edges.Load())

	// April 1st is still the same week, but a new month.
	want = spec +
		" " + msAt(2026, 3, 23) + " " + msAt(2026, 3, 30) + " " + msAt(2026, 4, 6) + " " + msAt(2026, 4, 13) +
		" " + msAt(2026, 3, 1) + " " + msAt(2026, 4, 1) + " " + msAt(2026, 5, 1) + " " + msAt(2026, 6, 1)
	assert.Equal(t, want, s.Arg(utcAt(2026, 4, 1, 0, 0)))
	assert.NotSame(t, cached, s.edges.Load())
	cached = s.edges.Load()
	assert.Equal(t, utcAt(2026, 4, 1, 0, 0), cached.from.UTC())
	assert.Equal(t, utcAt(2026, 4, 6, 0, 0), cached.to.UTC())
}
