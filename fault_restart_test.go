package redlimit

// Redis restarted without persistence (kill -9, a new redis-server on the
// same port): every limiter's state and the script cache are lost.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRestartUnderLoad(t *testing.T) {
	// Restart is kill -9 and a new redis-server on the same port, with no
	// persistence: every limiter's state, and the script cache, is lost with
	// it. That is what a Redis without persistence does; the handles here
	// keep their config as a default (WithDefault), so they go on after it
	// with fresh state, each granting its capacity once more. go-redis's
	// retries (MaxRetries) would bridge an outage this short: without them,
	// the callers see it.
	t.Run("alone", func(t *testing.T) { restartUnderLoad(t, false) })
	t.Run("batched", func(t *testing.T) { restartUnderLoad(t, true) })
}

func restartUnderLoad(t *testing.T, batching bool) {
	b := newFaultBed(t, &redis.Options{MaxRetries: -1, DialerRetries: 1})
	ctx := context.Background()
	var opts []Option
	if !batching {
		opts = append(opts, WithoutBatching())
	}
	runs := countingRuns(t, New(b.rdb, opts...))
	// Each grant is filed by when its call ran: wholly before the restart,
	// wholly after it, or across it (then it may belong to either life).
	var began, ended atomic.Int64 // of the restart, Unix ns; 0 until then
	type phases struct{ before, across, after atomic.Int64 }
	phase := map[*faultRun]*phases{}
	for _, r := range runs {
		phase[r] = &phases{}
	}
	wait := faultHammer(t, runs, faultWorkers, func(r *faultRun, start, end time.Time, ok bool, err error) bool {
		restartEnded := ended.Load()
		if ok {
			switch p := phase[r]; {
			case began.Load() == 0 || end.UnixNano() < began.Load():
				p.before.Add(1)
			case restartEnded != 0 && start.UnixNano() > restartEnded:
				p.after.Add(1)
			default:
				p.across.Add(1)
			}
		}
		return restartEnded != 0 && err == nil && !ok
	})
	waitProgress(t, runs, faultCapacity/4)
	began.Store(time.Now().UnixNano())
	b.srv.Restart(t)
	ended.Store(time.Now().UnixNano())
	wait()

	for _, r := range runs {
		p := phase[r]
		before, across, after := p.before.Load(), p.across.Load(), p.after.Load()
		errs := r.errors()
		t.Logf("%s: %d grants before the restart, %d across it, %d after; %d denials; %d errors, the first %v",
			r.algo.name, before, across, after, r.denied.Load(), len(errs), errs[:min(1, len(errs))])
		require.Equal(t, r.granted.Load(), before+across+after)
		require.NotEmpty(t, errs, "%s: the outage was seen", r.algo.name)
		for _, err := range errs {
			assert.ErrorIs(t, err, ErrUnavailable)
			assert.True(t, keepsCause(err), "the cause is kept: %v", err)
		}
		// The second life counted exactly its capacity: every grant after
		// the restart, and some made across it.
		assert.Equal(t, int64(faultCapacity), r.algo.counted(t, b.admin, r.limiter, r.cfg), "%s: grants Redis counted after the restart", r.algo.name)
		assert.LessOrEqual(t, after, int64(faultCapacity), "%s", r.algo.name)
		assert.GreaterOrEqual(t, after+across, int64(faultCapacity), "%s", r.algo.name)
		// And the first life at most its capacity.
		assert.LessOrEqual(t, before+across+after, int64(2*faultCapacity), "%s: at most the capacity in each life", r.algo.name)
	}
	// The decisions' script was loaded again.
	ok, err := b.admin.ScriptExists(ctx, scripts.Decide.SHA).Result()
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, ok, "the decision script was loaded again")
	assert.Zero(t, b.wire.wrote("eval"))
}

// What a Redis restart without persistence over-admits, measured under load
// and bounded. Three processes of 16 goroutines (faultChild, the
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
