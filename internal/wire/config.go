package wire

import (
	"fmt"
	"strconv"
	"strings"
)

// A config as the scripts are given it (ConfigArg) and as the config hash
// keeps it (ConfigFields: the admin script's get reply, StoredConfig), with
// the formats of its fields more (further rates) and calendar (calendar
// rates), each written and read here only.

// ConfigArg is a config as the scripts are given it: source, rate,
// interval ms, type, burst, buckets and keep-alive ms, space-separated, then
// " @" and its calendar rates (FieldCalendar's format) if any, then " " and
// its further rates (FieldMore's format) if any. Zero burst and buckets go
// as they are: the scripts apply the defaults.
type ConfigArg struct {
	Rate, IntervalMS, Type, Burst, Buckets, KeepAliveMS int64
	Calendars                                           []PlacedCalendar
	More                                                []Rate
}

// configArg is the Lua pattern that reads ConfigArg's fields and the rest.
const configArg = `^(%a+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) ?(.*)$`

// configArgCommon is the Lua pattern that reads a ConfigArg the common
// decision takes (Overall, no keep-alive, one rate, no calendar): rate,
// interval ms, burst and buckets. It matches exactly the arguments that
// configArg reads with type 0, keep-alive 0 and nothing after them, with
// four captures, not eight: one match is a fair part of a lone decision.
const configArgCommon = `^%a+ (%d+) (%d+) 0 (%d+) (%d+) 0 ?$`

// Encode writes c for source.
func (c ConfigArg) Encode(source Source) string {
	b := make([]byte, 0, 64)
	b = append(b, source...)
	for _, n := range []int64{c.Rate, c.IntervalMS, c.Type, c.Burst, c.Buckets, c.KeepAliveMS} {
		b = strconv.AppendInt(append(b, ' '), n, 10)
	}
	if len(c.Calendars) > 0 {
		b = append(append(b, " @"...), EncodeCalendars(c.Calendars)...)
	}
	if len(c.More) > 0 {
		b = append(append(b, ' '), EncodeMore(c.More)...)
	}
	return string(b)
}

// Rate is one rate of a config as the field more, ConfigArg and a decision's
// reply give it: four numbers, space-separated.
type Rate struct{ Rate, IntervalMS, Burst, Buckets int64 }

// EncodeMore writes rates in FieldMore's format.
func EncodeMore(rates []Rate) string {
	b := make([]byte, 0, 24*len(rates))
	for i, r := range rates {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, r.Rate, 10)
		b = strconv.AppendInt(append(b, ' '), r.IntervalMS, 10)
		b = strconv.AppendInt(append(b, ' '), r.Burst, 10)
		b = strconv.AppendInt(append(b, ' '), r.Buckets, 10)
	}
	return string(b)
}

// ParseMore reads FieldMore's format: nothing, or four non-negative
// integers a rate.
func ParseMore(s string) ([]Rate, bool) {
	if s == "" {
		return nil, true
	}
	f := strings.Fields(s)
	if len(f)%4 != 0 || len(f)/4 > MaxRates-1 {
		return nil, false
	}
	rates := make([]Rate, 0, len(f)/4)
	for i := 0; i < len(f); i += 4 {
		var n [4]int64
		for j := range n {
			x, err := strconv.ParseInt(f[i+j], 10, 64)
			if err != nil || x < 0 {
				return nil, false
			}
			n[j] = x
		}
		rates = append(rates, Rate{Rate: n[0], IntervalMS: n[1], Burst: n[2], Buckets: n[3]})
	}
	return rates, true
}

// PlacedCalendar is one calendar rate as the field calendar keeps it:
// "place=spec", place 1 for the config's own rate, 2 … for the further ones;
// spec is "period:anchor:zone" (the package redlimit's Calendar reads it).
type PlacedCalendar struct {
	Place int
	Spec  string
}

// EncodeCalendars writes calendar rates in FieldCalendar's format, ','
// between them.
func EncodeCalendars(cals []PlacedCalendar) string {
	var b strings.Builder
	for i, c := range cals {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(c.Place))
		b.WriteByte('=')
		b.WriteString(c.Spec)
	}
	return b.String()
}

// ParseCalendars reads FieldCalendar's format: its places (1..MaxRates) and
// specs, which the caller reads.
func ParseCalendars(s string) ([]PlacedCalendar, bool) {
	if s == "" {
		return nil, true
	}
	var cals []PlacedCalendar
	for item := range strings.SplitSeq(s, ",") {
		place, spec, ok := strings.Cut(item, "=")
		n, err := strconv.Atoi(place)
		if !ok || err != nil || n < 1 || n > MaxRates || spec == "" {
			return nil, false
		}
		cals = append(cals, PlacedCalendar{Place: n, Spec: spec})
	}
	return cals, true
}

// StoredConfig is a config as the hash keeps it: ConfigFields' values.
type StoredConfig struct {
	Rate, IntervalMS, Type, Burst, Buckets, KeepAliveMS int64
	More                                                []Rate
	Calendars                                           []PlacedCalendar
}

// ParseGetReply reads the admin script's get reply: ConfigFields' values,
// in order, the numbers as integers and more and calendar as strings; {}
// for none stored (found false). A reply of another shape is
// ErrUnexpectedReply; a field calendar it cannot read, ErrCorruptState.
func ParseGetReply(reply any) (c StoredConfig, found bool, err error) {
	f, ok := reply.([]any)
	if ok && len(f) == 0 {
		return StoredConfig{}, false, nil
	}
	if !ok || len(f) != len(ConfigFields) {
		return StoredConfig{}, false, Unexpected(reply)
	}
	var n [6]int64
	for i := range n {
		if n[i], ok = f[i].(int64); !ok {
			return StoredConfig{}, false, Unexpected(reply)
		}
	}
	more, ok1 := f[6].(string)
	cals, ok2 := f[7].(string)
	if !ok1 || !ok2 {
		return StoredConfig{}, false, Unexpected(reply)
	}
	return storedConfig(n, more, cals, reply)
}

// ParseStoredFields reads a config from the hash's fields, by name (as
// HGETALL gives them): rate and interval are required, the other numbers
// default to 0. A field it cannot read is ErrCorruptState.
func ParseStoredFields(fields map[string]string) (c StoredConfig, found bool, err error) {
	if _, has := fields[FieldRate]; !has {
		return StoredConfig{}, false, nil
	}
	var n [6]int64
	for i, name := range ConfigFields[:6] {
		s, has := fields[name]
		if !has && i < 2 {
			return StoredConfig{}, false, fmt.Errorf("%w: field %s missing", ErrCorruptState, name)
		}
		if has {
			x, err := strconv.ParseInt(s, 10, 64)
			if err != nil || x < 0 {
				return StoredConfig{}, false, fmt.Errorf("%w: field %s = %q", ErrCorruptState, name, s)
			}
			n[i] = x
		}
	}
	return storedConfig(n, fields[FieldMore], fields[FieldCalendar], nil)
}

// storedConfig reads the fields more and calendar beside the numbers n. A
// field more it cannot read is an unexpected reply when reply is the get
// reply it came in (the script checks it), else a corrupt state.
func storedConfig(n [6]int64, more, calendars string, reply any) (StoredConfig, bool, error) {
	c := StoredConfig{Rate: n[0], IntervalMS: n[1], Type: n[2], Burst: n[3], Buckets: n[4], KeepAliveMS: n[5]}
	var ok bool
	if c.More, ok = ParseMore(more); !ok {
		if reply != nil {
			return StoredConfig{}, false, Unexpected(reply)
		}
		return StoredConfig{}, false, fmt.Errorf("%w: field %s = %q", ErrCorruptState, FieldMore, more)
	}
	c.Calendars, ok = ParseCalendars(calendars)
	for _, cal := range c.Calendars {
		ok = ok && cal.Place <= 1+len(c.More)
	}
	if !ok {
		return StoredConfig{}, false, fmt.Errorf("%w: field %s = %q", ErrCorruptState, FieldCalendar, calendars)
	}
	return c, true, nil
}
