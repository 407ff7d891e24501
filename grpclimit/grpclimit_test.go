package grpclimit_test

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// serve starts a gRPC server on a loopback port with the health service,
// whose unary Check and List and server-streaming Watch stand for any
// service's methods, and returns its address.
func serve(t *testing.T, opts ...grpc.ServerOption) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// allButList limits every method of the health service but List (left
// unlimited) with a fixed window called name plus the caller's key, with
// cfg as its default.
func allButList(client *redlimit.Client, name string, cfg redlimit.Config) func(method, key string) *redlimit.Limiter {
	return func(method, key string) *redlimit.Limiter {
		if method == healthpb.Health_List_FullMethodName {
			return nil
		}
		return client.FixedWindow(name + key).WithDefault(cfg)
	}
}

// cost reads the x-cost metadata: the permits a call asks for, 1 without it.
func cost(xCost []string) int64 {
	n, err := strconv.ParseInt(strings.Join(xCost, ""), 10, 64)
	if err != nil {
		return 1
	}
	return n
}

// hookedErrors records what an error hook (WithErrorHook) is given.
type hookedErrors struct {
	mu   sync.Mutex
	errs []error
}

func (h *hookedErrors) hook(_ context.Context, _ string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs = append(h.errs, err)
}

func (h *hookedErrors) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs = nil
}

func (h *hookedErrors) get() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.errs)
}

// check reports, for the call k, unless the hook got nothing (want nil) or
// one error matching want.
func (h *hookedErrors) check(t *testing.T, k kind, want error) {
	t.Helper()
	hooked := h.get()
	switch {
	case want == nil && len(hooked) > 0:
		t.Errorf("%s: hook got %v, want nothing", k, hooked)
	case want != nil && (len(hooked) != 1 || !errors.Is(hooked[0], want)):
		t.Errorf("%s: hook got %v, want one error matching %v", k, hooked, want)
	}
}

// limitedServer is serve with both server interceptors. The health service
// stands for any service, so it is limited too (WithLimitedGRPCServices).
func limitedServer(t *testing.T, limiterFor func(method, key string) *redlimit.Limiter, opts ...grpclimit.Option) *grpc.ClientConn {
	opts = append([]grpclimit.Option{grpclimit.WithLimitedGRPCServices()}, opts...)
	return dial(t, serve(t,
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(limiterFor, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(limiterFor, opts...))))
}

// kind is how a test calls the health service.
type kind string

const (
	unary  kind = "Check" // unary
	stream kind = "Watch" // server streaming
	list   kind = "List"  // unary, left unlimited by the tests' limiterFor
)

// answer is what a caller sees of one call.
type answer struct {
	code   codes.Code
	msg    string
	fields map[string]string // the rate-limit header metadata, several values joined with " | "
	retry  string            // the RetryInfo delay, "" without one
}

// call makes one call of kind with md as its request metadata.
func call(t *testing.T, conn *grpc.ClientConn, k kind, md ...string) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	client := healthpb.NewHealthClient(conn)
	var header metadata.MD
	var err error
	switch k {
	case unary:
		_, err = client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	case list:
		_, err = client.List(ctx, &healthpb.HealthListRequest{}, grpc.Header(&header))
	case stream:
		var s healthpb.Health_WatchClient
		if s, err = client.Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
			// The server sends the status at once, then waits for changes:
			// one message is the whole call, and cancel ends it.
			_, err = s.Recv()
			header, _ = s.Header()
		}
	}
	st := status.Convert(err)
	a := answer{code: st.Code(), msg: st.Message(), fields: map[string]string{}}
	for _, key := range []string{grpclimit.PolicyKey, grpclimit.RateLimitKey, "retry-after"} {
		if v := header.Get(key); len(v) > 0 {
			a.fields[key] = strings.Join(v, " | ")
		}
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			a.retry = ri.GetRetryDelay().AsDuration().String()
		}
	}
	return a
}

// TestServersShareOneLimit runs two instances of a service, each with its own
// redlimit.Client and gRPC server, in front of one Redis: a caller's calls
// count against one limit whichever instance serves them, unary or stream.
func TestServersShareOneLimit(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		name := redistest.UniqueName(t, "grpclimit-test:")
		cfg := redlimit.PerMinute(3)
		var admin *redlimit.Client // to change the rate, as an operator would
		startInstance := func() *grpc.ClientConn {
			client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
			admin = client
			return limitedServer(t, allButList(client, name, cfg),
				grpclimit.WithKey(grpclimit.Metadata("x-api-key")),
				grpclimit.WithPermits(func(ctx context.Context, method string, req any) int64 {
					if isUnary := method == healthpb.Health_Check_FullMethodName; isUnary != (req != nil) {
						t.Errorf("%s: the permits function given request %v", method, req)
					}
					return cost(metadata.ValueFromIncomingContext(ctx, "x-cost"))
				}),
			)
		}
		instances := []*grpc.ClientConn{startInstance(), startInstance()}

		const policy = `"default";q=3;w=60`
		exceeded := "grpclimit: rate limit exceeded"
		steps := []struct {
			at       time.Duration // since redistest.WindowStart
			instance int
			kind     kind
			key      string // x-api-key
			cost     string // x-cost, "" for the default 1
			setRate  int64  // per minute, stored before the call when > 0
			want     answer
		}{
			{at: 15 * time.Second, instance: 0, kind: unary, key: "a", want: answer{code: codes.OK, fields: map[string]string{
				grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=2;t=45`}}},
			{at: 20 * time.Second, instance: 1, kind: stream, key: "a", want: answer{code: codes.OK, fields: map[string]string{
				grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=1;t=40`}}},
			{at: 20 * time.Second, instance: 0, kind: unary, key: "a", want: answer{code: codes.OK, fields: map[string]string{
				grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=0;t=40`}}},
			// The limit is spent on both instances: denied until the window
			// ends, RetryInfo exact, t rounded up to whole seconds.
			{at: 21 * time.Second, instance: 1, kind: unary, key: "a", want: answer{code: codes.ResourceExhausted, msg: exceeded, retry: "39s", fields: map[string]string{
				grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=0;t=39`}}},
			{at: 21500 * time.Millisecond, instance: 0, kind: stream, key: "a", want: answer{code: codes.ResourceExhausted, msg: exceeded, retry: "38.5s", fields: map[string]string{
				grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=0;t=39`}}},
			// A method limiterFor leaves unlimited.
			{at: 21500 * time.Millisecond, instance: 1, kind: list, key: "a", want: answer{code: codes.OK, fields: map[string]string{}}},
			// Another caller has its own limit.
			{at: 21500 * time.Millisecond, instance: 1, kind: stream, key: "b", want: answer{code: codes.OK, fields: map[string]string{
				grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=2;t=39`}}},
			// A new window.
			{at: 60 * time.Second, instance: 1, kind: unary, key: "a", want: answer{code: codes.OK, fields: map[string]string{
				grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=2;t=60`}}},
			{at: 61 * time.Second, instance: 0, kind: unary, key: "a", cost: "2", want: answer{code: codes.OK, fields: map[string]string{
				grpclimit.PolicyKey: policy, grpclimit.RateLimitKey: `"default";r=0;t=59`}}},
			// More than the limit can ever grant: no wait would help, so no
			// RetryInfo, and no ratelimit item to say when to come back; the
			// policy's q is the most a call may ask for.
			{at: 61 * time.Second, instance: 1, kind: unary, key: "b", cost: "4", want: answer{code: codes.ResourceExhausted, msg: "grpclimit: more permits than the rate limit grants", fields: map[string]string{
				grpclimit.PolicyKey: policy}}},
			// A rate stored in Redis wins over the handles' default, on every
			// instance at once: q follows it with no extra round trip.
			{at: 62 * time.Second, instance: 1, kind: stream, key: "a", setRate: 5, want: answer{code: codes.OK, fields: map[string]string{
				grpclimit.PolicyKey: `"default";q=5;w=60`, grpclimit.RateLimitKey: `"default";r=1;t=58`}}},
		}
		for i, step := range steps {
			now.Set(redistest.WindowStart.Add(step.at))
			if step.setRate > 0 {
				if err := admin.FixedWindow(name+step.key).SetRate(context.Background(), redlimit.PerMinute(step.setRate)); err != nil {
					t.Fatal(err)
				}
			}
			md := []string{"x-api-key", step.key}
			if step.cost != "" {
				md = append(md, "x-cost", step.cost)
			}
			got := call(t, instances[step.instance], step.kind, md...)
			if got.code != step.want.code || got.msg != step.want.msg || got.retry != step.want.retry || !maps.Equal(got.fields, step.want.fields) {
				t.Errorf("step %d (+%v, instance %d, %s): %+v\nwant %+v", i, step.at, step.instance, step.kind, got, step.want)
			}
		}
	})
}

// TestPeerIP: without a KeyFunc, calls are keyed by the peer's address, and
// policy names are quoted as httplimit quotes them.
func TestPeerIP(t *testing.T) {
	rdb := redistest.Miniredis(t)
	client := redlimit.New(rdb, redlimit.WithClock(func() time.Time { return redistest.WindowStart }))
	var keys []string
	var mu sync.Mutex
	conn := limitedServer(t, func(method, key string) *redlimit.Limiter {
		mu.Lock()
		keys = append(keys, key)
		mu.Unlock()
		return client.Funnel("peer:" + key).WithDefault(redlimit.Config{Rate: 1, Interval: time.Second, Burst: 2})
	}, grpclimit.WithPolicy(`per "ip"`))

	want := []answer{
		{code: codes.OK, fields: map[string]string{grpclimit.PolicyKey: `"per \"ip\"";q=2;w=2`, grpclimit.RateLimitKey: `"per \"ip\"";r=1;t=1`}},
		{code: codes.OK, fields: map[string]string{grpclimit.PolicyKey: `"per \"ip\"";q=2;w=2`, grpclimit.RateLimitKey: `"per \"ip\"";r=0;t=2`}},
		{code: codes.ResourceExhausted, msg: "grpclimit: rate limit exceeded", retry: "1s", fields: map[string]string{grpclimit.PolicyKey: `"per \"ip\"";q=2;w=2`, grpclimit.RateLimitKey: `"per \"ip\"";r=0;t=1`}},
	}
	for i, k := range []kind{unary, stream, unary} {
		if got := call(t, conn, k); got.code != want[i].code || got.msg != want[i].msg || got.retry != want[i].retry || !maps.Equal(got.fields, want[i].fields) {
			t.Errorf("call %d (%s): %+v\nwant %+v", i, k, got, want[i])
		}
	}
	if !slices.Equal(keys, []string{"127.0.0.1", "127.0.0.1", "127.0.0.1"}) {
		t.Errorf("keys %q", keys)
	}
}

// TestSeveralRates: a token bucket of two rates lists both in
// ratelimit-policy, each named after its window, and ratelimit reports the
// rate that bound each decision; RetryInfo holds that rate's exact wait.
func TestSeveralRates(t *testing.T) {
	redistest.EachBackend(t, redistest.Servers, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := new(redistest.Clock)
		name := redistest.UniqueName(t, "grpclimit-test:")
		client := redlimit.New(newRDB(), redlimit.WithClock(now.Now))
		conn := limitedServer(t, func(_, key string) *redlimit.Limiter {
			return client.TokenBucket(name + key).WithDefault(redlimit.PerSecond(2).And(redlimit.PerMinute(3)))
		}, grpclimit.WithPolicy("rpc"))

		const both = `"rpc/1s";q=2;w=1, "rpc/1m";q=3;w=60`
		exceeded := "grpclimit: rate limit exceeded"
		fields := func(rateLimit string) map[string]string {
			return map[string]string{grpclimit.PolicyKey: both, grpclimit.RateLimitKey: rateLimit}
		}
		steps := []struct {
			at   time.Duration // since redistest.WindowStart
			kind kind
			want answer
		}{
			// The second has fewer left: it binds, and t is within its window.
			{10 * time.Second, unary, answer{code: codes.OK, fields: fields(`"rpc/1s";r=1;t=1`)}},
			{10 * time.Second, stream, answer{code: codes.OK, fields: fields(`"rpc/1s";r=0;t=1`)}},
			// The second denies until its grants come back at 11s.
			{10500 * time.Millisecond, unary, answer{code: codes.ResourceExhausted, msg: exceeded, retry: "500ms", fields: fields(`"rpc/1s";r=0;t=1`)}},
			// The minute's last permit: the minute binds, full again when
			// this grant comes back, at 71s.
			{11 * time.Second, unary, answer{code: codes.OK, fields: fields(`"rpc/1m";r=0;t=60`)}},
			// The minute denies until the first grant comes back, at 70s.
			{30 * time.Second, stream, answer{code: codes.ResourceExhausted, msg: exceeded, retry: "40s", fields: fields(`"rpc/1m";r=0;t=40`)}},
		}
		for i, step := range steps {
			now.Set(redistest.WindowStart.Add(step.at))
			if got := call(t, conn, step.kind); got.code != step.want.code || got.msg != step.want.msg || got.retry != step.want.retry || !maps.Equal(got.fields, step.want.fields) {
				t.Errorf("step %d (+%v, %s): %+v\nwant %+v", i, step.at, step.kind, got, step.want)
			}
		}
	})
}

// TestServerErrors covers what happens when no decision can be made, for
// unary calls and streams alike.
func TestServerErrors(t *testing.T) {
	type limiterFor func(*redlimit.Client) func(method, key string) *redlimit.Limiter
	withDefault := func(client *redlimit.Client) func(string, string) *redlimit.Limiter {
		return func(_, key string) *redlimit.Limiter {
			return client.FixedWindow("errors:" + key).WithDefault(redlimit.PerSecond(10))
		}
	}
	withoutConfig := func(client *redlimit.Client) func(string, string) *redlimit.Limiter {
		return func(_, key string) *redlimit.Limiter { return client.FixedWindow("errors:" + key) }
	}
	unauthenticated := status.Error(codes.Unauthenticated, "who are you?")

	tests := []struct {
		name       string
		limiterFor limiterFor
		clientOpts []redlimit.Option
		opts       []grpclimit.Option
		redis      string // "down", or "auth": requires a password the client lacks
		code       codes.Code
		wantErr    error // nil: the hook must not be called
	}{
		{"no key: InvalidArgument, even failing open", withDefault, nil, []grpclimit.Option{grpclimit.WithKey(grpclimit.Metadata("x-api-key")), grpclimit.WithFailOpen()}, "", codes.InvalidArgument, grpclimit.ErrNoKey},
		{"a key func's status is the call's", withDefault, nil, []grpclimit.Option{grpclimit.WithKey(func(context.Context, string) (string, error) { return "", unauthenticated })}, "", codes.Unauthenticated, unauthenticated},
		{"not initialized: Internal, even failing open", withoutConfig, nil, []grpclimit.Option{grpclimit.WithFailOpen()}, "", codes.Internal, redlimit.ErrNotInitialized},
		{"negative permits: Internal", withDefault, nil, []grpclimit.Option{grpclimit.WithPermits(func(context.Context, string, any) int64 { return -1 })}, "", codes.Internal, redlimit.ErrInvalidPermits},
		{"misconfigured: Internal, even failing open", withDefault, nil, []grpclimit.Option{grpclimit.WithFailOpen()}, "auth", codes.Internal, redlimit.ErrMisconfigured},
		{"misconfigured: Internal, even if the Client fails open", withDefault, []redlimit.Option{redlimit.WithFailOpen()}, nil, "auth", codes.Internal, redlimit.ErrMisconfigured},
		{"redis down: Unavailable", withDefault, nil, nil, "down", codes.Unavailable, redlimit.ErrUnavailable},
		{"redis down: fail open", withDefault, nil, []grpclimit.Option{grpclimit.WithFailOpen()}, "down", codes.OK, redlimit.ErrUnavailable},
		{"redis down: the Client fails open", withDefault, []redlimit.Option{redlimit.WithFailOpen()}, nil, "down", codes.OK, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := miniredis.RunT(t)
			// No retries: a closed miniredis refuses at once, and each dial retry would only add 100ms.
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
			t.Cleanup(func() { _ = rdb.Close() })
			switch tt.redis {
			case "down":
				m.Close()
			case "auth":
				m.RequireAuth("secret")
			}
			hooked := new(hookedErrors)
			opts := append([]grpclimit.Option{grpclimit.WithErrorHook(hooked.hook)}, tt.opts...)
			conn := limitedServer(t, tt.limiterFor(redlimit.New(rdb, tt.clientOpts...)), opts...)

			for _, k := range []kind{unary, stream} {
				hooked.reset()
				got := call(t, conn, k)
				if got.code != tt.code {
					t.Errorf("%s: %v %q, want %v", k, got.code, got.msg, tt.code)
				}
				if len(got.fields) > 0 || got.retry != "" {
					t.Errorf("%s: rate-limit fields %v, RetryInfo %q without a decision", k, got.fields, got.retry)
				}
				hooked.check(t, k, tt.wantErr)
			}
		})
	}
}

// TestMisconfiguredRealRedis: a real server's refusal (WRONGPASS: a user that
// does not exist, so the server is left as it is) is ErrMisconfigured, and
// WithFailOpen lets no call through, on the server or the caller side.
func TestMisconfiguredRealRedis(t *testing.T) {
	s := redistest.Shared(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: "grpclimit-nobody", Password: "nope", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	client := redlimit.New(rdb)
	name := redistest.UniqueName(t, "grpclimit-test:")
	hookedErrs := new(hookedErrors)
	hook := grpclimit.WithErrorHook(hookedErrs.hook)
	server := limitedServer(t, func(_, key string) *redlimit.Limiter {
		return client.FixedWindow(name + key).WithDefault(redlimit.PerSecond(10))
	}, grpclimit.WithFailOpen(), hook)
	addr, reached := upstream(t)
	caller := limitedCaller(t, addr, func(context.Context, string) *redlimit.Limiter {
		return client.FixedWindow(name + "upstream").WithDefault(redlimit.PerSecond(10))
	}, grpclimit.WithFailOpen(), hook)

	for _, k := range []kind{unary, stream} {
		if got := call(t, server, k); got.code != codes.Internal || got.msg != "grpclimit: rate limiter misconfigured" {
			t.Errorf("server, %s: %v %q, want Internal", k, got.code, got.msg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if st := clientCall(ctx, caller, k); st.Code() != codes.Internal || st.Message() != "grpclimit: rate limiter misconfigured" {
			t.Errorf("caller, %s: %v %q, want Internal", k, st.Code(), st.Message())
		}
		cancel()
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d calls reached the upstream", n)
	}
	hooked := hookedErrs.get()
	if len(hooked) != 4 {
		t.Errorf("hook got %v, want four ErrMisconfigured", hooked)
	}
	for _, err := range hooked {
		if !errors.Is(err, redlimit.ErrMisconfigured) {
			t.Errorf("hook got %v, want ErrMisconfigured", err)
		}
	}
}

// TestCallerGone: a call whose caller has gone away ends with its context's
// code, and that is not an error to report.
func TestCallerGone(t *testing.T) {
	rdb := redistest.Miniredis(t)
	client := redlimit.New(rdb)
	hooked := false
	intercept := grpclimit.UnaryServerInterceptor(func(_, key string) *redlimit.Limiter {
		return client.FixedWindow("gone:" + key).WithDefault(redlimit.PerSecond(1))
	}, grpclimit.WithKey(func(context.Context, string) (string, error) { return "k", nil }),
		grpclimit.WithErrorHook(func(context.Context, string, error) { hooked = true }))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	_, err := intercept(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/s/m"}, func(context.Context, any) (any, error) {
		called = true
		return nil, nil
	})
	if status.Code(err) != codes.Canceled || called || hooked {
		t.Errorf("err %v, handler called: %v, hook called: %v", err, called, hooked)
	}
}
