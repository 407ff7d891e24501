package redlimit

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redlimit/redlimit/internal/calendar"
	"github.com/redlimit/redlimit/internal/wire"
)

// RateType says whether a limit is shared by every client or kept per client.
type RateType int

const (
	Overall   RateType = iota // one limit shared by every client
	PerClient                 // a separate limit for each client ID
)

func (t RateType) String() string {
	switch t {
	case Overall:
		return "overall"
	case PerClient:
		return "per-client"
	}
	return "RateType(" + strconv.Itoa(int(t)) + ")"
}

// Config is a limiter's rate, or rates. It is stored in Redis (TrySetRate,
// SetRate), so every instance of a service follows a change on its next call.
//
// Rate permits are granted per Interval. Interval and KeepAlive have millisecond
// resolution: the token bucket's Redis layout, shared with Redisson, stores them
// in milliseconds.
//
// Calendar, set by PerDay, PerWeek, PerMonth and PerMonthFrom, makes the
// rate's windows the calendar's (a fixed window's only; see Calendar).
//
// More holds the further rates And adds, enforced together with this one: a
// request is granted only if every rate allows it, and then counts against
// all of them. Of each, only Rate, Interval, Burst, Buckets and Calendar
// count; Type and KeepAlive are this Config's (leave theirs zero).
type Config struct {
	Type      RateType
	Rate      int64         // permits per Interval
	Interval  time.Duration // at least 1ms, a whole number of milliseconds
	Burst     int64         // funnel only: capacity; 0 means Rate
	Buckets   int           // sliding window only: sub-windows per Interval; 0 means 10
	KeepAlive time.Duration // 0: the config never expires; else idle TTL refreshed on every acquire (≥ every Interval)
	Calendar  Calendar      // fixed window only: windows that follow the calendar; Interval is then its longest window
	More      []Config      // further rates, each with its own Interval (And)
}

// And returns c with the rates of others added to it: PerSecond(10).And(PerHour(1000))
// grants at most 10 permits in any second and 1,000 in any hour, decided
// atomically. Each rate needs an Interval of its own, and a longer one must
// grant more permits than a shorter one; at most four rates in all.
func (c Config) And(others ...Config) Config {
	c.More = slices.Clone(c.More)
	for _, o := range others {
		more := o.More
		o.More = nil
		c.More = append(append(c.More, o), more...)
	}
	return c
}

// rates returns c's rates, c's own first, each with c's Type and KeepAlive.
func (c Config) rates() []Config {
	more := c.More
	c.More = nil
	all := append(make([]Config, 0, 1+len(more)), c)
	for _, o := range more {
		o.Type, o.KeepAlive, o.More = c.Type, c.KeepAlive, nil
		all = append(all, o)
	}
	return all
}

// Per returns a config granting n permits per interval to all clients together.
func Per(n int64, interval time.Duration) Config {
	return Config{Type: Overall, Rate: n, Interval: interval}
}

// PerSecond returns a config granting n permits per second.
func PerSecond(n int64) Config { return Per(n, time.Second) }

// PerMinute returns a config granting n permits per minute.
func PerMinute(n int64) Config { return Per(n, time.Minute) }

// PerHour returns a config granting n permits per hour.
func PerHour(n int64) Config { return Per(n, time.Hour) }

func (c Config) String() string {
	s := fmt.Sprintf("%d per %v", c.Rate, c.Interval)
	if c.Calendar.Period != 0 {
		s = fmt.Sprintf("%d per %v", c.Rate, c.Calendar)
	}
	if c.Type == PerClient {
		s += " per client"
	}
	if c.Burst != 0 {
		s += fmt.Sprintf(", burst %d", c.Burst)
	}
	if c.Buckets != 0 {
		s += fmt.Sprintf(", %d buckets", c.Buckets)
	}
	if c.KeepAlive != 0 {
		s += fmt.Sprintf(", keep alive %v", c.KeepAlive)
	}
	for _, o := range c.More {
		o.Type, o.KeepAlive = Overall, 0
		s += " and " + o.String()
	}
	return s
}

const (
	defaultBuckets = wire.DefaultBuckets
	// maxTolerance bounds a funnel's capacity in time (Burst × Interval / Rate,
	// in µs): the scripts add it to now in µs (~2^50.6 today), and Lua numbers
	// are doubles, exact to 2^53.
	maxTolerance = wire.MaxDebt
	// maxInterval keeps now + interval, in microseconds, far inside maxExact.
	maxInterval = wire.MaxTTLMS * time.Millisecond
	// maxRates bounds a config's rates: each costs a decision some Redis
	// time, and the scripts name the fields of at most this many.
	maxRates = wire.MaxRates
)

// withDefaults fills the zero values that stand for a default.
func (c Config) withDefaults() Config {
	if c.Burst == 0 {
		c.Burst = c.Rate
	}
	if c.Buckets == 0 {
		c.Buckets = defaultBuckets
	}
	return c
}

func invalid(format string, a ...any) error { return wire.Invalid(format, a...) }

// validate reports why c cannot be used, wrapping ErrInvalidConfig: a rate
// out of range, or rates that do not make one limit together.
func (c Config) validate() error {
	if len(c.More)+1 > maxRates {
		return invalid("%d rates, at most %d", len(c.More)+1, maxRates)
	}
	for i, o := range c.More {
		switch {
		case len(o.More) > 0:
			return invalid("rate %d holds rates of its own", i+2)
		case o.Type != Overall && o.Type != c.Type:
			return invalid("rate %d is %v, the limiter %v", i+2, o.Type, c.Type)
		case o.KeepAlive != 0 && o.KeepAlive != c.KeepAlive:
			return invalid("rate %d keeps alive %v, the limiter %v", i+2, o.KeepAlive, c.KeepAlive)
		}
	}
	rates := c.rates()
	specs := make([]wire.RateSpec, len(rates))
	for i, r := range rates {
		specs[i] = wire.RateSpec{Type: int64(r.Type), Rate: r.Rate, Burst: r.Burst, Buckets: r.Buckets, Interval: r.Interval, KeepAlive: r.KeepAlive}
		if r.Calendar.Period != 0 {
			specs[i].Calendar, specs[i].CalendarErr = r.Calendar, r.Calendar.validate()
			if specs[i].CalendarErr == nil {
				specs[i].Longest = r.Calendar.longest()
			}
		}
	}
	return wire.ValidateRates(specs)
}

// maxLogRate bounds a token bucket's own Rate: the log it keeps in Redisson's
// layout holds each record's permits as a 4-byte unsigned integer, and one
// record may hold up to Rate of them (scripts/tokenbucket.lua).
const maxLogRate = wire.MaxLogRate

// validateLog reports why c cannot be a token bucket's config. Its further
// rates (And) keep decimal counts, so they may be larger.
func (c Config) validateLog() error {
	if c.Rate > maxLogRate {
		return invalid("rate %d is above %d: a token bucket keeps Redisson's log, which counts a record's permits in 4 bytes",
			c.Rate, int64(maxLogRate))
	}
	return nil
}

// equal reports whether c and o are the same config, field by field: a
// Config holds a slice, so == does not compare it.
func (c Config) equal(o Config) bool {
	return c.Type == o.Type && c.Rate == o.Rate && c.Interval == o.Interval && c.Burst == o.Burst &&
		c.Buckets == o.Buckets && c.KeepAlive == o.KeepAlive && c.Calendar.equal(o.Calendar) && slices.EqualFunc(c.More, o.More, Config.equal)
}

// arg encodes c for the scripts (wire.ConfigArg). Zero Burst and Buckets go
// as they are: the scripts apply the defaults, so Config reads back what was
// set.
func (c Config) arg(source wire.Source) string {
	return wire.ConfigArg{Rate: c.Rate, IntervalMS: c.Interval.Milliseconds(), Type: int64(c.Type), Burst: c.Burst,
		Buckets: int64(c.Buckets), KeepAliveMS: c.KeepAlive.Milliseconds(), Calendars: c.calendars(), More: rateList(c.More)}.Encode(source)
}

// rateList is rates as the scripts take and give them.
func rateList(rates []Config) []wire.Rate {
	list := make([]wire.Rate, 0, len(rates))
	for _, r := range rates {
		list = append(list, wire.Rate{Rate: r.Rate, IntervalMS: r.Interval.Milliseconds(), Burst: r.Burst, Buckets: int64(r.Buckets)})
	}
	return list
}

// configOf is the Config a stored one (the get reply) says.
func configOf(st wire.StoredConfig) (Config, error) {
	cfg := Config{
		Rate: st.Rate, Interval: time.Duration(st.IntervalMS) * time.Millisecond, Type: RateType(st.Type),
		Burst: st.Burst, Buckets: int(st.Buckets), KeepAlive: time.Duration(st.KeepAliveMS) * time.Millisecond,
	}
	for _, r := range st.More {
		cfg.More = append(cfg.More, Config{Rate: r.Rate, Interval: time.Duration(r.IntervalMS) * time.Millisecond, Burst: r.Burst, Buckets: int(r.Buckets)})
	}
	for _, pc := range st.Calendars {
		r, ok := calendar.Parse(pc.Spec)
		if !ok {
			return Config{}, fmt.Errorf("%w: field %s = %q", ErrCorruptState, wire.FieldCalendar, pc.Spec)
		}
		cal := calendarOf(r)
		if pc.Place == 1 {
			cfg.Calendar = cal
		} else {
			cfg.More[pc.Place-2].Calendar = cal
		}
	}
	return cfg, nil
}

// calendars lists the rates of c that follow a calendar, as the config
// hash's field calendar keeps them, or nil for none.
func (c Config) calendars() []wire.PlacedCalendar {
	var list []wire.PlacedCalendar
	for i, r := range c.rates() {
		if r.Calendar.Period != 0 {
			list = append(list, wire.PlacedCalendar{Place: i + 1, Spec: r.Calendar.rule().Spec()})
		}
	}
	return list
}
