package redistest

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// WindowStart is a whole hour, so a fixed window of a second, a minute or
// an hour starts there (fixed windows are aligned to the Unix epoch): where
// the middleware suites' controlled clocks start.
var WindowStart = time.Unix(1_800_000_000, 0)

// Clock is a controlled time for redlimit.WithClock: it moves only when a
// test moves it. Safe for concurrent use, as handlers and limiters read it on
// other goroutines.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Miniredis returns a client with default options of a fresh miniredis;
// both are closed when t ends.
func Miniredis(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Backends says which servers EachBackend runs a test on.
type Backends int

const (
	// Servers: a fresh miniredis, and the test binary's real redis-server.
	Servers Backends = iota
	// WithCluster: Servers and the test binary's real Redis Cluster.
	WithCluster
)

// EachBackend runs f as subtests "miniredis", "redis" and, with WithCluster,
// "cluster". The real ones are skipped without redis-server unless
// REDLIMIT_REQUIRE_REDIS=1. connect returns a new client on each call (as
// separate processes would have), closed when the subtest ends.
func EachBackend(t *testing.T, which Backends, f func(t *testing.T, connect func() redis.UniversalClient)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		f(t, func() redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
	})
	t.Run("redis", func(t *testing.T) {
		s := Shared(t)
		f(t, func() redis.UniversalClient { return s.Client(t) })
	})
	if which == WithCluster {
		t.Run("cluster", func(t *testing.T) {
			c := SharedCluster(t)
			f(t, func() redis.UniversalClient { return c.Client(t) })
		})
	}
}

// UniqueName keeps tests sharing one server apart: prefix, the test's name
// and random hex, then a colon.
func UniqueName(t testing.TB, prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + t.Name() + ":" + hex.EncodeToString(b) + ":"
}
