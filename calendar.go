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
// A day begins at the first instant whose local date is that day: the
// first of two midnights where the clocks go back to one, the end of the
// gap where they skip it. Weeks and months begin as their first day does.
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
// the day clocks go back (Australia/Lord_Howe's half hour fits in it). A
// shift of more than an hour makes a longer one: Antarctica/Troll's two
// hours, and days that began at the first of two midnights when the clocks
// went back to 00:00 from 02:00 or 03:00 (Asia/Magadan's of 26 hours in
// 2014, Antarctica/Casey's of 27 in 2010). The scripts count those by their
// own edges all the same.
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
	first := c.firstOf(c.localDate(t))
	next := c.following(first)
	start, end = c.begins(first), c.begins(next)
	// Where the clocks go back across midnight, the date goes back with
	// them (America/Goose_Bay until 2010: 00:01 to 23:01): t can read a date
	// earlier than the window that holds it, which began at the first
	// midnight.
	for !t.Before(end) {
		first, next = next, c.following(next)
		start, end = end, c.begins(next)
	}
	return start, end
}

// date is a calendar date as a count of days from 1970-01-01, so that a
// week is 7 of them and a local clock reading (Unix seconds plus the
// offset) divides into one.
type date int64

const secondsPerDay = 24 * 60 * 60

func dateOf(y int, m time.Month, d int) date {
	return date(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / secondsPerDay)
}

func (d date) ymd() (int, time.Month, int) {
	return time.Unix(int64(d)*secondsPerDay, 0).UTC().Date()
}

func (d date) weekday() time.Weekday {
	return time.Weekday((int64(d)%7 + 7 + int64(time.Thursday)) % 7) // 1970-01-01 was a Thursday
}

func daysInMonth(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// localDate is the date t reads in c's zone.
func (c Calendar) localDate(t time.Time) date {
	_, offset := t.In(c.Location).Zone()
	wall := t.Unix() + int64(offset)
	d := wall / secondsPerDay
	if wall%secondsPerDay < 0 {
		d-- // before 1970: round down, not toward zero
	}
	return date(d)
}

// firstOf is the first date of the window that holds date d: d itself, the
// weekday on or before it, or the billing day of its month or the month
// before (a month shorter than Day bills on its last day).
func (c Calendar) firstOf(d date) date {
	switch c.Period {
	case Weekly:
		return d - date((d.weekday()-c.Weekday+7)%7)
	case Monthly:
		y, m, day := d.ymd()
		if billing := min(c.Day, daysInMonth(y, m)); day >= billing {
			return dateOf(y, m, billing)
		}
		return dateOf(y, m-1, min(c.Day, daysInMonth(y, m-1)))
	}
	return d
}

// following is the first date of the window after the one first starts.
func (c Calendar) following(first date) date {
	switch c.Period {
	case Weekly:
		return first + 7
	case Monthly:
		y, m, _ := first.ymd()
		return dateOf(y, m+1, min(c.Day, daysInMonth(y, m+1)))
	}
	return first + 1
}

// begins is the first instant whose local date is d or later: d's first
// midnight where the clocks repeat it, the end of the gap where they skip
// it, and where they skip d whole (Pacific/Apia's 30 December 2011), the
// start of the next date they have. time.Date cannot say: it picks one of
// two midnights by a guess (the later one east of UTC), and in a gap an
// instant before it.
//
// It is found on real instants: between two of the zone's transitions the
// local clock runs with UTC at one offset, so in each such stretch it first
// reads d's midnight at a known instant, if that falls in the stretch. The
// stretches are walked in order from one where the clock still reads an
// earlier date; the first that reaches d has the answer (at its start, if
// a transition jumped the clock past midnight).
func (c Calendar) begins(d date) time.Time {
	midnight := int64(d) * secondsPerDay // of the local clock
	// Offsets are under 26 hours (RFC 8536 asks it of zone files), so 26
	// hours before midnight UTC the clock reads an earlier date; should a
	// zone stray further, the walk starts a day earlier.
	from := time.Unix(midnight-26*60*60, 0).In(c.Location)
	for t := from; ; {
		offset, end := stretch(t)
		at := time.Unix(midnight-int64(offset), 0).In(c.Location)
		switch {
		case at.After(t) && (end.IsZero() || at.Before(end)):
			return at
		case !at.After(t) && t.Equal(from):
			from = from.Add(-24 * time.Hour)
			t = from
		case !at.After(t):
			return t // the transition at t moved the clock past midnight
		default:
			t = end
		}
	}
}

// stretch returns the zone's offset at t and the end of the stretch of
// time that keeps it from t on: the next transition, or the zero Time if
// there is none.
func stretch(t time.Time) (offset int, end time.Time) {
	_, offset = t.Zone()
	if _, end = t.ZoneBounds(); end.IsZero() || end.After(t) {
		return offset, end
	}
	// Past a zone's last listed transition Go works the bounds out from its
	// rule, and on the last UTC day of a leap year answers an end before t
	// (golang/go#81583; in Go's own slim zone files, which time/tzdata
	// embeds, America/New_York's rule serves every year since 2008, in a
	// fat /usr/share/zoneinfo from 2038). There, look a quarter of an hour on:
	// no zone changes its offset twice within one, so an instant there with
	// t's offset had it all along; with another, the change is found by
	// halving, to the second (transitions fall on whole seconds).
	const step = 15 * 60
	lo, hi := t.Unix(), t.Unix()+step
	if _, o := time.Unix(hi, 0).In(t.Location()).Zone(); o == offset {
		return offset, time.Unix(hi, 0).In(t.Location())
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if _, o := time.Unix(mid, 0).In(t.Location()).Zone(); o == offset {
			lo = mid
		} else {
			hi = mid
		}
	}
	return offset, time.Unix(hi, 0).In(t.Location())
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
