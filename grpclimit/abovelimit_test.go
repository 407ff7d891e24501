package grpclimit_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// aboveLimit is the status of a call that costs more than the limit can
// ever grant, on the server and the calling side alike.
const aboveLimit = "grpclimit: more permits than the rate limit grants"

// TestAboveLimit: a call that costs more than the limit can ever grant ends
// with ResourceExhausted and no RetryInfo, as the client interceptors end
// it, and carries ratelimit-policy (q tells the caller the most it may ask
// for) but no ratelimit item, whose r and t would say "come back then" to a
// call no wait lets through. It takes nothing, is not an outage (the error
// hook is not told), and its handler does not run.
func TestAboveLimit(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := redistest.NewClock(redistest.WindowStart.Add(10 * time.Second))
		name := redistest.UniqueName(t, "grpclimit-test:")
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		hooked := new(hookedErrors)
		conn := limitedServer(t, allButList(client, name, redlimit.PerMinute(3)), grpclimit.WithKey(grpclimit.Metadata("x-api-key")), grpclimit.WithErrorHook(hooked.hook),
			grpclimit.WithPermits(func(ctx context.Context, _ string, _ any) int64 {
				return cost(metadata.ValueFromIncomingContext(ctx, "x-cost"))
			}))

		const policy = `"default";q=3;w=60`
		steps := []struct {
			kind kind
			cost string
			want answer
		}{
			{unary, "4", answer{code: codes.ResourceExhausted, msg: aboveLimit, fields: map[string]string{grpclimit.PolicyKey: policy}}},
			{stream, "4", answer{code: codes.ResourceExhausted, msg: aboveLimit, fields: map[string]string{grpclimit.PolicyKey: policy}}},
			// They took nothing: the whole limit is there.
			{unary, "3", answer{code: codes.OK, fields: map[string]string{grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=0;t=50`}}},
			// Spent or not, no wait lets 4 through: no RetryInfo.
			{stream, "4", answer{code: codes.ResourceExhausted, msg: aboveLimit, fields: map[string]string{grpclimit.PolicyKey: policy}}},
			{unary, "1", answer{code: codes.ResourceExhausted, msg: "grpclimit: rate limit exceeded", retry: "50s", fields: map[string]string{
				grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=0;t=50`}}},
		}
		for i, step := range steps {
			got := call(t, conn, step.kind, "x-api-key", "k", "x-cost", step.cost)
			if got.code != step.want.code || got.msg != step.want.msg || got.retry != step.want.retry || !maps.Equal(got.fields, step.want.fields) {
				t.Errorf("step %d (%s, cost %s): %+v\nwant %+v", i, step.kind, step.cost, got, step.want)
			}
		}
		if errs := hooked.get(); len(errs) > 0 {
			t.Errorf("error hook told %v", errs)
		}
	})
}

// aboveLimitAllower answers as Limiter.Allow did before it returned
// ErrPermitsExceedRate: a denial with RetryAfter Never and no error, as an
// Allower written then still may.
type aboveLimitAllower struct{}

func (*aboveLimitAllower) Allow(context.Context, int64) (redlimit.Result, error) {
	return redlimit.Result{Limit: 5, Remaining: 5, RetryAfter: redlimit.Never, Window: 10 * time.Second}, nil
}

// TestAboveLimitFromAllower: such an answer ends the call the same way,
// ratelimit-policy and all.
func TestAboveLimitFromAllower(t *testing.T) {
	hooked := new(hookedErrors)
	limiterFor := func(string, string) *aboveLimitAllower { return &aboveLimitAllower{} }
	opts := []grpclimit.Option{grpclimit.WithKey(grpclimit.Metadata("x-api-key")), grpclimit.WithErrorHook(hooked.hook), grpclimit.WithLimitedGRPCServices()}
	conn := dial(t, serve(t,
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(limiterFor, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(limiterFor, opts...))))
	want := answer{code: codes.ResourceExhausted, msg: aboveLimit, fields: map[string]string{grpclimit.PolicyKey: `"default";q=5;w=10`}}
	for _, k := range []kind{unary, stream} {
		if got := call(t, conn, k, "x-api-key", "k"); got.code != want.code || got.msg != want.msg || got.retry != want.retry || !maps.Equal(got.fields, want.fields) {
			t.Errorf("%s: %+v\nwant %+v", k, got, want)
		}
	}
	if errs := hooked.get(); len(errs) > 0 {
		t.Errorf("error hook told %v", errs)
	}
}
