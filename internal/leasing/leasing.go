// Package leasing serves a leased handle's decisions from blocks of
// permits (the package redlimit's Limiter.WithLease, whose Lease says what
// bound it keeps): a block is taken in one script call, a reservation
// counted in Redis like any grant, and granted from in memory until it
// runs out or its time passes; then what it did not use goes back, and the
// next is sized to the recent demand. A take may outlive its caller, and a
// Close may come while one is in flight: whatever a take counted in Redis
// is used or given back.
//
// The answers are R, the package redlimit's Result, which this package
// only carries: Answer says how a request was answered, and the handle
// makes the Result.
package leasing

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/requestid"
)

// Config is how a lease takes its blocks: the package redlimit's Lease.
type Config struct {
	Time  time.Duration // the longest a block is used
	Max   int64         // caps a block; 0: only Share does
	Share float64       // caps a block at this fraction of the limit, above 0
}

// Redis is how a lease takes and gives back its blocks.
type Redis[R any] interface {
	// Take reserves want permits, or as few as least, under id.
	Take(ctx context.Context, want, least int64, id *requestid.ID) (Taken[R], error)
	// Refund releases what b holds of its take's reservation, and returns
	// how many permits Redis took back.
	Refund(ctx context.Context, b Block) (int64, error)
}

// Taken is Redis's answer to a take.
type Taken[R any] struct {
	Answer     R
	Limit      int64         // the smallest Limit of its rates: what caps a block
	RetryAfter time.Duration // denied: the wait
	At         int64         // the grant, µs on Redis's clock
	Permits    int64         // taken: 0 when denied
	EndsUS     int64         // µs until the first window its permits count in ends; 0 for none
}

// Block is one take's permits.
type Block struct {
	Held  int64         // left to grant
	Size  int64         // taken
	At    int64         // the grant, µs on Redis's clock: what a refund names
	ID    *requestid.ID // the take's, which its refund names
	used  int64         // granted from it
	from  time.Time     // sent, on the Client's clock
	until time.Time     // not used from then: from + Time, or its window's end
	timer *time.Timer
}

// Stats counts what a lease did: the package redlimit's LeaseStats.
type Stats struct {
	Calls    int64
	Taken    int64
	Used     int64
	Returned int64
}

// Kind is how a lease answered a request.
type Kind int

const (
	Unserved   Kind = iota // not at all: the request goes to Redis, unleased
	FromBlock              // granted from the block
	Denied                 // denied as the latest take was, until its retry
	Took                   // granted by the take it made, from its block
	TookDenied             // denied by the take it made
)

// Answer is how a lease answered a request: Last is Redis's answer to the
// latest take (this request's own, for Took and TookDenied), sent Since
// ago; Held is what the block holds after it.
type Answer[R any] struct {
	Kind  Kind
	Last  R
	Held  int64
	Since time.Duration
}

// Lease is a leased handle's block and what it knows of the limiter.
type Lease[R any] struct {
	cfg   Config
	redis Redis[R]
	// now is a controlled clock (WithClock's), or nil for the real one. On
	// a controlled clock no timer gives a block back (a request or Close
	// does), and a block replaced is given back before the request goes
	// on: a run is then the same every time.
	now func() time.Time

	mu     sync.Mutex
	closed bool
	block  Block
	// last is Redis's answer to the latest take, sent at lastAt, whose
	// smallest limit is lastLimit; after a denied take, requests of
	// deniedAsking permits or more are denied here until deniedUntil: the
	// retry, or Time if sooner.
	last         R
	lastLimit    int64
	lastAt       time.Time
	deniedUntil  time.Time
	deniedAsking int64
	// taking is the take in flight, nil when none is; closers, how many
	// Close calls wait for it, to give its block back themselves.
	taking  *taking[R]
	closers int

	calls, taken, used, returned atomic.Int64
}

// New returns a lease that takes its blocks through redis, on the clock
// now (nil: the real one).
func New[R any](cfg Config, redis Redis[R], now func() time.Time) *Lease[R] {
	return &Lease[R]{cfg: cfg, redis: redis, now: now}
}

func (s *Lease[R]) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// Stats reports what the lease did.
func (s *Lease[R]) Stats() Stats {
	return Stats{Calls: s.calls.Load(), Taken: s.taken.Load(), Used: s.used.Load(), Returned: s.returned.Load()}
}

// Holding reports what the block holds unused, and the most a block takes.
func (s *Lease[R]) Holding() (held, most int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.block.Held, s.most(1)
}

// Close gives back what the block holds unused, and makes the lease serve
// nothing from then on. A take in flight is waited for, until ctx ends, and
// its block given back too.
func (s *Lease[R]) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for s.taking != nil {
		// A take in flight: its block goes back here, once it returns.
		t := s.taking
		s.closers++
		s.mu.Unlock()
		var err error
		select {
		case <-t.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.mu.Lock()
		s.closers--
		if err != nil {
			if s.taking == nil && s.closers == 0 {
				go s.refund(context.Background(), s.drop()) // it returned as Close gave up
			}
			s.mu.Unlock()
			return fmt.Errorf("redlimit: %w", err)
		}
	}
	b := s.drop()
	s.mu.Unlock()
	return s.refund(ctx, b)
}

// drop takes the block out, for a refund. The lock is held.
func (s *Lease[R]) drop() Block {
	b := s.block
	if b.timer != nil {
		b.timer.Stop()
	}
	s.block = Block{Size: b.Size, used: b.used, from: b.from, until: b.until}
	return b
}

// Allow decides permits from the block, or takes a new one; served is
// false when the request must go to Redis as an unleased one would.
func (s *Lease[R]) Allow(ctx context.Context, permits int64) (a Answer[R], err error, served bool) {
	for {
		s.mu.Lock()
		if s.closed || permits > s.most(permits) {
			s.mu.Unlock()
			return Answer[R]{}, nil, false
		}
		now := s.clock()
		b := &s.block
		if b.Held >= permits && now.Before(b.until) {
			b.Held -= permits
			b.used += permits
			a = Answer[R]{Kind: FromBlock, Last: s.last, Held: b.Held, Since: now.Sub(s.lastAt)}
			s.mu.Unlock()
			s.used.Add(permits)
			return a, nil, true
		}
		if now.Before(s.deniedUntil) && permits >= s.deniedAsking && b.Held < permits {
			a = Answer[R]{Kind: Denied, Last: s.last, Held: b.Held, Since: now.Sub(s.lastAt)}
			s.mu.Unlock()
			return a, nil, true
		}
		if s.taking != nil {
			wait := s.taking.done
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return Answer[R]{}, fmt.Errorf("redlimit: %w", ctx.Err()), true
			}
		}
		want := s.want(now, permits)
		old := s.drop()
		t := &taking[R]{done: make(chan struct{})}
		s.taking = t
		s.mu.Unlock()
		if old.Held > 0 && s.now != nil {
			// On a controlled clock, in order: a run is then the same every
			// time.
			_ = s.refund(ctx, old)
		} else if old.Held > 0 {
			go s.refund(context.Background(), old)
		}
		return s.await(ctx, t, permits, want)
	}
}

// taking is a take in flight, and what it answers its caller.
type taking[R any] struct {
	done chan struct{} // closed when the take has returned
	left bool          // its caller left first: the block keeps the caller's permits
	a    Answer[R]
	err  error
}

// await runs take t for its caller, who may leave before it returns: Redis
// may have counted it by then, so it runs on, up to the caller's deadline
// or 5 s from now if later, and its block (the caller's permits too) is
// kept, to be used or given back.
func (s *Lease[R]) await(ctx context.Context, t *taking[R], permits, want int64) (Answer[R], error, bool) {
	tctx, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
	if d, ok := ctx.Deadline(); ok {
		tctx, cancel = context.WithDeadline(tctx, later(d, time.Now().Add(callTimeout)))
	}
	go func() {
		s.take(tctx, t, permits, want)
		cancel()
	}()
	select {
	case <-t.done:
		return t.a, t.err, true
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-t.done: // returned meanwhile: its answer stands
		return t.a, t.err, true
	default:
		t.left = true
		return Answer[R]{}, fmt.Errorf("redlimit: %w", ctx.Err()), true
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// callTimeout bounds a take whose caller left and a refund whose caller
// set no deadline.
const callTimeout = 5 * time.Second

// most is the largest block: Max, and Share of the limit as Redis last
// said it (before any take, the request's own permits).
func (s *Lease[R]) most(permits int64) int64 { return s.mostOf(s.lastLimit, permits) }

// mostOf is most, by limit.
func (s *Lease[R]) mostOf(limit, permits int64) int64 {
	if limit <= 0 {
		return permits
	}
	most := max(1, int64(float64(limit)*s.cfg.Share))
	if s.cfg.Max > 0 {
		most = min(most, s.cfg.Max)
	}
	return most
}

// want sizes the next block: what the last one served, scaled to a whole
// lease time, twice over (and at least twice its size when it ran out
// early) for room to grow, since what is not used goes back. Never fewer
// than permits or more than most. The lock is held.
func (s *Lease[R]) want(now time.Time, permits int64) int64 {
	b := s.block
	n := permits
	if b.Size > 0 {
		lived := max(now.Sub(b.from), time.Millisecond)
		pace := float64(b.used) * float64(s.cfg.Time) / float64(lived)
		switch {
		case now.Before(b.until):
			n = max(n, int64(2*pace), 2*b.Size) // it ran out early
		default:
			n = max(n, int64(2*pace))
		}
	}
	return min(n, max(permits, s.most(permits)))
}

// take asks Redis for want permits, or as few as permits, and grants the
// caller's permits from them, unless the caller left: t's answer. A take is
// a reservation of want, or as few as fit if permits or more: its id stays
// in the request log for as long as a refund may come, and the refund
// names it.
func (s *Lease[R]) take(ctx context.Context, t *taking[R], permits, want int64) {
	from := s.clock()
	id := requestid.New()
	tk, err := s.redis.Take(ctx, want, permits, id)
	s.calls.Add(1)
	// over: a block above the cap of the limits it was taken under (a rate
	// lowered since the last take, which sized it), given back at once.
	var over Block
	defer func() {
		if over.Held > 0 {
			_ = s.refund(ctx, over)
		}
		close(t.done)
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.taking = nil
	if err != nil {
		t.err = err
		return
	}
	s.last, s.lastLimit, s.lastAt = tk.Answer, tk.Limit, from
	s.deniedUntil = time.Time{}
	if tk.Permits == 0 {
		if tk.RetryAfter > 0 {
			// Denied locally until the retry, but for no longer than a
			// block lives: a rate raised elsewhere reaches the handle
			// within Time (its own SetRate, Reset and Release forget the
			// denial at once: ForgetDenial).
			s.deniedUntil, s.deniedAsking = from.Add(min(tk.RetryAfter, s.cfg.Time)), permits
		}
		t.a = Answer[R]{Kind: TookDenied, Last: tk.Answer, Held: s.block.Held}
		return
	}
	used := permits
	if t.left {
		used = 0 // the caller's permits stay in the block
	}
	s.taken.Add(tk.Permits)
	s.used.Add(used)
	// A block is never used past the first of the windows its permits
	// count in to end (a fixed window's: its permits are its window's).
	until := from.Add(s.cfg.Time)
	if end := from.Add(time.Duration(tk.EndsUS) * time.Microsecond); tk.EndsUS > 0 && end.Before(until) {
		until = end
	}
	s.block = Block{Held: tk.Permits - used, Size: tk.Permits, used: used, At: tk.At, ID: id, from: from, until: until}
	if tk.Permits > max(permits, s.mostOf(tk.Limit, permits)) {
		over = s.drop()
	} else if s.closed {
		// Closed while the take was in flight: what it took beyond the
		// request goes back, by the Close waiting for it, or at once.
		if s.closers == 0 {
			go s.refund(context.Background(), s.drop())
		}
	} else if s.block.Held > 0 && s.now == nil {
		// Given back when its time is up, if no request does it sooner (on
		// a controlled clock, a request or Close does).
		at := tk.At
		s.block.timer = time.AfterFunc(until.Sub(from), func() { s.expire(at, id) })
	}
	t.a = Answer[R]{Kind: Took, Last: tk.Answer, Held: s.block.Held}
}

// expire gives back the block its take (at, id) made, if it is still the one held.
func (s *Lease[R]) expire(at int64, id *requestid.ID) {
	s.mu.Lock()
	if s.block.At != at || s.block.ID != id || s.block.Held == 0 {
		s.mu.Unlock()
		return
	}
	b := s.drop()
	s.mu.Unlock()
	s.refund(context.Background(), b)
}

// refund gives back what b holds unused: the release of its take's
// reservation. Redis takes back only what is still counted of b's grant, so
// a refund however late never frees more than b's own permits would have.
// It does so once, while its take's id is in the request log: not after a
// Reset, a Delete or new rates, when the state the grant was counted in is
// gone or counts otherwise.
func (s *Lease[R]) refund(ctx context.Context, b Block) error {
	if b.Held <= 0 {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeout)
		defer cancel()
	}
	back, err := s.redis.Refund(ctx, b)
	s.calls.Add(1)
	if err != nil {
		return err
	}
	s.returned.Add(back)
	return nil
}

// ForgetDenial ends the local denial (see deniedUntil), after a local
// change that may free permits sooner than it says.
func (s *Lease[R]) ForgetDenial() {
	s.mu.Lock()
	s.deniedUntil = time.Time{}
	s.mu.Unlock()
}
