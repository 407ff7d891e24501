package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	clusterNodes   = 6 // three primaries, one replica each
	clusterSlots   = 16384
	clusterTimeout = 30 * time.Second // create, failover or slot move to settle
	createTimeout  = 60 * time.Second // redis-cli --cluster create
	migrateBatch   = 100

	// clusterNodeTimeout bounds how stale gossip gets: a node pings every
	// other node at least every half of it, and Failover and MoveSlot wait
	// until every node has heard of the change. A node that does not answer
	// for this long (DEBUG SLEEP) is declared failed and its replica takes
	// over.
	clusterNodeTimeout = 3 * time.Second
)

// Cluster is a local Redis Cluster of three primaries with one replica each.
// Its node timeout is 3 s: a node blocked longer than that (DEBUG SLEEP 3)
// is declared failed and its replica takes over.
type Cluster struct {
	nodes []*Server
	// mu serialises topology changes (Failover, MoveSlot), which must start
	// from a settled cluster.
	mu sync.Mutex
}

// StartCluster starts a cluster for this test only; it is stopped in
// t.Cleanup. It skips like Start, and also needs redis-cli.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	needBinaries(t, "redis-server", "redis-cli")
	return startForTest(t, "cluster", startCluster, func(c *Cluster) string { return fmt.Sprintf("cluster %v", c.Addrs()) })
}

// SharedCluster returns the cluster shared by all tests of this test binary,
// starting it on first use; it is stopped by Main. Tests that change the
// topology (Failover, MoveSlot) should use StartCluster instead.
func SharedCluster(t testing.TB) *Cluster {
	t.Helper()
	needBinaries(t, "redis-server", "redis-cli")
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedCluster != nil {
		return sharedCluster
	}
	dir, err := sharedTempDir("redistest-cluster-")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	c, err := startCluster(dir)
	if err != nil {
		t.Fatalf("redistest: starting shared cluster: %v", err)
	}
	sharedCluster = c
	return c
}

// Addrs returns the "127.0.0.1:port" of every node, primaries and replicas.
func (c *Cluster) Addrs() []string { return addrsOf(c.nodes) }

func addrsOf(servers []*Server) []string {
	addrs := make([]string, len(servers))
	for i, n := range servers {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a go-redis cluster client with default options seeded with
// all nodes, closed in t.Cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// SlotOwner returns the address of the primary that owns slot, once all nodes
// agree on it.
func (c *Cluster) SlotOwner(t testing.TB, slot int) string {
	t.Helper()
	checkSlot(t, slot)
	topo, err := c.waitSettled(clusterTimeout, nil)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c.nodes[topo.index[topo.owner[slot]]].Addr()
}

// Failover promotes a replica of the primary that owns slot with CLUSTER
// FAILOVER (the coordinated kind: no writes are lost) and waits until every
// node agrees the replica is the new owner.
func (c *Cluster) Failover(t testing.TB, slot int) {
	t.Helper()
	checkSlot(t, slot)
	c.mu.Lock()
	defer c.mu.Unlock()

	topo, err := c.waitSettled(clusterTimeout, nil)
	if err != nil {
		t.Fatalf("redistest: failover of slot %d: %v", slot, err)
	}
	oldID := topo.owner[slot]
	newID := topo.replicasOf(oldID)[0] // waitSettled guarantees one
	replica := c.nodes[topo.index[newID]]

	ctx := context.Background()
	deadline := time.Now().Add(clusterTimeout)
	for {
		if _, err := replica.doString(ctx, "CLUSTER", "FAILOVER"); err != nil {
			t.Fatalf("redistest: failover of slot %d: %v", slot, err)
		}
		// The primary aborts a manual failover after 5 s if the replica
		// cannot catch up, and then nothing happens: re-issue it.
		wait := min(10*time.Second, time.Until(deadline))
		_, err = c.waitSettled(wait, func(tp *topology) error {
			if tp.owner[slot] != newID {
				return fmt.Errorf("slot %d still owned by %s, want %s (%s)", slot, tp.owner[slot], newID, replica.Addr())
			}
			return nil
		})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: failover of slot %d from %s to %s (%s) did not complete in %v: %v",
				slot, oldID, newID, replica.Addr(), clusterTimeout, err)
		}
	}
}

// MoveSlot migrates slot and its keys from its owner to another primary, the
// way redis-cli --cluster reshard does: SETSLOT IMPORTING/MIGRATING, MIGRATE
// in batches, then SETSLOT NODE on every primary. Clients see ASK during the
// move and MOVED after it.
func (c *Cluster) MoveSlot(t testing.TB, slot int) {
	t.Helper()
	checkSlot(t, slot)
	c.mu.Lock()
	defer c.mu.Unlock()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("redistest: moving slot %d: "+format, append([]any{slot}, args...)...)
	}

	topo, err := c.waitSettled(clusterTimeout, nil)
	if err != nil {
		fail("%v", err)
	}
	srcID := topo.owner[slot]
	primaries := topo.primaries()
	var dstID string
	for _, id := range primaries {
		if id != srcID {
			dstID = id
			break
		}
	}
	src, dst := c.nodes[topo.index[srcID]], c.nodes[topo.index[dstID]]

	ctx := context.Background()
	steps := []struct {
		n    *Server
		args []any
	}{
		// Importing first, so that a client sent over by an ASK from the
		// source is never refused by the destination.
		{dst, []any{"CLUSTER", "SETSLOT", slot, "IMPORTING", srcID}},
		{src, []any{"CLUSTER", "SETSLOT", slot, "MIGRATING", dstID}},
	}
	for _, st := range steps {
		if _, err := st.n.doString(ctx, st.args...); err != nil {
			fail("%v", err)
		}
	}

	deadline := time.Now().Add(clusterTimeout)
	moved := 0
	for {
		keys, err := src.do(ctx, "CLUSTER", "GETKEYSINSLOT", slot, migrateBatch).StringSlice()
		if err != nil {
			fail("GETKEYSINSLOT on %s: %v", src.Addr(), err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			fail("still migrating keys after %v (%d moved)", clusterTimeout, moved)
		}
		args := []any{"MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		// NOKEY only means the keys expired or were deleted meanwhile.
		if _, err := src.doString(ctx, args...); err != nil {
			fail("%v", err)
		}
		moved += len(keys)
	}

	// Destination first, then source (so the source stops redirecting with
	// ASK only once the destination owns the slot), then the rest.
	order := []string{dstID, srcID}
	for _, id := range primaries {
		if id != dstID && id != srcID {
			order = append(order, id)
		}
	}
	for _, id := range order {
		if _, err := c.nodes[topo.index[id]].doString(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID); err != nil {
			fail("%v", err)
		}
	}

	if _, err := c.waitSettled(clusterTimeout, func(tp *topology) error {
		if tp.owner[slot] != dstID {
			return fmt.Errorf("slot %d owned by %s, want %s", slot, tp.owner[slot], dstID)
		}
		return nil
	}); err != nil {
		fail("%d keys moved from %s to %s but the cluster did not settle: %v", moved, src.Addr(), dst.Addr(), err)
	}
}

func checkSlot(t testing.TB, slot int) {
	t.Helper()
	if slot < 0 || slot >= clusterSlots {
		t.Fatalf("redistest: slot %d out of range [0, %d)", slot, clusterSlots)
	}
}

func startCluster(dir string) (_ *Cluster, err error) {
	c := &Cluster{}
	defer func() {
		if err != nil {
			_ = c.stop()
		}
	}()
	c.nodes, err = startNodes(dir, "node", clusterNodes, func(dir string) (*Server, error) { return startServer(dir, true) })
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, indent(string(out)))
	}

	if _, err := c.waitSettled(clusterTimeout, nil); err != nil {
		return nil, fmt.Errorf("after redis-cli --cluster create: %w\nredis-cli output:\n%s", err, indent(string(out)))
	}
	return c, nil
}

func (c *Cluster) stop() error { return killAll(c.nodes) }

// topology is the cluster as every node agrees it is.
type topology struct {
	owner    [clusterSlots]string // slot -> primary node ID
	index    map[string]int       // node ID -> index in Cluster.nodes
	masterOf map[string]string    // replica ID -> its primary's ID, as the replica says
}

// primaries returns the IDs of the primaries owning slots, in node order so
// that the choice of a destination is deterministic.
func (tp *topology) primaries() []string {
	var ids []string
	for id := range tp.index {
		if _, ok := tp.masterOf[id]; !ok && slices.Contains(tp.owner[:], id) {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b string) int { return tp.index[a] - tp.index[b] })
	return ids
}

func (tp *topology) replicasOf(primaryID string) []string {
	var ids []string
	for r, m := range tp.masterOf {
		if m == primaryID {
			ids = append(ids, r)
		}
	}
	slices.SortFunc(ids, func(a, b string) int { return tp.index[a] - tp.index[b] })
	return ids
}

// waitSettled polls until the cluster is settled (see settled) and cond, if
// not nil, holds.
func (c *Cluster) waitSettled(timeout time.Duration, cond func(*topology) error) (*topology, error) {
	deadline := time.Now().Add(timeout)
	for {
		tp, err := c.settled()
		if err == nil && cond != nil {
			err = cond(tp)
		}
		if err == nil {
			return tp, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("cluster not settled after %v: %w", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settled checks that every node reports cluster_state:ok with all slots
// served, knows every other node and none as failing, that all nodes agree on
// slot owners and replicas, and that every slot-owning primary has a replica whose
// replication link is up (so a Failover can be coordinated).
func (c *Cluster) settled() (*topology, error) {
	ctx := context.Background()
	tp := &topology{index: map[string]int{}, masterOf: map[string]string{}}
	var refLayout string
	var ref *Server
	var firstView []clusterNode
	for i, n := range c.nodes {
		info, err := n.doString(ctx, "CLUSTER", "INFO")
		if err != nil {
			return nil, err
		}
		if st := infoField(info, "cluster_state"); st != "ok" {
			return nil, fmt.Errorf("%s: cluster_state:%s", n.Addr(), st)
		}
		if ok := infoField(info, "cluster_slots_ok"); ok != strconv.Itoa(clusterSlots) {
			return nil, fmt.Errorf("%s: cluster_slots_ok:%s", n.Addr(), ok)
		}

		text, err := n.doString(ctx, "CLUSTER", "NODES")
		if err != nil {
			return nil, err
		}
		view := parseClusterNodes(text)
		if len(view) != len(c.nodes) {
			return nil, fmt.Errorf("%s knows %d nodes, want %d", n.Addr(), len(view), len(c.nodes))
		}
		for _, e := range view {
			for _, bad := range []string{"fail", "fail?", "handshake", "noaddr"} {
				if slices.Contains(e.flags, bad) {
					return nil, fmt.Errorf("%s sees %s (%s) as %s", n.Addr(), e.id, e.addr, strings.Join(e.flags, ","))
				}
			}
			if slices.Contains(e.flags, "myself") {
				tp.index[e.id] = i
				if slices.Contains(e.flags, "slave") {
					tp.masterOf[e.id] = e.master
				}
			}
		}
		layout := layoutString(view)
		if i == 0 {
			refLayout, ref, firstView = layout, n, view
		} else if layout != refLayout {
			return nil, fmt.Errorf("%s and %s disagree on the cluster layout:\n\t%s\n\t%s", ref.Addr(), n.Addr(), refLayout, layout)
		}

		if _, replica := tp.masterOf[selfID(view)]; replica {
			repl, err := n.doString(ctx, "INFO", "replication")
			if err != nil {
				return nil, err
			}
			if st := infoField(repl, "master_link_status"); st != "up" {
				return nil, fmt.Errorf("replica %s: master_link_status:%s", n.Addr(), st)
			}
		}
	}

	for _, e := range firstView {
		for _, r := range e.slots {
			for s := r[0]; s <= r[1]; s++ {
				tp.owner[s] = e.id
			}
		}
	}
	for _, id := range tp.primaries() {
		if len(tp.replicasOf(id)) == 0 {
			return nil, fmt.Errorf("primary %s has no replica", id)
		}
	}
	return tp, nil
}

// selfID returns the ID of the node whose view this is.
func selfID(view []clusterNode) string {
	for _, e := range view {
		if slices.Contains(e.flags, "myself") {
			return e.id
		}
	}
	return ""
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id     string
	addr   string
	flags  []string
	master string   // primary's ID for a replica, "-" for a primary
	slots  [][2]int // ranges owned; migrating/importing markers are dropped
}

// parseClusterNodes parses
// "<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...".
func parseClusterNodes(text string) []clusterNode {
	var nodes []clusterNode
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := clusterNode{id: f[0], addr: addr, flags: strings.Split(f[2], ","), master: f[3]}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				continue // "[slot->-id]" / "[slot-<-id]": a migration in progress
			}
			lo, hi, isRange := strings.Cut(s, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// layoutString renders who owns which slots and who replicates whom,
// comparable across views. Roles matter as well as slots: a primary ignores a
// manual failover request from a replica it does not yet know as its own.
func layoutString(view []clusterNode) string {
	var parts []string
	for _, e := range view {
		for _, r := range e.slots {
			parts = append(parts, fmt.Sprintf("%05d-%05d:%s", r[0], r[1], e.id))
		}
		if e.master != "-" {
			parts = append(parts, "replica:"+e.id+">"+e.master)
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// KeySlot returns the cluster hash slot of key (CRC16 of the key, or of its
// {hash tag}, modulo 16384), as CLUSTER KEYSLOT would.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16 // CRC16-CCITT (XMODEM)
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// HashTagForSlot returns a hash tag such as "{123}" whose keys ("{123}:a",
// "{123}:b", ...) all live in slot. It panics if slot is out of range.
func HashTagForSlot(slot int) string {
	// Decimal tags below 110k already cover every slot.
	for i := range 1 << 20 {
		tag := strconv.Itoa(i)
		if KeySlot(tag) == slot {
			return "{" + tag + "}"
		}
	}
	panic(fmt.Sprintf("redistest: no hash tag for slot %d", slot))
}
