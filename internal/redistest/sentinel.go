package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the sentinels of a Sentinel know their primary
// by (FailoverOptions.MasterName).
const SentinelMaster = "redistest"

const (
	sentinelCount   = 3
	sentinelQuorum  = 2
	sentinelTimeout = 30 * time.Second // start or failover to settle
)

// sentinelPeriods shorten what a sentinel waits for (SENTINEL DEBUG, Redis
// 7.0+), so that a failover settles in about two seconds instead of ten. A
// sentinel says hello every 100 ms (by default 2 s): sentinels find each
// other sooner, and a former primary that still says it is one is turned
// into a replica 4 hellos after the switch instead of 8 s. It reads INFO
// every second (by default 10 s; during a failover it is always 1 s), not
// less: it turns the former primary into a replica only while its last INFO
// from the new one is less than two periods old, and at 100 ms a busy
// machine misses that window for good. A sentinel stalled longer than the
// tilt trigger (2 s) stops acting for the tilt period: 1 s, not 30.
// Detecting a failed primary keeps its default (30 s): failovers here are
// asked for, never set off by a slow machine.
var sentinelPeriods = []any{"info-period", 1000, "publish-period", 100, "tilt-period", 1000}

// Sentinel is a primary, one replica and three sentinels (quorum 2)
// monitoring them as SentinelMaster, all on 127.0.0.1 and without
// persistence, like Start's servers. Failover swaps the roles of the two
// data nodes.
type Sentinel struct {
	nodes     [2]*Server // the data nodes, in start order: which is primary changes
	sentinels []*Server
	// mu serialises Failover.
	mu sync.Mutex
}

// StartSentinel starts a Sentinel for this test only; it is stopped in
// t.Cleanup (or by Main). It skips like Start, and also needs redis-sentinel.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	needBinaries(t, "redis-server", "redis-sentinel")
	return startForTest(t, "sentinel", startSentinel, func(s *Sentinel) string {
		return fmt.Sprintf("primary %s, replica %s, sentinels %v", s.nodes[0].Addr(), s.nodes[1].Addr(), s.SentinelAddrs())
	})
}

// SentinelAddrs returns the "127.0.0.1:port" of the three sentinels.
func (s *Sentinel) SentinelAddrs() []string { return addrsOf(s.sentinels) }

// Client returns a go-redis failover client with default options, seeded
// with the sentinels, closed in t.Cleanup.
func (s *Sentinel) Client(t testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: s.SentinelAddrs()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Primary returns the data node every sentinel names as the primary, once
// the setup is settled (see settled).
func (s *Sentinel) Primary(t testing.TB) *Server {
	t.Helper()
	p, err := s.waitSettled(sentinelTimeout, -1)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s.nodes[p]
}

// Replica returns the data node replicating the primary, once settled.
func (s *Sentinel) Replica(t testing.TB) *Server {
	t.Helper()
	p, err := s.waitSettled(sentinelTimeout, -1)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s.nodes[1-p]
}

// Failover sends SENTINEL FAILOVER to one sentinel and waits until the
// replica is the primary every sentinel names and the former primary
// replicates it. It returns the former primary and the new one.
//
// This is Sentinel's kind of failover, not the coordinated one of CLUSTER
// FAILOVER: the primary is not paused first, so writes it accepts after the
// replica stopped replicating it (until clients hear of the switch) are lost
// when it becomes a replica.
func (s *Sentinel) Failover(t testing.TB) (from, to *Server) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.waitSettled(sentinelTimeout, -1)
	if err != nil {
		t.Fatalf("redistest: failover: %v", err)
	}
	from, to = s.nodes[p], s.nodes[1-p]

	ctx := context.Background()
	deadline := time.Now().Add(sentinelTimeout)
	// A replica says its link is up once it has loaded the primary's
	// snapshot, but after a diskless sync the primary streams writes to it
	// only from its first REPLCONF ACK (sent once a second): promoted before
	// that, it lacks everything written since it synced. Wait until it has
	// applied what the primary had written before the failover is asked for.
	if err := caughtUp(to, from, time.Until(deadline)); err != nil {
		t.Fatalf("redistest: failover from %s to %s: %v", from.Addr(), to.Addr(), err)
	}
	for {
		_, err := s.sentinels[0].doString(ctx, "SENTINEL", "FAILOVER", SentinelMaster)
		if err == nil {
			break
		}
		// NOGOODSLAVE: the sentinel's last word from the replica is too
		// old, or its link just went down; it will hear from it again.
		if !strings.Contains(err.Error(), "NOGOODSLAVE") || time.Now().After(deadline) {
			t.Fatalf("redistest: failover from %s to %s: %v", from.Addr(), to.Addr(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The sentinels turn the former primary into a replica on their own
	// (see sentinelPeriods), but a machine busy enough (the race detector
	// on every core) can make them miss their moment, or tilt, for longer
	// than a test waits: then do what they would, once, and say so.
	_, err = s.waitSettled(min(10*time.Second, time.Until(deadline)), 1-p)
	if err != nil {
		if info, ierr := from.doString(ctx, "INFO", "replication"); ierr == nil && infoField(info, "role") == "master" {
			t.Logf("redistest: the sentinels left %s a primary after the switch (%v): REPLICAOF %s", from.Addr(), err, to.Addr())
			if _, rerr := from.doString(ctx, "REPLICAOF", "127.0.0.1", to.port); rerr != nil {
				t.Fatalf("redistest: REPLICAOF on %s: %v", from.Addr(), rerr)
			}
		}
		_, err = s.waitSettled(time.Until(deadline), 1-p)
	}
	if err != nil {
		t.Fatalf("redistest: failover from %s to %s did not complete: %v\nlog of the sentinel asked (%s):\n%s",
			from.Addr(), to.Addr(), err, s.sentinels[0].LogPath(), indent(s.sentinels[0].logTail()))
	}
	return from, to
}

func startSentinel(dir string) (_ *Sentinel, err error) {
	s := &Sentinel{}
	defer func() {
		if err != nil {
			_ = s.stop()
		}
	}()
	nodes, err := startNodes(dir, "node", len(s.nodes), func(dir string) (*Server, error) { return startServer(dir, false) })
	copy(s.nodes[:], nodes)
	if err != nil {
		return s, err
	}

	// The replica must be attached before the sentinels start: they learn of
	// replicas from the primary's INFO, which they read at once and then
	// only every info-period.
	ctx := context.Background()
	primary, replica := s.nodes[0], s.nodes[1]
	if _, err := replica.doString(ctx, "REPLICAOF", "127.0.0.1", primary.port); err != nil {
		return s, err
	}
	if err := waitFor(sentinelTimeout, func() error { return replicaOf(replica, primary) }); err != nil {
		return s, err
	}

	if s.sentinels, err = startNodes(dir, "sentinel", sentinelCount, func(dir string) (*Server, error) {
		return startOnFreePort(dir, false, func(n *Server) error { return n.launchSentinel(primary.port) })
	}); err != nil {
		return s, err
	}
	for _, n := range s.sentinels {
		// Redis before 7.0 has no SENTINEL DEBUG: it only takes longer.
		if err := n.do(ctx, append([]any{"SENTINEL", "DEBUG"}, sentinelPeriods...)...).Err(); err != nil &&
			!strings.Contains(strings.ToLower(err.Error()), "unknown") {
			return s, fmt.Errorf("%s: SENTINEL DEBUG: %w", n.Addr(), err)
		}
	}
	if _, err := s.waitSettled(sentinelTimeout, 0); err != nil {
		return s, err
	}
	return s, nil
}

func (s *Sentinel) stop() error { return killAll(slices.Concat(s.sentinels, s.nodes[:])) }

// launchSentinel is launch for a sentinel: redis-sentinel with a config file
// of its own (a sentinel rewrites it with what it learns), the same admin
// connection and the same readiness check (a sentinel answers INFO server
// with its process_id too). s.mu must be held. Restart is for data nodes
// only: it would start a redis-server.
func (s *Server) launchSentinel(primaryPort int) error {
	conf := filepath.Join(s.dir, "sentinel.conf")
	text := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d\n", SentinelMaster, primaryPort, sentinelQuorum)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return err
	}
	args := []string{conf,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", "", // stdout, which goes to LogPath
	}
	return s.spawn("redis-sentinel", args)
}

func waitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitSettled polls until the setup is settled (see settled), with the
// primary at index want unless want is -1, and returns the primary's index.
func (s *Sentinel) waitSettled(timeout time.Duration, want int) (int, error) {
	p := -1
	err := waitFor(timeout, func() error {
		var err error
		if p, err = s.settled(); err != nil {
			return err
		}
		if want >= 0 && p != want {
			return fmt.Errorf("primary is %s, want %s", s.nodes[p].Addr(), s.nodes[want].Addr())
		}
		return nil
	})
	return p, err
}

// settled checks that every sentinel names the same data node as primary,
// knows the other as its replica with a working link and nothing wrong with
// it, and knows the other sentinels; and that the data nodes agree: the
// primary says so, the replica replicates it with its link up. That is the
// state a SENTINEL FAILOVER can start from, and the one it ends in.
func (s *Sentinel) settled() (int, error) {
	ctx := context.Background()
	p := -1
	for _, sn := range s.sentinels {
		addr, err := sn.do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster).StringSlice()
		if err != nil {
			return -1, fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
		}
		i := slices.IndexFunc(s.nodes[:], func(n *Server) bool { return len(addr) == 2 && n.Addr() == addr[0]+":"+addr[1] })
		if i < 0 {
			return -1, fmt.Errorf("sentinel %s names %v as primary, not a data node", sn.Addr(), addr)
		}
		if p >= 0 && i != p {
			return -1, fmt.Errorf("sentinels disagree on the primary: %s and %s", s.nodes[p].Addr(), s.nodes[i].Addr())
		}
		p = i

		master, err := sentinelRecords(sn.do(ctx, "SENTINEL", "MASTER", SentinelMaster))
		if err != nil || len(master) != 1 {
			return -1, fmt.Errorf("sentinel %s: SENTINEL MASTER: %v %v", sn.Addr(), master, err)
		}
		if f := master[0]["flags"]; f != "master" {
			return -1, fmt.Errorf("sentinel %s: primary %s flags %s", sn.Addr(), s.nodes[p].Addr(), f)
		}
		if n := master[0]["num-other-sentinels"]; n != strconv.Itoa(len(s.sentinels)-1) {
			return -1, fmt.Errorf("sentinel %s knows %s other sentinels, want %d", sn.Addr(), n, len(s.sentinels)-1)
		}
		replicas, err := sentinelRecords(sn.do(ctx, "SENTINEL", "REPLICAS", SentinelMaster))
		if err != nil {
			return -1, fmt.Errorf("sentinel %s: SENTINEL REPLICAS: %w", sn.Addr(), err)
		}
		r := s.nodes[1-p]
		if len(replicas) != 1 || replicas[0]["name"] != r.Addr() || replicas[0]["flags"] != "slave" ||
			replicas[0]["master-link-status"] != "ok" || replicas[0]["master-port"] != strconv.Itoa(s.nodes[p].port) {
			return -1, fmt.Errorf("sentinel %s sees replicas %v, want %s replicating %s", sn.Addr(), replicas, r.Addr(), s.nodes[p].Addr())
		}
	}
	info, err := s.nodes[p].doString(ctx, "INFO", "replication")
	if err != nil {
		return -1, err
	}
	if role := infoField(info, "role"); role != "master" {
		return -1, fmt.Errorf("%s: role:%s, want master", s.nodes[p].Addr(), role)
	}
	if err := replicaOf(s.nodes[1-p], s.nodes[p]); err != nil {
		return -1, err
	}
	return p, nil
}

// caughtUp waits until replica has applied the replication stream up to the
// primary's offset when it is called.
func caughtUp(replica, primary *Server, timeout time.Duration) error {
	want, err := replOffset(primary, "master_repl_offset")
	if err != nil {
		return err
	}
	return waitFor(timeout, func() error {
		got, err := replOffset(replica, "slave_repl_offset")
		if err != nil {
			return err
		}
		if got < want {
			return fmt.Errorf("replica %s at offset %d, primary %s was at %d", replica.Addr(), got, primary.Addr(), want)
		}
		return nil
	})
}

// replOffset reads one offset field of s's INFO replication.
func replOffset(s *Server, field string) (int64, error) {
	info, err := s.doString(context.Background(), "INFO", "replication")
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(infoField(info, field), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %s: %w", s.Addr(), field, err)
	}
	return n, nil
}

// replicaOf checks that r replicates primary with its link up.
func replicaOf(r, primary *Server) error {
	info, err := r.doString(context.Background(), "INFO", "replication")
	if err != nil {
		return err
	}
	if role, port, link := infoField(info, "role"), infoField(info, "master_port"), infoField(info, "master_link_status"); role != "slave" || port != strconv.Itoa(primary.port) || link != "up" {
		return fmt.Errorf("%s: role:%s master_port:%s master_link_status:%s, want a replica of %s with its link up", r.Addr(), role, port, link, primary.Addr())
	}
	return nil
}

// sentinelRecords parses SENTINEL MASTER (one flat list of field, value) or
// SENTINEL REPLICAS / SENTINELS (a list of them).
func sentinelRecords(cmd *redis.Cmd) ([]map[string]string, error) {
	v, err := cmd.Slice()
	if err != nil {
		return nil, err
	}
	flat := func(list []any) (map[string]string, error) {
		m := map[string]string{}
		for i := 0; i+1 < len(list); i += 2 {
			k, ok1 := list[i].(string)
			val, ok2 := list[i+1].(string)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("unexpected reply %v", list)
			}
			m[k] = val
		}
		return m, nil
	}
	if len(v) > 0 {
		if _, ok := v[0].(string); ok {
			m, err := flat(v)
			return []map[string]string{m}, err
		}
	}
	var out []map[string]string
	for _, e := range v {
		list, ok := e.([]any)
		if !ok {
			return nil, fmt.Errorf("unexpected reply %v", v)
		}
		m, err := flat(list)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}
