package grpclimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// TestCallerGoneMidDecision: a caller that cancels its call while the call
// is being decided never gets the handler run, unary or stream, on a Client
// made WithFailOpen and with FailOpen: a caller that is gone is not an
// outage. Whether Redis had granted it or not, the error hook is not told.
func TestCallerGoneMidDecision(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		for _, ran := range []bool{false, true} {
			rdb := newRDB()
			hook := redistest.NewHeldDecision(ran)
			rdb.AddHook(hook)
			client := redlimit.New(rdb, redlimit.WithFailOpen())
			name := redistest.UniqueName(t, "grpclimit-test:")
			var handled, hooked atomic.Int64
			limiterFor := func(_, key string) *redlimit.Limiter {
				return client.FixedWindow(name + key).WithDefault(redlimit.PerMinute(5))
			}
			opts := []grpclimit.Option{grpclimit.WithLimitedGRPCServices(), grpclimit.WithFailOpen(), grpclimit.WithErrorHook(func(context.Context, string, error) { hooked.Add(1) })}
			// ended learns of each call's end on the server, after grpclimit's.
			ended := make(chan struct{}, 1)
			conn := dial(t, serve(t,
				grpc.ChainUnaryInterceptor(
					func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
						defer func() { ended <- struct{}{} }()
						return handler(ctx, req)
					},
					grpclimit.UnaryServerInterceptor(limiterFor, opts...),
					func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
						handled.Add(1)
						return handler(ctx, req)
					}),
				grpc.ChainStreamInterceptor(
					func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
						defer func() { ended <- struct{}{} }()
						return handler(srv, ss)
					},
					grpclimit.StreamServerInterceptor(limiterFor, opts...),
					func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
						handled.Add(1)
						return handler(srv, ss)
					})))
			health := healthpb.NewHealthClient(conn)
			for _, k := range []kind{unary, stream, unary} {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() {
					var err error
					if k == unary {
						_, err = health.Check(ctx, &healthpb.HealthCheckRequest{})
					} else {
						var s healthpb.Health_WatchClient
						if s, err = health.Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
							_, err = s.Recv()
						}
					}
					done <- err
				}()
				select {
				case <-hook.Arrived():
				case <-time.After(10 * time.Second):
					t.Fatal("the decision never reached Redis")
				}
				cancel()
				if err := <-done; status.Code(err) != codes.Canceled {
					t.Errorf("%s: %v, want Canceled", k, err)
				}
				select {
				case <-ended:
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: the server never ended the call", k)
				}
			}
			if handled.Load() != 0 || hooked.Load() != 0 {
				t.Errorf("script ran %v: handler ran %d times for 3 callers gone, error hook told %d times", ran, handled.Load(), hooked.Load())
			}
		}
	})
}
