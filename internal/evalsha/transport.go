package evalsha

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit/internal/wire"
)

// Transport runs scripts on one go-redis client.
type Transport struct {
	rdb     redis.Scripter
	scripts Scripts
	loads   sync.Map // *Script → *scriptLoad, see reload
	breaker *Breaker // nil: none
	batches batches
}

// Options are how a Transport sends.
type Options struct {
	Breaker *Breaker // fail fast while Redis is down; nil for none
	NoBatch bool     // every decision in a call of its own
}

// NewTransport makes a Transport running scripts on rdb.
func NewTransport(rdb redis.Scripter, scripts Scripts, opts Options) *Transport {
	t := &Transport{rdb: rdb, scripts: scripts, breaker: opts.Breaker}
	t.batches.route(rdb, opts.NoBatch)
	return t
}

// Run runs s once on keys and args: an op that is no decision (the admin
// and in-flight scripts). With a breaker, the breaker may answer instead,
// and learns from the outcome.
func (t *Transport) Run(ctx context.Context, s *Script, keys, args []any) (any, error) {
	return t.run(ctx, 1, s, keys, nil, args)
}

// run is Run for a call that holds decisions requests: the breaker counts
// each. head goes before args: a lone decision's request head.
func (t *Transport) run(ctx context.Context, decisions int, s *Script, keys, head, args []any) (any, error) {
	if err := ctx.Err(); err != nil {
		// Not sent: the breaker learns nothing. A deadline that passed
		// while the call waited for its batch is an outage, as one that
		// passes while Redis does not answer.
		return nil, Classify(ctx, err, keys)
	}
	pass, err := t.breaker.enter()
	if err != nil {
		return nil, err
	}
	reply, err := t.evalSha(ctx, s, keys, head, args)
	t.breaker.leave(pass, err, decisions)
	return reply, err
}

// evalSha runs s with EVALSHA. A server without it (restarted, failed over,
// SCRIPT FLUSH, a new Cluster node: the script cache is neither persisted nor
// replicated) answers NOSCRIPT; evalSha then has it loaded (reload) and tries
// again. With several servers (Cluster shards, Ring) caches empty at
// different moments, so a retry can meet NOSCRIPT again, from a server that
// lost the script after the load it waited for: each such answer gets a load
// of its own, up to maxScriptRuns EVALSHAs in all.
func (t *Transport) evalSha(ctx context.Context, s *Script, keys, head, args []any) (any, error) {
	sent := time.Now()
	reply, err := t.send(ctx, s, keys, head, args)
	for runs := 1; isNoScript(err) && runs < maxScriptRuns; runs++ {
		answered := time.Now()
		if err := t.reload(ctx, s, sent, answered, runs > 1); err != nil {
			return nil, fmt.Errorf("%w (loading script %s)", Classify(ctx, err, keys), s.Name)
		}
		sent = time.Now()
		reply, err = t.send(ctx, s, keys, head, args)
	}
	if err != nil {
		return nil, s.namingCommand(err, Classify(ctx, err, keys))
	}
	return reply, nil
}

// send sends one EVALSHA of s. go-redis's EvalSha boxes the sha and every
// key on each call, an allocation each; a limiter's keys and the sha are
// boxed once, so send builds the command itself when the client can process
// one (every go-redis client can: Client, ClusterClient, Ring,
// AutoPipeliner), routed by its first key as EvalSha routes it.
func (t *Transport) send(ctx context.Context, s *Script, keys, head, args []any) (any, error) {
	p, ok := t.rdb.(interface {
		Process(context.Context, redis.Cmder) error
	})
	if !ok {
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = k.(string)
		}
		return t.rdb.EvalSha(ctx, s.SHA, names, append(append([]any(nil), head...), args...)...).Result()
	}
	cmdArgs := make([]any, 0, 3+len(keys)+len(head)+len(args))
	cmdArgs = append(append(append(append(cmdArgs, "evalsha", s.shaArg, len(keys)), keys...), head...), args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	cmd.SetFirstKeyPos(3)
	_ = p.Process(ctx, cmd)
	return cmd.Result()
}

// maxScriptRuns bounds the EVALSHAs of one call. Every NOSCRIPT after the
// first means a server emptied its cache again after a load sent for this
// call: a call still meeting NOSCRIPT after this many ends with ErrUnavailable.
const maxScriptRuns = 5

// reload loads s once for all the callers that met NOSCRIPT together. The
// caller's EVALSHA was sent at sent and answered NOSCRIPT at answered.
//
// On a first NOSCRIPT, a load that completed after sent is taken as the cure:
// the EVALSHA may have reached the server before that load did, and this is
// what keeps it to one SCRIPT LOAD per flush for any number of callers. That
// guess is wrong when the server lost the script again after the load reached
// it (another flush, a restart, a failover): the retry then meets NOSCRIPT
// and comes back with again set. Then only a load begun after answered
// counts, as it reaches every server after whatever emptied this one.
func (t *Transport) reload(ctx context.Context, s *Script, sent, answered time.Time, again bool) error {
	v, _ := t.loads.LoadOrStore(s, &scriptLoad{})
	l := v.(*scriptLoad)
	l.mu.Lock()
	defer l.mu.Unlock()
	if (!again && l.done.After(sent)) || (again && l.began.After(answered)) {
		return nil
	}
	began := time.Now()
	if err := s.load(ctx, t.rdb); err != nil {
		return err
	}
	l.began, l.done = began, time.Now()
	return nil
}

type scriptLoad struct {
	mu          sync.Mutex
	began, done time.Time // the last load that succeeded: when it was sent, when every server had answered
}

// load sends SCRIPT LOAD. ClusterClient sends it to every shard itself; a Ring
// sends it to one, so each shard gets its own.
func (s *Script) load(ctx context.Context, rdb redis.Scripter) error {
	if ring, ok := rdb.(*redis.Ring); ok {
		return ring.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
			return shard.ScriptLoad(ctx, s.Source).Err()
		})
	}
	return rdb.ScriptLoad(ctx, s.Source).Err()
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

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

// NewBreaker returns a breaker (see redlimit.WithBreaker): after failures
// decisions in a row end in wire.ErrUnavailable, every call fails at once for
// coolDown, then one probe goes to Redis.
func NewBreaker(failures int, coolDown time.Duration) *Breaker {
	return &Breaker{failures: int64(failures), coolDown: coolDown, now: time.Now}
}

// Breaker is closed (calls go to Redis), open (calls fail at once until
// until), or probing (open, with one call let through). A closed breaker
// costs a call two atomic loads, and writes only after a failure.
type Breaker struct {
	failures int64
	coolDown time.Duration
	now      func() time.Time

	failed atomic.Int64 // consecutive failures while closed
	open   atomic.Bool
	// recoveries counts the answers that ended a run of failures or closed
	// the breaker. A failure counts only if none came while its call was
	// out: calls sent to a dead server can fail long after it is back (go-redis
	// retries), and must not open the breaker again.
	recoveries atomic.Int64

	mu      sync.Mutex // guards the rest, and open's changes
	until   time.Time  // end of the cool-down
	probing bool       // the probe is out
	cause   error      // the failure that opened it, or that the last probe met
}

// pass is a call's way through the breaker.
type pass struct {
	probe      bool
	recoveries int64 // when the call was sent
}

// Probe reports whether the call is the breaker's probe.
func (p pass) Probe() bool { return p.probe }

// Enter and Leave are enter and leave, for tests that step the breaker.
func (b *Breaker) Enter() (pass, error)                   { return b.enter() }
func (b *Breaker) Leave(p pass, err error, decisions int) { b.leave(p, err, decisions) }

// SetClock makes the breaker read now, for tests on a controlled clock.
func (b *Breaker) SetClock(now func() time.Time) { b.now = now }

// OpenFor is how long the breaker said err's call must wait for its next
// probe, or false when err is no refusal of an open breaker.
func OpenFor(err error) (time.Duration, bool) {
	var open *breakerOpenError
	if !errors.As(err, &open) {
		return 0, false
	}
	return open.wait, true
}

// enter lets a call go to Redis, or returns the error to answer it with.
func (b *Breaker) enter() (pass, error) {
	if b == nil {
		return pass{}, nil
	}
	p := pass{recoveries: b.recoveries.Load()}
	if !b.open.Load() {
		return p, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open.Load() {
		return p, nil
	}
	now := b.now()
	if b.probing || now.Before(b.until) {
		return p, &breakerOpenError{wait: max(0, b.until.Sub(now)), cause: b.cause}
	}
	b.probing, p.probe = true, true
	return p, nil
}

// leave records the outcome of a call that went to Redis, deciding
// decisions requests (a batch's, or one).
func (b *Breaker) leave(p pass, err error, decisions int) {
	if b == nil {
		return
	}
	stale := b.recoveries.Load() != p.recoveries // Redis answered someone since this call was sent
	switch {
	case errors.Is(err, context.Canceled) || (stale && errors.Is(err, wire.ErrUnavailable)):
		// Nothing learnt of Redis: the caller gave up, or the failure is older than an answer.
		if p.probe {
			b.mu.Lock()
			b.probing = false
			b.mu.Unlock()
		}
	case errors.Is(err, wire.ErrUnavailable):
		if p.probe {
			b.mu.Lock()
			b.until, b.probing, b.cause = b.now().Add(b.coolDown), false, err
			b.mu.Unlock()
			return
		}
		if b.failed.Add(int64(decisions)) >= b.failures && !b.open.Load() {
			b.mu.Lock()
			if !b.open.Load() {
				b.until, b.cause = b.now().Add(b.coolDown), err
				b.open.Store(true)
			}
			b.mu.Unlock()
		}
	default: // Redis answered
		if b.failed.Load() == 0 && !b.open.Load() {
			return
		}
		b.mu.Lock()
		b.recoveries.Add(1)
		b.failed.Store(0)
		b.open.Store(false)
		b.probing, b.cause = false, nil
		b.mu.Unlock()
	}
}

// breakerOpenError is what a call gets while the breaker is open.
type breakerOpenError struct {
	wait  time.Duration // until the next probe; 0 while one is out
	cause error
}

func (e *breakerOpenError) Error() string {
	cause := strings.TrimPrefix(e.cause.Error(), wire.ErrUnavailable.Error()+": ")
	if e.wait == 0 {
		return fmt.Sprintf("%v, probing Redis; last failure: %s", wire.ErrBreakerOpen, cause)
	}
	return fmt.Sprintf("%v for %v more; last failure: %s", wire.ErrBreakerOpen, e.wait.Round(time.Millisecond), cause)
}

func (e *breakerOpenError) Unwrap() []error { return []error{wire.ErrBreakerOpen, e.cause} }
