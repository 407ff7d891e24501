package redlimit

import "github.com/redlimit/redlimit/internal/wire"

// The package's errors, for errors.Is. Each wraps a detail, and the
// backend's errors keep their cause.
var (
	// ErrNotInitialized: no rate is stored for the limiter and its handle has no default.
	ErrNotInitialized = wire.ErrNotInitialized
	// ErrInvalidConfig: a Config outside what the limiters can compute exactly.
	ErrInvalidConfig = wire.ErrInvalidConfig
	// ErrInvalidPermits: a negative number of permits, or a charge whose debt
	// the limiter's state cannot hold exactly (nothing is written then).
	ErrInvalidPermits = wire.ErrInvalidPermits
	// ErrPermitsExceedRate: a request for more permits than the limiter can ever grant at once.
	ErrPermitsExceedRate = wire.ErrPermitsExceedRate
	// ErrInvalidName: an empty limiter name, or one whose braces do not form a Redis Cluster hash tag.
	ErrInvalidName = wire.ErrInvalidName
	// ErrCorruptState: a limiter's key in Redis holds something the scripts did not write.
	ErrCorruptState = wire.ErrCorruptState
	// ErrAlgorithmMismatch: the name's stored config belongs to another algorithm.
	ErrAlgorithmMismatch = wire.ErrAlgorithmMismatch
	// ErrUnsupported: the limiter's algorithm does not offer the call
	// (Charge on a fixed window).
	ErrUnsupported = wire.ErrUnsupported
	// ErrClockSkew: Redis's clock and the client's disagree by more than a
	// calendar quota's window: the windows the client sent (a day, a week or
	// a month around its own clock) do not hold Redis's time. Not an outage:
	// never failed open.
	ErrClockSkew = wire.ErrClockSkew
	// ErrUnexpectedReply: Redis answered with a reply the scripts never send.
	ErrUnexpectedReply = wire.ErrUnexpectedReply
	// ErrUnavailable: Redis could not decide (unreachable, timed out, loading,
	// failing over, out of memory, the caller's deadline passed before it
	// answered...). The error wraps the cause too, and the context's error.
	// A caller that cancelled its context is not an outage: that error wraps
	// context.Canceled, not ErrUnavailable, and WithFailOpen does not grant it.
	ErrUnavailable = wire.ErrUnavailable
	// ErrMisconfigured: Redis refused the call for a reason only its operator
	// can fix (NOPERM, NOAUTH, WRONGPASS, unknown command...). Not an outage:
	// never failed open. The error wraps the refusal.
	ErrMisconfigured = wire.ErrMisconfigured
	// ErrHoldLost: an in-flight Hold expired before its holder released or
	// refreshed it (its refreshes failed for a whole TTL, or came too late),
	// so its slot may have gone to another holder meanwhile.
	ErrHoldLost = wire.ErrHoldLost
	// ErrBreakerOpen: WithBreaker answered without asking Redis. It wraps ErrUnavailable.
	ErrBreakerOpen = wire.ErrBreakerOpen
)

func unexpected(reply any) error { return wire.Unexpected(reply) }
