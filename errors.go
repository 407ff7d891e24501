package redlimit

import (
	"errors"
	"fmt"
)

// The package's errors, for errors.Is. Each wraps a detail, and the
// backend's errors keep their cause.
var (
	// ErrNotInitialized: no rate is stored for the limiter and its handle has no default.
	ErrNotInitialized = errors.New("redlimit: rate not set")
	// ErrInvalidConfig: a Config outside what the limiters can compute exactly.
	ErrInvalidConfig = errors.New("redlimit: invalid config")
	// ErrInvalidPermits: a negative number of permits.
	ErrInvalidPermits = errors.New("redlimit: invalid permits")
	// ErrPermitsExceedRate: a request for more permits than the limiter can ever grant at once.
	ErrPermitsExceedRate = errors.New("redlimit: permits exceed the limit")
	// ErrInvalidName: an empty limiter name, or one whose braces do not form a Redis Cluster hash tag.
	ErrInvalidName = errors.New("redlimit: invalid limiter name")
	// ErrCorruptState: a limiter's key in Redis holds something the scripts did not write.
	ErrCorruptState = errors.New("redlimit: corrupt state")
	// ErrAlgorithmMismatch: the name's stored config belongs to another algorithm.
	ErrAlgorithmMismatch = errors.New("redlimit: limiter holds another algorithm")
	// ErrUnsupported: the limiter's algorithm does not offer the call
	// (Charge on a fixed window).
	ErrUnsupported = errors.New("redlimit: not supported by the algorithm")
	// ErrClockSkew: Redis's clock and the client's disagree by more than a
	// calendar quota's window: the windows the client sent (a day, a week or
	// a month around its own clock) do not hold Redis's time. Not an outage:
	// never failed open.
	ErrClockSkew = errors.New("redlimit: clocks disagree")
	// ErrUnexpectedReply: Redis answered with a reply the scripts never send.
	ErrUnexpectedReply = errors.New("redlimit: unexpected reply")
	// ErrUnavailable: Redis could not decide (unreachable, timed out, loading,
	// failing over, out of memory, the caller's deadline passed before it
	// answered...). The error wraps the cause too, and the context's error.
	// A caller that cancelled its context is not an outage: that error wraps
	// context.Canceled, not ErrUnavailable, and WithFailOpen does not grant it.
	ErrUnavailable = errors.New("redlimit: redis unavailable")
	// ErrMisconfigured: Redis refused the call for a reason only its operator
	// can fix (NOPERM, NOAUTH, WRONGPASS, unknown command...). Not an outage:
	// never failed open. The error wraps the refusal.
	ErrMisconfigured = errors.New("redlimit: redis misconfigured")
	// ErrHoldLost: an in-flight Hold expired before its holder released or
	// refreshed it (its refreshes failed for a whole TTL, or came too late),
	// so its slot may have gone to another holder meanwhile.
	ErrHoldLost = errors.New("redlimit: hold lost")
	// ErrBreakerOpen: WithBreaker answered without asking Redis. It wraps ErrUnavailable.
	ErrBreakerOpen = fmt.Errorf("%w: breaker open", ErrUnavailable)
)
