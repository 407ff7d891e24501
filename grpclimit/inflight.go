package grpclimit

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
)

// releaseTimeout bounds the release after a handler: it runs on a context
// of its own, as the call's has ended by then.
const releaseTimeout = 5 * time.Second

// UnaryServerInFlight holds a slot of an in-flight limit
// (redlimit.InFlight) while each unary call's handler runs, and releases it
// when the handler returns, panics included: at most Limit calls of a key
// are being served at once, across every instance. key names the caller
// (KeyFunc, escaped by redlimit.KeyPart as the rate interceptors escape it)
// and limitFor returns the limit it counts against:
//
//	exports := client.InFlight("exports").WithDefault(redlimit.InFlightConfig{Limit: 10, TTL: 30 * time.Second})
//	limitFor := func(method, key string) *redlimit.InFlight {
//		if method == pb.Reports_Export_FullMethodName {
//			return exports
//		}
//		return nil // unlimited
//	}
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInFlight(limitFor)))
//
// A full limit fails the call with codes.ResourceExhausted, at once or
// after waiting up to WithMaxWait for a slot; it carries no RetryInfo, as a
// slot comes free when a handler returns, which nothing predicts. A nil
// *redlimit.InFlight leaves the call unlimited. The options are the rate
// interceptors', where they apply (WithKey, WithFailOpen, WithErrorHook,
// WithLimitedGRPCServices), and WithMaxWait; errors map as theirs do. A
// release that fails, or finds the hold lost (redlimit.ErrHoldLost: the
// handler outlived its hold, refreshes failing), is told to the error hook.
func UnaryServerInFlight(limitFor func(method, key string) *redlimit.InFlight, opts ...Option) grpc.UnaryServerInterceptor {
	o := newOptions(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		hold, err := o.hold(ctx, info.FullMethod, limitFor)
		if err != nil {
			return nil, err
		}
		defer o.release(ctx, info.FullMethod, hold)
		return handler(ctx, req)
	}
}

// StreamServerInFlight is UnaryServerInFlight for streams: a slot is held
// for the stream's whole life.
func StreamServerInFlight(limitFor func(method, key string) *redlimit.InFlight, opts ...Option) grpc.StreamServerInterceptor {
	o := newOptions(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		hold, err := o.hold(ss.Context(), info.FullMethod, limitFor)
		if err != nil {
			return err
		}
		defer o.release(ss.Context(), info.FullMethod, hold)
		return handler(srv, ss)
	}
}

// hold takes a call's slot. A nil error lets the call through, with the
// Hold to release after it (nil when unlimited, or failed open); any other
// is the status to end it with.
func (o *options) hold(ctx context.Context, method string, limitFor func(method, key string) *redlimit.InFlight) (*redlimit.Hold, error) {
	if !o.limitAll && grpcService(method) {
		return nil, nil
	}
	key, err := o.callKey(ctx, o.key, method)
	if err != nil {
		return nil, err
	}
	limit := limitFor(method, key)
	if limit == nil {
		return nil, nil
	}
	hold, err := acquire(ctx, limit, o.wait)
	if err == nil {
		o.breakerRun.Decided()
	}
	if err != nil || ctx.Err() != nil {
		// A caller gone (or out of time) by the time of the answer gets no
		// handler, whatever the answer (failed): a slot it got goes back.
		o.release(ctx, method, hold)
		return nil, o.failed(ctx, method, err)
	}
	if hold == nil {
		return nil, status.Error(codes.ResourceExhausted, "grpclimit: too many calls in flight")
	}
	return hold, nil
}

// acquire takes a slot of limit: at once, or within wait. A wait that runs
// out is a denial (no Hold, no error), whatever the attempt it cut short
// said; the call's own end is its error.
func acquire(ctx context.Context, limit *redlimit.InFlight, wait time.Duration) (*redlimit.Hold, error) {
	if wait <= 0 {
		return limit.TryAcquire(ctx)
	}
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	hold, err := limit.Acquire(waitCtx)
	if err != nil && ctx.Err() == nil && waitCtx.Err() != nil {
		return nil, nil
	}
	return hold, err
}

// release gives a call's slot back, on a context of its own: the call's
// has ended, or is about to.
func (o *options) release(ctx context.Context, method string, hold *redlimit.Hold) {
	if hold == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := hold.Release(ctx); err != nil {
		o.report(ctx, method, err)
	}
}
