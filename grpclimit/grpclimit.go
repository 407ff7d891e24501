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
// A call that costs more permits than the limit can ever grant (its
// PermitsFunc above q: redlimit.ErrPermitsExceedRate) can never succeed, so
// it is not told to come back: it ends with codes.ResourceExhausted, the
// message "grpclimit: more permits than the rate limit grants" and no
// RetryInfo, as the client interceptors end it, and its header metadata has
// ratelimit-policy (q is the most a call may ask for) but no ratelimit item.
// It takes nothing, and is the caller's doing, not an outage: ErrorHook is
// not told.
//
// A limiter of several rates (redlimit.Config.And) is reported as httplimit
// reports it: ratelimit-policy lists every rate, each named after the
// PolicyName and its window, and ratelimit the rate that bound the decision
// (Result.Bound), its t no longer than that rate's window:
//
//	ratelimit-policy: "default/1s";q=10;w=1, "default/1h";q=1000;w=3600
//	ratelimit: "default/1s";r=9;t=1
//
// The server interceptors leave gRPC's own reflection and health services
// (grpc.reflection.*, grpc.health.*) unlimited, before any KeyFunc runs: a
// tool such as grpcurl, or a load balancer's health check, carries no API
// key and should not spend a caller's permits. LimitGRPCServices(true)
// limits them too.
//
// Callers are keyed by default by their IP address (PeerIP): an IPv4
// address, or an IPv6 address's /64 network, the block one subscriber holds,
// so that its other addresses are not fresh limits. PeerPrefix sets other
// prefix lengths.
//
// The interceptors are safe for concurrent use.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/breakerrun"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// The header metadata keys a server interceptor sets on every call it decides.
const (
	PolicyKey    = "ratelimit-policy"
	RateLimitKey = "ratelimit"
)

// ErrNoKey: the call does not carry what its key is made of.
var ErrNoKey = errors.New("grpclimit: no key")

// Option configures the server interceptors. The options and their defaults:
//
//	KeyFunc            PeerIP(): the peer's IPv4 address, or its IPv6 /64
//	PermitsFunc        1 permit per call
//	PolicyName         "default"
//	FailOpen           false: when Redis is unavailable, fail calls with codes.Unavailable
//	ShadowHeaders      false: a decision in shadow mode sets no rate-limit metadata
//	ErrorHook          none
//	LimitGRPCServices  false: grpc.reflection.* and grpc.health.* are not limited
type Option interface{ apply(*options) }

// ClientOption configures the client interceptors: PermitsFunc, FailOpen and
// ErrorHook, with the same defaults.
type ClientOption interface{ applyClient(*clientOptions) }

// KeyFunc names the caller a call counts against; the limiter is
// limiterFor(method, redlimit.KeyPart(key)). An error fails the call
// whatever FailOpen says (the key comes from the call, and failing open
// would let a caller skip the limit by leaving out what the key is made
// of): with the error's own code when it is a gRPC status
// (status.FromError), else with codes.InvalidArgument.
//
// The key is the caller's text (metadata, a claim), so the interceptors
// escape it with redlimit.KeyPart before limiterFor sees it, whatever the
// KeyFunc: no brace, '%', space or control byte, no byte above 0x7f, at most
// redlimit.MaxKeyPart bytes. A caller can then neither fail the call (a '{'
// of its own would make an invalid name: codes.Internal for every such
// call), nor choose the hash tag, and so the Redis Cluster slot, of its
// limiter, nor make a key as long as its metadata. Keys as PeerIP makes
// them, and ordinary ones ("alice@example.com"), pass unchanged.
type KeyFunc func(ctx context.Context, method string) (string, error)

// PermitsFunc is how many permits a call takes. method is the full method
// name ("/package.Service/Method"); req is a unary call's request message,
// and nil for a stream, which is decided before any message. Zero lets the
// call through and only reports the limiter's state; more than the limit can
// ever grant is codes.ResourceExhausted without RetryInfo (see the package
// doc); a negative number is an error (ErrorHook, codes.Internal).
type PermitsFunc func(ctx context.Context, method string, req any) int64

// PolicyName identifies the policy in ratelimit-policy and ratelimit. It must
// be printable ASCII: the interceptor constructors panic otherwise.
type PolicyName string

// FailOpen lets calls through when Redis cannot decide
// (redlimit.ErrUnavailable: unreachable, timed out, failing over), without
// rate-limit metadata on the server. Without it they fail with
// codes.Unavailable. Either way ErrorHook learns the error.
//
// Any other error is a bug or a misconfiguration to fix, not an outage to
// ride out, and fails the call with codes.Internal whatever FailOpen says:
// redlimit.ErrMisconfigured above all (Redis refused: an ACL, a password),
// which failing open would turn into limits silently switched off.
// codes.Internal rather than FailedPrecondition because the caller can do
// nothing about it, as httplimit answers 500 to it.
//
// A Client made WithFailOpen grants such calls itself: no error reaches the
// interceptor, so ErrorHook is not told (the Client's observer is).
type FailOpen bool

// ErrorHook is told of every error: the KeyFunc's, Redis's, the script's;
// not of a call whose context ended first, nor of a denial, nor of a call
// above the limit (redlimit.ErrPermitsExceedRate), which is the caller's to
// fix and would let any caller fill a log. It runs on the
// call's goroutine, so it must be quick: a log line, a counter.
//
// The one exception: while a Client's breaker is open
// (redlimit.WithBreaker), every call is answered with
// redlimit.ErrBreakerOpen in microseconds, and a hook that logs would write
// a line for each. So ErrorHook is told of the first ErrBreakerOpen of a run
// only: the next is told once something else has happened in between (a
// decision, or another error, such as the breaker's failed probe once per
// cool-down). The failures that open the breaker and those of its probes are
// told as they come. To count every call answered so, use the Client's
// observer (redlimit.WithObserver), which sees them all.
type ErrorHook func(ctx context.Context, method string, err error)

// ShadowHeaders sets the rate-limit metadata of a decision made in shadow
// mode (redlimit.Limiter.WithShadow, SetShadow) as enforcing would have;
// the call goes through either way. By default such a decision sets none,
// so that a limit on trial is invisible to callers.
type ShadowHeaders bool

// LimitGRPCServices limits the calls of gRPC's reflection and health
// services (methods under /grpc.reflection. and /grpc.health.) like any
// other. By default they go through without a KeyFunc or a limiter.
type LimitGRPCServices bool

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

type options struct {
	key      KeyFunc
	policy   PolicyName
	limitAll LimitGRPCServices
	shadow   ShadowHeaders
	clientOptions

	name string // the policy name as an sf-string
}

type clientOptions struct {
	permits PermitsFunc
	open    FailOpen
	hook    ErrorHook

	// breakerRun: a run of ErrBreakerOpen is told once. See ErrorHook.
	breakerRun breakerrun.Run
}

func (o KeyFunc) apply(opts *options)           { opts.key = o }
func (o PolicyName) apply(opts *options)        { opts.policy = o }
func (o PermitsFunc) apply(opts *options)       { o.applyClient(&opts.clientOptions) }
func (o FailOpen) apply(opts *options)          { o.applyClient(&opts.clientOptions) }
func (o ErrorHook) apply(opts *options)         { o.applyClient(&opts.clientOptions) }
func (o LimitGRPCServices) apply(opts *options) { opts.limitAll = o }
func (o ShadowHeaders) apply(opts *options)     { opts.shadow = o }

func (o PermitsFunc) applyClient(opts *clientOptions) { opts.permits = o }
func (o FailOpen) applyClient(opts *clientOptions)    { opts.open = o }
func (o ErrorHook) applyClient(opts *clientOptions)   { opts.hook = o }

func onePermit(context.Context, string, any) int64 { return 1 }

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
// ends with codes.Canceled, and the handler never runs for it, even under
// FailOpen: a caller that is gone is not an outage.
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
// when the stream starts, PermitsFunc given no request.
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

func newOptions(opts []Option) *options {
	o := &options{
		key:           PeerIP(),
		policy:        "default",
		clientOptions: clientOptions{permits: onePermit},
	}
	for _, opt := range opts {
		opt.apply(o)
	}
	name, ok := ratelimitfields.Name(string(o.policy))
	if !ok {
		panic(fmt.Sprintf("grpclimit: policy name %q is not printable ASCII", o.policy))
	}
	o.name = name
	return o
}

// grpcService reports whether method belongs to gRPC's reflection or health
// service, left unlimited unless LimitGRPCServices.
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
	if !bool(o.limitAll) && grpcService(method) {
		return nil
	}
	key, err := o.callKey(ctx, method)
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
	if res.Limit > 0 && (!res.Shadow || bool(o.shadow)) {
		// SetHeader fails only once headers are sent, which nothing has
		// done before the handler runs.
		_ = setHeader(o.fields(res))
	}
	switch {
	case above:
		return errAboveLimit
	case !res.Allowed:
		return denied(res)
	}
	return nil
}

// callKey is the KeyFunc's key, escaped: the one place a key from a call
// becomes part of a limiter name, so that no KeyFunc, ours or the caller's,
// can skip it. An error is the status to end the call with.
func (o *options) callKey(ctx context.Context, method string) (string, error) {
	key, err := o.key(ctx, method)
	if err != nil {
		o.report(ctx, method, err)
		if st, ok := status.FromError(err); ok {
			return "", st.Err()
		}
		return "", status.Error(codes.InvalidArgument, err.Error())
	}
	return redlimit.KeyPart(key), nil
}

// failed maps an error from the limiter to the call's status; nil lets the
// call through (FailOpen). The context's end comes first: the caller is gone
// or out of time, and its own error says so better than the limiter's.
// ErrMisconfigured is checked before ErrUnavailable so that nothing can fail
// it open.
func (o *clientOptions) failed(ctx context.Context, method string, err error) error {
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

func (o *clientOptions) report(ctx context.Context, method string, err error) {
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
func denied(res redlimit.Result) error {
	st := status.New(codes.ResourceExhausted, "grpclimit: rate limit exceeded")
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)}); err == nil {
		st = withInfo
	}
	return st.Err()
}
