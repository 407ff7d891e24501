package redlimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An operator alerting on Redis's errors must see none from a limiter in
// steady state, whatever its config's shape. A decision reads the limiter's
// key as a string or a hash as its last decision found it, and a wrong
// guess costs a failed command: a calendar quota on a default replied as
// if a hash held it, so that each decision after the first guessed wrong
// (WRONGTYPE in INFO errorstats, 9 in 10 decisions). Each shape here warms
// up, then decides 20 times with no failed command, on real Redis (miniredis
// keeps no error statistics).
func TestNoFailedCommandsInSteadyState(t *testing.T) {
	ctx := context.Background()
	admin, rdb := ownServer(t)
	nyc, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	perClient := func(cfg Config) Config { cfg.Type = PerClient; return cfg }
	for _, a := range algorithms {
		shapes := []struct {
			what string
			cfg  Config
		}{
			{"one rate", a.tune(PerMinute(1000), 0, 0)},
			{"several rates", a.tune(PerMinute(1000), 0, 0).And(a.tune(PerHour(10_000), 0, 0))},
			{"per client", perClient(a.tune(PerMinute(1000), 0, 0))},
		}
		if a.name == "fixed_window" {
			shapes = append(shapes,
				struct {
					what string
					cfg  Config
				}{"calendar", PerDay(1000, nyc)},
				struct {
					what string
					cfg  Config
				}{"calendar and a rate", PerMinute(100).And(PerDay(1000, nyc))})
		}
		for _, shape := range shapes {
			for _, stored := range []bool{false, true} {
				what := a.name + " " + shape.what
				if stored {
					what += " stored"
				}
				t.Run(what, func(t *testing.T) {
					clk := newClock()
					l := a.new(newClient(rdb, clk), uniqueName(t)).WithDefault(shape.cfg)
					if stored {
						require.NoError(t, l.SetRate(ctx, shape.cfg))
					}
					decide := func() {
						_, err := l.Allow(ctx, 1)
						require.NoError(t, err)
						clk.Add(time.Millisecond)
					}
					for range 3 { // learn the layout: a wrong guess, at most once
						decide()
					}
					require.NoError(t, admin.ConfigResetStat(ctx).Err())
					for range 20 {
						decide()
					}
					assert.Empty(t, errorStats(t, admin), "no failed command")
				})
			}
		}
	}
}

// errorStats returns INFO errorstats' lines: the errors Redis answered,
// scripts' commands' included.
func errorStats(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	info, err := admin.Info(context.Background(), "errorstats").Result()
	require.NoError(t, err)
	var lines []string
	for line := range strings.Lines(info) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	return lines
}
