package evalsha

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/wire"
)

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
