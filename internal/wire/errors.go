package wire

import (
	"errors"
	"fmt"
)

// The errors of the package redlimit, for errors.Is: declared here, where
// the scripts' errors and the transport's classes are, and exported again
// there with their documentation.
var (
	ErrNotInitialized    = errors.New("redlimit: rate not set")
	ErrInvalidConfig     = errors.New("redlimit: invalid config")
	ErrInvalidPermits    = errors.New("redlimit: invalid permits")
	ErrPermitsExceedRate = errors.New("redlimit: permits exceed the limit")
	ErrInvalidName       = errors.New("redlimit: invalid limiter name")
	ErrCorruptState      = errors.New("redlimit: corrupt state")
	ErrAlgorithmMismatch = errors.New("redlimit: limiter holds another algorithm")
	ErrUnsupported       = errors.New("redlimit: not supported by the algorithm")
	ErrClockSkew         = errors.New("redlimit: clocks disagree")
	ErrUnexpectedReply   = errors.New("redlimit: unexpected reply")
	ErrUnavailable       = errors.New("redlimit: redis unavailable")
	ErrMisconfigured     = errors.New("redlimit: redis misconfigured")
	ErrHoldLost          = errors.New("redlimit: hold lost")
	ErrBreakerOpen       = fmt.Errorf("%w: breaker open", ErrUnavailable)
)

// A script raises its own errors as "REDLIMIT <kind> <detail>" (Lua's fail),
// each kind one sentinel's.
const (
	ErrorPrefix = "REDLIMIT "
	// KindNotInitialized: "not initialized <key>": ErrNotInitialized.
	KindNotInitialized = "not initialized"
	// KindAlgorithm: "algorithm <key> holds a <name> config, not <name>":
	// ErrAlgorithmMismatch.
	KindAlgorithm = "algorithm"
	// KindClock: "clock at <ms> is outside the calendar windows …": ErrClockSkew.
	KindClock = "clock"
	// KindPermits: "permits <n>: <why>", a request the state cannot hold
	// exactly: ErrInvalidPermits, with nothing written.
	KindPermits = "permits"
	// KindCorrupt: "corrupt <key>: <what>", where what may be an error of
	// Redis met on that key: ErrCorruptState, unless Redis's error says
	// otherwise.
	KindCorrupt = "corrupt"
)

// Unexpected is ErrUnexpectedReply for reply.
func Unexpected(reply any) error {
	return fmt.Errorf("%w: %T %v", ErrUnexpectedReply, reply, reply)
}
