// Package breakerrun tells an error hook of a run of breaker-open errors
// once: while the breaker is open every request fails at once with
// ErrBreakerOpen, and a hook that logs each would flood the log (140,337
// lines in 3 s, seen). httplimit and grpclimit share it.
package breakerrun

import (
	"errors"
	"sync/atomic"

	"github.com/redlimit/redlimit"
)

// Run tracks whether the latest error a hook was told of is ErrBreakerOpen,
// with nothing else since. Its zero value is ready; it is safe for
// concurrent use.
type Run struct{ open atomic.Bool }

// Tell reports whether the hook should be told of err: any error but a
// breaker-open one that follows another with nothing between.
func (r *Run) Tell(err error) bool {
	if errors.Is(err, redlimit.ErrBreakerOpen) {
		return !r.open.Swap(true)
	}
	r.open.Store(false)
	return true
}

// Decided ends a run: a decision came back, so the breaker closed. A load
// first, so that decisions cost no write to shared memory.
func (r *Run) Decided() {
	if r.open.Load() {
		r.open.Store(false)
	}
}
