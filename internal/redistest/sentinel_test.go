package redistest

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A failover client follows SENTINEL FAILOVER, data written before it is on
// the new primary, the former primary refuses writes as a replica, and a
// second failover brings the first primary back.
func TestSentinel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartSentinel(t)
	c := s.Client(t)
	first := s.Primary(t)
	if err := c.Set(ctx, "redistest:sentinel", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	// The replica must have it before the failover: WAIT for one replica.
	if n, err := c.Wait(ctx, 1, 0).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 0 = %d, %v; want 1", n, err)
	}

	from, to := s.Failover(t)
	if from != first || to == first || s.Primary(t) != to || s.Replica(t) != from {
		t.Fatalf("Failover() = %s, %s; primary %s, replica %s; want from %s", from.Addr(), to.Addr(), s.Primary(t).Addr(), s.Replica(t).Addr(), first.Addr())
	}
	if got, err := c.Get(ctx, "redistest:sentinel").Result(); err != nil || got != "v" {
		t.Fatalf("GET on the new primary = %q, %v; want \"v\"", got, err)
	}
	old := redisClient(t, from)
	if err := old.Set(ctx, "redistest:sentinel", "w", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("SET on the former primary: %v, want READONLY", err)
	}

	if back, _ := s.Failover(t); back != to || s.Primary(t) != first {
		t.Fatalf("second failover left %s primary, want %s", s.Primary(t).Addr(), first.Addr())
	}
	if err := c.Set(ctx, "redistest:sentinel", "x", 0).Err(); err != nil {
		t.Fatalf("SET after failing back: %v", err)
	}
}

// redisClient is a plain client to one node that does not retry, so a
// READONLY reply comes back at once.
func redisClient(t *testing.T, s *Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
