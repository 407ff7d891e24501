package redlimit

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Calendar quotas: a fixed window whose edges are the calendar's in a time
// zone (local midnight, a weekday, a billing day), not multiples of an
// Interval since the Unix epoch. A day is 23, 24 or 25 hours long and a month
// 28 to 31 days, so the scripts cannot work the edges out: Redis knows no
// time zones. Go does: every decision on a calendar quota carries the edges
// of the windows around the client's clock (ARGV[argCalendar], see
// calendarSet.arg), and the script counts in the one that holds Redis's clock.

// Period is how long a calendar window lasts: a day, a week or a month.
type Period int

const (
	Daily   Period = iota + 1 // from local midnight
	Weekly                    // from midnight of a chosen weekday
	Monthly                   // from midnight of a chosen day of the month
)

// Calendar makes a rate's windows follow the calendar in Location. The zero
// Calendar is none: windows of Interval, aligned to the Unix epoch.
type Calendar struct {
	Period   Period
	Location *time.Location // a named zone (IANA, or UTC): every instance must load the same
	Weekday  time.Weekday   // Weekly: the day each window starts on
	Day      int            // Monthly: the day each window starts on, 1..31; a month shorter than Day starts on its last day
}

// PerDay returns a config granting n permits per calendar day in loc, from
// one local midnight to the next (23 or 25 hours on the days clocks change).
func PerDay(n int64, loc *time.Location) Config {
	return Calendar{Period: Daily, Location: loc}.rate(n)
}

// PerWeek returns a config granting n permits per week in loc, each from
// local midnight of the weekday first.
func PerWeek(n int64, loc *time.Location, first time.Weekday) Config {
	return Calendar{Period: Weekly, Location: loc, Weekday: first}.rate(n)
}

// PerMonth returns a config granting n permits per calendar month in loc,
// from local midnight on the 1st.
func PerMonth(n int64, loc *time.Location) Config { return PerMonthFrom(n, loc, 1) }

// PerMonthFrom returns a config granting n permits per month in loc, each
// from local midnight on day (a billing day, 1..31). A month with fewer days
// starts its window on its last: billing on the 31st, February's window
// starts on the 28th (29th) and March's on the 31st.
func PerMonthFrom(n int64, loc *time.Location, day int) Config {
	return Calendar{Period: Monthly, Location: loc, Day: day}.rate(n)
}

func (c Calendar) rate(n int64) Config {
	return Config{Type: Overall, Rate: n, Interval: c.longest(), Calendar: c}
}

// longest is the longest window of c's period, and the Interval of its
// rate: what a rate of the same Interval is compared with (a longer one must
// grant more), and what the CLI shows. A day or a week is an hour longer on
// the day clocks go back (Australia/Lord_Howe's half hour fits in it; only
// Antarctica/Troll's two-hour shift makes a longer one, whose windows the
// scripts still count by their own edges).
func (c Calendar) longest() time.Duration {
	switch c.Period {
	case Daily:
		return 25 * time.Hour
	case Weekly:
		return 7*24*time.Hour + time.Hour
	case Monthly:
		return 31*24*time.Hour + time.Hour
	}
	return 0
}

// validate reports why c cannot be used, wrapping ErrInvalidConfig.
func (c Calendar) validate() error {
	switch {
	case c.Period < Daily || c.Period > Monthly:
		return invalid("unknown calendar period %d", int(c.Period))
	case c.Location == nil:
		return invalid("a calendar quota needs a time zone")
	case c.Location == time.Local || c.Location.String() == "Local":
		return invalid("time.Local differs between machines: name the zone (time.LoadLocation)")
	case c.Period != Weekly && c.Weekday != 0:
		return invalid("weekday %v: only a weekly quota starts on a weekday", c.Weekday)
	case c.Weekday < time.Sunday || c.Weekday > time.Saturday:
		return invalid("unknown weekday %d", int(c.Weekday))
	case c.Period != Monthly && c.Day != 0:
		return invalid("day %d: only a monthly quota starts on a day of the month", c.Day)
	case c.Period == Monthly && (c.Day < 1 || c.Day > 31):
		return invalid("day of the month %d is outside 1..31", c.Day)
	case strings.ContainsAny(c.Location.String(), " :,="):
		return invalid("time zone %q", c.Location.String())
	}
	// Every instance finds the zone by its name (calendarSet), so the name
	// must load, and load this zone: not a fixed offset that borrowed a
	// zone's name (time.FixedZone("CET", 3600) would get CET's summers).
	named, err := time.LoadLocation(c.Location.String())
	if err != nil {
		return invalid("time zone %q: %v", c.Location.String(), err)
	}
	for _, t := range sameZoneProbes {
		_, given := t.In(c.Location).Zone()
		if _, loaded := t.In(named).Zone(); given != loaded {
			return invalid("time zone %q is not the zone of that name (offset %ds at %v, not %ds)", c.Location.String(), given, t, loaded)
		}
	}
	return nil
}

// sameZoneProbes are instants where a zone and a fixed offset under its
// name tell apart: either side of both solstices, this decade.
var sameZoneProbes = func() []time.Time {
	var probes []time.Time
	for y := 2024; y <= 2030; y += 3 {
		probes = append(probes, time.Date(y, 1, 15, 12, 0, 0, 0, time.UTC), time.Date(y, 7, 15, 12, 0, 0, 0, time.UTC))
	}
	return probes
}()

// window returns the calendar window that holds t: [start, end).
func (c Calendar) window(t time.Time) (start, end time.Time) {
	y, m, d := t.In(c.Location).Date()
	switch c.Period {
	case Daily:
		return c.midnight(y, m, d), c.midnight(y, m, d+1)
	case Weekly:
		back := (int(t.In(c.Location).Weekday()) - int(c.Weekday) + 7) % 7
		return c.midnight(y, m, d-back), c.midnight(y, m, d-back+7)
	case Monthly:
		start = c.billing(y, m)
		if t.Before(start) {
			return c.billing(y, m-1), start
		}
		return start, c.billing(y, m+1)
	}
	return t, t
}

// midnight is the first instant of a local day (d may run past the month's
// end, as time.Date allows). Where the clocks skip midnight, 00:00 does not
// exist, and time.Date may answer an hour of the day before: the day then
// begins when the gap ends, found in steps of 15 minutes (every offset in
// the zone database is a whole number of them). A date the zone skipped
// whole (Pacific/Apia's 30 December 2011) begins where the next one does.
func (c Calendar) midnight(y int, m time.Month, d int) time.Time {
	want := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	t := time.Date(y, m, d, 0, 0, 0, 0, c.Location)
	for {
		ly, lm, ld := t.In(c.Location).Date()
		if !time.Date(ly, lm, ld, 0, 0, 0, 0, time.UTC).Before(want) {
			return t
		}
		t = t.Add(15 * time.Minute)
	}
}

// billing is the start of month m's window: its Day, or its last day when
// it is shorter.
func (c Calendar) billing(y int, m time.Month) time.Time {
	first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	days := first.AddDate(0, 1, -1).Day()
	y, m = first.Year(), first.Month()
	return c.midnight(y, m, min(c.Day, days))
}

// spec names c for the scripts and the config hash: "period:anchor:zone",
// as the field calendar keeps it.
func (c Calendar) spec() string {
	anchor := 0
	switch c.Period {
	case Weekly:
		anchor = int(c.Weekday)
	case Monthly:
		anchor = c.Day
	}
	period := "none"
	switch c.Period {
	case Daily:
		period = "day"
	case Weekly:
		period = "week"
	case Monthly:
		period = "month"
	}
	return fmt.Sprintf("%s:%d:%s", period, anchor, c.Location)
}

// parseCalendar reads spec back.
func parseCalendar(spec string) (Calendar, bool) {
	parts := strings.SplitN(spec, ":", 3)
	if len(parts) != 3 {
		return Calendar{}, false
	}
	anchor, err := strconv.Atoi(parts[1])
	if err != nil {
		return Calendar{}, false
	}
	loc, err := time.LoadLocation(parts[2])
	if err != nil {
		return Calendar{}, false
	}
	c := Calendar{Location: loc}
	switch parts[0] {
	case "day":
		c.Period = Daily
	case "week":
		c.Period, c.Weekday = Weekly, time.Weekday(anchor)
	case "month":
		c.Period, c.Day = Monthly, anchor
	}
	if c.validate() != nil || c.spec() != spec {
		return Calendar{}, false
	}
	return c, true
}

func (c Calendar) String() string {
	switch c.Period {
	case Daily:
		return "day in " + c.Location.String()
	case Weekly:
		return fmt.Sprintf("week from %v in %s", c.Weekday, c.Location)
	case Monthly:
		if c.Day == 1 {
			return "month in " + c.Location.String()
		}
		return fmt.Sprintf("month from day %d in %s", c.Day, c.Location)
	}
	return "Calendar(" + strconv.Itoa(int(c.Period)) + ")"
}

// equal compares calendars by their zones' names: two loads of one zone are
// two pointers.
func (c Calendar) equal(o Calendar) bool {
	if c.Period == 0 || o.Period == 0 {
		return c.Period == o.Period
	}
	return c.spec() == o.spec()
}

// calendarSet is a config's calendar rates as a decision sends them: the
// config hash's field calendar (Config.calendars), and the windows around
// the client's clock (edges), worked out once per window.
type calendarSet struct {
	spec  string
	rates []rateCalendar
	edges atomic.Pointer[calendarEdges]
}

// calendarEdges is ARGV[argCalendar] for any clock in [from, to).
type calendarEdges struct {
	arg      any
	from, to time.Time
}

func newCalendarSet(spec string) (*calendarSet, bool) {
	rates, ok := parseCalendars(spec)
	if !ok {
		return nil, false
	}
	return &calendarSet{spec: spec, rates: rates}, true
}

// arg is ARGV[argCalendar] at now: the spec, then for each calendar rate the
// edges of the window before the one holding now, of that one, and of the
// one after, in ms. Redis's clock may be on either side of a boundary that
// the client's has crossed or not: the script counts in the window that
// holds Redis's (or WithClock's) time, and refuses one outside all three.
func (s *calendarSet) arg(now time.Time) any {
	if e := s.edges.Load(); e != nil && !now.Before(e.from) && now.Before(e.to) {
		return e.arg
	}
	b := append(make([]byte, 0, 96), s.spec...)
	e := &calendarEdges{from: time.Time{}, to: time.Unix(1<<40, 0)}
	for _, r := range s.rates {
		start, end := r.cal.window(now)
		before, _ := r.cal.window(start.Add(-time.Nanosecond))
		_, after := r.cal.window(end)
		for _, t := range []time.Time{before, start, end, after} {
			b = strconv.AppendInt(append(b, ' '), t.UnixMilli(), 10)
		}
		if start.After(e.from) {
			e.from = start
		}
		if end.Before(e.to) {
			e.to = end
		}
	}
	e.arg = string(b)
	s.edges.Store(e)
	return e.arg
}

// MarshalText writes c as the config hash keeps it, "period:anchor:zone"
// (day:0:Europe/Berlin, week:1:UTC for Mondays, month:31:America/New_York),
// or nothing for no calendar.
func (c Calendar) MarshalText() ([]byte, error) {
	if c.Period == 0 {
		return nil, nil
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return []byte(c.spec()), nil
}

// UnmarshalText reads what MarshalText writes, wrapping ErrInvalidConfig
// when it cannot.
func (c *Calendar) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*c = Calendar{}
		return nil
	}
	cal, ok := parseCalendar(string(b))
	if !ok {
		return invalid("calendar %q", b)
	}
	*c = cal
	return nil
}
