package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
)

// Two calls a minute per API key, shared by every instance of the service,
// unary calls and streams alike. The health service stands for yours: gRPC's
// own health and reflection services are not limited unless
// WithLimitedGRPCServices says so.
func ExampleUnaryServerInterceptor() {
	mr, _ := miniredis.Run() // stands in for your Redis
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	now := func() time.Time { return time.Unix(1_800_000_030, 0) } // fixed, for a stable output
	client := redlimit.New(rdb, redlimit.WithClock(now))

	cfg := redlimit.PerMinute(2)
	limiterFor := func(method, key string) *redlimit.Limiter {
		return client.FixedWindow("rpc:" + key).WithDefault(cfg)
	}
	opts := []grpclimit.Option{grpclimit.WithKey(grpclimit.Metadata("x-api-key")), grpclimit.WithLimitedGRPCServices()}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(limiterFor, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(limiterFor, opts...)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()

	conn, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k-123")
	for range 3 {
		var header metadata.MD
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		st := status.Convert(err)
		fmt.Println(st.Code(), header.Get("ratelimit-policy"), header.Get("ratelimit"))
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Println("retry in", info.GetRetryDelay().AsDuration())
			}
		}
	}
	// Output:
	// OK ["default";q=2;w=60] ["default";r=1;t=30]
	// OK ["default";q=2;w=60] ["default";r=0;t=30]
	// ResourceExhausted ["default";q=2;w=60] ["default";r=0;t=30]
	// retry in 30s
}

// Every instance of a caller shares an upstream's quota of two calls a
// minute: a call waits for its turn, and one whose wait would pass its
// deadline fails at once, without reaching the upstream.
func ExampleUnaryClientInterceptor() {
	mr, _ := miniredis.Run() // stands in for your Redis
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	now := func() time.Time { return time.Unix(1_800_000_030, 0) } // fixed, for a stable output
	client := redlimit.New(rdb, redlimit.WithClock(now))

	srv := grpc.NewServer() // the upstream
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()

	quota := client.FixedWindow("upstream").WithDefault(redlimit.PerMinute(2))
	limiterFor := func(ctx context.Context, method string) *redlimit.Limiter { return quota }
	conn, _ := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(grpclimit.UnaryClientInterceptor(limiterFor)),
		grpc.WithChainStreamInterceptor(grpclimit.StreamClientInterceptor(limiterFor)))
	defer conn.Close()
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the quota is back in 30s
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			fmt.Println(status.Code(err), status.Convert(err).Message())
			continue
		}
		fmt.Println("OK")
	}
	// Output:
	// OK
	// OK
	// DeadlineExceeded grpclimit: the rate limit's wait would pass the call's deadline
}

// Per peer and per API key, decided at once: a call its key's limit
// denies takes nothing from the peer's, which every caller behind that
// address shares (chained interceptors would have counted it there). One
// hash tag keeps both limiters in one Redis Cluster slot.
func ExampleUnaryServerAll() {
	mr, _ := miniredis.Run() // stands in for your Redis
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	now := func() time.Time { return time.Unix(1_800_000_030, 0) } // fixed, for a stable output
	client := redlimit.New(rdb, redlimit.WithClock(now))

	perPeer := func(_, ip string) *redlimit.Limiter {
		return client.FixedWindow("{rpc}peer:" + ip).WithDefault(redlimit.PerMinute(3))
	}
	policies := []grpclimit.Policy{
		{Name: "per-peer", Limiter: perPeer},
		{Name: "per-key", Key: grpclimit.Metadata("x-api-key"), Limiter: func(_, key string) *redlimit.Limiter {
			return client.FixedWindow("{rpc}key:" + key).WithDefault(redlimit.PerMinute(1))
		}},
	}
	opts := []grpclimit.Option{grpclimit.WithLimitedGRPCServices()}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerAll(client, policies, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerAll(client, policies, opts...)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(lis)
	defer srv.Stop()

	conn, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	for _, key := range []string{"k-1", "k-1", "k-1", "k-2"} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
		var header metadata.MD
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		st := status.Convert(err)
		fmt.Println(key, st.Code(), header.Get("ratelimit"))
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Println("retry in", info.GetRetryDelay().AsDuration())
			}
		}
	}
	left, _ := perPeer("", "127.0.0.1").AvailablePermits(context.Background())
	fmt.Println("left for the peer:", left)
	// Output:
	// k-1 OK ["per-peer";r=2;t=30, "per-key";r=0;t=30]
	// k-1 ResourceExhausted ["per-peer";r=2;t=30, "per-key";r=0;t=30]
	// retry in 30s
	// k-1 ResourceExhausted ["per-peer";r=2;t=30, "per-key";r=0;t=30]
	// retry in 30s
	// k-2 OK ["per-peer";r=1;t=30, "per-key";r=0;t=30]
	// left for the peer: 1
}
