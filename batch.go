package redlimit

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Group commit. Most of a decision's cost, in Redis and in the client, is
// the script call around it, not the algorithm: so while a decision's call
// is in flight, the decisions that arrive on the same Client wait for it,
// and then go out together, in one EVALSHA of the batch script
// (scripts/batch.lua), which decides each as it would alone, in the order
// they came, at one time. A lone caller goes out at once, as it always did:
// there is no timer and no added wait. Each caller gets its own reply or
// error, and a caller whose context ends while it waits leaves its batch.
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

// WithoutBatching sends every decision in a call of its own, as soon as its
// caller makes it, instead of batching the decisions that arrive while one
// is in flight.
func WithoutBatching() Option { return func(c *Client) { c.batches.off = true } }

// batchScript decides the requests of a batch, of every algorithm.
var batchScript = newBatchScript(tokenBucket, funnel, fixedWindow, slidingWindow)

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
	script *script
	keys   []any
	args   []any
	queued bool // still in the queue: may leave it
	alone  bool // a batch of one: the caller sends it
	reply  any
	err    error
	wake   chan struct{} // alone or reply set
}

// batch is the requests sent in one call: keys and args are the call's,
// copied from the requests as they were taken from the queue.
type batch struct {
	members    []*pending
	keys, args []any
}

// batchSizes counts the batches sent and the decisions they held, for tests
// and benchmarks to see batches form.
type batchSizes struct {
	calls, decisions atomic.Int64
}

// batches is a Client's batchers: how its requests may share a call.
type batches struct {
	off    bool    // WithoutBatching
	single bool    // one server: every request shares one batcher, all
	all    batcher // single's
	slots  *slots  // a Cluster's: one batcher per hash slot
}

// route sets how requests through rdb may share a call.
func (b *batches) route(rdb redis.Scripter) {
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
		return b.slots.of(clusterSlot(key))
	}
	return nil
}

// decision runs one decision's script call, in a batch when others are in
// flight. Keys and args are copied into a batch as it is taken from the
// queue, so they are the caller's again when decision returns.
func (c *Client) decision(ctx context.Context, s *script, keys, args []any) (reply any, err error) {
	g := c.batches.of(keys)
	if g == nil {
		return c.run(ctx, s, keys, args)
	}
	g.mu.Lock()
	if g.inflight < batchCalls && len(g.queue) == 0 {
		g.inflight++
		g.mu.Unlock()
		return c.alone(ctx, g, s, keys, args)
	}
	p := pendings.Get().(*pending)
	p.ctx, p.script, p.keys, p.args, p.queued = ctx, s, keys, args, true
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
			c.finished(g) // the call it was to make, and now will not
		}
		// Left before its batch was sent: not counted. Taken into one
		// already: it may be counted, as a lone call whose caller left
		// mid-flight may.
		return nil, scriptError(ctx, ctx.Err(), keys)
	}
	// Woken, the caller owns p again, and gives it back.
	alone, reply, err := p.alone, p.reply, p.err
	*p = pending{wake: p.wake}
	pendings.Put(p)
	if alone {
		// A batch of one: its call is the caller's own.
		return c.alone(ctx, g, s, keys, args)
	}
	switch r := reply.(type) {
	case string:
		if r == "admin" {
			// The decision refused the request's config: alone, the
			// script goes on to say why.
			return c.run(ctx, s, keys, args)
		}
	case []any:
		return nil, decisionError(ctx, r, keys)
	}
	return reply, err
}

// pendings recycles the pending of callers woken by their reply: no one
// holds them then. One that left its batch is not recycled, as its batch
// may still answer it.
var pendings = sync.Pool{New: func() any { return &pending{wake: make(chan struct{}, 1)} }}

// alone makes one call of g for the caller's own request.
func (c *Client) alone(ctx context.Context, g *batcher, s *script, keys, args []any) (any, error) {
	reply, err := c.run(ctx, s, keys, args)
	c.finished(g)
	return reply, err
}

func remove(queue []*pending, p *pending) []*pending {
	for i, q := range queue {
		if q == p {
			return append(queue[:i], queue[i+1:]...)
		}
	}
	return queue
}

// finished ends a call of g, and sends the next batches from the queue.
func (c *Client) finished(g *batcher) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	for g.inflight < batchCalls && len(g.queue) > 0 {
		n := min(len(g.queue), batchSize)
		first := g.queue[0]
		b := &batch{
			members: make([]*pending, 0, n),
			keys:    make([]any, 0, n*len(first.keys)),
			args:    make([]any, 0, 2+n*(3+len(first.args))),
		}
		for _, p := range g.queue[:n] {
			p.queued = false
			if p.ctx.Err() != nil {
				// Its caller is leaving: the batch goes without it.
				p.err = scriptError(p.ctx, p.ctx.Err(), p.keys)
				p.wake <- struct{}{}
				continue
			}
			b.members = append(b.members, p)
			b.keys = append(b.keys, p.keys...)
			if len(b.members) == 1 {
				b.args = append(b.args, "batch", noArg)
			}
			b.args = append(b.args, p.script.nameArg, len(p.keys), len(p.args))
			b.args = append(b.args, p.args...)
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
		go c.sendBatch(g, b)
	}
}

// sendBatch runs batch b and hands each member its reply.
func (c *Client) sendBatch(g *batcher, b *batch) {
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
	if c.now != nil {
		b.args[argNow-1] = c.now().UnixMicro() // no TIME: members carry their clocks
	}
	reply, err := c.runDeciding(ctx, len(b.members), batchScript, b.keys, b.args)
	replies, ok := reply.([]any)
	if err == nil && (!ok || len(replies) != len(b.members)) {
		err = unexpected(reply)
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
	c.finished(g)
	for _, p := range b.members {
		p.wake <- struct{}{}
	}
}

// batchMembers is the context key of a batch call's members' contexts.
type batchMembers struct{}

// membersOf returns the contexts of the callers whose decisions the call
// under ctx carries, or nil when it is no batch's.
func membersOf(ctx context.Context) []context.Context {
	members, _ := ctx.Value(batchMembers{}).([]context.Context)
	return members
}

// stats returns how many batches c has sent, and the decisions they held.
func (b *batches) stats() (calls, decisions int64) {
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

// decisionError is the error a batch's decision raised, r: {message}, as
// the same decision sent alone would give it.
func decisionError(ctx context.Context, r []any, keys []any) error {
	msg, ok := "", len(r) == 1
	if ok {
		msg, ok = r[0].(string)
	}
	if !ok {
		return unexpected(r)
	}
	// Redis 6.2 puts the script's line first: "@user_script: 12: -OOM …".
	msg = strings.TrimPrefix(scriptLine.ReplaceAllString(msg, ""), "-")
	return scriptError(ctx, replyError(msg), keys)
}

var scriptLine = regexp.MustCompile(`^@user_script: ?\d+: `)

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

// clusterSlot is the hash slot of key, as Redis Cluster computes it: the
// CRC16 of its hash tag (the first {…} holding anything), else of the key.
func clusterSlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	return int(crc16(key) % clusterSlots)
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
