package denials

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/wire"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Limiters that stop being asked do not stay in memory: every sweepEvery
// stores, expired denials go, and so do limiters left with none.
func TestLocalCacheSweep(t *testing.T) {
	d := &Cache[string]{}
	gone := Key("funnel:gone", "")
	d.Store(gone, 1, "denied", time.Second, time.Second, epoch)
	later := epoch.Add(2 * time.Second) // past gone's RetryAfter
	kept := Key("funnel:kept", wire.ConfigArg{Rate: 1, IntervalMS: 1000}.Encode(wire.SourceDefault))
	for i := range sweepEvery - 2 {
		d.Store(Key(fmt.Sprint("funnel:", i), ""), 1, "denied", time.Hour, time.Second, later)
	}
	_, ok := d.m.Load("funnel:gone")
	require.True(t, ok, "no sweep before the %dth store", sweepEvery)
	d.Store(kept, 1, "kept", time.Hour, time.Second, later) // the sweepEvery-th
	_, ok = d.m.Load("funnel:gone")
	assert.False(t, ok, "a limiter whose denials all expired is dropped")
	r, at, retryAt, ok := d.Lookup(kept, 1, later)
	assert.True(t, ok)
	assert.Equal(t, "kept", r)
	assert.Equal(t, later, at)
	assert.Equal(t, time.Hour, retryAt.Sub(later))
}

// A denial answers requests of as many permits or more under its key, until
// its wait or its maximum age, whichever is shorter; Forget drops every
// way of deciding its limiter; the last NUL splits a key.
func TestLookup(t *testing.T) {
	d := &Cache[string]{}
	a, b := Key("funnel:x\x00y", "default 1"), Key("funnel:x\x00y", "default 2")
	limiter, decision := Split(a)
	assert.Equal(t, "funnel:x\x00y", limiter)
	assert.Equal(t, "default 1", decision)
	d.Store(a, 5, "a", time.Hour, time.Second, epoch)
	d.Store(b, 1, "b", 300*time.Millisecond, time.Second, epoch)

	_, _, _, ok := d.Lookup(a, 4, epoch)
	assert.False(t, ok, "fewer permits than denied")
	r, _, _, ok := d.Lookup(a, 5, epoch.Add(time.Second-time.Nanosecond))
	assert.True(t, ok)
	assert.Equal(t, "a", r)
	_, _, _, ok = d.Lookup(a, 5, epoch.Add(time.Second))
	assert.False(t, ok, "past the maximum age")
	_, _, _, ok = d.Lookup(b, 1, epoch.Add(300*time.Millisecond))
	assert.False(t, ok, "past the wait")

	d.Store(a, 5, "a", time.Hour, time.Second, epoch)
	d.Store(b, 1, "b", time.Hour, time.Second, epoch)
	d.Forget(a)
	_, _, _, ok = d.Lookup(b, 1, epoch)
	assert.False(t, ok, "the limiter's every way gone")
}
