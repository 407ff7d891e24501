package redlimit

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit/internal/wire"
)

// Want is one limiter's part of an all-or-nothing decision
// (Client.AllowAll): Permits from Limiter.
type Want struct {
	Limiter *Limiter
	Permits int64
}

// AllResult is the outcome of Client.AllowAll.
type AllResult struct {
	// Allowed: every limiter granted its permits, and each counted them.
	// Denied, none counted any.
	Allowed bool
	// RetryAfter is, denied, the longest wait of the limiters that denied
	// (Never when one can never grant so many): the soonest the call can
	// be granted, if nothing else takes permits meanwhile. 0 when allowed.
	RetryAfter time.Duration
	// Results holds each Want's Result, in order: its limiter's own answer,
	// as Allow's would be (its Remaining, RetryAfter, Reason, Shadow…).
	// When the call is denied, a Result with Allowed false is a limiter that
	// denied; one with Allowed true would have granted, but counted nothing,
	// and its Remaining is what it still has.
	Results []Result
}

// maxAllAttempts bounds the calls of one AllowAll: a call whose replies
// teach the limiters what their requests must carry (the whole key list of
// a PerClient limiter, then a calendar's windows) is sent again, each
// lesson once.
const maxAllAttempts = 4

// AllowAll decides several limiters at once, all or nothing: it takes each
// Want's permits only if every limiter grants them, and otherwise takes
// none. Per IP, per user, per API key and a global limit in one call: a
// request one of them denies uses up none of the others.
//
// The limiters may be of any algorithms and configs, with defaults
// (WithDefault), stored configs, several rates or PerClient, each at most
// once (sharing no key with another: ErrInvalidPermits), and all made by
// this Client. They are decided in one script call, atomically: first each
// is checked, counting nothing, then, only if all fit, each is granted,
// exactly as its check said. So every limiter's keys must be on the one
// server that call reaches: through a *redis.Client (or a FailoverClient)
// any names; on a Cluster, names in one hash slot; through anything else
// (a Ring, an AutoPipeliner, a wrapper) names with one hash tag, as
// "{user42}:ip" and "{user42}:user" have. Otherwise it is ErrMisconfigured,
// and nothing is sent.
//
// A denied call writes nothing at all: not even the keep-alive a denied
// Allow refreshes (Config.KeepAlive), so a limiter only ever asked in calls
// others deny is idle. Bad input is refused so too: negative permits
// (ErrInvalidPermits); more permits than a limiter can ever grant
// (ErrPermitsExceedRate, with that limiter's RetryAfter and the call's
// Never, as Allow answers it). Redis does not roll a script back: a write
// it refuses during the grants (out of memory) leaves the limiters granted
// before it counted, and the call fails, which errs toward denying.
//
// What each handle's options do here:
//   - shadow mode (WithShadow, the handle's, or the stored config's): that
//     limiter's denial does not stop the others, and its Result is granted
//     as Allow's would be (Reason ReasonShadow); what it grants it counts
//     when the call is granted;
//   - WithFailOpen: when Redis cannot decide (ErrUnavailable) the call is
//     granted, each Result ReasonFailOpen, as is a call whose limiters are
//     all in shadow mode;
//   - WithLocalCache: a cached denial does not answer the call (it knows
//     nothing of the other limiters); the denials the call meets are cached,
//     for Allow;
//   - a leased handle (WithLease) is decided in Redis, not from its block;
//   - the observer hears each limiter's Result, with the call's error.
//
// Zero permits peek at a limiter, as Allow's do; no Wants at all is a
// granted call that asks nothing.
func (c *Client) AllowAll(ctx context.Context, wants ...Want) (AllResult, error) {
	if err := c.checkAll(wants); err != nil {
		return AllResult{}, err
	}
	if len(wants) == 0 {
		return AllResult{Allowed: true}, nil
	}
	start := time.Now()
	results := make([]Result, len(wants))
	committed, err := c.decideAll(ctx, wants, results)
	all := AllResult{Allowed: committed, Results: results}
	open := err != nil
	for i, w := range wants {
		l := w.Limiter
		r, _, opened := c.settleOpen(ctx, l, results[i], err) // all or nothing: never decided locally (degraded mode)
		results[i], open = r, open && opened
		if err == nil && !committed {
			if c.denials != nil {
				c.cacheDenial(l, w.Permits, r)
			}
			if !r.Allowed && all.RetryAfter != Never && (r.RetryAfter == Never || r.RetryAfter > all.RetryAfter) {
				all.RetryAfter = r.RetryAfter
			}
		}
		c.tell(l, w.Permits, r, err, start)
	}
	switch {
	case open:
		// Every limiter granted it open: the observer has the error.
		return AllResult{Allowed: true, Results: results}, nil
	case err != nil:
		return AllResult{}, err
	}
	for i, r := range results {
		if !committed && !r.Allowed && r.RetryAfter == Never {
			return all, fmt.Errorf("%w: %d permits of %s, limit %d", ErrPermitsExceedRate, wants[i].Permits, wants[i].Limiter.name, r.Limit)
		}
	}
	return all, nil
}

// checkAll refuses, before anything is sent, wants that one call cannot
// decide: a limiter missing, mistaken (its handle's error), another
// Client's, or met twice; negative permits; limiters whose keys the call's
// server may not hold.
func (c *Client) checkAll(wants []Want) error {
	seen := map[string]int{}
	names := make([]string, len(wants))
	for i, w := range wants {
		l := w.Limiter
		switch {
		case l == nil:
			return fmt.Errorf("%w: AllowAll: want %d has no limiter", ErrInvalidName, i)
		case l.err != nil:
			return l.err
		case l.client != c:
			return fmt.Errorf("%w: AllowAll: %s is another Client's limiter: one call decides only its own Client's", ErrMisconfigured, l.name)
		case w.Permits < 0:
			return fmt.Errorf("%w: %d of %s", ErrInvalidPermits, w.Permits, l.name)
		}
		for _, k := range l.keys {
			if j, ok := seen[k]; ok {
				return fmt.Errorf("%w: AllowAll: %s and %s share the key %s: ask each limiter once, for the sum", ErrInvalidPermits,
					wants[j].Limiter.name, l.name, k)
			}
			seen[k] = i
		}
		names[i] = l.name
		if !c.transport.Together(names[:i+1]) {
			return fmt.Errorf("%w: AllowAll: %s and %s cannot be decided in one call: on a Cluster their names need one hash slot, "+
				"through a Ring or a wrapper one hash tag ({tag}name)", ErrMisconfigured, names[0], l.name)
		}
	}
	return nil
}

// decideAll runs the all-or-nothing call (internal/wire's FrameAll) and
// reads each limiter's reply into results. committed: the call granted
// every binding request, and each counted its permits.
func (c *Client) decideAll(ctx context.Context, wants []Want, results []Result) (committed bool, _ error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("redlimit: %w", err)
	}
	reqs := make([]request, len(wants))
	frames := make([]framed, len(wants))
	for i, w := range wants {
		reqs[i] = request{op: opAllow, permits: w.Permits}
	}
	shadow := make([]bool, len(wants))
	for i, w := range wants {
		shadow[i] = c.shadow || w.Limiter.shadow
	}
	for range maxAllAttempts {
		buf := make([]any, len(wants)*wire.ArgLast)
		call := wire.NewAllCall(shadow)
		for i, w := range wants {
			l := w.Limiter
			f := l.frame(reqs[i], buf[i*wire.ArgLast:(i+1)*wire.ArgLast])
			frames[i] = f
			call.Add(l.algArg, opAllow, f.keys, f.args)
		}
		reply, err := c.transport.Run(ctx, scripts.Decide, call.Keys, call.Args)
		if err != nil {
			return false, err
		}
		counted, replies, ok := wire.ParseAll(reply, len(wants))
		if !ok {
			return false, unexpected(reply)
		}
		again := false
		for i, w := range wants {
			r, _, learnt, err := w.Limiter.answer(ctx, &reqs[i], frames[i], replies[i])
			if err != nil {
				return false, err
			}
			results[i], again = r, again || learnt
		}
		if !again {
			return counted, nil
		}
		if counted {
			return false, unexpected(reply) // counted, yet a reply that is no decision
		}
	}
	return false, fmt.Errorf("%w: AllowAll: the limiters kept asking for other requests", ErrUnexpectedReply)
}
