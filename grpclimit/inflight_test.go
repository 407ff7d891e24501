package grpclimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// heldLimit returns how many holds l lists.
func heldLimit(t *testing.T, l *redlimit.InFlight) int {
	t.Helper()
	list, err := l.Holders(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// blocking is a unary interceptor, after the one under test, that keeps
// each Check call in its handler until let through: a slow handler.
func blocking(entered chan<- struct{}, release <-chan struct{}) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != healthpb.Health_Check_FullMethodName {
			return handler(ctx, req)
		}
		entered <- struct{}{}
		<-release
		return handler(ctx, req)
	}
}

// Two instances of a service share one in-flight limit of 2: while two
// unary calls are in their handlers, a third fails with
// codes.ResourceExhausted at once; each slot comes back as its handler
// returns. A stream holds its slot for its whole life.
func TestInFlightInterceptors(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		name := redistest.UniqueName(t, "grpclimit-test:")
		cfg := redlimit.InFlightConfig{Limit: 2, TTL: 30 * time.Second}
		entered, release := make(chan struct{}, 4), make(chan struct{})
		var conns []*grpc.ClientConn
		for range 2 {
			client := redlimit.New(newRDB())
			limitFor := func(method, key string) *redlimit.InFlight {
				if method == healthpb.Health_List_FullMethodName {
					return nil
				}
				return client.InFlight(name).WithDefault(cfg)
			}
			opts := []grpclimit.Option{grpclimit.WithLimitedGRPCServices()}
			conns = append(conns, dial(t, serve(t,
				grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInFlight(limitFor, opts...), blocking(entered, release)),
				grpc.ChainStreamInterceptor(grpclimit.StreamServerInFlight(limitFor, opts...)))))
		}
		limit := redlimit.New(newRDB()).InFlight(name)

		answers := make(chan codes.Code, 2)
		for i := range 2 {
			go func() { answers <- call(t, conns[i], unary).code }()
			<-entered
		}
		if n := heldLimit(t, limit); n != 2 {
			t.Fatalf("%d held, want 2", n)
		}
		full := call(t, conns[0], unary)
		if full.code != codes.ResourceExhausted || full.retry != "" {
			t.Fatalf("third call: %v %q (RetryInfo %q), want ResourceExhausted without RetryInfo", full.code, full.msg, full.retry)
		}
		if a := call(t, conns[1], stream); a.code != codes.ResourceExhausted {
			t.Fatalf("a stream: %v, want ResourceExhausted", a.code)
		}
		if a := call(t, conns[1], list); a.code != codes.OK {
			t.Fatalf("an unlimited method: %v", a.code)
		}
		release <- struct{}{}
		release <- struct{}{}
		for range 2 {
			if code := <-answers; code != codes.OK {
				t.Fatalf("released call: %v", code)
			}
		}
		if n := heldLimit(t, limit); n != 0 {
			t.Fatalf("%d held after the handlers returned", n)
		}

		// A stream holds its slot until it ends.
		ctx, cancel := context.WithCancel(context.Background())
		watch, err := healthpb.NewHealthClient(conns[0]).Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := watch.Recv(); err != nil {
			t.Fatal(err)
		}
		if n := heldLimit(t, limit); n != 1 {
			t.Fatalf("%d held by an open stream, want 1", n)
		}
		cancel()
		deadline := time.Now().Add(5 * time.Second)
		for heldLimit(t, limit) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("the ended stream's slot was not released")
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// WithMaxWait: a call waits for a slot: granted when one comes free in
// time, ResourceExhausted when none does.
func TestInFlightInterceptorMaxWait(t *testing.T) {
	client := redlimit.New(redistest.Miniredis(t))
	exports := client.InFlight(redistest.UniqueName(t, "grpclimit-test:")).WithDefault(redlimit.InFlightConfig{Limit: 1, TTL: 30 * time.Second})
	limitFor := func(string, string) *redlimit.InFlight { return exports }
	entered, release := make(chan struct{}, 4), make(chan struct{})
	serveWaiting := func(wait time.Duration) *grpc.ClientConn {
		return dial(t, serve(t, grpc.ChainUnaryInterceptor(
			grpclimit.UnaryServerInFlight(limitFor, grpclimit.WithLimitedGRPCServices(), grpclimit.WithMaxWait(wait)),
			blocking(entered, release))))
	}
	patient, brief := serveWaiting(5*time.Second), serveWaiting(60*time.Millisecond)

	busy := make(chan codes.Code, 1)
	go func() { busy <- call(t, patient, unary).code }()
	<-entered
	start := time.Now()
	if a := call(t, brief, unary); a.code != codes.ResourceExhausted {
		t.Fatalf("no slot within the wait: %v, want ResourceExhausted", a.code)
	}
	if waited := time.Since(start); waited < 60*time.Millisecond {
		t.Fatalf("answered after %v, before the wait ended", waited)
	}
	waiter := make(chan codes.Code, 1)
	go func() { waiter <- call(t, patient, unary).code }()
	time.Sleep(100 * time.Millisecond)
	release <- struct{}{}
	if code := <-busy; code != codes.OK {
		t.Fatalf("busy: %v", code)
	}
	<-entered
	release <- struct{}{}
	if code := <-waiter; code != codes.OK {
		t.Fatalf("a slot came free within the wait: %v, want OK", code)
	}
}

// Errors map as the rate interceptors' do: an unavailable Redis fails the
// call with codes.Unavailable, or with WithFailOpen lets it through, the error
// hook told either way; a hold lost under the handler is told to it when
// it is released.
func TestInFlightInterceptorErrors(t *testing.T) {
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { down.Close() })
	cfg := redlimit.InFlightConfig{Limit: 1, TTL: 30 * time.Second}
	unavailable := redlimit.New(down).InFlight("x").WithDefault(cfg)
	hooked := &hookedErrors{}
	for _, open := range []bool{false, true} {
		opts := []grpclimit.Option{grpclimit.WithLimitedGRPCServices(), grpclimit.WithErrorHook(hooked.hook)}
		if open {
			opts = append(opts, grpclimit.WithFailOpen())
		}
		conn := dial(t, serve(t, grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInFlight(
			func(string, string) *redlimit.InFlight { return unavailable }, opts...))))
		want := codes.Unavailable
		if open {
			want = codes.OK
		}
		if a := call(t, conn, unary); a.code != want {
			t.Errorf("fail open %v: %v, want %v", open, a.code, want)
		}
		hooked.check(t, unary, redlimit.ErrUnavailable)
		hooked.reset()
	}

	client := redlimit.New(redistest.Miniredis(t))
	exports := client.InFlight(redistest.UniqueName(t, "grpclimit-test:")).WithDefault(cfg)
	deleting := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, err := exports.Delete(ctx); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
	conn := dial(t, serve(t, grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInFlight(
		func(string, string) *redlimit.InFlight { return exports },
		grpclimit.WithLimitedGRPCServices(), grpclimit.WithErrorHook(hooked.hook)), deleting)))
	if a := call(t, conn, unary); a.code != codes.OK {
		t.Fatalf("%v %s", a.code, a.msg)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(hooked.get()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // the release runs as the handler returns, after the reply may be sent
	}
	if errs := hooked.get(); len(errs) != 1 || !errors.Is(errs[0], redlimit.ErrHoldLost) {
		t.Fatalf("hook got %v, want ErrHoldLost", errs)
	}
}
