// Package calendar works out the windows of calendar quotas: a fixed window
// whose edges are the calendar's in a time zone (local midnight, a weekday,
// a billing day), not multiples of an interval since the Unix epoch. A day
// is 23, 24 or 25 hours long and a month 28 to 31 days, so the scripts
// cannot work the edges out: Redis knows no time zones. Go does: every
// decision on a calendar quota carries the edges of the windows around the
// client's clock (Set.Arg), and the script counts in the one that holds
// Redis's clock.
//
// The package redlimit's Calendar is a Rule; this package holds the date
// arithmetic, the "period:anchor:zone" format the config hash keeps, and
// the edges a decision sends.
package calendar

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/wire"
)

// Period is how long a window lasts: a day, a week or a month. Its values
// are the package redlimit's.
type Period int

const (
	Daily   Period = iota + 1 // from local midnight
	Weekly                    // from midnight of a chosen weekday
	Monthly                   // from midnight of a chosen day of the month
)

// Rule says where a calendar quota's windows begin: every Period in
// Location, from Weekday (weekly) or Day (monthly; a month shorter than Day
// starts on its last day).
type Rule struct {
	Period   Period
	Location *time.Location
	Weekday  time.Weekday
	Day      int
}

// Longest is the longest window of r's period, and the Interval of its
// rate: what a rate of the same Interval is compared with (a longer one
// must grant more), and what the CLI shows. A day or a week is an hour
// longer on the day clocks go back (Australia/Lord_Howe's half hour fits
// in it). A shift of more than an hour makes a longer one: Antarctica/Troll's
// two hours, and days that began at the first of two midnights when the
// clocks went back to 00:00 from 02:00 or 03:00 (Asia/Magadan's of 26 hours
// in 2014, Antarctica/Casey's of 27 in 2010). The scripts count those by
// their own edges all the same.
func (r Rule) Longest() time.Duration {
	switch r.Period {
	case Daily:
		return 25 * time.Hour
	case Weekly:
		return 7*24*time.Hour + time.Hour
	case Monthly:
		return 31*24*time.Hour + time.Hour
	}
	return 0
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{wire.ErrInvalidConfig}, a...)...)
}

// Validate reports why r cannot be used, wrapping ErrInvalidConfig.
func (r Rule) Validate() error {
	switch {
	case r.Period < Daily || r.Period > Monthly:
		return invalid("unknown calendar period %d", int(r.Period))
	case r.Location == nil:
		return invalid("a calendar quota needs a time zone")
	case r.Location == time.Local || r.Location.String() == "Local":
		return invalid("time.Local differs between machines: name the zone (time.LoadLocation)")
	case r.Period != Weekly && r.Weekday != 0:
		return invalid("weekday %v: only a weekly quota starts on a weekday", r.Weekday)
	case r.Weekday < time.Sunday || r.Weekday > time.Saturday:
		return invalid("unknown weekday %d", int(r.Weekday))
	case r.Period != Monthly && r.Day != 0:
		return invalid("day %d: only a monthly quota starts on a day of the month", r.Day)
	case r.Period == Monthly && (r.Day < 1 || r.Day > 31):
		return invalid("day of the month %d is outside 1..31", r.Day)
	case strings.ContainsAny(r.Location.String(), " :,="):
		return invalid("time zone %q", r.Location.String())
	}
	// Every instance finds the zone by its name (Parse), so the name must
	// load, and load this zone: not a fixed offset that borrowed a zone's
	// name (time.FixedZone("CET", 3600) would get CET's summers).
	named, err := time.LoadLocation(r.Location.String())
	if err != nil {
		return invalid("time zone %q: %v", r.Location.String(), err)
	}
	for _, t := range sameZoneProbes {
		_, given := t.In(r.Location).Zone()
		if _, loaded := t.In(named).Zone(); given != loaded {
			return invalid("time zone %q is not the zone of that name (offset %ds at %v, not %ds)", r.Location.String(), given, t, loaded)
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

// Window returns the window that holds t: [start, end).
func (r Rule) Window(t time.Time) (start, end time.Time) {
	first := r.firstOf(r.localDate(t))
	next := r.following(first)
	start, end = r.begins(first), r.begins(next)
	// Where the clocks go back across midnight, the date goes back with
	// them (America/Goose_Bay until 2010: 00:01 to 23:01): t can read a date
	// earlier than the window that holds it, which began at the first
	// midnight.
	for !t.Before(end) {
		first, next = next, r.following(next)
		start, end = end, r.begins(next)
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

// localDate is the date t reads in r's zone.
func (r Rule) localDate(t time.Time) date {
	_, offset := t.In(r.Location).Zone()
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
func (r Rule) firstOf(d date) date {
	switch r.Period {
	case Weekly:
		return d - date((d.weekday()-r.Weekday+7)%7)
	case Monthly:
		y, m, day := d.ymd()
		if billing := min(r.Day, daysInMonth(y, m)); day >= billing {
			return dateOf(y, m, billing)
		}
		return dateOf(y, m-1, min(r.Day, daysInMonth(y, m-1)))
	}
	return d
}

// following is the first date of the window after the one first starts.
func (r Rule) following(first date) date {
	switch r.Period {
	case Weekly:
		return first + 7
	case Monthly:
		y, m, _ := first.ymd()
		return dateOf(y, m+1, min(r.Day, daysInMonth(y, m+1)))
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
func (r Rule) begins(d date) time.Time {
	midnight := int64(d) * secondsPerDay // of the local clock
	// Offsets are under 26 hours (RFC 8536 asks it of zone files), so 26
	// hours before midnight UTC the clock reads an earlier date; should a
	// zone stray further, the walk starts a day earlier.
	from := time.Unix(midnight-26*60*60, 0).In(r.Location)
	for t := from; ; {
		offset, end := stretch(t)
		at := time.Unix(midnight-int64(offset), 0).In(r.Location)
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

// Spec names r for the scripts and the config hash: "period:anchor:zone",
// as the field calendar keeps it.
func (r Rule) Spec() string {
	anchor := 0
	switch r.Period {
	case Weekly:
		anchor = int(r.Weekday)
	case Monthly:
		anchor = r.Day
	}
	period := "none"
	switch r.Period {
	case Daily:
		period = "day"
	case Weekly:
		period = "week"
	case Monthly:
		period = "month"
	}
	return fmt.Sprintf("%s:%d:%s", period, anchor, r.Location)
}

// Parse reads Spec back: a valid rule, written exactly as Spec writes it.
func Parse(spec string) (Rule, bool) {
	parts := strings.SplitN(spec, ":", 3)
	if len(parts) != 3 {
		return Rule{}, false
	}
	anchor, err := strconv.Atoi(parts[1])
	if err != nil {
		return Rule{}, false
	}
	loc, err := time.LoadLocation(parts[2])
	if err != nil {
		return Rule{}, false
	}
	r := Rule{Location: loc}
	switch parts[0] {
	case "day":
		r.Period = Daily
	case "week":
		r.Period, r.Weekday = Weekly, time.Weekday(anchor)
	case "month":
		r.Period, r.Day = Monthly, anchor
	}
	if r.Validate() != nil || r.Spec() != spec {
		return Rule{}, false
	}
	return r, true
}

// Placed is one calendar rate of a config: its place (1 for the config's
// own rate, 2.. for the further ones), and its rule.
type Placed struct {
	Place int
	Rule  Rule
}

// ParseList reads the config hash's field calendar (wire.ParseCalendars's
// format): at least one rate, each a valid rule.
func ParseList(s string) ([]Placed, bool) {
	placed, ok := wire.ParseCalendars(s)
	if !ok || len(placed) == 0 {
		return nil, false
	}
	list := make([]Placed, 0, len(placed))
	for _, pc := range placed {
		r, ok := Parse(pc.Spec)
		if !ok {
			return nil, false
		}
		list = append(list, Placed{Place: pc.Place, Rule: r})
	}
	return list, true
}

// Set is a config's calendar rates as a decision sends them: the config
// hash's field calendar, and the windows around the client's clock (Arg),
// worked out once per window.
type Set struct {
	spec  string
	rates []Placed
	edges atomic.Pointer[edges]
}

// edges is Arg's answer for any clock in [from, to).
type edges struct {
	arg      any
	from, to time.Time
}

// NewSet reads the field calendar spec (ParseList) into a Set.
func NewSet(spec string) (*Set, bool) {
	rates, ok := ParseList(spec)
	if !ok {
		return nil, false
	}
	return &Set{spec: spec, rates: rates}, true
}

// Arg is the decision's argument wire.ArgCalendar at now: the spec, then
// for each calendar rate the edges of the window before the one holding
// now, of that one, and of the one after, in ms. Redis's clock may be on
// either side of a boundary that the client's has crossed or not: the
// script counts in the window that holds Redis's (or WithClock's) time, and
// refuses one outside all three.
func (s *Set) Arg(now time.Time) any {
	if e := s.edges.Load(); e != nil && !now.Before(e.from) && now.Before(e.to) {
		return e.arg
	}
	b := append(make([]byte, 0, 96), s.spec...)
	e := &edges{from: time.Time{}, to: time.Unix(1<<40, 0)}
	for _, r := range s.rates {
		start, end := r.Rule.Window(now)
		before, _ := r.Rule.Window(start.Add(-time.Nanosecond))
		_, after := r.Rule.Window(end)
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

// Pinned returns a Set whose Arg is always s's at at, whatever the clock:
// the edges a client whose clock stood still sends, for tests.
func (s *Set) Pinned(at time.Time) *Set {
	p := &Set{spec: s.spec, rates: s.rates}
	p.edges.Store(&edges{arg: s.Arg(at), to: time.Unix(1<<40, 0)})
	return p
}
