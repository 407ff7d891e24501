package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { Main(m) }

func TestShared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Shared(t)
	c := s.Client(t)
	if err := c.Set(ctx, "redistest:shared", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.Get(ctx, "redistest:shared").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want \"v\"", got, err)
	}
	// The server is the redis-server on PATH (Redis 6.2 or later; Valkey
	// reports its own version beside the Redis version it is compatible with).
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		t.Fatalf("redis-server --version: %v", err)
	}
	m := regexp.MustCompile(` v=(\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("redis-server --version printed %q: no v=", out)
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		t.Fatalf("INFO server: %v", err)
	}
	want := string(m[1])
	if got := infoField(info, "valkey_version"); got != "" {
		if got != want {
			t.Errorf("valkey_version = %q, want %q (redis-server --version)", got, want)
		}
		want = infoField(info, "redis_version")
	}
	if v := s.Version(); v != want {
		t.Errorf("Version() = %q, want %q (redis-server --version)", v, want)
	}
	if err := c.Do(ctx, "DEBUG", "SLEEP", "0").Err(); err != nil {
		t.Errorf("DEBUG SLEEP 0: %v (is --enable-debug-command on?)", err)
	}
}

func TestSharedFromParallelTests(t *testing.T) {
	t.Parallel()
	addrs := make(chan string, 8)
	t.Run("group", func(t *testing.T) {
		for i := range cap(addrs) {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				s := Shared(t)
				if err := s.Client(t).Ping(context.Background()).Err(); err != nil {
					t.Errorf("PING: %v", err)
				}
				addrs <- s.Addr()
			})
		}
	})
	close(addrs)
	first := <-addrs
	for a := range addrs {
		if a != first {
			t.Errorf("Shared returned servers %s and %s; want one", first, a)
		}
	}
}

func TestRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Start(t)
	if s.Addr() == Shared(t).Addr() {
		t.Fatalf("Start returned the shared server %s", s.Addr())
	}
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	addr := s.Addr()
	start := time.Now()
	s.Restart(t)
	t.Logf("restart took %v", time.Since(start))
	if s.Addr() != addr {
		t.Fatalf("Addr after Restart = %s, want %s", s.Addr(), addr)
	}
	// The old connection is dead; go-redis retries on a fresh one.
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET k after Restart: err = %v, want redis.Nil (no persistence)", err)
	}

	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := s.Kill(); err != nil {
		t.Errorf("second Kill: %v", err)
	}
	fresh := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	defer fresh.Close()
	if err := fresh.Ping(ctx).Err(); err == nil {
		t.Errorf("PING after Kill succeeded")
	}
}

func TestKeySlot(t *testing.T) {
	t.Parallel()
	c := SharedCluster(t).Client(t) // Redis 7.0 has CLUSTER KEYSLOT only in cluster mode
	for _, key := range []string{"", "foo", "{user1000}.following", "a{}b", "{}{x}", "x{y}z{w}", "redlimit:{42}:tokens"} {
		want, err := c.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
		}
		if got := KeySlot(key); got != int(want) {
			t.Errorf("KeySlot(%q) = %d, want %d", key, got, want)
		}
	}
	for _, slot := range []int{0, 1, 8000, 16383} {
		if got := KeySlot(HashTagForSlot(slot) + ":x"); got != slot {
			t.Errorf("HashTagForSlot(%d) gives keys in slot %d", slot, got)
		}
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var stopStart time.Time
	t.Cleanup(func() {
		if !stopStart.IsZero() {
			t.Logf("cluster teardown took %v", time.Since(stopStart))
		}
	})
	c := StartCluster(t)
	t.Cleanup(func() { stopStart = time.Now() })
	cc := c.Client(t)

	// Keys spread over all three primaries.
	keys := make([]string, 100)
	owners := map[string]bool{}
	for i := range keys {
		keys[i] = fmt.Sprintf("redistest:key:%d", i)
		if err := cc.Set(ctx, keys[i], i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", keys[i], err)
		}
	}
	for _, slot := range []int{KeySlot(keys[0]), KeySlot(keys[1]), 0, 8000, 16383} {
		owners[c.SlotOwner(t, slot)] = true
	}
	if len(owners) < 2 {
		t.Errorf("keys landed on %d primaries, want several", len(owners))
	}
	checkKeys := func(step string) {
		t.Helper()
		for i, k := range keys {
			if got, err := cc.Get(ctx, k).Int(); err != nil || got != i {
				t.Fatalf("after %s: GET %s = %d, %v; want %d", step, k, got, err, i)
			}
		}
	}
	checkKeys("create")

	slot := KeySlot(keys[0])
	before := c.SlotOwner(t, slot)
	start := time.Now()
	c.Failover(t, slot)
	t.Logf("failover took %v", time.Since(start))
	if after := c.SlotOwner(t, slot); after == before {
		t.Errorf("slot %d still owned by %s after Failover", slot, after)
	}
	checkKeys("failover")
	if err := cc.Set(ctx, keys[0], 0, 0).Err(); err != nil {
		t.Fatalf("SET after failover: %v", err)
	}

	// A slot full of keys, moved while a writer keeps using it.
	tag := HashTagForSlot(5000)
	var moveKeys []string
	for i := range 250 {
		k := fmt.Sprintf("%s:%d", tag, i)
		moveKeys = append(moveKeys, k)
		if err := cc.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		w := c.Client(t)
		for n := 0; ; n++ {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			if err := w.Incr(ctx, tag+":counter").Err(); err != nil {
				writerDone <- fmt.Errorf("INCR during MoveSlot (after %d): %w", n, err)
				return
			}
		}
	}()
	before = c.SlotOwner(t, 5000)
	start = time.Now()
	c.MoveSlot(t, 5000)
	t.Logf("MoveSlot took %v", time.Since(start))
	close(stop)
	if err := <-writerDone; err != nil {
		t.Error(err)
	}
	if after := c.SlotOwner(t, 5000); after == before {
		t.Errorf("slot 5000 still owned by %s after MoveSlot", after)
	}
	for _, k := range moveKeys {
		if got, err := cc.Get(ctx, k).Result(); err != nil || got != k {
			t.Fatalf("after MoveSlot: GET %s = %q, %v", k, got, err)
		}
	}
	if err := cc.Set(ctx, moveKeys[0], "new", 0).Err(); err != nil {
		t.Fatalf("SET after MoveSlot: %v", err)
	}
	checkKeys("MoveSlot")
}

func TestSharedCluster(t *testing.T) {
	t.Parallel()
	c := SharedCluster(t)
	if c2 := SharedCluster(t); c2 != c {
		t.Fatalf("SharedCluster returned two clusters")
	}
	if n := len(c.Addrs()); n != 6 {
		t.Fatalf("Addrs() has %d nodes, want 6", n)
	}
	cc := c.Client(t)
	ctx := context.Background()
	if err := cc.Set(ctx, "redistest:shared-cluster", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := cc.Get(ctx, "redistest:shared-cluster").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v", got, err)
	}
}
