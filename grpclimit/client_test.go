package grpclimit_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// upstream starts the rate-limited service the callers call, and counts the
// calls that reach it.
func upstream(t *testing.T) (addr string, reached *atomic.Int64) {
	reached = new(atomic.Int64)
	addr = serve(t,
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			reached.Add(1)
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			reached.Add(1)
			return handler(srv, ss)
		}))
	return addr, reached
}

// limitedCaller dials addr through both client interceptors.
func limitedCaller(t *testing.T, addr string, limiterFor func(ctx context.Context, method string) *redlimit.Limiter, opts ...grpclimit.Option) *grpc.ClientConn {
	return dial(t, addr,
		grpc.WithChainUnaryInterceptor(grpclimit.UnaryClientInterceptor(limiterFor, opts...)),
		grpc.WithChainStreamInterceptor(grpclimit.StreamClientInterceptor(limiterFor, opts...)))
}

// clientCall makes one call of kind on ctx and returns its status.
func clientCall(ctx context.Context, conn *grpc.ClientConn, k kind, md ...string) *status.Status {
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	client := healthpb.NewHealthClient(conn)
	var err error
	switch k {
	case unary:
		_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	case list:
		_, err = client.List(ctx, &healthpb.HealthListRequest{})
	case stream:
		var s healthpb.Health_WatchClient
		if s, err = client.Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
			_, err = s.Recv()
		}
	}
	return status.Convert(err)
}

// costFromMetadata reads a call's permits from its outgoing x-cost metadata.
func costFromMetadata(ctx context.Context, _ string, _ any) int64 {
	md, _ := metadata.FromOutgoingContext(ctx)
	return cost(md.Get("x-cost"))
}

// TestClientWaits runs two instances of a caller, each with its own
// redlimit.Client, sharing the quota of one upstream: a call waits for its
// permits, and fails at once when the wait would pass its deadline.
//
// Acquire sleeps in real time for the RetryAfter the controlled clock gave
// it. So that the next attempt finds the permits free, the clock jumps by
// that wait as the denial is observed (when a step says so): the waits are
// exact, the real sleeps short.
func TestClientWaits(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		name := redistest.UniqueName(t, "grpclimit-test:")
		cfg := redlimit.PerSecond(2)
		addr, reached := upstream(t)

		var mu sync.Mutex
		var decisions []string
		var advance atomic.Bool
		observe := func(d redlimit.Decision) {
			mu.Lock()
			defer mu.Unlock()
			decisions = append(decisions, fmt.Sprintf("allowed=%v r=%d wait=%v", d.Result.Allowed, d.Result.Remaining, d.Result.RetryAfter))
			if advance.Load() && !d.Result.Allowed && d.Result.RetryAfter > 0 {
				now.Add(d.Result.RetryAfter)
			}
		}
		startInstance := func() *grpc.ClientConn {
			client := redlimit.New(newRDB(), redlimit.WithClock(now.Now), redlimit.WithObserver(observe))
			limiterFor := allButList(client, name, cfg)
			return limitedCaller(t, addr, func(_ context.Context, method string) *redlimit.Limiter {
				return limiterFor(method, "")
			}, grpclimit.WithPermits(costFromMetadata))
		}
		instances := []*grpc.ClientConn{startInstance(), startInstance()}

		const tooLong = "grpclimit: the rate limit's wait would pass the call's deadline"
		steps := []struct {
			at        time.Duration // since redistest.WindowStart; 0 keeps the clock where it is
			instance  int
			kind      kind
			cost      string
			timeout   time.Duration
			advance   bool // jump the clock by a denial's wait
			code      codes.Code
			msg       string
			reached   bool
			decisions []string
			minWait   time.Duration // real time the call must have taken
		}{
			{at: 500 * time.Millisecond, instance: 0, kind: unary, timeout: 5 * time.Second, code: codes.OK, reached: true,
				decisions: []string{"allowed=true r=1 wait=0s"}},
			{instance: 1, kind: stream, timeout: 5 * time.Second, code: codes.OK, reached: true,
				decisions: []string{"allowed=true r=0 wait=0s"}},
			// The quota is spent until +1s: 500ms to wait, 250ms left.
			{instance: 0, kind: unary, timeout: 250 * time.Millisecond, code: codes.DeadlineExceeded, msg: tooLong,
				decisions: []string{"allowed=false r=0 wait=500ms"}},
			{instance: 1, kind: stream, timeout: 250 * time.Millisecond, code: codes.DeadlineExceeded, msg: tooLong,
				decisions: []string{"allowed=false r=0 wait=500ms"}},
			// 100ms to wait, 5s left: the call waits, then goes ahead in the
			// next window.
			{at: 900 * time.Millisecond, instance: 1, kind: unary, timeout: 5 * time.Second, advance: true, code: codes.OK, reached: true,
				decisions: []string{"allowed=false r=0 wait=100ms", "allowed=true r=1 wait=0s"}, minWait: 100 * time.Millisecond},
			{instance: 0, kind: stream, timeout: 5 * time.Second, code: codes.OK, reached: true,
				decisions: []string{"allowed=true r=0 wait=0s"}},
			{at: 1950 * time.Millisecond, instance: 0, kind: stream, timeout: 5 * time.Second, advance: true, code: codes.OK, reached: true,
				decisions: []string{"allowed=false r=0 wait=50ms", "allowed=true r=1 wait=0s"}, minWait: 50 * time.Millisecond},
			// A method limiterFor leaves unlimited: no decision.
			{instance: 1, kind: list, timeout: 5 * time.Second, code: codes.OK, reached: true},
			// More than the quota: no wait would help.
			{instance: 1, kind: unary, cost: "3", timeout: 5 * time.Second, code: codes.ResourceExhausted, msg: "grpclimit: more permits than the rate limit grants",
				decisions: []string{"allowed=false r=1 wait=-1ns"}},
		}
		for i, step := range steps {
			if step.at > 0 {
				now.Set(redistest.WindowStart.Add(step.at))
			}
			advance.Store(step.advance)
			mu.Lock()
			decisions = nil
			mu.Unlock()
			before := reached.Load()
			var md []string
			if step.cost != "" {
				md = []string{"x-cost", step.cost}
			}

			ctx, cancel := context.WithTimeout(context.Background(), step.timeout)
			start := time.Now()
			st := clientCall(ctx, instances[step.instance], step.kind, md...)
			took := time.Since(start)
			cancel()

			mu.Lock()
			got := decisions
			mu.Unlock()
			if st.Code() != step.code || st.Message() != step.msg || (reached.Load() > before) != step.reached || !slices.Equal(got, step.decisions) || took < step.minWait {
				t.Errorf("step %d (%s on %d): %v %q, reached upstream: %v, decisions %q, took %v\nwant %v %q, %v, %q, at least %v",
					i, step.kind, step.instance, st.Code(), st.Message(), reached.Load() > before, got, took,
					step.code, step.msg, step.reached, step.decisions, step.minWait)
			}
		}
	})
}

// TestClientErrors covers what happens when no decision can be made, for
// unary calls and streams alike.
func TestClientErrors(t *testing.T) {
	withDefault := func(client *redlimit.Client) func(context.Context, string) *redlimit.Limiter {
		return func(context.Context, string) *redlimit.Limiter {
			return client.FixedWindow("client-errors").WithDefault(redlimit.PerMinute(1))
		}
	}
	withoutConfig := func(client *redlimit.Client) func(context.Context, string) *redlimit.Limiter {
		return func(context.Context, string) *redlimit.Limiter { return client.FixedWindow("client-errors") }
	}
	tests := []struct {
		name       string
		limiterFor func(*redlimit.Client) func(context.Context, string) *redlimit.Limiter
		clientOpts []redlimit.Option
		opts       []grpclimit.Option
		redis      string // "down"; "auth": requires a password the client lacks; "spent": the limit is used up
		cancel     bool   // cancel the call after 100ms
		code       codes.Code
		reached    bool
		wantErr    error // nil: the hook must not be called
	}{
		{"redis down: Unavailable", withDefault, nil, nil, "down", false, codes.Unavailable, false, redlimit.ErrUnavailable},
		{"redis down: fail open", withDefault, nil, []grpclimit.Option{grpclimit.WithFailOpen()}, "down", false, codes.OK, true, redlimit.ErrUnavailable},
		{"redis down: the Client fails open", withDefault, []redlimit.Option{redlimit.WithFailOpen()}, nil, "down", false, codes.OK, true, nil},
		{"misconfigured: Internal, even failing open", withDefault, nil, []grpclimit.Option{grpclimit.WithFailOpen()}, "auth", false, codes.Internal, false, redlimit.ErrMisconfigured},
		{"not initialized: Internal, even failing open", withoutConfig, nil, []grpclimit.Option{grpclimit.WithFailOpen()}, "", false, codes.Internal, false, redlimit.ErrNotInitialized},
		{"negative permits: Internal", withDefault, nil, []grpclimit.Option{grpclimit.WithPermits(func(context.Context, string, any) int64 { return -1 })}, "", false, codes.Internal, false, redlimit.ErrInvalidPermits},
		{"canceled while waiting: Canceled, not an error", withDefault, nil, nil, "spent", true, codes.Canceled, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := miniredis.RunT(t)
			// No retries: a closed miniredis refuses at once, and each dial retry would only add 100ms.
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
			t.Cleanup(func() { _ = rdb.Close() })
			client := redlimit.New(rdb, append([]redlimit.Option{redlimit.WithClock(func() time.Time { return redistest.WindowStart })}, tt.clientOpts...)...)
			switch tt.redis {
			case "down":
				m.Close()
			case "auth":
				m.RequireAuth("secret")
			case "spent":
				if err := tt.limiterFor(client)(context.Background(), "").Acquire(context.Background(), 1); err != nil {
					t.Fatal(err)
				}
			}
			hooked := new(hookedErrors)
			opts := append([]grpclimit.Option{grpclimit.WithErrorHook(hooked.hook)}, tt.opts...)
			addr, reached := upstream(t)
			conn := limitedCaller(t, addr, tt.limiterFor(client), opts...)

			for _, k := range []kind{unary, stream} {
				hooked.reset()
				before := reached.Load()
				ctx, cancel := context.WithCancel(context.Background())
				if tt.cancel {
					time.AfterFunc(100*time.Millisecond, cancel)
				}
				st := clientCall(ctx, conn, k)
				cancel()
				if st.Code() != tt.code || (reached.Load() > before) != tt.reached {
					t.Errorf("%s: %v %q, reached upstream: %v; want %v, %v", k, st.Code(), st.Message(), reached.Load() > before, tt.code, tt.reached)
				}
				hooked.check(t, k, tt.wantErr)
			}
		})
	}
}
