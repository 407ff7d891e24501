// Package grpclimit is gRPC middleware for redlimit: server interceptors that
// rate-limit incoming calls, so that every instance of a service shares one
// limit per caller, and client interceptors that wait for a shared limit
// before calling a rate-limited upstream.
//
// A server interceptor makes one decision per call (Limiter.Allow): a unary
// call or a whole stream, whatever the number of messages it carries. Its
// Result goes into the response's header metadata as the fields httplimit
// writes (draft-ietf-httpapi-ratelimit-headers), in gRPC's lower case:
//
//	ratelimit-policy: "default";q=100;w=60
//	ratelimit: "default";r=42;t=17
//
// A denied call ends with codes.ResourceExhausted and a google.rpc.RetryInfo
// detail holding the exact wait (Result.RetryAfter). Every value comes from
// the decision, so each follows a SetRate at once: q is the Result's Limit
// (the config's Rate; a funnel's Burst), w its Window (the config's Interval;
// the time a funnel's Burst takes to drain), r Remaining; t is until the
// limiter is full again, or on a denial the wait; w and t are in whole
// seconds, rounded up.
//
// A call that costs more permits than the limit can ever grant
// (WithPermits above q: redlimit.ErrPermitsExceedRate) can never succeed, so
// it is not told to come back: it ends with codes.ResourceExhausted, the
// message "grpclimit: more permits than the rate limit grants" and no
// RetryInfo, as the client interceptors end it, and its header metadata has
// ratelimit-policy (q is the most a call may ask for) but no ratelimit item.
// It takes nothing, and is the caller's doing, not an outage: the error
// hook (WithErrorHook) is not told.
//
// A limiter of several rates (redlimit.Config.And) is reported as httplimit
// reports it: ratelimit-policy lists every rate, each named after the
// policy (WithPolicy) and its window, and ratelimit the rate that bound the decision
// (Result.Bound), its t no longer than that rate's window:
//
//	ratelimit-policy: "default/1s";q=10;w=1, "default/1h";q=1000;w=3600
//	ratelimit: "default/1s";r=9;t=1
//
// Chained server interceptors decide one after the other, so the first has
// counted a call by the time the next denies it: a caller its per-key
// limit holds back keeps spending its peer's permits. UnaryServerAll and
// StreamServerAll decide several policies in one script call instead,
// counting in none of them unless all grant (redlimit.Client.AllowAll),
// with the same metadata; on a Redis Cluster their limiters' names need
// one hash tag.
//
// The server interceptors leave gRPC's own reflection and health services
// (grpc.reflection.*, grpc.health.*) unlimited, before any KeyFunc runs: a
// tool such as grpcurl, or a load balancer's health check, carries no API
// key and should not spend a caller's permits. WithLimitedGRPCServices
// limits them too.
//
// Callers are keyed by default by their IP address (PeerIP): an IPv4
// address, or an IPv6 address's /64 network, the block one subscriber holds,
// so that its other addresses are not fresh limits. WithKey sets another
// key: PeerPrefix for other prefix lengths, Metadata for a metadata value.
//
// The interceptors are safe for concurrent use.
package grpclimit

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// The header metadata keys a server interceptor sets on every call it decides.
const (
	PolicyKey    = "ratelimit-policy"
	RateLimitKey = "ratelimit"
)

// ErrNoKey: the call does not carry what its key is made of.
var ErrNoKey = errors.New("grpclimit: no key")

// Allower is what the server interceptors ask for a decision: a
// *redlimit.Limiter, or a wrapper or fake of one. A Result with Limit 0 and
// no error is a grant without a decision (a Client's WithFailOpen): no
// rate-limit metadata is set.
type Allower interface {
	Allow(ctx context.Context, permits int64) (redlimit.Result, error)
}

// Acquirer is what the client interceptors wait on: a *redlimit.Limiter, or
// a wrapper or fake of one.
type Acquirer interface {
	Acquire(ctx context.Context, permits int64) error
}

// UnaryServerInterceptor takes permits from limiterFor(method, key) for each
// unary call, key naming its caller (KeyFunc), escaped by redlimit.KeyPart
// so that it is safe in a limiter name as it is. limiterFor returns a
// *redlimit.Limiter, or any Allower (a wrapper, a fake in tests): L is
// inferred from it. A Limiter is one named limit,
// so limiterFor returns a handle per key (and per method, for limits that
// differ by method). Handles hold no state and cost no round trip to make:
//
//	limiterFor := func(method, key string) *redlimit.Limiter {
//		if method == pb.Search_Export_FullMethodName {
//			return client.FixedWindow("export:" + key).WithDefault(redlimit.PerHour(10))
//		}
//		return client.FixedWindow("rpc:" + key).WithDefault(redlimit.PerMinute(100))
//	}
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(limiterFor)),
//		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(limiterFor)))
//
// A nil Limiter (L's zero value) leaves the call unlimited. A call
// whose caller goes away (its context cancelled) before the decision is made
// ends with codes.Canceled, and the handler never runs for it, even with
// WithFailOpen: a caller that is gone is not an outage.
func UnaryServerInterceptor[L interface {
	comparable
	Allower
}](limiterFor func(method, key string) L, opts ...Option) grpc.UnaryServerInterceptor {
	o := newOptions(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		setHeader := func(md metadata.MD) error { return grpc.SetHeader(ctx, md) }
		if err := decide(o, ctx, info.FullMethod, req, limiterFor, setHeader); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streams: one decision
// when the stream starts, WithPermits's function given no request.
func StreamServerInterceptor[L interface {
	comparable
	Allower
}](limiterFor func(method, key string) L, opts ...Option) grpc.StreamServerInterceptor {
	o := newOptions(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := decide(o, ss.Context(), info.FullMethod, nil, limiterFor, ss.SetHeader); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// grpcService reports whether method belongs to gRPC's reflection or health
// service, left unlimited unless WithLimitedGRPCServices.
func grpcService(method string) bool {
	return strings.HasPrefix(method, "/grpc.reflection.") || strings.HasPrefix(method, "/grpc.health.")
}

// decide takes a call's permits. A nil error lets the call through; any
// other is the status to end it with. (A function, not a method: methods
// cannot have type parameters.)
func decide[L interface {
	comparable
	Allower
}](o *options, ctx context.Context, method string, req any, limiterFor func(method, key string) L, setHeader func(metadata.MD) error) error {
	if !o.limitAll && grpcService(method) {
		return nil
	}
	key, err := o.callKey(ctx, o.key, method)
	if err != nil {
		return err
	}
	limiter := limiterFor(method, key)
	var none L
	if limiter == none {
		return nil
	}
	res, err := limiter.Allow(ctx, o.permits(ctx, method, req))
	// A call above the limit is a decision, and the caller's to fix, not an
	// error of ours: whether Allow says so (ErrPermitsExceedRate) or, as an
	// Allower written before it did may, denies it with RetryAfter Never.
	above := errors.Is(err, redlimit.ErrPermitsExceedRate) || err == nil && ratelimitfields.AboveLimit(res)
	if err == nil || above {
		o.breakerRun.Decided()
	}
	if (err != nil && !above) || ctx.Err() != nil {
		// A caller gone (or out of time) by the time of the answer gets no
		// handler, whatever the answer: see failed.
		return o.failed(ctx, method, err)
	}
	// Limit 0: granted by a Client's WithFailOpen, without a decision.
	if res.Limit > 0 && (!res.Shadow || o.shadow) {
		// SetHeader fails only once headers are sent, which nothing has
		// done before the handler runs.
		_ = setHeader(o.fields(res))
	}
	switch {
	case above:
		return errAboveLimit
	case !res.Allowed:
		return denied(res.RetryAfter)
	}
	return nil
}

// callKey is key's key of a call, escaped: the one place a key from a call
// becomes part of a limiter name, so that no KeyFunc, ours or the caller's,
// can skip it. An error is the status to end the call with.
func (o *options) callKey(ctx context.Context, key KeyFunc, method string) (string, error) {
	k, err := key(ctx, method)
	if err != nil {
		o.report(ctx, method, err)
		if st, ok := status.FromError(err); ok {
			return "", st.Err()
		}
		return "", status.Error(codes.InvalidArgument, err.Error())
	}
	return redlimit.KeyPart(k), nil
}

// failed maps an error from the limiter to the call's status; nil lets the
// call through (WithFailOpen). The context's end comes first: the caller is gone
// or out of time, and its own error says so better than the limiter's.
// ErrMisconfigured is checked before ErrUnavailable so that nothing can fail
// it open.
func (o *options) failed(ctx context.Context, method string, err error) error {
	switch {
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, redlimit.ErrMisconfigured):
		o.report(ctx, method, err)
		return status.Error(codes.Internal, "grpclimit: rate limiter misconfigured")
	case errors.Is(err, redlimit.ErrUnavailable):
		o.report(ctx, method, err)
		if o.open {
			return nil
		}
		return status.Error(codes.Unavailable, "grpclimit: rate limiter unavailable")
	default:
		o.report(ctx, method, err)
		return status.Error(codes.Internal, "grpclimit: rate limiter failed")
	}
}

func (o *options) report(ctx context.Context, method string, err error) {
	if o.hook == nil {
		return
	}
	if o.breakerRun.Tell(err) {
		o.hook(ctx, method, err)
	}
}

// fields are httplimit's RateLimit-Policy and RateLimit for one decision;
// of a call above the limit, the policy only (ratelimitfields.For).
func (o *options) fields(res redlimit.Result) metadata.MD {
	f := ratelimitfields.For(o.name, res)
	if f.Limit == "" {
		return metadata.Pairs(PolicyKey, f.Policy)
	}
	return metadata.Pairs(PolicyKey, f.Policy, RateLimitKey, f.Limit)
}

// errAboveLimit ends a call for more permits than the limit can ever
// grant, on the server and the calling side alike. It carries no
// RetryInfo: no wait would help.
var errAboveLimit = status.Error(codes.ResourceExhausted, "grpclimit: more permits than the rate limit grants")

// denied is the status of a denied call: RetryInfo carries the exact wait,
// unrounded.
func denied(wait time.Duration) error {
	st := status.New(codes.ResourceExhausted, "grpclimit: rate limit exceeded")
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		st = withInfo
	}
	return st.Err()
}
