package grpclimit

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
)

// UnaryClientInterceptor waits for permits from limiterFor(ctx, method)
// (Limiter.Acquire; any Acquirer) before each unary call, for an upstream that limits its
// callers: every instance of the calling service then shares the upstream's
// quota instead of being denied by it. ctx is the call's outgoing context; a
// nil Limiter (L's zero value) leaves the call unlimited.
//
// The wait honours the call's deadline. When the limiter says the wait would
// pass it, the call fails at once, without reaching the upstream, with
// codes.DeadlineExceeded: the code the caller would get by waiting, so its
// handling of deadlines applies, and one that gRPC's retry policies and
// callers do not take for the upstream's own ResourceExhausted (which says
// retrying later helps; here a longer deadline would). A call for more
// permits than the limit can ever grant fails with codes.ResourceExhausted
// and no RetryInfo, as the server interceptors end it: no wait would help.
// Redis unavailable is codes.Unavailable, or the call goes ahead with
// WithFailOpen; any other error, redlimit.ErrMisconfigured among them, is
// codes.Internal.
func UnaryClientInterceptor[L interface {
	comparable
	Acquirer
}](limiterFor func(ctx context.Context, method string) L, opts ...Option) grpc.UnaryClientInterceptor {
	o := newOptions(opts)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if err := wait(o, ctx, method, req, limiterFor); err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}

// StreamClientInterceptor is UnaryClientInterceptor for streams: it waits
// once, before the stream starts, WithPermits's function given no request.
func StreamClientInterceptor[L interface {
	comparable
	Acquirer
}](limiterFor func(ctx context.Context, method string) L, opts ...Option) grpc.StreamClientInterceptor {
	o := newOptions(opts)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
		if err := wait(o, ctx, method, nil, limiterFor); err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, callOpts...)
	}
}

// wait takes a call's permits, waiting for them. A nil error lets the call
// go ahead; any other is the status to end it with. A wait that cannot end
// before the deadline, and a request above the limit, are denials, not
// errors: the error hook is not told. (A function, not a method: methods cannot
// have type parameters.)
func wait[L interface {
	comparable
	Acquirer
}](o *options, ctx context.Context, method string, req any, limiterFor func(ctx context.Context, method string) L) error {
	limiter := limiterFor(ctx, method)
	var none L
	if limiter == none {
		return nil
	}
	err := limiter.Acquire(ctx, o.permits(ctx, method, req))
	switch {
	case err == nil:
		o.breakerRun.Decided()
		return nil
	case ctx.Err() != nil || errors.Is(err, redlimit.ErrMisconfigured) || errors.Is(err, redlimit.ErrUnavailable):
		return o.failed(ctx, method, err)
	case errors.Is(err, redlimit.ErrPermitsExceedRate):
		o.breakerRun.Decided() // Redis answered: a decision, as on the server side
		return errAboveLimit
	case errors.Is(err, context.DeadlineExceeded):
		// Acquire's refusal to start a wait longer than the time left; the
		// context itself has not ended (checked above).
		return status.Error(codes.DeadlineExceeded, "grpclimit: the rate limit's wait would pass the call's deadline")
	default:
		return o.failed(ctx, method, err)
	}
}
