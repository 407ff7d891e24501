package redlimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redlimit/redlimit/internal/calendar"
	"github.com/redlimit/redlimit/internal/evalsha"
	"github.com/redlimit/redlimit/internal/requestid"
	"github.com/redlimit/redlimit/internal/wire"
)

// A decision's road, in one direction. decide runs it through the layers,
// each with its own state and each skipped when its option is off:
//
//  1. the handle's lease (lease.go), or the Client's on the limiter while
//     it is hot (hot.go): a block of permits taken earlier;
//  2. the Client's cache of denials (local_cache.go);
//  3. Redis: ask, the one road to the transport (internal/evalsha), with
//     the arguments and reply internal/wire declares;
//  4. degraded mode, shadow mode and fail-open (settle), which may decide
//     what Redis could not, or grant what the layers above did not;
//  5. the observer (tell).
//
// A local change that may free permits sooner than a layer's answer says
// (SetRate, Reset, a release…) reaches every layer through forget.
func (l *Limiter) decide(ctx context.Context, permits int64) (Result, error) {
	c := l.client
	start := time.Now()
	var r Result
	var err error
	served := false
	// A caller that has given up goes to Redis, which tells it so, rather
	// than to a lease or a cached denial.
	local := permits > 0 && l.err == nil && ctx.Err() == nil
	leased := l
	if local && l.lease == nil && c.hot != nil {
		// The Client's lease on the limiter while it is hot here (hot.go).
		leased, err = c.hot.lease(ctx, l)
		served = err != nil
	}
	if local && !served && leased != nil && leased.lease != nil {
		r, err, served = leased.allowLeased(ctx, permits)
	}
	if local && !served && c.denials != nil {
		r, served = c.cachedDenial(l, permits)
	}
	if !served {
		r, _, err = l.ask(ctx, request{op: opAllow, permits: permits})
		if err == nil && c.denials != nil && permits > 0 {
			c.cacheDenial(l, permits, r)
		}
	}
	r, err, open := c.settle(ctx, l, permits, r, err)
	c.tell(l, permits, r, err, start)
	if open {
		return r, nil
	}
	return r, err
}

// settle applies degraded mode, shadow mode and fail-open: degraded mode
// (WithDegraded, degraded.go) decides locally what Redis could not, within
// the instance's share; then settleOpen. open: the request was decided
// without Redis; the error goes to the observer only.
func (c *Client) settle(ctx context.Context, l *Limiter, permits int64, r Result, err error) (_ Result, _ error, open bool) {
	if local, ok := c.degraded.settle(ctx, l, permits, r, err); ok { // a nil c.degraded decides nothing
		return shadowed(local, c.shadow || l.shadow || local.Shadow), err, true
	}
	return c.settleOpen(ctx, l, r, err)
}

// settleOpen applies shadow mode and fail-open: shadow mode (the Client's,
// the handle's or the stored config's) grants what the limit denied, and,
// as WithFailOpen does, what Redis could not decide.
func (c *Client) settleOpen(ctx context.Context, l *Limiter, r Result, err error) (_ Result, _ error, open bool) {
	shadow := c.shadow || l.shadow || r.Shadow
	if c.grantsOpen(ctx, err, shadow) {
		return Result{Allowed: true, Reason: ReasonFailOpen, Shadow: shadow}, err, true
	}
	if err == nil {
		r = shadowed(r, shadow)
	}
	return r, err, false
}

// shadowed is r in shadow mode, when on: granted whatever the limit said.
func shadowed(r Result, on bool) Result {
	if on {
		r.Shadow = true
		if !r.Allowed {
			r.Allowed, r.Reason = true, ReasonShadow
		}
	}
	return r
}

// grantsOpen reports whether a request Redis failed to decide with err is
// granted: with WithFailOpen (or open, for shadow mode), when Redis was
// unavailable. A caller's own cancellation is not an outage: it is never
// granted, even when Redis failed at the moment it cancelled.
func (c *Client) grantsOpen(ctx context.Context, err error, open bool) bool {
	return err != nil && (c.failOpen || open) && errors.Is(err, ErrUnavailable) && !errors.Is(ctx.Err(), context.Canceled)
}

// tell tells the observer of a decision that began at start.
func (c *Client) tell(l *Limiter, permits int64, r Result, err error, start time.Time) {
	if c.observe != nil {
		c.observe(Decision{Limiter: l.name, Algorithm: l.alg.Name, Permits: permits, Result: r, Err: err,
			Latency: time.Since(start)})
	}
}

// forget drops what the layers hold of the limiter, after a local change
// that may free permits sooner than they say: the Client's cached denials,
// a leased handle's own, and the Client's hot leases on the limiter.
func (l *Limiter) forget() {
	if l.client.denials != nil && l.err == nil {
		l.client.denials.Forget(l.denial)
	}
	if l.lease != nil {
		l.lease.ForgetDenial()
	}
	if l.client.hot != nil && l.err == nil {
		l.client.hot.forget(l.denial)
	}
}

// request is one decision request (wire.Op*): what its arguments say
// beyond the handle's own.
type request struct {
	op      any // one of the ops below
	permits int64
	// A reservation: least, the fewest permits it takes; logWindow, how
	// long the request log keeps its id (ms). A release: grantAt and
	// grantSize, the reservation's grant. id names either.
	least, logWindow   int64
	grantAt, grantSize int64
	id                 *requestid.ID
	calendarLearnt     bool
	settling           // a settle's own arguments, and a reservation's timeout (reserve.go)
}

// The ops, boxed once: converting a string to an interface on every call
// would allocate.
var (
	opAllow, opCharge, opReserve, opRelease any = string(wire.OpAllow), string(wire.OpCharge), string(wire.OpReserve), string(wire.OpRelease)
	opSettle                                any = string(wire.OpSettle)

	noArg any = ""
)

// ask runs one decision request in Redis: the one road from every decision
// to the transport. Its keys and arguments are in the positions
// internal/wire declares; it returns the decision read, or, for a
// release, the permits given back as the decision's Remaining.
func (l *Limiter) ask(ctx context.Context, req request) (Result, wire.Decision, error) {
	if l.err != nil {
		return Result{}, wire.Decision{}, l.err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, wire.Decision{}, fmt.Errorf("redlimit: %w", err)
	}
	for {
		pooled := argsPool.Get().(*[]any)
		f := l.frame(req, (*pooled)[:wire.ArgLast])
		reply, err := l.client.transport.Decide(ctx, evalsha.Request{Algorithm: l.algArg, Op: req.op, Keys: f.keys, Args: f.args, Lean: f.lean})
		clear(f.args)
		*pooled = f.args[:0]
		argsPool.Put(pooled)
		if err != nil {
			return Result{}, wire.Decision{}, err
		}
		r, d, again, err := l.answer(ctx, &req, f, reply)
		if !again {
			return r, d, err
		}
	}
}

// framed is one decision request as frame lays it out: its keys, its
// arguments, and the lean script that decides it alone, if any.
type framed struct {
	keys, args []any
	lean       *evalsha.Script
	whole      bool // sent the whole key list
}

// frame lays out req's keys and arguments (into args, ArgLast long),
// in the positions internal/wire declares.
func (l *Limiter) frame(req request, args []any) framed {
	c := l.client
	now := noArg
	if c.now != nil {
		now = c.now().UnixMicro()
	}
	calendarArg := noArg
	if cals := l.calendarsSent(); cals != nil {
		calendarArg = cals.Arg(c.clock())
	}
	reserve, release := req.op == opReserve, req.op == opRelease || req.op == opSettle
	// A request id names the token bucket's record, the request log's
	// entry, and a reservation; only requests that count need one.
	counts := req.permits > 0 && (req.op == opAllow || req.op == opCharge)
	id := noArg
	if req.id != nil {
		id = req.id
	} else if reserve || counts && (l.alg.Records || c.retryWindow > 0) {
		id = requestid.New()
	}
	logWindow := c.retryWindowArg
	if reserve {
		logWindow = req.logWindow
	}
	// Every key and argument costs Redis about as much as a small command:
	// a request sends the trailing ones only when it uses them, and the
	// whole key list (the registry, the request log, this client's state)
	// only when the limiter is known to be PerClient or a log is kept.
	whole := c.retryWindow > 0 || reserve || release || l.family.perClient.Load()
	n := wire.ArgConfig
	switch {
	case req.op == opSettle:
		n = wire.ArgMaxDebt
	case release:
		n = wire.ArgGrantSize
	case reserve && req.timeoutMS > 0:
		n = wire.ArgTimeout
	case reserve:
		n = wire.ArgLeast
	case whole:
		n = wire.ArgClientID
	case id != noArg:
		n = wire.ArgID
	case calendarArg != noArg:
		n = wire.ArgCalendar
	}
	keys := l.keyArgs
	if !whole {
		keys = keys[:l.alg.Registry()-1]
	}
	args[wire.ArgNow-1], args[wire.ArgPermits-1], args[wire.ArgConfig-1], args[wire.ArgCalendar-1] = now, req.permits, l.configArg(), calendarArg
	args[wire.ArgID-1], args[wire.ArgLogWindow-1], args[wire.ArgClientID-1] = id, logWindow, l.clientID
	args[wire.ArgLeast-1], args[wire.ArgGrantAt-1], args[wire.ArgGrantSize-1] = req.least, req.grantAt, req.grantSize
	if reserve || release {
		req.settling.args(args)
	}
	// The common decision alone runs the lean script of its algorithm (a
	// fraction of the decision script's cost), unless the limiter has been
	// found to need more.
	var lean *evalsha.Script
	if n == wire.ArgConfig && req.op == opAllow && l.calendars == nil && len(l.dfltRates) <= 1 && !l.family.full.Load() {
		lean = scripts.Lean[l.alg.Name]
	}
	return framed{keys: keys, args: args[:n], lean: lean, whole: whole}
}

// answer reads the reply to req, sent as f. again: the reply taught the
// limiter's family what the request must carry (the decision script, the
// whole key list, calendar windows), and it is to be sent again.
func (l *Limiter) answer(ctx context.Context, req *request, f framed, reply any) (_ Result, _ wire.Decision, again bool, _ error) {
	switch s, _ := reply.(string); {
	case s == wire.ReplyFullScript && f.lean != nil:
		l.family.full.Store(true)
		return Result{}, wire.Decision{}, true, nil
	case s == wire.ReplyPerClient && !f.whole:
		l.family.perClient.Store(true)
		return Result{}, wire.Decision{}, true, nil
	case strings.HasPrefix(s, wire.ReplyCalendar) && !req.calendarLearnt:
		// The config in force has calendar rates other than those sent: the
		// script names them, and the family sends them from now on.
		cals, ok := calendar.NewSet(s[len(wire.ReplyCalendar):])
		if !ok {
			return Result{}, wire.Decision{}, false, fmt.Errorf("%w: %s: field calendar = %q", ErrCorruptState, l.name, s[len(wire.ReplyCalendar):])
		}
		l.family.calendars.Store(cals)
		req.calendarLearnt = true
		return Result{}, wire.Decision{}, true, nil
	case s == wire.ReplyAdmin:
		// The script refused the config: the admin script says why.
		if _, err := l.admin(ctx, wire.OpDiagnose, noArg, nil); err != nil {
			return Result{}, wire.Decision{}, false, err
		}
		return Result{}, wire.Decision{}, false, unexpected(reply)
	}
	if req.op == opRelease || req.op == opSettle {
		back, ok := reply.(int64)
		if !ok || back < 0 && (req.op != opSettle || back != wire.SettledBefore) || back > req.permits {
			return Result{}, wire.Decision{}, false, unexpected(reply)
		}
		return Result{Remaining: back}, wire.Decision{}, false, nil
	}
	d, ok := wire.ParseDecision(reply, l.dfltRates, req.op == opReserve)
	if !ok || d.Kind == wire.ReplyDefault && l.source != wire.SourceDefault {
		return Result{}, wire.Decision{}, false, unexpected(reply)
	}
	if hashed := d.Kind == wire.ReplyHash; l.stored != nil && hashed != l.family.hashed.Load() {
		l.family.hashed.Store(hashed)
	}
	return resultOf(d), d, false, nil
}

// resultOf is the Result a decision's reply says.
func resultOf(d wire.Decision) Result {
	r := Result{
		Allowed:    d.Allowed,
		Limit:      d.Limit,
		Remaining:  d.Remaining,
		RetryAfter: micros(d.Retry),
		ResetAfter: micros(d.Reset),
		Window:     time.Duration(d.WindowMS) * time.Millisecond,
		Shadow:     d.Shadow,
	}
	if len(d.More) > 0 {
		r.Bound = d.Bound
		r.Quotas = make([]Quota, 1, 1+len(d.More))
		r.Quotas[0] = Quota{Limit: r.Limit, Window: r.Window, ResetAfter: micros(d.Resets[0])}
		for i, m := range d.More {
			limit, window := wire.Quota(m)
			r.Quotas = append(r.Quotas, Quota{Limit: limit, Window: time.Duration(window) * time.Millisecond, ResetAfter: micros(d.Resets[i+1])})
		}
		r.Limit, r.Window = r.Quotas[r.Bound].Limit, r.Quotas[r.Bound].Window
	}
	return r
}

func micros(us int64) time.Duration {
	if us < 0 {
		return Never
	}
	return time.Duration(us) * time.Microsecond
}

// calendarsSent is the calendar rates whose windows a request sends: those
// a script last named for the limiter, else the handle's own config's. A
// handle whose config is in force whatever is stored (Throttle's, SetRate's)
// sends its own.
func (l *Limiter) calendarsSent() *calendar.Set {
	if l.source == wire.SourceFixed || l.source == wire.SourceNew {
		return l.calendars
	}
	if learnt := l.family.calendars.Load(); learnt != nil {
		return learnt
	}
	return l.calendars
}

// argsPool recycles ask's argument slices: the transport copies the
// arguments into its call, so a slice is free again once Decide returns.
var argsPool = sync.Pool{New: func() any { s := make([]any, 0, wire.ArgLast); return &s }}

// admin runs an op of the admin script on the limiter: its whole key list,
// then the state keys of the other clients named.
func (l *Limiter) admin(ctx context.Context, op wire.Op, value any, clients []string) (any, error) {
	if l.err != nil {
		return nil, l.err
	}
	c := l.client
	now := noArg
	if c.now != nil {
		now = c.now().UnixMicro()
	}
	keys := l.keyArgs
	args := make([]any, wire.AdminOthers-1, wire.AdminOthers-1+len(clients))
	args[wire.AdminAlgorithm-1], args[wire.AdminOp-1], args[wire.AdminNow-1] = l.algArg, string(op), now
	args[wire.AdminValue-1], args[wire.AdminConfig-1], args[wire.AdminClientID-1] = value, l.configArg(), l.clientID
	if len(clients) > 0 {
		keys = append([]any(nil), keys...)
		for _, other := range clients {
			for _, k := range l.alg.StateKeys(l.name, other) {
				keys = append(keys, k)
			}
			args = append(args, other)
		}
	}
	return c.run(ctx, scripts.Admin, keys, args)
}

// everyClient runs an admin op that must reach every client's keys. The
// script checks the list against its registry of clients and names any
// missing, so the op is sent again with them (clients appear between calls
// only rarely).
func (l *Limiter) everyClient(ctx context.Context, op wire.Op, value any) (bool, error) {
	var clients []string
	for range 10 {
		reply, err := l.admin(ctx, op, value, clients)
		if err != nil {
			return false, err
		}
		if missing, ok := wire.MissingClients(reply); ok {
			clients = append(clients, missing...)
			continue
		}
		n, ok := reply.(int64)
		if !ok {
			return false, unexpected(reply)
		}
		return n == 1, nil
	}
	return false, fmt.Errorf("redlimit: %s %s: clients kept appearing", op, l.name)
}
