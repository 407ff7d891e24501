package inflight

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redlimit/redlimit/internal/wire"
)

// The in-flight script's ops, boxed once: script arguments.
var (
	OpAcquire, OpRefresh, OpHolders, OpRelease any = string(wire.OpAcquire), string(wire.OpRefresh), string(wire.OpHolders), string(wire.OpHoldRelease)
	OpGet, OpSet, OpTrySet, OpDelete, OpReset  any = string(wire.OpGet), string(wire.OpSet), string(wire.OpTrySet), string(wire.OpDelete), string(wire.OpReset)
)

// Args lays out the in-flight script's arguments in the positions
// internal/wire declares (wire.InFlightOp …).
func Args(op, now, id, config any) []any {
	args := make([]any, wire.InFlightConfig)
	args[wire.InFlightOp-1], args[wire.InFlightNow-1], args[wire.InFlightHold-1], args[wire.InFlightConfig-1] = op, now, id, config
	return args
}

// ConfigArg encodes a config for the script: source, limit, ttl in ms.
func ConfigArg(source wire.Source, limit int64, ttl time.Duration) string {
	return string(source) + " " + strconv.FormatInt(limit, 10) + " " + strconv.FormatInt(ttl.Milliseconds(), 10)
}

// minTTL bounds TTL from below: a hold's lease ends LeaseMargin(TTL)
// before its TTL does, and below 10ms the margin would leave no time for a
// refresh (every TTL/3) to renew it in.
const minTTL = wire.MinTTLMS * time.Millisecond

// Validate reports why limit and ttl cannot be an in-flight config,
// wrapping ErrInvalidConfig (redlimit.InFlight.Validate).
func Validate(limit int64, ttl time.Duration) error {
	invalid := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{wire.ErrInvalidConfig}, a...)...)
	}
	switch {
	case limit < 1 || limit > wire.MaxInFlightLimit:
		return invalid("limit %d is outside 1..%d", limit, wire.MaxInFlightLimit)
	case ttl < time.Millisecond:
		return invalid("ttl %v is below 1ms", ttl)
	case ttl%time.Millisecond != 0:
		return invalid("ttl %v is not a whole number of milliseconds", ttl)
	case ttl < minTTL:
		return invalid("ttl %v is below %v: a hold's lease would leave no time to refresh it in", ttl, minTTL)
	case ttl > maxMS*time.Millisecond:
		return invalid("ttl %v is above %v", ttl, maxMS*time.Millisecond)
	}
	return nil
}
