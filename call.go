package redlimit

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The road from every Limiter method to Redis: a request, its keys and
// arguments in the order scripts/common.lua names them, and the reply.

// decide runs an allow request, through the local cache when there is one,
// and tells the observer.
func (l *Limiter) decide(ctx context.Context, permits int64) (Result, error) {
	c := l.client
	start := time.Now()
	var r Result
	var err error
	cached, leased := false, false
	// A caller that has given up goes to eval, which tells it so, rather
	// than to a cached denial or a lease.
	if l.lease != nil && permits > 0 && l.err == nil && ctx.Err() == nil {
		r, err, leased = l.lease.allow(ctx, l, permits)
	} else if c.denials != nil && permits > 0 && l.err == nil && ctx.Err() == nil {
		r, cached = c.denials.lookup(l.denialKey, permits, c.clock())
	}
	if !cached && !leased {
		var reply any
		if reply, err = l.eval(ctx, request{op: opAllow, permits: permits}); err == nil {
			r, err = parseResult(reply, l.dflt)
		}
		if err == nil && c.denials != nil && permits > 0 {
			c.denials.store(l.denialKey, permits, r, c.clock())
		}
	}
	if cached {
		r.Reason = ReasonCache
	}
	shadow := c.shadow || l.shadow || r.Shadow
	// Shadow mode never denies, so it fails open.
	failOpen := c.grantsOpen(ctx, err, shadow)
	if failOpen {
		r = Result{Allowed: true, Reason: ReasonFailOpen, Shadow: shadow}
	}
	if shadow && err == nil {
		r.Shadow = true
		if !r.Allowed {
			r.Allowed, r.Reason = true, ReasonShadow
		}
	}
	if c.observe != nil {
		c.observe(Decision{Limiter: l.name, Algorithm: l.alg.name, Permits: permits, Result: r, Err: err, Latency: time.Since(start), Cached: cached})
	}
	if failOpen {
		return r, nil
	}
	return r, err
}

// grantsOpen reports whether a request Redis failed to decide with err is
// granted: with WithFailOpen (or open, for shadow mode), when Redis was
// unavailable. A caller's own cancellation is not an outage (scriptError):
// it is never granted, even when Redis failed at the moment it cancelled.
func (c *Client) grantsOpen(ctx context.Context, err error, open bool) bool {
	return err != nil && (c.failOpen || open) && errors.Is(err, ErrUnavailable) && !errors.Is(ctx.Err(), context.Canceled)
}

// forgetDenial drops this Client's cached denial, and a leased handle's
// own, after a local change that may free permits sooner than the denial
// said.
func (l *Limiter) forgetDenial() {
	if l.client.denials != nil && l.err == nil {
		l.client.denials.forget(l.denialKey)
	}
	if s := l.lease; s != nil {
		s.mu.Lock()
		s.deniedUntil = time.Time{}
		s.mu.Unlock()
	}
}

// request is one script call; the config it gives the scripts is its
// handle's (Limiter.source, Limiter.config).
type request struct {
	op      any      // one of the ops below
	permits int64    // allow, release
	ms      int64    // expire: the TTL
	clients []string // other clients whose keys the op must reach
	arg     string   // lease, refund: ARGV[PERMITS] (see scripts/common.lua)
	// id names the request when its caller must know it: a lease's take,
	// which its refund names (nil: one is made where needed); logWindow,
	// when not nil, is the request log's window for it.
	id        *requestID
	logWindow any
	// calendarLearnt: the request is sent again with the calendar rates
	// its script named (calendarReply), and is not sent a third time.
	calendarLearnt bool
}

// The scripts' ops and config sources, boxed once: converting a string to
// an interface on every call would allocate.
var (
	opAllow, opRelease, opGet, opSet, opTrySet    any = "allow", "release", "get", "set", "tryset"
	opReset, opDelete, opExpire, opPersist, opTTL any = "reset", "delete", "expire", "persist", "ttl"
	opClients, opShadow, opCharge                 any = "clients", "shadow", "charge"
	opLease, opRefund                             any = "lease", "refund"

	noArg any = ""
)

// The scripts' arguments, by position (ARGV[i]): declared here once, sent
// in this order by eval, and named so in the scripts by script.go's header.
const (
	argOp        = 1 + iota // allow | release | get | set | …
	argNow                  // µs, or '' for Redis TIME
	argPermits              // permits, or ms for expire
	argConfig               // the handle's config (Config.arg), or ''
	argCalendar             // the calendar rates' windows (calendarSet.arg), or ''
	argID                   // the request id, when it needs one
	argLogWindow            // the request log's window in ms, or ''
	argClientID             // this client's id
	argOthers               // other clients' ids, to the end (admin ops)
)

// Where the config a script is given comes from (ARGV[argConfig]).
const (
	sourceNone    = ""        // the stored one only
	sourceDefault = "default" // WithDefault: the handle's while none is stored
	sourceFixed   = "fixed"   // Throttle's, whatever is stored
	sourceNew     = "new"     // SetRate's, about to be stored
	// sourceDefer is sourceDefault sent by a handle whose last decision met
	// the limiter's hash, so that the script reads that first: see
	// Limiter.stored.
	sourceDefer = "defer"
)

// eval runs the limiter's script once: the one road from every method to
// Redis. Its keys and arguments are in the order scripts/common.lua names.
func (l *Limiter) eval(ctx context.Context, req request) (any, error) {
	if l.err != nil {
		return nil, l.err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redlimit: %w", err)
	}
	c := l.client
	now := noArg
	if c.now != nil {
		now = c.now().UnixMicro()
	}
	// A request ID names the token bucket's record, and the request log's
	// entry; only grants and releases need one.
	id, calendar := noArg, noArg
	if cals := l.calendarsSent(); cals != nil {
		calendar = cals.arg(c.clock())
	}
	counts := (req.op == opAllow || req.op == opCharge || req.op == opLease) && req.permits > 0
	if req.id != nil {
		id = req.id
	} else if req.op == opRelease || counts && (l.alg.records || c.retryWindow > 0) {
		id = newRequestID()
	}
	var n any = req.permits
	if req.op == opExpire {
		n = req.ms
	} else if req.arg != "" {
		n = req.arg
	}
	// Every key and argument costs Redis about as much as a small command: a
	// decision on a limiter not known to be PerClient, with no request log,
	// goes with the config's and the Overall state's keys only, and without
	// the log's window and the client id (argLogWindow, argClientID); one
	// that records no id goes without argID too, and one with no calendar
	// without argCalendar.
	decision := req.op == opAllow || req.op == opRelease || req.op == opCharge
	short := decision && c.retryWindow == 0 && !l.perClient.Load()
	keys := l.keyArgs
	pooled := argsPool.Get().(*[]any)
	config := l.config
	if decision && l.stored != nil && l.stored.Load() {
		config = l.deferConfig
	}
	args := (*pooled)[:argOthers-1]
	args[argOp-1], args[argNow-1], args[argPermits-1], args[argConfig-1] = req.op, now, n, config
	logWindow := c.retryWindowArg
	if req.logWindow != nil {
		logWindow = req.logWindow
	}
	args[argCalendar-1], args[argID-1], args[argLogWindow-1], args[argClientID-1] = calendar, id, logWindow, l.clientID
	if short {
		keys = keys[:l.alg.registry()-1]
		switch {
		case id != noArg:
			args = args[:argID]
		case calendar != noArg:
			args = args[:argCalendar]
		default:
			args = args[:argConfig]
		}
	}
	if len(req.clients) > 0 {
		keys = slices.Clone(keys)
		for _, other := range req.clients {
			for _, k := range l.stateKeys(other) {
				keys = append(keys, k)
			}
			args = append(args, other)
		}
	}
	var reply any
	var err error
	if decision {
		reply, err = c.decision(ctx, l.alg.script, keys, args)
	} else {
		reply, err = c.run(ctx, l.alg.script, keys, args)
	}
	clear(args)
	*pooled = args[:0]
	argsPool.Put(pooled)
	if short && reply == perClientReply {
		l.perClient.Store(true)
		return l.eval(ctx, req)
	}
	if s, ok := reply.(string); ok && strings.HasPrefix(s, calendarReply) && !req.calendarLearnt && l.family != nil {
		// The config in force has calendar rates other than those sent: the
		// script names them, and the family sends them from now on.
		cals, ok := newCalendarSet(s[len(calendarReply):])
		if !ok {
			return nil, fmt.Errorf("%w: %s: field calendar = %q", ErrCorruptState, l.name, s[len(calendarReply):])
		}
		l.family.calendars.Store(cals)
		req.calendarLearnt = true
		return l.eval(ctx, req)
	}
	if s, ok := reply.(string); ok && decision && l.stored != nil {
		// The reply's kind says whether a hash was found (replyHash).
		if stored := strings.HasPrefix(s, replyHash+" "); stored != l.stored.Load() {
			l.stored.Store(stored)
		}
	}
	return reply, err
}

// requestID is a request's id: 16 hex digits in one allocation, where a
// string would take two (its bytes, and its box as an argument). go-redis
// writes it through MarshalBinary.
type requestID [16]byte

func newRequestID() *requestID {
	id := new(requestID)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	hex.Encode(id[:], b[:])
	return id
}

func (id *requestID) MarshalBinary() ([]byte, error) { return id[:], nil }

// perClientReply is a decision's reply when it was sent the short key list
// but the limiter is PerClient (scripts/common.lua).
const perClientReply = "perclient"

// calendarReply begins a reply that asks for the calendar rates' windows:
// the config in force has calendar rates (what follows, Config.calendars)
// that the request sent no windows for (ARGV[argCalendar]).
const calendarReply = "calendar "

// calendarsSent is the calendar rates whose windows a request sends: those
// a script last named for the limiter, else the handle's own config's. A
// handle whose config is in force whatever is stored (Throttle's, SetRate's)
// sends its own.
func (l *Limiter) calendarsSent() *calendarSet {
	if l.source == sourceFixed || l.source == sourceNew || l.family == nil {
		return l.calendars
	}
	if learnt := l.family.calendars.Load(); learnt != nil {
		return learnt
	}
	return l.calendars
}

// argsPool recycles eval's argument slices: go-redis copies the arguments
// into its command, so a slice is free again once the call returns.
var argsPool = sync.Pool{New: func() any { s := make([]any, 0, 16); return &s }}

// everyClient runs an op that must reach every client's keys. The script
// checks the list against its registry of clients and names any missing, so
// the op is sent again with them (clients appear between calls only rarely).
func (l *Limiter) everyClient(ctx context.Context, req request) (bool, error) {
	for range 10 {
		reply, err := l.eval(ctx, req)
		if err != nil {
			return false, err
		}
		if missing, ok := missingClients(reply); ok {
			req.clients = append(req.clients, missing...)
			continue
		}
		n, ok := reply.(int64)
		if !ok {
			return false, unexpected(reply)
		}
		return n == 1, nil
	}
	return false, fmt.Errorf("redlimit: %v %s: clients kept appearing", req.op, l.name)
}

func missingClients(reply any) ([]string, bool) {
	v, ok := reply.([]any)
	if !ok || len(v) != 2 || v[0] != "missing" {
		return nil, false
	}
	ids, ok := v[1].([]any)
	if !ok {
		return nil, false
	}
	missing := make([]string, 0, len(ids))
	for _, id := range ids {
		s, ok := id.(string)
		if !ok {
			return nil, false
		}
		missing = append(missing, s)
	}
	return missing, true
}

// A decision's reply (scripts/common.lua): its kind, then integers, in one
// string, so that the client reads one value, not many. The fields are
// declared here once: script.go writes the scripts' replies from these
// lists, and parseResult reads them by the same positions.
const (
	// replyHash: a hash held the limiter's config or state. The fields are
	// all of hashReply, the bound and the further rates only with several
	// rates.
	replyHash = "h"
	// replyDefault: the handle's default decided and no hash holds the
	// state, so the client knows every limit and window: the fields are
	// defaultReply's. It also tells the handle that its next decision
	// finds no hash (Limiter.stored).
	replyDefault = "d"
)

// The fields of a reply, by position in hashReply.
const (
	replyAllowed   = iota // 0 or 1
	replyLimit            // the most one request may take, of the bound rate
	replyRemaining        // what is left of every rate's, the least
	replyRetry            // µs until a denied request fits; -1: never
	replyReset            // µs until every rate is full again
	replyWindow           // ms: the span the first rate's limit applies to
	replyShadow           // 1: the stored config is in shadow mode (Limiter.SetShadow)
	replyBound            // several rates: the rate that bound the answer
	replyMore             // several rates: the further ones as the hash's more holds them, four fields each
)

// hashReply names, for each field, the Lua local the decision writes, up
// to the bound; the further rates follow as the config's more string.
var hashReply = [...]string{
	replyAllowed: "allowed", replyLimit: "limit", replyRemaining: "remaining",
	replyRetry: "retry", replyReset: "reset", replyWindow: "window", replyShadow: "shadow", replyBound: "bound",
}

// defaultReply is a default reply's fields, as positions in hashReply: the
// bound comes only with several rates.
var defaultReply = [...]int{replyAllowed, replyRemaining, replyRetry, replyReset, replyBound}

// parseResult reads a decision's reply (see replyHash). A default reply is
// completed from dflt, the handle's default, as the hash reply of the same
// decision would be, and then both are read alike.
func parseResult(reply any, dflt Config) (Result, error) {
	s, _ := reply.(string)
	kind, s, _ := strings.Cut(s, " ")
	var n [replyMore + 4*(maxRates-1)]int64
	fields := 0
	switch kind {
	case replyHash:
		fields = 1 + strings.Count(s, " ")
		if fields != replyBound && (fields < replyMore+4 || fields > len(n) || (fields-replyMore)%4 != 0) || !spaced(s, n[:fields]) {
			return Result{}, unexpected(reply)
		}
	case replyDefault:
		if dflt.Rate < 1 {
			return Result{}, unexpected(reply)
		}
		at := defaultReply[:len(defaultReply)-1]
		if len(dflt.More) > 0 {
			at = defaultReply[:]
		}
		var d [len(defaultReply)]int64
		if 1+strings.Count(s, " ") != len(at) || !spaced(s, d[:len(at)]) {
			return Result{}, unexpected(reply)
		}
		for i, field := range at {
			n[field] = d[i]
		}
		q := quota(dflt.Rate, dflt.Interval.Milliseconds(), dflt.Burst)
		n[replyLimit], n[replyWindow] = q.Limit, q.Window.Milliseconds()
		fields = replyBound
		if len(dflt.More) > 0 {
			fields = replyMore
			for _, o := range dflt.More {
				n[fields], n[fields+1], n[fields+2] = o.Rate, o.Interval.Milliseconds(), o.Burst
				fields += 4
			}
		}
	default:
		return Result{}, unexpected(reply)
	}
	if !durations(n[replyRetry:replyReset+1]) || n[replyWindow] < 0 || n[replyWindow] > math.MaxInt64/int64(time.Millisecond) ||
		n[replyShadow] != 0 && n[replyShadow] != 1 {
		return Result{}, unexpected(reply)
	}
	r := Result{
		Allowed:    n[replyAllowed] == 1,
		Limit:      n[replyLimit],
		Remaining:  n[replyRemaining],
		RetryAfter: micros(n[replyRetry]),
		ResetAfter: micros(n[replyReset]),
		Window:     time.Duration(n[replyWindow]) * time.Millisecond,
		Shadow:     n[replyShadow] == 1,
	}
	if fields > replyBound {
		r.Bound = int(n[replyBound])
		r.Quotas = make([]Quota, 1, 1+(fields-replyMore)/4)
		r.Quotas[0] = Quota{Limit: r.Limit, Window: r.Window}
		for i := replyMore; i < fields; i += 4 {
			rate, interval, burst := n[i], n[i+1], n[i+2]
			if rate < 1 || interval < 1 || burst < 0 {
				return Result{}, unexpected(reply)
			}
			r.Quotas = append(r.Quotas, quota(rate, interval, burst))
		}
		if r.Bound < 0 || r.Bound >= len(r.Quotas) {
			return Result{}, unexpected(reply)
		}
		r.Limit, r.Window = r.Quotas[r.Bound].Limit, r.Quotas[r.Bound].Window
	}
	return r, nil
}

// quota is a rate's Limit and Window as the scripts report them: the most
// one request may take (a funnel's burst; the rate when it has none, the
// other algorithms always) and the span it applies to, computed in doubles
// as scripts/common.lua does.
func quota(rate, intervalMS, burst int64) Quota {
	limit := rate
	if burst > 0 {
		limit = burst
	}
	window := math.Ceil(float64(limit) * float64(intervalMS) / float64(rate))
	return Quota{Limit: limit, Window: time.Duration(window) * time.Millisecond}
}

// spaced parses s as exactly len(n) integers separated by single spaces.
func spaced(s string, n []int64) bool {
	for i := range n {
		field := s
		if i < len(n)-1 {
			at := strings.IndexByte(s, ' ')
			if at < 0 {
				return false
			}
			field, s = s[:at], s[at+1:]
		}
		x, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return false
		}
		n[i] = x
	}
	return true
}

// integers copies v into n, reporting whether every element was an integer.
func integers(v []any, n []int64) bool {
	for i := range n {
		x, ok := v[i].(int64)
		if !ok {
			return false
		}
		n[i] = x
	}
	return true
}

// durations reports whether each of us is a wait in µs that a Duration
// holds, or negative (Never): the scripts send nothing else.
func durations(us []int64) bool {
	for _, x := range us {
		if x > math.MaxInt64/int64(time.Microsecond) {
			return false
		}
	}
	return true
}

func micros(us int64) time.Duration {
	if us < 0 {
		return Never
	}
	return time.Duration(us) * time.Microsecond
}

func unexpected(reply any) error {
	return fmt.Errorf("%w: %T %v", ErrUnexpectedReply, reply, reply)
}
