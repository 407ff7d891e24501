package evalsha

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/wire"
)

// Group commit. Most of a decision's cost, in Redis and in the client, is
// the script call around it, not the algorithm: so while a decision's call
// is in flight, the decisions that arrive on the same Transport wait for
// it, and then go out together, in one EVALSHA of the decision script, which
// decides each as it would alone, in the order they came. A lone caller goes
// out at once: there is no timer and no added wait. Each caller gets its own
// reply or error, and a caller whose context ends while it waits leaves its
// batch.
//
// Only requests whose keys live together can share a call: on a single
// server (Client, FailoverClient) any; on a Cluster, those of one hash slot.
// Other clients (Ring, AutoPipeliner, wrappers) send each decision alone.

// batchCalls is how many script calls of one group may be in flight at
// once: one being decided while the next crosses the network keeps Redis
// busy, and more only split the waiting callers into smaller batches.
const batchCalls = 2

// batchSize bounds the decisions in one call, and so how long one script
// holds Redis (a token bucket's decision is the slowest, tens of µs).
const batchSize = 64

// Request is one decision: its algorithm and op (boxed once by the caller:
// converting a string to an interface on every call would allocate), and
// its keys and arguments as internal/wire lays them out. Lean, if not nil,
// is the lean script of its algorithm, which a request sent alone runs: the
// common decision, which answers wire.ReplyFullScript for anything else.
type Request struct {
	Algorithm, Op any
	Keys, Args    []any
	Lean          *Script
}

// batcher queues the decisions of one group (see batches.of) while its
// calls are in flight.
type batcher struct {
	mu       sync.Mutex
	inflight int
	queue    []*pending
	sizes    batchSizes
}

// pending is one decision waiting for its batch. The batcher's lock guards
// its fields while it is queued; once taken into a batch, the batch's
// sender sets reply and err, and wake hands them to the caller.
type pending struct {
	ctx    context.Context
	req    Request
	queued bool // still in the queue: may leave it
	alone  bool // a batch of one: the caller sends it
	reply  any
	err    error
	wake   chan struct{} // alone or reply set
}

// batchSizes counts the batches sent and the decisions they held, for tests
// and benchmarks to see batches form.
type batchSizes struct {
	calls, decisions atomic.Int64
}

// batches is a Transport's batchers: how its requests may share a call.
type batches struct {
	off    bool    // every decision alone
	single bool    // one server: every request shares one batcher, all
	all    batcher // single's
	slots  *slots  // a Cluster's: one batcher per hash slot
}

// route sets how requests through rdb may share a call.
func (b *batches) route(rdb redis.Scripter, off bool) {
	b.off = off
	switch rdb.(type) {
	case *redis.Client:
		b.single = true
	case *redis.ClusterClient:
		b.slots = new(slots)
	}
}

// of returns the batcher for requests on keys, or nil when they go alone.
func (b *batches) of(keys []any) *batcher {
	switch {
	case b.off:
		return nil
	case b.single:
		return &b.all
	case b.slots != nil:
		key, _ := keys[0].(string)
		return b.slots.of(ClusterSlot(key))
	}
	return nil
}

// Decide runs one decision, in a batch when others are in flight, and
// returns its reply: a decision's (internal/wire), or wire.ReplyAdmin for a
// config the script refused. req's keys and args are copied into a batch
// as it is taken from the queue, so they are the caller's again when Decide
// returns.
func (t *Transport) Decide(ctx context.Context, req Request) (any, error) {
	g := t.batches.of(req.Keys)
	if g == nil {
		return t.alone(ctx, nil, req)
	}
	g.mu.Lock()
	if g.inflight < batchCalls && len(g.queue) == 0 {
		g.inflight++
		g.mu.Unlock()
		return t.alone(ctx, g, req)
	}
	p := pendings.Get().(*pending)
	p.ctx, p.req, p.queued = ctx, req, true
	g.queue = append(g.queue, p)
	g.mu.Unlock()
	select {
	case <-p.wake:
	case <-ctx.Done():
		g.mu.Lock()
		if p.queued {
			g.queue = remove(g.queue, p)
		}
		alone := p.alone
		g.mu.Unlock()
		if alone {
			<-p.wake
			t.finished(g) // the call it was to make, and now will not
		}
		// Left before its batch was sent: not counted. Taken into one
		// already: it may be counted, as a lone call whose caller left
		// mid-flight may.
		return nil, Classify(ctx, ctx.Err(), req.Keys)
	}
	// Woken, the caller owns p again, and gives it back.
	alone, reply, err := p.alone, p.reply, p.err
	*p = pending{wake: p.wake}
	pendings.Put(p)
	if alone {
		// A batch of one: its call is the caller's own.
		return t.alone(ctx, g, req)
	}
	if err != nil {
		return nil, err
	}
	return element(ctx, reply, req.Keys)
}

// pendings recycles the pending of callers woken by their reply: no one
// holds them then. One that left its batch is not recycled, as its batch
// may still answer it.
var pendings = sync.Pool{New: func() any { return &pending{wake: make(chan struct{}, 1)} }}

// alone makes one call (of g, if not nil) for the caller's own request: a
// batch of one, whose reply is the request's own.
func (t *Transport) alone(ctx context.Context, g *batcher, req Request) (any, error) {
	head := [wire.RequestHead]any{req.Algorithm, req.Op, len(req.Keys), len(req.Args)}
	s := t.scripts.Decide
	if req.Lean != nil {
		s = req.Lean
	}
	reply, err := t.run(ctx, 1, s, req.Keys, head[:], req.Args)
	if g != nil {
		t.finished(g)
	}
	return reply, err
}

// element is one request's reply in a call's: {message} is the error its
// decision raised, classed as the same decision sent alone would be.
func element(ctx context.Context, reply any, keys []any) (any, error) {
	r, ok := reply.([]any)
	if !ok {
		return reply, nil
	}
	msg, ok := "", len(r) == 1
	if ok {
		msg, ok = r[0].(string)
	}
	if !ok {
		return nil, wire.Unexpected(r)
	}
	// Redis 6.2 puts the script's line first: "@user_script: 12: -OOM …".
	msg = strings.TrimPrefix(scriptLine.ReplaceAllString(msg, ""), "-")
	return nil, Classify(ctx, ReplyError(msg), keys)
}

var scriptLine = regexp.MustCompile(`^@user_script: ?\d+: `)

func remove(queue []*pending, p *pending) []*pending {
	for i, q := range queue {
		if q == p {
			return append(queue[:i], queue[i+1:]...)
		}
	}
	return queue
}

// batch is the requests sent in one call: keys and args are the call's,
// copied from the requests as they were taken from the queue.
type batch struct {
	members    []*pending
	keys, args []any
}

// finished ends a call of g, and sends the next batches from the queue.
func (t *Transport) finished(g *batcher) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	for g.inflight < batchCalls && len(g.queue) > 0 {
		n := min(len(g.queue), batchSize)
		first := g.queue[0]
		b := &batch{
			members: make([]*pending, 0, n),
			keys:    make([]any, 0, n*len(first.req.Keys)),
			args:    make([]any, 0, n*(wire.RequestHead+len(first.req.Args))),
		}
		for _, p := range g.queue[:n] {
			p.queued = false
			if p.ctx.Err() != nil {
				// Its caller is leaving: the batch goes without it.
				p.err = Classify(p.ctx, p.ctx.Err(), p.req.Keys)
				p.wake <- struct{}{}
				continue
			}
			b.members = append(b.members, p)
			b.keys = append(b.keys, p.req.Keys...)
			b.args = append(b.args, p.req.Algorithm, p.req.Op, len(p.req.Keys), len(p.req.Args))
			b.args = append(b.args, p.req.Args...)
		}
		g.queue = append(g.queue[:0], g.queue[n:]...)
		if len(b.members) == 0 {
			continue
		}
		g.inflight++
		if len(b.members) == 1 {
			p := b.members[0]
			p.alone = true
			p.wake <- struct{}{}
			continue
		}
		// Sent from a goroutine of its own, so that every caller waits
		// for its reply or its context, whichever comes first.
		go t.sendBatch(g, b)
	}
}

// sendBatch runs batch b and hands each member its reply.
func (t *Transport) sendBatch(g *batcher, b *batch) {
	// The call is every member's: one caller leaving does not end it, and
	// it gives up at the last member's deadline. It carries their
	// contexts, for hooks that trace each caller.
	members := make([]context.Context, len(b.members))
	var last time.Time
	bounded := true
	for i, p := range b.members {
		members[i] = p.ctx
		d, ok := p.ctx.Deadline()
		bounded = bounded && ok
		if d.After(last) {
			last = d
		}
	}
	ctx := context.WithValue(context.WithoutCancel(b.members[0].ctx), batchMembers{}, members)
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, last)
		defer cancel()
	}
	reply, err := t.run(ctx, len(b.members), t.scripts.Decide, b.keys, nil, b.args)
	replies, ok := reply.([]any)
	if err == nil && (!ok || len(replies) != len(b.members)) {
		err = wire.Unexpected(reply)
	}
	for i, p := range b.members {
		if err != nil {
			p.err = err
		} else {
			p.reply = replies[i]
		}
	}
	g.sizes.calls.Add(1)
	g.sizes.decisions.Add(int64(len(b.members)))
	t.finished(g)
	for _, p := range b.members {
		p.wake <- struct{}{}
	}
}

// batchMembers is the context key of a batch call's members' contexts.
type batchMembers struct{}

// MembersOf returns the contexts of the callers whose decisions the call
// under ctx carries, or nil when it is no batch's.
func MembersOf(ctx context.Context) []context.Context {
	members, _ := ctx.Value(batchMembers{}).([]context.Context)
	return members
}

// BatchStats returns how many batches t has sent, and the decisions they
// held.
func (t *Transport) BatchStats() (calls, decisions int64) {
	b := &t.batches
	add := func(g *batcher) {
		calls += g.sizes.calls.Load()
		decisions += g.sizes.decisions.Load()
	}
	add(&b.all)
	if b.slots != nil {
		for i := range b.slots {
			if g := b.slots[i].Load(); g != nil {
				add(g)
			}
		}
	}
	return calls, decisions
}

// slots holds a Cluster client's batchers, one per hash slot, made as their
// first request comes.
type slots [clusterSlots]atomic.Pointer[batcher]

const clusterSlots = 16384

func (s *slots) of(slot int) *batcher {
	if g := s[slot].Load(); g != nil {
		return g
	}
	s[slot].CompareAndSwap(nil, new(batcher))
	return s[slot].Load()
}

// Together reports whether one call can carry requests on all of names
// (limiters' keys, each sharing its slot with the rest of its limiter's):
// on a single server (Client, FailoverClient) any; on a Cluster those of
// one hash slot; through anything else (a Ring, an AutoPipeliner, a
// wrapper), whose server it cannot see, those of one hash tag (the whole
// name without one), which every go-redis sharding keeps on one server.
func (t *Transport) Together(names []string) bool {
	same := func(of func(string) any) bool {
		for _, n := range names[min(1, len(names)):] {
			if of(n) != of(names[0]) {
				return false
			}
		}
		return true
	}
	switch t.rdb.(type) {
	case *redis.Client:
		return true
	case *redis.ClusterClient:
		return same(func(n string) any { return ClusterSlot(n) })
	}
	return same(func(n string) any { return hashTag(n) })
}

// ClusterSlot is the hash slot of key, as Redis Cluster computes it: the
// CRC16 of its hash tag (the first {…} holding anything), else of the key.
func ClusterSlot(key string) int {
	return int(crc16(hashTag(key)) % clusterSlots)
}

// hashTag is what Redis Cluster and go-redis's Ring hash of key: its hash
// tag (the first {…} holding anything), else the whole key.
func hashTag(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key[open+1 : open+1+end]
		}
	}
	return key
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021), Redis Cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// BatchCalls is how many calls of one group may be in flight at once, for
// tests that hold them.
const BatchCalls = batchCalls

// Queued returns how many requests on key wait for a batch, for tests that
// line them up.
func (t *Transport) Queued(key string) int {
	g := t.batches.of([]any{key})
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// BatchStatsOf returns how many batches the group of key has sent, and the
// decisions they held.
func (t *Transport) BatchStatsOf(key string) (calls, decisions int64) {
	g := t.batches.of([]any{key})
	if g == nil {
		return 0, 0
	}
	return g.sizes.calls.Load(), g.sizes.decisions.Load()
}
