package hotkeys

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The rate over the last Period: this period's count, and the last one's
// weighted by the part of it still within a Period of now.
func TestRate(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	e := &entry[int]{}
	assert.Equal(t, 10.0, e.rate(start, 10))
	assert.Equal(t, 10.0, e.rate(start.Add(Period/2), 0), "the same period")
	assert.Equal(t, 5.0+4, e.rate(start.Add(Period+Period/2), 4), "half of the last period's 10, and 4")
	assert.Equal(t, 4.0, e.rate(start.Add(2*Period), 0), "the last period's 4, whole")
	assert.Equal(t, 0.0, e.rate(start.Add(4*Period), 0), "two periods on: nothing")
	assert.Equal(t, 1.0, e.rate(start, 1), "a clock gone back counts in the latest period")
}

type testLease struct{ key string }

// A key is leased from the decision that takes its rate above Above, once,
// keeps its lease while its rate stays at half of Above or more, and gives
// it back (Close, then Closed) when a decision in a later period finds it
// below; Close gives every lease back and takes none again.
func TestLeaseHotAndCool(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_000_000, 0)
	var opened, closed, counted []string
	tab := New(Config[*testLease]{
		Above:  10,
		Now:    func() time.Time { return now },
		Close:  func(_ context.Context, l *testLease) error { closed = append(closed, l.key); return nil },
		Closed: func(l *testLease) { counted = append(counted, l.key) },
	})
	open := func(key string) func() *testLease {
		return func() *testLease { opened = append(opened, key); return &testLease{key} }
	}
	for i := range 10 {
		l, hot := tab.Lease(ctx, "a", open("a"))
		require.False(t, hot, "decision %d: 10 a second is not above 10", i+1)
		require.Nil(t, l)
	}
	l, hot := tab.Lease(ctx, "a", open("a"))
	require.True(t, hot, "the 11th")
	assert.Equal(t, "a", l.key)
	again, _ := tab.Lease(ctx, "a", open("a"))
	assert.Same(t, l, again)
	assert.Equal(t, []string{"a"}, opened)

	now = now.Add(Period + Period/2) // 12 of the last period, halved: 6, not below 5
	_, hot = tab.Lease(ctx, "a", open("a"))
	assert.True(t, hot)
	now = now.Add(Period) // 1 of the last period: cooled by the sweep
	var s Stats[*testLease]
	tab.Read(now, func(in Stats[*testLease]) { s = in })
	assert.Equal(t, [2]int64{1, 0}, [2]int64{s.Started, s.Cooled})
	_, hot = tab.Lease(ctx, "b", open("b"))
	assert.False(t, hot)
	assert.Equal(t, []string{"a"}, closed)
	assert.Equal(t, []string{"a"}, counted)
	tab.Read(now, func(in Stats[*testLease]) { s = in })
	assert.Equal(t, Stats[*testLease]{Started: 1, Cooled: 1}, s)

	for range 11 {
		tab.Lease(ctx, "b", open("b"))
	}
	tab.Read(now, func(in Stats[*testLease]) { s = in })
	require.Len(t, s.Leased, 1)
	assert.Equal(t, "b", s.Leased[0].Key)
	assert.Equal(t, 12.0, s.Leased[0].Rate)
	require.NoError(t, tab.Close(ctx))
	assert.Equal(t, []string{"a", "b"}, closed)
	for range 20 {
		_, hot = tab.Lease(ctx, "c", open("c"))
		assert.False(t, hot, "closed: no lease taken again")
	}
	assert.Equal(t, []string{"a", "b"}, opened)
	assert.Equal(t, 3, tab.Len())
}
