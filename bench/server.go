package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/redistest"
)

// launcher is the little of a testing.TB that redistest.Start uses, so that
// the benchmark starts its redis-server the way the tests do. A method it
// does not define panics on the nil TB: redistest has started to use more.
type launcher struct {
	testing.TB
	dirs     []string
	cleanups []func()
}

// failed carries a Fatalf or Skip out of redistest.Start to startServer.
type failed struct{ error }

func (l *launcher) Helper()          {}
func (l *launcher) Cleanup(f func()) { l.cleanups = append(l.cleanups, f) }
func (l *launcher) Errorf(format string, a ...any) {
	log("redistest: "+format, a...)
}
func (l *launcher) Fatalf(format string, a ...any) { panic(failed{fmt.Errorf(format, a...)}) }
func (l *launcher) Skip(a ...any)                  { panic(failed{errors.New(fmt.Sprint(a...))}) }

func (l *launcher) TempDir() string {
	dir, err := os.MkdirTemp("", "redlimit-bench-")
	if err != nil {
		l.Fatalf("%v", err)
	}
	l.dirs = append(l.dirs, dir)
	return dir
}

func (l *launcher) stop() {
	for _, f := range slices.Backward(l.cleanups) {
		f()
	}
	for _, d := range l.dirs {
		os.RemoveAll(d)
	}
}

// startServer starts the first redis-server on PATH on a free loopback port,
// without persistence; stop kills it. The benchmark flushes it between
// measurements, which is why it never touches any other Redis.
func startServer() (addr string, stop func(), err error) {
	l := &launcher{}
	defer func() {
		if p := recover(); p != nil {
			f, ok := p.(failed)
			if !ok {
				panic(p)
			}
			l.stop()
			err = f.error
		}
	}()
	return redistest.Start(l).Addr(), l.stop, nil
}

var errNoField = errors.New("no such INFO field")

// infoField returns one "name:value" field of INFO section, or errNoField.
func infoField(ctx context.Context, admin *redis.Client, section, name string) (string, error) {
	info, err := admin.Info(ctx, section).Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, nil
		}
	}
	return "", errNoField
}

// evalshaStats reads the calls and average server time of EVALSHA since the
// last CONFIG RESETSTAT: the script's own cost, without network or client
// time. Both are 0 when no EVALSHA ran (every decision was local).
func evalshaStats(ctx context.Context, admin *redis.Client) (calls int64, usec float64, err error) {
	v, err := infoField(ctx, admin, "commandstats", "cmdstat_evalsha")
	if err == errNoField {
		return 0, 0, nil
	} else if err == nil {
		_, err = fmt.Sscanf(v, "calls=%d,usec=%g,usec_per_call=%g", &calls, new(float64), &usec)
	}
	return calls, usec, err
}
