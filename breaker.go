package redlimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// WithBreaker makes the Client fail fast while Redis is down. After failures
// decisions in a row end in ErrUnavailable (a batch's call that fails
// counts each of its decisions), every call ends at once, without
// asking Redis, in ErrUnavailable (wrapping ErrBreakerOpen and the last
// failure) for coolDown. Then one call goes to Redis as a probe while the
// others still fail fast: if Redis answers, calls flow again; if not, another
// coolDown starts. Defaults: failures 5 (when < 1), coolDown 1s (when <= 0).
//
// Without it each call during an outage waits for go-redis to give up (its
// dial and read timeouts, times its retries: seconds with the defaults);
// with it, WithFailOpen grants and failing closed denies in microseconds.
// Any answer from Redis (a grant, a denial, ErrCorruptState,
// ErrMisconfigured...) starts the count again. A call whose context was
// cancelled counts neither way: the caller gave up, not Redis. A context
// deadline passing before Redis answers counts as a failure: a hung Redis
// looks like that.
func WithBreaker(failures int, coolDown time.Duration) Option {
	if failures < 1 {
		failures = 5
	}
	if coolDown <= 0 {
		coolDown = time.Second
	}
	return func(c *Client) { c.breaker = &breaker{failures: int64(failures), coolDown: coolDown, now: time.Now} }
}

// breaker is closed (calls go to Redis), open (calls fail at once until
// until), or probing (open, with one call let through). A closed breaker
// costs a call two atomic loads, and writes only after a failure.
type breaker struct {
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

// enter lets a call go to Redis, or returns the error to answer it with.
func (b *breaker) enter() (pass, error) {
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
func (b *breaker) leave(p pass, err error, decisions int) {
	if b == nil {
		return
	}
	stale := b.recoveries.Load() != p.recoveries // Redis answered someone since this call was sent
	switch {
	case errors.Is(err, context.Canceled) || (stale && errors.Is(err, ErrUnavailable)):
		// Nothing learnt of Redis: the caller gave up, or the failure is older than an answer.
		if p.probe {
			b.mu.Lock()
			b.probing = false
			b.mu.Unlock()
		}
	case errors.Is(err, ErrUnavailable):
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
	cause := strings.TrimPrefix(e.cause.Error(), ErrUnavailable.Error()+": ")
	if e.wait == 0 {
		return fmt.Sprintf("%v, probing Redis; last failure: %s", ErrBreakerOpen, cause)
	}
	return fmt.Sprintf("%v for %v more; last failure: %s", ErrBreakerOpen, e.wait.Round(time.Millisecond), cause)
}

func (e *breakerOpenError) Unwrap() []error { return []error{ErrBreakerOpen, e.cause} }
