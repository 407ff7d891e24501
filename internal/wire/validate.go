package wire

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// RateSpec is one rate of a config as ValidateRates checks it: the
// package redlimit's Config, its defaults not yet applied.
type RateSpec struct {
	Type                int64 // 0 overall, 1 per client
	Rate, Burst         int64
	Buckets             int
	Interval, KeepAlive time.Duration
	// Calendar is the calendar the rate follows (for messages), nil for
	// none; CalendarErr its own validation's error, Longest its longest
	// window.
	Calendar    fmt.Stringer
	CalendarErr error
	Longest     time.Duration
}

// maxInterval keeps now + interval, in microseconds, far inside the exact
// range of doubles.
const maxInterval = MaxTTLMS * time.Millisecond

// Invalid is an error wrapping ErrInvalidConfig.
func Invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
}

// ValidateRates reports why rates cannot make one limit, wrapping
// ErrInvalidConfig: a rate out of range, or rates that do not make one
// limit together.
func ValidateRates(rates []RateSpec) error {
	for _, r := range rates {
		if err := r.validate(); err != nil {
			return err
		}
	}
	// A rate whose interval is longer than another's but grants no more
	// permits makes the shorter one meaningless: it is a mistake.
	rates = slices.Clone(rates)
	slices.SortFunc(rates, func(a, b RateSpec) int { return cmp.Compare(a.Interval, b.Interval) })
	for i := 1; i < len(rates); i++ {
		short, long := rates[i-1], rates[i]
		switch {
		case short.Interval == long.Interval:
			return Invalid("two rates per %v", long.Interval)
		case long.Rate <= short.Rate:
			return Invalid("%d per %v grants no more than %d per %v", long.Rate, long.Interval, short.Rate, short.Interval)
		}
	}
	return nil
}

// validate reports why one rate cannot be used. Every limit here keeps
// the scripts' arithmetic inside the exact range of doubles.
func (c RateSpec) validate() error {
	bad := Invalid
	switch {
	case c.Type != 0 && c.Type != 1:
		return bad("unknown type %d", c.Type)
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
	case c.Buckets < 0 || c.Buckets > MaxBuckets:
		return bad("buckets %d is outside 0..%d", c.Buckets, MaxBuckets)
	case c.KeepAlive < 0:
		return bad("keep alive %v is negative", c.KeepAlive)
	case c.KeepAlive > 0 && c.KeepAlive < c.Interval:
		return bad("keep alive %v is shorter than the interval %v", c.KeepAlive, c.Interval)
	case c.KeepAlive%time.Millisecond != 0:
		return bad("keep alive %v is not a whole number of milliseconds", c.KeepAlive)
	case c.KeepAlive > maxInterval:
		return bad("keep alive %v is above %v", c.KeepAlive, maxInterval)
	}
	if c.Calendar != nil {
		if c.CalendarErr != nil {
			return c.CalendarErr
		}
		if c.Interval != c.Longest {
			return bad("interval %v: a %v quota's is %v, its longest window", c.Interval, c.Calendar, c.Longest)
		}
	}
	// The defaults: Burst is Rate, Buckets DefaultBuckets.
	rate, burst, buckets := c.Rate, cmp.Or(c.Burst, c.Rate), cmp.Or(c.Buckets, DefaultBuckets)
	intervalUS := c.Interval.Microseconds()
	switch {
	case rate > intervalUS:
		// The funnel's emission interval (Interval / Rate) must be at least 1µs.
		return bad("rate %d per %v is finer than one permit per microsecond", rate, c.Interval)
	case burst > MaxDebt/((intervalUS+rate-1)/rate): // the emission interval rounded up: the funnel's is exact
		return bad("burst %d at %d per %v is too large", burst, rate, c.Interval)
	case int64(buckets) > c.Interval.Milliseconds():
		return bad("%d buckets do not fit in %v at millisecond resolution", buckets, c.Interval)
	}
	return nil
}
