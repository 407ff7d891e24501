package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
)

// TestPeerPrefix: IPv6 peers are keyed by their /64 by default, so the
// addresses of one subscriber share a limit; IPv4 ones, mapped or not, by
// address; PeerPrefix sets other lengths.
func TestPeerPrefix(t *testing.T) {
	tests := []struct {
		key   grpclimit.KeyFunc
		addrs []string
		want  string
	}{
		{grpclimit.PeerIP(), []string{"2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff::9"}, "2001:db8:1:2::/64"},
		{grpclimit.PeerIP(), []string{"2001:db8:1:3::1"}, "2001:db8:1:3::/64"},
		{grpclimit.PeerIP(), []string{"1.2.3.4", "::ffff:1.2.3.4"}, "1.2.3.4"},
		{grpclimit.PeerPrefix(24, 48), []string{"1.2.3.4", "::ffff:1.2.3.4", "1.2.3.5"}, "1.2.3.0/24"},
		{grpclimit.PeerPrefix(24, 48), []string{"2001:db8:1:2::1", "2001:db8:1:ffff::9"}, "2001:db8:1::/48"},
		{grpclimit.PeerPrefix(32, 128), []string{"2001:db8:1:2::1"}, "2001:db8:1:2::1"},
		{grpclimit.PeerPrefix(32, 128), []string{"::ffff:1.2.3.4"}, "1.2.3.4"},
	}
	for i, tt := range tests {
		for _, addr := range tt.addrs {
			// A TCP peer, and one of a transport of its own that only prints its address.
			ip := net.ParseIP(addr)
			for _, a := range []net.Addr{&net.TCPAddr{IP: ip, Port: 443}, printedAddr(net.JoinHostPort(addr, "443"))} {
				ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: a})
				if got, err := tt.key(ctx, "/s/m"); got != tt.want || err != nil {
					t.Errorf("case %d, peer %v: key %q, error %v; want %q", i, a, got, err, tt.want)
				}
			}
		}
	}
	for _, bits := range [][2]int{{-1, 64}, {33, 64}, {32, -1}, {32, 129}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("PeerPrefix(%d, %d): no panic", bits[0], bits[1])
				}
			}()
			grpclimit.PeerPrefix(bits[0], bits[1])
		}()
	}
}

type printedAddr string

func (a printedAddr) Network() string { return "custom" }
func (a printedAddr) String() string  { return string(a) }

// countingLimiter is a grpclimit.Allower of its own, granting every call
// out of 10 a minute and counting what it was asked.
type countingLimiter struct {
	mu      sync.Mutex
	methods []string
}

func (c *countingLimiter) Allow(ctx context.Context, permits int64) (redlimit.Result, error) {
	method, _ := grpc.Method(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.methods = append(c.methods, method)
	return redlimit.Result{Allowed: true, Limit: 10, Remaining: 10 - int64(len(c.methods)), ResetAfter: time.Minute, Window: time.Minute}, nil
}

func (c *countingLimiter) asked() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.methods)
}

// TestGRPCServicesUnlimited runs a real server with the reflection and
// health services, keyed by an API key as docs/middleware.md's example: grpcurl's
// calls (reflection, no key) and health checks go through without a key and
// spend nothing, while a service of the user's (grpc.testing.TestService) is
// limited. WithLimitedGRPCServices limits them all.
func TestGRPCServicesUnlimited(t *testing.T) {
	const emptyCall = "/grpc.testing.TestService/EmptyCall"
	for _, limitAll := range []bool{false, true} {
		t.Run(fmt.Sprintf("limited %v", limitAll), func(t *testing.T) {
			fake := new(countingLimiter)
			limiterFor := func(method, key string) *countingLimiter { return fake }
			opts := []grpclimit.Option{grpclimit.WithKey(grpclimit.Metadata("x-api-key"))}
			if limitAll {
				opts = append(opts, grpclimit.WithLimitedGRPCServices())
			}
			srv := grpc.NewServer(
				grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(limiterFor, opts...)),
				grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(limiterFor, opts...)))
			healthpb.RegisterHealthServer(srv, health.NewServer())
			reflection.Register(srv)
			testgrpc.RegisterTestServiceServer(srv, testgrpc.UnimplementedTestServiceServer{})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			conn := dial(t, lis.Addr().String())

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			withKey := metadata.AppendToOutgoingContext(ctx, "x-api-key", "k1")
			listServices := func(ctx context.Context) ([]string, error) {
				s, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
				if err != nil {
					return nil, err
				}
				// A stream the server already ended says io.EOF on Send; its
				// status comes from Recv.
				if err := s.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
					return nil, err
				}
				resp, err := s.Recv()
				if err != nil {
					return nil, err
				}
				var names []string
				for _, svc := range resp.GetListServicesResponse().GetService() {
					names = append(names, svc.GetName())
				}
				return names, s.CloseSend()
			}
			listV1alpha := func(ctx context.Context) error {
				s, err := reflectionv1alpha.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
				if err != nil {
					return err
				}
				//lint:ignore SA1019 deprecated, but grpcurl and older tools still ask for it, so it must pass unlimited too
				if err := s.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
					return err
				}
				_, err = s.Recv()
				return err
			}
			check := func(ctx context.Context) error {
				_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
				return err
			}
			empty := func(ctx context.Context) error {
				_, err := testgrpc.NewTestServiceClient(conn).EmptyCall(ctx, &testgrpc.Empty{})
				return err
			}

			noKey := codes.OK // what gRPC's services answer a call without a key
			wantAsked := []string{emptyCall}
			if limitAll {
				noKey = codes.InvalidArgument
				wantAsked = []string{healthpb.Health_Check_FullMethodName, reflectionpb.ServerReflection_ServerReflectionInfo_FullMethodName, emptyCall}
			}
			names, err := listServices(ctx)
			if status.Code(err) != noKey {
				t.Errorf("reflection without a key: %v, want %v", err, noKey)
			}
			if want := []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection", "grpc.testing.TestService"}; !limitAll && !slices.Equal(names, want) {
				t.Errorf("services %q, want %q", names, want)
			}
			if err := listV1alpha(ctx); status.Code(err) != noKey {
				t.Errorf("v1alpha reflection without a key: %v, want %v", err, noKey)
			}
			if err := check(ctx); status.Code(err) != noKey {
				t.Errorf("health check without a key: %v, want %v", err, noKey)
			}
			if err := empty(ctx); status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "grpclimit: no key: no x-api-key metadata" {
				t.Errorf("EmptyCall without a key: %v, want InvalidArgument", err)
			}
			if got := fake.asked(); len(got) != 0 {
				t.Errorf("calls without a key spent permits: %q", got)
			}
			// With a key, gRPC's services spend a permit only when limited.
			if err := check(withKey); err != nil {
				t.Errorf("health check with a key: %v", err)
			}
			if _, err := listServices(withKey); err != nil {
				t.Errorf("reflection with a key: %v", err)
			}
			var header metadata.MD
			_, err = testgrpc.NewTestServiceClient(conn).EmptyCall(withKey, &testgrpc.Empty{}, grpc.Header(&header))
			if status.Code(err) != codes.Unimplemented {
				t.Errorf("EmptyCall with a key: %v, want the handler's Unimplemented", err)
			}
			want := fmt.Sprintf(`"default";r=%d;t=60`, 10-len(wantAsked))
			if got := header.Get(grpclimit.RateLimitKey); !slices.Equal(got, []string{want}) {
				t.Errorf("EmptyCall's ratelimit %q, want %q", got, want)
			}
			if got := fake.asked(); !slices.Equal(got, wantAsked) {
				t.Errorf("limiter asked for %q\nwant %q", got, wantAsked)
			}
		})
	}
}

// fakeAcquirer is a grpclimit.Acquirer of its own, recording the permits
// it is asked for.
type fakeAcquirer struct{ permits []int64 }

func (f *fakeAcquirer) Acquire(_ context.Context, permits int64) error {
	f.permits = append(f.permits, permits)
	return nil
}

// TestFakeAcquirer: the client interceptors wait on any Acquirer; a nil one
// leaves the call unlimited.
func TestFakeAcquirer(t *testing.T) {
	fake := new(fakeAcquirer)
	intercept := grpclimit.UnaryClientInterceptor(func(_ context.Context, method string) *fakeAcquirer {
		if method == "/free/m" {
			return nil
		}
		return fake
	}, grpclimit.WithPermits(func(context.Context, string, any) int64 { return 2 }))
	invoked := 0
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		invoked++
		return nil
	}
	for _, method := range []string{"/s/m", "/free/m", "/s/m"} {
		if err := intercept(context.Background(), method, nil, nil, nil, invoker); err != nil {
			t.Fatal(err)
		}
	}
	if invoked != 3 || !slices.Equal(fake.permits, []int64{2, 2}) {
		t.Errorf("invoked %d times, permits asked %v; want 3, [2 2]", invoked, fake.permits)
	}
}

// TestBreakerOpenToldOnce: 10,000 calls answered by an open breaker are one
// call of the error hook, not 10,000, on the server and the client side; the
// failures that opened it are told each.
func TestBreakerOpenToldOnce(t *testing.T) {
	newClient := func(t *testing.T) *redlimit.Client {
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { _ = rdb.Close() })
		m.Close()
		return redlimit.New(rdb, redlimit.WithBreaker(3, time.Hour))
	}
	checkHooked := func(t *testing.T, errs []error) {
		t.Helper()
		if len(errs) != 4 {
			t.Fatalf("hook called %d times, want 4: %v", len(errs), errs[:min(len(errs), 6)])
		}
		for i, err := range errs {
			if open := errors.Is(err, redlimit.ErrBreakerOpen); !errors.Is(err, redlimit.ErrUnavailable) || open != (i == 3) {
				t.Errorf("error %d: %v; want ErrUnavailable, ErrBreakerOpen only for the last", i, err)
			}
		}
	}

	t.Run("server", func(t *testing.T) {
		client := newClient(t)
		var errs []error
		intercept := grpclimit.UnaryServerInterceptor(func(_, key string) *redlimit.Limiter {
			return client.FixedWindow("breaker:" + key).WithDefault(redlimit.PerSecond(10))
		}, grpclimit.WithKey(func(context.Context, string) (string, error) { return "k", nil }),
			grpclimit.WithErrorHook(func(_ context.Context, _ string, err error) { errs = append(errs, err) }))
		handler := func(context.Context, any) (any, error) { return nil, nil }
		for i := range 10_000 {
			if _, err := intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/s/m"}, handler); status.Code(err) != codes.Unavailable {
				t.Fatalf("call %d: %v, want Unavailable", i, err)
			}
		}
		checkHooked(t, errs)
	})

	t.Run("client", func(t *testing.T) {
		client := newClient(t)
		var errs []error
		intercept := grpclimit.UnaryClientInterceptor(func(_ context.Context, method string) *redlimit.Limiter {
			return client.FixedWindow("breaker:upstream").WithDefault(redlimit.PerSecond(10))
		}, grpclimit.WithErrorHook(func(_ context.Context, _ string, err error) { errs = append(errs, err) }))
		invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
		for i := range 10_000 {
			if err := intercept(context.Background(), "/s/m", nil, nil, nil, invoker); status.Code(err) != codes.Unavailable {
				t.Fatalf("call %d: %v, want Unavailable", i, err)
			}
		}
		checkHooked(t, errs)
	})
}
