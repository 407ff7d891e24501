package redlimit

import (
	"fmt"
	"strconv"
	"time"
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

// Config is a limiter's rate. It is stored in Redis (TrySetRate, SetRate), so
// every instance of a service follows a change on its next call.
//
// Rate permits are granted per Interval. Interval and KeepAlive have millisecond
// resolution: the token bucket's Redis layout, shared with Redisson, stores them
// in milliseconds.
type Config struct {
	Type      RateType
	Rate      int64         // permits per Interval
	Interval  time.Duration // at least 1ms, a whole number of milliseconds
	Burst     int64         // funnel only: capacity; 0 means Rate
	Buckets   int           // sliding window only: sub-windows per Interval; 0 means 10
	KeepAlive time.Duration // 0: the config never expires; else idle TTL refreshed on every acquire (≥ Interval)
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
	return s
}

const (
	defaultBuckets = 10
	maxBuckets     = 1000
	// maxTolerance bounds a funnel's capacity in time (Burst × Interval / Rate,
	// in µs): the scripts add it to now in µs (~2^50.6 today), and Lua numbers
	// are doubles, exact to 2^53.
	maxTolerance = 1 << 52
	// maxInterval keeps now + interval, in microseconds, far inside maxExact.
	maxInterval = 10 * 365 * 24 * time.Hour
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

// validate reports why c cannot be used, wrapping ErrInvalidConfig. Every
// limit here keeps the scripts' arithmetic inside the exact range of doubles.
func (c Config) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	switch {
	case c.Type != Overall && c.Type != PerClient:
		return bad("unknown type %d", int(c.Type))
	case c.Rate < 1:
		return bad("rate %d is below 1", c.Rate)
	case c.Interval < time.Millisecond:
		return bad("interval %v is below 1ms", c.Interval)
	case c.Interval%time.Millisecond != 0:
		return bad("interval %v is not a whole number of milliseconds", c.Interval)
	case c.Interval > maxInterval:
		return bad("interval %v is above %v", c.Interval, maxInterval)
	case c.Burst < 0:
		return bad("burst %d is negative", c.Burst)
	case c.Buckets < 0 || c.Buckets > maxBuckets:
		return bad("buckets %d is outside 0..%d", c.Buckets, maxBuckets)
	case c.KeepAlive < 0:
		return bad("keep alive %v is negative", c.KeepAlive)
	case c.KeepAlive > 0 && c.KeepAlive < c.Interval:
		return bad("keep alive %v is shorter than the interval %v", c.KeepAlive, c.Interval)
	case c.KeepAlive%time.Millisecond != 0:
		return bad("keep alive %v is not a whole number of milliseconds", c.KeepAlive)
	case c.KeepAlive > maxInterval:
		return bad("keep alive %v is above %v", c.KeepAlive, maxInterval)
	}
	d := c.withDefaults()
	intervalUS := d.Interval.Microseconds()
	switch {
	case d.Rate > intervalUS:
		// The funnel's emission interval (Interval / Rate) must be at least 1µs.
		return bad("rate %d per %v is finer than one permit per microsecond", d.Rate, d.Interval)
	case d.Burst > maxTolerance/(intervalUS/d.Rate):
		return bad("burst %d at %d per %v is too large", d.Burst, d.Rate, d.Interval)
	case int64(d.Buckets) > d.Interval.Milliseconds():
		return bad("%d buckets do not fit in %v at millisecond resolution", d.Buckets, d.Interval)
	}
	return nil
}

// arg encodes c for the scripts as ARGV[5] (scripts/common.lua): source,
// then the fields, space-separated. Zero Burst and Buckets go as they are:
// the scripts apply the defaults, so Config reads back what was set.
func (c Config) arg(source string) string {
	return fmt.Sprintf("%s %d %d %d %d %d %d", source, c.Rate, c.Interval.Milliseconds(), c.Type, c.Burst, c.Buckets,
		c.KeepAlive.Milliseconds())
}
