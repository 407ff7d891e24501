package grpclimit_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// allServer is serve with both All interceptors; the health service stands
// for any service, so it is limited too (WithLimitedGRPCServices).
func allServer(t *testing.T, client *redlimit.Client, policies []grpclimit.Policy, opts ...grpclimit.Option) *grpc.ClientConn {
	opts = append([]grpclimit.Option{grpclimit.WithLimitedGRPCServices()}, opts...)
	return dial(t, serve(t,
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerAll(client, policies, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerAll(client, policies, opts...))))
}

// available lists each limiter's AvailablePermits.
func available(t *testing.T, ls ...*redlimit.Limiter) []int64 {
	t.Helper()
	out := make([]int64, len(ls))
	for i, l := range ls {
		n, err := l.AvailablePermits(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out[i] = n
	}
	return out
}

// TestServerAll: per peer and per API key decided at once, unary calls and
// streams alike. A call the per-key policy denies leaves the per-peer
// limiter as it was, and the other way round; both policies are reported
// in one value each, and RetryInfo holds the call's wait. On every
// backend, a Cluster's names under one hash tag.
func TestServerAll(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		name := fmt.Sprintf("{all%x}", rand.Uint32()) + redistest.UniqueName(t, "grpclimit-test:")
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		perPeer := func(ip string) *redlimit.Limiter {
			return client.FixedWindow(name + "peer:" + ip).WithDefault(redlimit.PerMinute(5))
		}
		perKey := func(key string) *redlimit.Limiter {
			return client.FixedWindow(name + "key:" + key).WithDefault(redlimit.PerMinute(2))
		}
		conn := allServer(t, client, []grpclimit.Policy{
			{Name: "per-peer", Limiter: func(_, ip string) *redlimit.Limiter { return perPeer(ip) }},
			{Name: "per-key", Key: grpclimit.Metadata("x-api-key"), Limiter: func(method, key string) *redlimit.Limiter {
				if method == healthpb.Health_List_FullMethodName {
					return nil // per peer only
				}
				return perKey(key)
			}, Permits: func(ctx context.Context, method string, req any) int64 {
				if isUnary := method != healthpb.Health_Watch_FullMethodName; isUnary != (req != nil) {
					t.Errorf("%s: the permits function given request %v", method, req)
				}
				return cost(metadata.ValueFromIncomingContext(ctx, "x-cost"))
			}},
		}, grpclimit.WithErrorHook(func(_ context.Context, method string, err error) { // a denial, and a call above a limit, are no errors
			t.Errorf("%s: error hook told %v", method, err)
		}))

		const both = `"per-peer";q=5;w=60, "per-key";q=2;w=60`
		exceeded := "grpclimit: rate limit exceeded"
		fields := func(policy, rateLimit string) map[string]string {
			f := map[string]string{grpclimit.PolicyKey: policy}
			if rateLimit != "" {
				f[grpclimit.RateLimitKey] = rateLimit
			}
			return f
		}
		steps := []struct {
			at        time.Duration
			kind      kind
			key, cost string
			want      answer
			available []int64 // afterwards: the peer's, a's, b's
		}{
			{10 * time.Second, unary, "a", "", answer{code: codes.OK, fields: fields(both, `"per-peer";r=4;t=50, "per-key";r=1;t=50`)}, []int64{4, 1, 2}},
			{20 * time.Second, stream, "a", "", answer{code: codes.OK, fields: fields(both, `"per-peer";r=3;t=40, "per-key";r=0;t=40`)}, []int64{3, 0, 2}},
			// per-key denies: per-peer would have granted, and counted
			// nothing; its item says what it still has.
			{30 * time.Second, unary, "a", "", answer{code: codes.ResourceExhausted, msg: exceeded, retry: "30s",
				fields: fields(both, `"per-peer";r=3;t=30, "per-key";r=0;t=30`)}, []int64{3, 0, 2}},
			{30500 * time.Millisecond, stream, "a", "", answer{code: codes.ResourceExhausted, msg: exceeded, retry: "29.5s",
				fields: fields(both, `"per-peer";r=3;t=30, "per-key";r=0;t=30`)}, []int64{3, 0, 2}},
			// A method per-key leaves out: per-peer alone.
			{31 * time.Second, list, "a", "", answer{code: codes.OK, fields: fields(`"per-peer";q=5;w=60`, `"per-peer";r=2;t=29`)}, []int64{2, 0, 2}},
			// More than per-key ever grants: no RetryInfo, no item for it,
			// nothing counted.
			{31 * time.Second, unary, "b", "3", answer{code: codes.ResourceExhausted, msg: aboveLimit,
				fields: fields(both, `"per-peer";r=2;t=29`)}, []int64{2, 0, 2}},
			{40 * time.Second, unary, "b", "", answer{code: codes.OK, fields: fields(both, `"per-peer";r=1;t=20, "per-key";r=1;t=20`)}, []int64{1, 0, 1}},
			{41 * time.Second, list, "b", "", answer{code: codes.OK, fields: fields(`"per-peer";q=5;w=60`, `"per-peer";r=0;t=19`)}, []int64{0, 0, 1}},
			// per-peer denies: b keeps its permit.
			{45 * time.Second, stream, "b", "", answer{code: codes.ResourceExhausted, msg: exceeded, retry: "15s",
				fields: fields(both, `"per-peer";r=0;t=15, "per-key";r=1;t=15`)}, []int64{0, 0, 1}},
		}
		for i, step := range steps {
			now.Set(redistest.WindowStart.Add(step.at))
			md := []string{"x-api-key", step.key}
			if step.cost != "" {
				md = append(md, "x-cost", step.cost)
			}
			got := call(t, conn, step.kind, md...)
			if got.code != step.want.code || got.msg != step.want.msg || got.retry != step.want.retry || !maps.Equal(got.fields, step.want.fields) {
				t.Errorf("step %d (+%v, %s): %+v\nwant %+v", i, step.at, step.kind, got, step.want)
			}
			if got := available(t, perPeer("127.0.0.1"), perKey("a"), perKey("b")); !slices.Equal(got, step.available) {
				t.Errorf("step %d: available %v, want %v", i, got, step.available)
			}
		}
	})
}

// TestServerAllLongestWait: of two denials, RetryInfo holds the longer
// wait, whichever policy comes first; a policy in shadow mode holds back
// nothing and sets metadata only with WithShadowHeaders.
func TestServerAllLongestWait(t *testing.T) {
	now := redistest.NewClock(redistest.WindowStart.Add(5 * time.Second))
	client := redlimit.New(redistest.Miniredis(t), redlimit.WithClock(now.Now))
	burst := client.FixedWindow("burst").WithDefault(redlimit.Config{Rate: 1, Interval: 10 * time.Second})
	minute := client.FixedWindow("minute").WithDefault(redlimit.PerMinute(1))
	trial := client.FixedWindow("trial").WithDefault(redlimit.PerMinute(1)).WithShadow()
	policies := []grpclimit.Policy{
		{Name: "burst", Limiter: func(string, string) *redlimit.Limiter { return burst }},
		{Name: "minute", Limiter: func(string, string) *redlimit.Limiter { return minute }},
		{Name: "trial", Limiter: func(string, string) *redlimit.Limiter { return trial }},
	}
	hidden := allServer(t, client, policies)
	shown := allServer(t, client, policies, grpclimit.WithShadowHeaders())
	const policy = `"burst";q=1;w=10, "minute";q=1;w=60`
	const withTrial = policy + `, "trial";q=1;w=60`
	exceeded := "grpclimit: rate limit exceeded"
	steps := []struct {
		at   time.Duration
		conn *grpc.ClientConn
		want answer
	}{
		{5 * time.Second, hidden, answer{code: codes.OK, fields: map[string]string{grpclimit.PolicyKey: policy,
			grpclimit.RateLimitKey: `"burst";r=0;t=5, "minute";r=0;t=55`}}},
		// Both deny, burst for 4s, minute for 54s; trial would too.
		{6 * time.Second, shown, answer{code: codes.ResourceExhausted, msg: exceeded, retry: "54s", fields: map[string]string{grpclimit.PolicyKey: withTrial,
			grpclimit.RateLimitKey: `"burst";r=0;t=4, "minute";r=0;t=54, "trial";r=0;t=54`}}},
		// A new burst window: it would grant, and keeps its permit.
		{12 * time.Second, hidden, answer{code: codes.ResourceExhausted, msg: exceeded, retry: "48s", fields: map[string]string{grpclimit.PolicyKey: policy,
			grpclimit.RateLimitKey: `"burst";r=1;t=0, "minute";r=0;t=48`}}},
	}
	for i, step := range steps {
		now.Set(redistest.WindowStart.Add(step.at))
		if got := call(t, step.conn, unary); got.code != step.want.code || got.msg != step.want.msg || got.retry != step.want.retry || !maps.Equal(got.fields, step.want.fields) {
			t.Errorf("step %d (+%v): %+v\nwant %+v", i, step.at, got, step.want)
		}
	}
	if got := available(t, burst, minute); !slices.Equal(got, []int64{1, 0}) {
		t.Errorf("available %v, want [1 0]", got)
	}
}

// TestServerAllErrors: what a call gets when its policies cannot be
// decided, as UnaryServerInterceptor: InvalidArgument for a KeyFunc's
// error, Unavailable or a pass (WithFailOpen) when Redis is down, Internal
// for everything else, fail-open or not. Limiters of two Clients cannot be
// decided in one call: ErrMisconfigured.
func TestServerAllErrors(t *testing.T) {
	tests := []struct {
		name    string
		down    bool
		open    bool
		other   bool // the per-key limiter is another Client's
		noKey   bool
		code    codes.Code
		wantErr error
	}{
		{"no key, even failing open", false, true, false, true, codes.InvalidArgument, grpclimit.ErrNoKey},
		{"redis down", true, false, false, false, codes.Unavailable, redlimit.ErrUnavailable},
		{"redis down, failing open", true, true, false, false, codes.OK, redlimit.ErrUnavailable},
		{"two Clients, even failing open", false, true, true, false, codes.Internal, redlimit.ErrMisconfigured},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := miniredis.RunT(t)
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			if tt.down {
				m.Close()
			}
			client := redlimit.New(rdb)
			keyClient := client
			if tt.other {
				keyClient = redlimit.New(rdb)
			}
			hooked := new(hookedErrors)
			opts := []grpclimit.Option{grpclimit.WithErrorHook(hooked.hook)}
			if tt.open {
				opts = append(opts, grpclimit.WithFailOpen())
			}
			conn := allServer(t, client, []grpclimit.Policy{
				{Name: "per-peer", Limiter: func(_, ip string) *redlimit.Limiter {
					return client.FixedWindow("peer:" + ip).WithDefault(redlimit.PerMinute(5))
				}},
				{Name: "per-key", Key: grpclimit.Metadata("x-api-key"), Limiter: func(_, key string) *redlimit.Limiter {
					return keyClient.FixedWindow("key:" + key).WithDefault(redlimit.PerMinute(5))
				}},
			}, opts...)
			md := []string{"x-api-key", "a"}
			if tt.noKey {
				md = nil
			}
			for _, k := range []kind{unary, stream} {
				hooked.reset()
				if got := call(t, conn, k, md...); got.code != tt.code || len(got.fields) > 0 || got.retry != "" {
					t.Errorf("%s: %+v, want %v and no metadata", k, got, tt.code)
				}
				hooked.check(t, k, tt.wantErr)
			}
		})
	}
}

// TestServerAllCrossSlot: on a Cluster, limiters whose names have no
// common hash tag cannot be decided in one call: codes.Internal
// (ErrMisconfigured, never failed open), nothing sent, each limiter keeps
// every permit. Under one tag the same policies decide.
func TestServerAllCrossSlot(t *testing.T) {
	client := redlimit.New(redistest.SharedCluster(t).Client(t))
	name := redistest.UniqueName(t, "grpclimit-test:")
	tag := fmt.Sprintf("{all%x}", rand.Uint32())
	for _, tt := range []struct {
		peer, key string // the limiters' names
		code      codes.Code
		wantErr   error
		left      []int64
	}{
		{name + "a:peer", name + "b:key", codes.Internal, redlimit.ErrMisconfigured, []int64{5, 5}},
		{tag + name + "a:peer", tag + name + "b:key", codes.OK, nil, []int64{4, 4}},
	} {
		peer := client.FixedWindow(tt.peer).WithDefault(redlimit.PerMinute(5))
		key := client.FixedWindow(tt.key).WithDefault(redlimit.PerMinute(5))
		hooked := new(hookedErrors)
		conn := allServer(t, client, []grpclimit.Policy{
			{Name: "per-peer", Limiter: func(string, string) *redlimit.Limiter { return peer }},
			{Name: "per-key", Limiter: func(string, string) *redlimit.Limiter { return key }},
		}, grpclimit.WithFailOpen(), grpclimit.WithErrorHook(hooked.hook))
		got := call(t, conn, unary)
		hooked.check(t, unary, tt.wantErr)
		if errs := hooked.get(); got.code != tt.code || tt.wantErr != nil && !strings.Contains(errs[0].Error(), "hash") {
			t.Errorf("%s, %s: %+v, hook %v; want %v", tt.peer, tt.key, got, errs, tt.code)
		}
		if got := available(t, peer, key); !slices.Equal(got, tt.left) {
			t.Errorf("%s, %s: available %v, want %v", tt.peer, tt.key, got, tt.left)
		}
	}
}

// TestServerAllPanics: policies the interceptors cannot serve are refused
// when they are made, not on a call.
func TestServerAllPanics(t *testing.T) {
	client := redlimit.New(redistest.Miniredis(t))
	l := func(string, string) *redlimit.Limiter { return nil }
	for name, policies := range map[string][]grpclimit.Policy{
		"not ASCII":  {{Name: "ünï", Limiter: l}},
		"repeated":   {{Name: "a", Limiter: l}, {Name: "a", Limiter: l}},
		"no Limiter": {{Name: "a"}},
	} {
		for _, build := range []func(){
			func() { grpclimit.UnaryServerAll(client, policies) },
			func() { grpclimit.StreamServerAll(client, policies) },
		} {
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("%s: no panic", name)
					}
				}()
				build()
			}()
		}
	}
}

// TestServerAllGRPCServices: gRPC's own health service is let through
// before any KeyFunc or Limiter runs, unless WithLimitedGRPCServices.
func TestServerAllGRPCServices(t *testing.T) {
	client := redlimit.New(redistest.Miniredis(t))
	policies := []grpclimit.Policy{{Name: "a", Key: grpclimit.Metadata("x-api-key"), Limiter: func(method, key string) *redlimit.Limiter {
		t.Errorf("%s: a limiter asked for", method)
		return nil
	}}}
	conn := dial(t, serve(t,
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerAll(client, policies)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerAll(client, policies))))
	for _, k := range []kind{unary, stream} {
		if got := call(t, conn, k); got.code != codes.OK || len(got.fields) > 0 {
			t.Errorf("%s: %+v, want OK without metadata", k, got)
		}
	}
}
