package inflight

import (
	"time"

	"github.com/redlimit/redlimit/internal/wire"
)

// The in-flight script's replies, read. A reply of any other shape, or
// with a number out of the range the script keeps to, is
// ErrUnexpectedReply: never a panic, never a hold the script did not grant.

// maxMS bounds every duration a reply holds (wire.MaxTTLMS).
const maxMS = wire.MaxTTLMS

// Acquire is an acquire's reply.
type Acquire struct {
	Granted bool
	Limit   int64         // the limit in force
	TTL     time.Duration // granted: the hold's
	Wait    time.Duration // denied: until the earliest hold expires
}

// ParseAcquire reads an acquire's reply: {1, ttl ms, limit} or {0, wait
// ms, limit}.
func ParseAcquire(reply any) (Acquire, error) {
	v, ok := reply.([]any)
	var n [3]int64
	if !ok || len(v) != len(n) || !wire.Integers(v, n[:]) || n[0] != 0 && n[0] != 1 ||
		n[1] < 0 || n[1] > maxMS || n[2] < 1 || n[2] > wire.MaxInFlightLimit {
		return Acquire{}, wire.Unexpected(reply)
	}
	d := time.Duration(n[1]) * time.Millisecond
	if n[0] == 1 {
		if d == 0 {
			return Acquire{}, wire.Unexpected(reply)
		}
		return Acquire{Granted: true, Limit: n[2], TTL: d}, nil
	}
	return Acquire{Limit: n[2], Wait: d}, nil
}

// ParseRefresh reads a refresh's reply: {HELD, ttl ms}, or {GONE or
// EXPIRED, 0}.
func ParseRefresh(reply any) (int64, time.Duration, error) {
	v, ok := reply.([]any)
	var n [2]int64
	if ok && len(v) == len(n) && wire.Integers(v, n[:]) {
		switch {
		case n[0] == wire.HoldHeld && n[1] >= wire.MinTTLMS && n[1] <= maxMS:
			return wire.HoldHeld, time.Duration(n[1]) * time.Millisecond, nil
		case (n[0] == wire.HoldGone || n[0] == wire.HoldExpired) && n[1] == 0:
			return n[0], 0, nil
		}
	}
	return 0, 0, wire.Unexpected(reply)
}

// ParseRelease reads a release's reply: what it found of the hold, GONE,
// HELD (released now) or EXPIRED.
func ParseRelease(reply any) (int64, error) {
	state, ok := reply.(int64)
	if !ok || state != wire.HoldGone && state != wire.HoldHeld && state != wire.HoldExpired {
		return 0, wire.Unexpected(reply)
	}
	return state, nil
}

// ZeroOrOne reads a reply of 0 or 1: whether a config was stored, or there
// was something to delete or reset.
func ZeroOrOne(reply any) (bool, error) {
	n, ok := reply.(int64)
	if !ok || n != 0 && n != 1 {
		return false, wire.Unexpected(reply)
	}
	return n == 1, nil
}

// ParseConfig reads a get's reply: {limit, ttl ms}, or {} for no config
// stored (found false). A config the script would never have stored is
// ErrUnexpectedReply.
func ParseConfig(reply any) (limit int64, ttl time.Duration, found bool, err error) {
	v, ok := reply.([]any)
	if ok && len(v) == 0 {
		return 0, 0, false, nil
	}
	var n [2]int64
	if !ok || len(v) != len(n) || !wire.Integers(v, n[:]) || Validate(n[0], time.Duration(n[1])*time.Millisecond) != nil {
		return 0, 0, false, wire.Unexpected(reply)
	}
	return n[0], time.Duration(n[1]) * time.Millisecond, true, nil
}

// Holder is one live hold, as the holders op lists it (redlimit.Holder).
type Holder struct {
	ID  string
	TTL time.Duration
}

// ParseHolders reads a holders reply: each hold's id and ms left, the one
// expiring first first.
func ParseHolders(reply any) ([]Holder, error) {
	v, ok := reply.([]any)
	if !ok || len(v)%2 != 0 {
		return nil, wire.Unexpected(reply)
	}
	holders := make([]Holder, 0, len(v)/2)
	for i := 0; i < len(v); i += 2 {
		id, ok1 := v[i].(string)
		ms, ok2 := v[i+1].(int64)
		if !ok1 || !ok2 || ms < 0 || ms > maxMS {
			return nil, wire.Unexpected(reply)
		}
		holders = append(holders, Holder{ID: id, TTL: time.Duration(ms) * time.Millisecond})
	}
	return holders, nil
}
