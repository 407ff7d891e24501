package redlimit

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redlimit/redlimit/internal/calendar"
)

// Calendar quotas: a fixed window whose edges are the calendar's in a time
// zone (local midnight, a weekday, a billing day), not multiples of an
// Interval since the Unix epoch. Redis knows no time zones, so every
// decision on a calendar quota carries the edges of the windows around the
// client's clock; internal/calendar works them out (calendar.Set), and
// holds the date arithmetic and the "period:anchor:zone" format.

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

// rule is c as internal/calendar works its windows out. Its periods have
// the same values as Period (TestCalendarPeriods).
func (c Calendar) rule() calendar.Rule {
	return calendar.Rule{Period: calendar.Period(c.Period), Location: c.Location, Weekday: c.Weekday, Day: c.Day}
}

func calendarOf(r calendar.Rule) Calendar {
	return Calendar{Period: Period(r.Period), Location: r.Location, Weekday: r.Weekday, Day: r.Day}
}

// longest is the longest window of c's period: its rate's Interval.
func (c Calendar) longest() time.Duration { return c.rule().Longest() }

// validate reports why c cannot be used, wrapping ErrInvalidConfig.
func (c Calendar) validate() error { return c.rule().Validate() }

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
	return c.rule().Spec() == o.rule().Spec()
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
	return []byte(c.rule().Spec()), nil
}

// UnmarshalText reads what MarshalText writes, wrapping ErrInvalidConfig
// when it cannot.
func (c *Calendar) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*c = Calendar{}
		return nil
	}
	r, ok := calendar.Parse(string(b))
	if !ok {
		return invalid("calendar %q", b)
	}
	*c = calendarOf(r)
	return nil
}
