package redistest

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// HeldDecision is a go-redis hook that holds each EVALSHA until the
// context of the call that sent it ends, so that a test can have its client
// leave (close the connection, cancel the call) while the decision is in
// flight. The middlewares must then neither run the handler nor report an
// outage, and that must hold on both sides of the race: whether Redis had
// already answered or the call never got that far. Every other command
// passes through untouched.
//
// Each held EVALSHA sends once on Arrived, which has room for one: a test
// sends one request at a time and receives before the next.
type HeldDecision struct {
	ran     bool
	arrived chan struct{}
}

// NewHeldDecision returns a HeldDecision. ran: the script runs first, and
// its answer (a grant) comes back after the client left; otherwise the call
// ends with the context's error, as go-redis's does when it gives up waiting
// for a connection of its pool.
func NewHeldDecision(ran bool) *HeldDecision {
	return &HeldDecision{ran: ran, arrived: make(chan struct{}, 1)}
}

// Arrived receives once for each EVALSHA the hook holds, once it holds it.
func (h *HeldDecision) Arrived() <-chan struct{} { return h.arrived }

// DialHook passes dials through.
func (h *HeldDecision) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook passes pipelines through: a decision is one EVALSHA.
func (h *HeldDecision) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// ProcessHook holds each EVALSHA until its context ends.
func (h *HeldDecision) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "evalsha" {
			return next(ctx, cmd)
		}
		var err error
		if h.ran {
			err = next(ctx, cmd)
		}
		h.arrived <- struct{}{}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			// The context never ended: the test's own wait for the
			// request's end fails; this only lets the call go.
		}
		if !h.ran {
			err = ctx.Err()
			cmd.SetErr(err)
		}
		return err
	}
}
