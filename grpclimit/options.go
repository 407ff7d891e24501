package grpclimit

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit/internal/breakerrun"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// Option configures the interceptors, as redlimit.Option configures a
// Client. One type serves them all; each reads the options that apply to it
// and ignores the others. The options, their defaults, and who reads them
// (of UnaryServerAll and StreamServerAll, WithKey and WithPermits are the
// defaults of the policies without their own):
//
//	WithKey                  PeerIP(): the peer's IPv4 address, or its IPv6 /64 (server)
//	WithPermits              1 permit per call (rate limits: server and client)
//	WithPolicy               "default" (server rate limits, but the All interceptors: Policy.Name)
//	WithFailOpen             off: when Redis is unavailable, fail calls with codes.Unavailable (all)
//	WithShadowHeaders        off: a decision in shadow mode sets no rate-limit metadata (server rate limits)
//	WithErrorHook            none (all)
//	WithLimitedGRPCServices  off: grpc.reflection.* and grpc.health.* are not limited (server)
//	WithMaxWait              0: a full in-flight limit fails the call at once (server in-flight limits)
type Option func(*options)

type options struct {
	key      KeyFunc
	permits  func(ctx context.Context, method string, req any) int64
	policy   string
	open     bool
	shadow   bool
	hook     func(ctx context.Context, method string, err error)
	limitAll bool
	wait     time.Duration

	name string // the policy name as an sf-string
	// breakerRun: a run of ErrBreakerOpen is told once. See WithErrorHook.
	breakerRun breakerrun.Run
}

// newOptions applies opts over the defaults. It panics on a policy name
// that is not printable ASCII.
func newOptions(opts []Option) *options {
	o := &options{
		key:     PeerIP(),
		permits: func(context.Context, string, any) int64 { return 1 },
		policy:  "default",
	}
	for _, opt := range opts {
		opt(o)
	}
	name, ok := ratelimitfields.Name(o.policy)
	if !ok {
		panic(fmt.Sprintf("grpclimit: policy name %q is not printable ASCII", o.policy))
	}
	o.name = name
	return o
}

// WithKey names the caller a call counts against (KeyFunc): PeerIP,
// PeerPrefix, Metadata, or a function of your own.
func WithKey(key KeyFunc) Option { return func(o *options) { o.key = key } }

// WithPermits sets how many permits a call takes; default 1. method is the
// full method name ("/package.Service/Method"); req is a unary call's
// request message, and nil for a stream, which is decided before any
// message. Zero lets the call through and only reports the limiter's state;
// more than the limit can ever grant is codes.ResourceExhausted without
// RetryInfo (see the package doc); a negative number is an error (the error
// hook, codes.Internal).
func WithPermits(permits func(ctx context.Context, method string, req any) int64) Option {
	return func(o *options) { o.permits = permits }
}

// WithPolicy names the policy in ratelimit-policy and ratelimit; default
// "default". It must be printable ASCII: the interceptor constructors panic
// otherwise.
func WithPolicy(name string) Option { return func(o *options) { o.policy = name } }

// WithFailOpen lets calls through when Redis cannot decide
// (redlimit.ErrUnavailable: unreachable, timed out, failing over), without
// rate-limit metadata on the server. Without it they fail with
// codes.Unavailable. Either way the error hook learns the error.
//
// Any other error is a bug or a misconfiguration to fix, not an outage to
// ride out, and fails the call with codes.Internal even with WithFailOpen:
// redlimit.ErrMisconfigured above all (Redis refused: an ACL, a password),
// which failing open would turn into limits silently switched off.
// codes.Internal rather than FailedPrecondition because the caller can do
// nothing about it, as httplimit answers 500 to it.
//
// A Client made redlimit.WithFailOpen grants such calls itself: no error
// reaches the interceptor, so the error hook is not told (the Client's
// observer is).
func WithFailOpen() Option { return func(o *options) { o.open = true } }

// WithShadowHeaders sets the rate-limit metadata of a decision made in
// shadow mode (redlimit.Limiter.WithShadow, SetShadow) as enforcing would
// have; the call goes through either way. By default such a decision sets
// none, so that a limit on trial is invisible to callers.
func WithShadowHeaders() Option { return func(o *options) { o.shadow = true } }

// WithErrorHook tells hook of every error: the KeyFunc's, Redis's, the
// script's; not of a call whose context ended first, nor of a denial, nor of
// a call above the limit (redlimit.ErrPermitsExceedRate), which is the
// caller's to fix and would let any caller fill a log. It runs on the call's
// goroutine, so it must be quick: a log line, a counter.
//
// The one exception: while a Client's breaker is open
// (redlimit.WithBreaker), every call is answered with
// redlimit.ErrBreakerOpen in microseconds, and a hook that logs would write
// a line for each. So the hook is told of the first ErrBreakerOpen of a run
// only: the next is told once something else has happened in between (a
// decision, or another error, such as the breaker's failed probe once per
// cool-down). The failures that open the breaker and those of its probes are
// told as they come. To count every call answered so, use the Client's
// observer (redlimit.WithObserver), which sees them all.
func WithErrorHook(hook func(ctx context.Context, method string, err error)) Option {
	return func(o *options) { o.hook = hook }
}

// WithLimitedGRPCServices limits the calls of gRPC's reflection and health
// services (methods under /grpc.reflection. and /grpc.health.) like any
// other. By default the server interceptors let them through without a
// KeyFunc or a limiter.
func WithLimitedGRPCServices() Option { return func(o *options) { o.limitAll = true } }

// WithMaxWait is how long the in-flight interceptors (UnaryServerInFlight,
// StreamServerInFlight) wait for a slot before failing a call with
// codes.ResourceExhausted; default 0, no wait. A wait looks again every
// 20ms (redlimit.InFlight.Acquire), and ends early with the call's own
// deadline.
func WithMaxWait(d time.Duration) Option { return func(o *options) { o.wait = d } }
