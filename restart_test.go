package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// What a Redis restart without persistence over-admits, measured under load
// and bounded. Three processes of 16 goroutines (TestFaultInjectionChild, the
// three ways of talking to Redis of fiProfiles) acquire from one limiter per
// algorithm, its counting config as the handle's default (stored nowhere, so
// the handles go on after the restart): the run lies in one window of each
// limit. The restart comes in the worst case: once every limiter has used up
// its limit and callers are being denied. Redis forgets that usage, and in
// the same window the limiter grants its whole limit again: up to twice the
// limit in the window spanning the restart, one extra limit's worth per
// restart, which is the bound asserted (and the figures are logged). A
// config stored with SetRate is lost with the rest: a handle without a
// default then fails with ErrNotInitialized, which is never failed open.
func TestRestartOverAdmission(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes for ~5s")
	}
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	t.Logf("redis-server %s", srv.Version())
	names := fiNames(t)
	cfgs := make([]Config, len(algorithms))
	peeks, stored := make([]*Limiter, len(algorithms)), make([]*Limiter, len(algorithms))
	for i, a := range algorithms {
		cfgs[i] = a.counting(fiCapacity)
		peeks[i] = a.new(New(admin), names[i]).WithDefault(cfgs[i])
		stored[i] = a.new(New(admin), names[i]+"-stored")
		require.NoError(t, stored[i].SetRate(ctx, cfgs[i]))
	}
	// usedUp waits until every limiter has no permit left, then lets the
	// callers be denied for a while: the load goes on.
	usedUp := func() {
		require.Eventually(t, func() bool {
			for _, l := range peeks {
				if r, err := l.Allow(ctx, 0); err != nil || r.Remaining > 0 {
					return false
				}
			}
			return true
		}, fiChildTime, 5*time.Millisecond, "every limiter used up its limit")
		time.Sleep(300 * time.Millisecond)
	}
	var began, ended time.Time
	tallies, took := runFaultChildren(t, fiSpec{Addr: srv.Addr(), Names: names, Capacity: fiCapacity, Goroutines: fiGoroutines, UntilEOF: true}, func() {
		usedUp()
		began = time.Now()
		srv.Restart(t)
		ended = time.Now()
		usedUp()
	})

	t.Logf("restart (kill -9, start, answering) took %v; load: %d processes × %d goroutines for %v",
		ended.Sub(began).Round(time.Millisecond), fiProcesses, fiGoroutines, took.Round(time.Millisecond))
	for i, a := range algorithms {
		tl := tallies[i]
		// Each grant by when its call ran: wholly before the restart, wholly
		// after it, or across it (then it may belong to either life).
		var before, across, after int64
		for _, g := range tl.Grants {
			switch {
			case g[1] < began.UnixNano():
				before++
			case g[0] > ended.UnixNano():
				after++
			default:
				across++
			}
		}
		granted := before + across + after
		t.Logf("%s: %d granted in the window spanning the restart, limit %d (+%d%%): %d before it, %d across, %d after; %d denials; %d errors %v",
			a.name, granted, fiCapacity, (granted-fiCapacity)*100/fiCapacity, before, across, after, tl.Denied, tl.errors(), tl.Errors)
		assert.LessOrEqual(t, granted, int64(2*fiCapacity), "%s: at most one extra limit's worth per restart", a.name)
		assert.Greater(t, granted, int64(fiCapacity), "%s: the restart forgot the usage (what this test measures)", a.name)
		assert.LessOrEqual(t, before, int64(fiCapacity), "%s: the first life at most its limit", a.name)
		assert.LessOrEqual(t, after, int64(fiCapacity), "%s: the second life at most its limit", a.name)
		assert.Equal(t, int64(fiCapacity), a.counted(t, admin, peeks[i], cfgs[i]), "%s: Redis counted the second life's whole limit, no more", a.name)
		assert.Empty(t, tl.Wrong, "%s: errors that are not ErrUnavailable with their network cause", a.name)
		assert.Positive(t, tl.Denied, "%s: callers were denied: the load outran the limit", a.name)

		_, err := stored[i].Allow(ctx, 1)
		assert.ErrorIs(t, err, ErrNotInitialized, "%s: the stored config was lost with the restart", a.name)
	}
}
