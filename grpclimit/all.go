package grpclimit

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// Policy is one limit of UnaryServerAll and StreamServerAll: a call takes
// Permits(ctx, method, req) from Limiter(method, key), key naming its
// caller by Key.
type Policy struct {
	// Name names the policy in ratelimit-policy and ratelimit: printable
	// ASCII, and unique among the policies of an interceptor.
	Name string
	// Limiter returns the limiter of the method and the caller key names,
	// escaped by redlimit.KeyPart, as UnaryServerInterceptor's limiterFor
	// does; nil leaves the call out of this policy. Its limiters must be of
	// the interceptor's client.
	Limiter func(method, key string) *redlimit.Limiter
	// Key names the caller; nil: WithKey's (by default PeerIP).
	Key KeyFunc
	// Permits is what a call takes; nil: WithPermits's (by default 1).
	Permits func(ctx context.Context, method string, req any) int64
}

// UnaryServerAll decides every policy of a unary call at once, all or
// nothing (redlimit.Client.AllowAll): a call that one policy denies takes
// no permit from the others.
//
// Chained UnaryServerInterceptors, per peer and per API key, decide one
// after the other, and the first has counted a call by the time the second
// denies it: a caller that its per-key limit holds back keeps spending its
// peer's permits, and those of every caller behind that address, with
// calls none of which are served. UnaryServerAll decides the policies in
// one script call, which counts in none of them unless all grant:
//
//	policies := []grpclimit.Policy{
//		{Name: "per-peer", Limiter: func(_, ip string) *redlimit.Limiter {
//			return client.FixedWindow("{rpc}peer:" + ip).WithDefault(redlimit.PerMinute(1000))
//		}},
//		{Name: "per-key", Key: grpclimit.Metadata("x-api-key"), Limiter: func(_, key string) *redlimit.Limiter {
//			return client.FixedWindow("{rpc}key:" + key).WithDefault(redlimit.PerMinute(100))
//		}},
//	}
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerAll(client, policies)),
//		grpc.ChainStreamInterceptor(grpclimit.StreamServerAll(client, policies)))
//
// One script call runs on one server, so on a Redis Cluster the limiters
// of a call must be in one hash slot: their names need one hash tag, as
// "{rpc}" above (through a Ring or a wrapper client too; through a plain or
// failover client any names do). Otherwise the call fails with
// codes.Internal (redlimit.ErrMisconfigured, never failed open), and
// nothing is counted. Policies keyed apart, as per peer and per key, share
// nothing but the call, so their tag is a constant, which puts every
// caller's limiters on one node; where that node cannot take the load,
// chain UnaryServerInterceptors instead. Policies keyed alike (per key, and
// per key on an expensive method) can tag their names with the key
// ("{"+key+"}:export"): each caller's limiters share a slot, and the
// callers spread over the Cluster.
//
// The header metadata is UnaryServerInterceptor's, with every policy in
// the lists: ratelimit-policy and ratelimit each hold one value, an item
// for each policy in order, reporting its own limiter's Result (a granted
// one's on a denied call too, which counted nothing and says what the
// limiter still has). A denied call ends with codes.ResourceExhausted and
// RetryInfo holding the longest wait of the policies that denied
// (redlimit.AllResult.RetryAfter); one for more than a policy can ever
// grant, as UnaryServerInterceptor ends it, without RetryInfo or that
// policy's ratelimit item. A policy whose Limiter is nil for the call has
// no part in it; with none left the call goes through undecided.
//
// The options are UnaryServerInterceptor's: WithKey and WithPermits are
// the defaults of policies without their own, WithPolicy is not read;
// errors, WithFailOpen, shadow mode (a policy in shadow mode does not hold
// back the others; WithShadowHeaders), gRPC's own services and a caller
// gone are handled as it handles them. It panics if client is nil, a Name
// is repeated or not printable ASCII, or a Limiter is nil.
func UnaryServerAll(client *redlimit.Client, policies []Policy, opts ...Option) grpc.UnaryServerInterceptor {
	o, ps := newAll(client, policies, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		setHeader := func(md metadata.MD) error { return grpc.SetHeader(ctx, md) }
		if err := o.decideAll(ctx, client, ps, info.FullMethod, req, setHeader); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerAll is UnaryServerAll for streams: one decision when the
// stream starts, the Permits functions given no request.
func StreamServerAll(client *redlimit.Client, policies []Policy, opts ...Option) grpc.StreamServerInterceptor {
	o, ps := newAll(client, policies, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := o.decideAll(ss.Context(), client, ps, info.FullMethod, nil, ss.SetHeader); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// policy is a Policy with its defaults filled in, and its name quoted.
type policy struct {
	Policy
	name string
}

// newAll checks the policies, and fills in their defaults from the options.
func newAll(client *redlimit.Client, policies []Policy, opts []Option) (*options, []policy) {
	if client == nil {
		panic("grpclimit: no client for the policies")
	}
	o := newOptions(opts)
	names := make([]string, len(policies))
	for i, p := range policies {
		names[i] = p.Name
	}
	quoted := ratelimitfields.Policies("grpclimit", names, func(i int) bool { return policies[i].Limiter != nil })
	ps := make([]policy, len(policies))
	for i, p := range policies {
		ps[i] = policy{Policy: p, name: quoted[i]}
		if ps[i].Key == nil {
			ps[i].Key = o.key
		}
		if ps[i].Permits == nil {
			ps[i].Permits = o.permits
		}
	}
	return o, ps
}

// decideAll takes a call's permits of every policy, or of none. A nil
// error lets the call through; any other is the status to end it with.
func (o *options) decideAll(ctx context.Context, client *redlimit.Client, ps []policy, method string, req any, setHeader func(metadata.MD) error) error {
	if !o.limitAll && grpcService(method) {
		return nil
	}
	var wants []redlimit.Want
	var names []string
	for _, p := range ps {
		key, err := o.callKey(ctx, p.Key, method)
		if err != nil {
			return err
		}
		if l := p.Limiter(method, key); l != nil {
			wants = append(wants, redlimit.Want{Limiter: l, Permits: p.Permits(ctx, method, req)})
			names = append(names, p.name)
		}
	}
	if len(wants) == 0 {
		return nil
	}
	all, err := client.AllowAll(ctx, wants...)
	above := errors.Is(err, redlimit.ErrPermitsExceedRate)
	if err == nil || above {
		o.breakerRun.Decided()
	}
	if (err != nil && !above) || ctx.Err() != nil {
		return o.failed(ctx, method, err) // see decide
	}
	var policies, limits []string
	for i, res := range all.Results {
		// Limit 0: granted by a Client's WithFailOpen, without a decision.
		if res.Limit > 0 && (!res.Shadow || o.shadow) {
			f := ratelimitfields.For(names[i], res)
			policies = append(policies, f.Policy)
			if f.Limit != "" {
				limits = append(limits, f.Limit)
			}
		}
	}
	if len(policies) > 0 {
		// One value each, as one limiter of several rates has: a list
		// split over values is one many clients read the first of.
		md := metadata.Pairs(PolicyKey, strings.Join(policies, ", "))
		if len(limits) > 0 {
			md.Set(RateLimitKey, strings.Join(limits, ", "))
		}
		_ = setHeader(md) // see decide
	}
	switch {
	case above:
		return errAboveLimit
	case !all.Allowed:
		return denied(all.RetryAfter)
	}
	return nil
}
