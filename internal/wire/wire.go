// Package wire is the contract between redlimit's Go code and its Lua
// scripts, declared once: every script's keys and arguments by position, the
// ops, the config argument and the config hash's fields, every reply's
// shape, the errors the scripts raise, the key layout and which algorithm
// owns what a limiter's key holds. The scripts read it from the header
// LuaHeader writes before them (internal/evalsha assembles them); the
// library, the in-flight limits and the operator's command read it from
// here. Nothing here talks to Redis.
package wire

import (
	"fmt"
	"slices"
	"strings"
)

// Algorithm is what the scripts and the operator's tools know of one
// algorithm: where its state lives and what shapes it takes.
type Algorithm struct {
	// Name is the one the config hash's algorithm field stores and
	// observers see. A hash without the field is the token bucket's, as
	// Redisson writes it.
	Name string
	// State lists the suffixes of one client's state keys: the Overall
	// state's are {name}:suffix (none when InConfig), a client's
	// {name}:suffix:client.
	State []string
	// InConfig: the Overall state is fields of the limiter's key (Fields,
	// suffixed by each rate's K), or, with no config stored, a flat state:
	// those fields' values as one string.
	InConfig bool
	// Fields are the state's hash fields, each rate's suffixed with its K.
	Fields []string
	// Types are the Redis types of the state keys, in State's order.
	Types []string
	// Own is the config field only this algorithm uses, or "".
	Own string
	// Records: its grants carry the request id (the token bucket's log), so
	// that it recognises a re-sent grant by itself.
	Records bool
	// Charges: a grant past the limit is a debt its state holds exactly.
	Charges bool
	// Calendar: its rates may follow the calendar.
	Calendar bool
	// flat lists the bytes of its flat state ("" for none: it writes only
	// its marker); the first algorithm whose bytes hold a string wrote it
	// (OwnerOf), so each one's must not be another's subset listed before.
	flat string
	// foreign is a Lua pattern found in every string of the limiter's key
	// this algorithm did not write, and, its marker aside, in none it did.
	foreign string
}

// The algorithms, in the order OwnerOf tries their flat shapes.
var (
	TokenBucket = &Algorithm{Name: "tokenbucket", State: []string{"value", "permits", "grants"},
		Types: []string{"string", "zset", "zset"}, Records: true, Charges: true, foreign: ""}
	Funnel = &Algorithm{Name: "funnel", State: []string{"tat"}, InConfig: true, Fields: []string{"tat"},
		Types: []string{"hash"}, Own: FieldBurst, Charges: true, flat: "0123456789,;", foreign: "[^%d,;]"}
	FixedWindow = &Algorithm{Name: "fixed_window", State: []string{"window"}, InConfig: true, Fields: []string{"window", "count"},
		Types: []string{"hash"}, Own: FieldCalendar, Calendar: true, flat: "0123456789 ;", foreign: "^[^ ]*$"}
	SlidingWindow = &Algorithm{Name: "sliding_window", State: []string{"buckets"}, InConfig: true, Fields: []string{"counts"},
		Types: []string{"hash"}, Own: FieldBuckets, Charges: true, flat: "0123456789:,;", foreign: "^[^:]*$"}

	Algorithms = []*Algorithm{TokenBucket, Funnel, FixedWindow, SlidingWindow}
)

// AlgorithmNamed returns the algorithm stored as name, or nil.
func AlgorithmNamed(name string) *Algorithm {
	for _, a := range Algorithms {
		if a.Name == name {
			return a
		}
	}
	return nil
}

// OwnerOf names the algorithm that wrote value, a string at a limiter's
// key (no config stored): a marker is its algorithm's name, a flat state
// has its algorithm's shape. It returns "" for anything else.
func OwnerOf(value string) string {
	if AlgorithmNamed(value) != nil {
		return value
	}
	for _, a := range Algorithms {
		if a.flat != "" && value != "" && strings.Trim(value, a.flat) == "" {
			return a.Name
		}
	}
	return ""
}

// Positions of a decision's keys (KEYS, 1-based within a request): the
// limiter's key, then the Overall state's keys (none when InConfig), the
// client registry, the request log, then this client's state keys. A
// request that needs none of the last three (not PerClient, no request log)
// is sent without them.
const KeyLimiter = 1

// Registry is the position of the client registry among a's keys.
func (a *Algorithm) Registry() int {
	if a.InConfig {
		return 2
	}
	return 2 + len(a.State)
}

// Requests is the position of the request log among a's keys.
func (a *Algorithm) Requests() int { return a.Registry() + 1 }

// The fields of a limiter's config hash. Rate, interval, type and
// keepAliveTime are Redisson's, as its RRateLimiter stores them.
const (
	FieldRate      = "rate"
	FieldInterval  = "interval" // ms
	FieldType      = "type"     // 0 Overall, 1 PerClient
	FieldKeepAlive = "keepAliveTime"
	FieldAlgorithm = "algorithm" // absent: the token bucket, as Redisson writes it
	FieldMore      = "more"      // further rates: rate, interval ms, burst, buckets of each, space-separated
	FieldShadow    = "shadow"    // "1": shadow mode (Limiter.SetShadow)
	FieldBurst     = "burst"
	FieldBuckets   = "buckets"
	FieldCalendar  = "calendar" // calendar rates: "place=period:anchor:zone", ',' between them
)

// HashFields are the fields a decision reads first, in this order (H_RATE …
// in Lua); the algorithm's own field follows, then its state's.
var HashFields = []string{FieldRate, FieldInterval, FieldType, FieldKeepAlive, FieldAlgorithm, FieldMore, FieldShadow}

// ConfigFields are every config field, in the order the admin script's get
// reply gives their values.
var ConfigFields = []string{FieldRate, FieldInterval, FieldType, FieldBurst, FieldBuckets, FieldKeepAlive, FieldMore, FieldCalendar}

// hashRead is what a decision of a reads of the limiter's key with HMGET:
// HashFields, its own field, then its first rate's state fields.
func (a *Algorithm) hashRead() []string {
	fields := slices.Clone(HashFields)
	if a.Own != "" {
		fields = append(fields, a.Own)
	}
	return append(fields, a.Fields...)
}

// StateFields lists every algorithm's state fields (its first rate's): a
// hash holding any of them holds another algorithm's state.
func StateFields() []string {
	var all []string
	for _, a := range Algorithms {
		all = append(all, a.Fields...)
	}
	return all
}

// RateSuffix is the suffix of a rate's state fields and key parts, K, by its
// place in the config (0 its own, 1 … More's).
func RateSuffix(place int) string {
	if place == 0 {
		return ""
	}
	return fmt.Sprint(place + 1)
}

// Bounds the scripts share with config.go's validation.
const (
	MaxRates       = 4
	DefaultBuckets = 10
	MaxBuckets     = 1000
	// MaxDebt bounds how far a state may run ahead of now, µs: a funnel's
	// TAT after a charge. Now (~2^50.6 µs) plus it stays below 2^53, where
	// doubles are exact, and its expiry far inside Redis's.
	MaxDebt = 1 << 52
	// MaxLogRate bounds a token bucket's own rate: Redisson's records count
	// a record's permits in 4 bytes.
	MaxLogRate = 1<<32 - 1
)
