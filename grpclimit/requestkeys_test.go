package grpclimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// keysUnder lists the keys that start with prefix, on every primary of a
// Cluster.
func keysUnder(t *testing.T, rdb redis.UniversalClient, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex // ForEachMaster scans every primary at once
	var keys []string
	scan := func(c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cluster, ok := rdb.(*redis.ClusterClient); ok {
		err = cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error { return scan(c) })
	} else {
		err = scan(rdb)
	}
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

// TestKeysFromMetadata: a metadata value is a key like any other, whatever
// it holds. Each hostile value is limited as any caller is (two calls, then
// ResourceExhausted at the limit of 2), never Internal nor an error hook
// call; its limiter's key in Redis is the prefix's hash tag around "user:"
// and the escaped value, so no caller picks the Cluster slot its limit
// lives in nor makes a key longer than the bound; and no two values share a
// limit. Each value is followed by the text its escaped form would have
// were escaping not injective. Binary values come in a -bin key, which
// carries any bytes.
func TestKeysFromMetadata(t *testing.T) {
	long := strings.Repeat("a", 100<<10)
	longToo := long[:len(long)-1] + "b" // the same but for its last byte: no truncation may join them
	hashed := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "%sha256:" + hex.EncodeToString(sum[:])
	}
	hostile := []struct {
		mdKey, value, key string
	}{
		{"x-user", "a{b", "a%7Bb"}, // an unclosed '{': was ErrInvalidName, Internal
		{"x-user", "a%7Bb", "a%257Bb"},
		{"x-user", "{x}", "%7Bx%7D"}, // was the key's hash tag: the caller's pick of shard
		{"x-user", "%7Bx%7D", "%257Bx%257D"},
		{"x-user-bin", "\x00\xff", "%00%FF"},
		{"x-user", "%00%FF", "%2500%25FF"},
		{"x-user", long, hashed(long)}, // 100 KB: was a 100 KB key, sent on every call
		{"x-user-bin", longToo, hashed(longToo)},
		// Ordinary keys stay as they are.
		{"x-user", "alice@example.com", "alice@example.com"},
		{"x-user", "2001:db8::/64", "2001:db8::/64"},
	}
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := redistest.NewClock(redistest.WindowStart.Add(10 * time.Second))
		prefix := redistest.UniqueName(t, "grpclimit-test:")
		rdb := newRDB()
		client := redlimit.New(rdb, redlimit.WithPrefix(prefix), redlimit.WithClock(now.Now))
		var mu sync.Mutex
		var given []string
		limiterFor := func(_, key string) *redlimit.Limiter {
			mu.Lock()
			given = append(given, key)
			mu.Unlock()
			// As docs/operations.md writes it: the key part is the interceptor's to make safe.
			return client.FixedWindow("user:" + key).WithDefault(redlimit.PerMinute(2))
		}
		hooked := new(hookedErrors)
		conns := map[string]*grpc.ClientConn{}
		for _, mdKey := range []string{"x-user", "x-user-bin"} {
			conns[mdKey] = limitedServer(t, limiterFor, grpclimit.WithPolicy("per-user"), grpclimit.WithKey(grpclimit.Metadata(mdKey)), grpclimit.WithErrorHook(hooked.hook))
		}

		fields := func(rateLimit string) map[string]string {
			return map[string]string{grpclimit.PolicyKey: `"per-user";q=2;w=60`, grpclimit.RateLimitKey: rateLimit}
		}
		want := []struct {
			kind kind
			want answer
		}{
			{unary, answer{code: codes.OK, fields: fields(`"per-user";r=1;t=50`)}},
			{stream, answer{code: codes.OK, fields: fields(`"per-user";r=0;t=50`)}},
			{unary, answer{code: codes.ResourceExhausted, msg: "grpclimit: rate limit exceeded", retry: "50s", fields: fields(`"per-user";r=0;t=50`)}},
		}
		var wantGiven, wantKeys []string
		for _, h := range hostile {
			for i, w := range want {
				got := call(t, conns[h.mdKey], w.kind, h.mdKey, h.value)
				if got.code != w.want.code || got.msg != w.want.msg || got.retry != w.want.retry || !maps.Equal(got.fields, w.want.fields) {
					t.Errorf("%s %.40q, call %d (%s): %+v\nwant %+v", h.mdKey, h.value, i, w.kind, got, w.want)
				}
				wantGiven = append(wantGiven, h.key)
			}
			// The prefix made the hash tag, around the whole name: the slot
			// is that of "user:" and the escaped value, whatever was sent.
			wantKeys = append(wantKeys, prefix+"{user:"+h.key+"}")
		}
		if errs := hooked.get(); len(errs) > 0 {
			t.Errorf("error hook told %v", errs)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(given, wantGiven) {
			t.Errorf("limiterFor given %.200q\nwant %.200q", given, wantGiven)
		}
		slices.Sort(wantKeys)
		if got := keysUnder(t, rdb, prefix); !slices.Equal(got, wantKeys) {
			t.Errorf("keys in Redis %.300q\nwant %.300q", got, wantKeys)
		}
	})
}

// TestInFlightKeysFromMetadata: the in-flight interceptors escape their
// keys as the rate ones do: a hostile value holds a slot of its own limit,
// never Internal.
func TestInFlightKeysFromMetadata(t *testing.T) {
	client := redlimit.New(redistest.Miniredis(t), redlimit.WithPrefix("svc:"))
	var mu sync.Mutex
	var names []string
	limitFor := func(_, key string) *redlimit.InFlight {
		l := client.InFlight("exports:" + key).WithDefault(redlimit.InFlightConfig{Limit: 1, TTL: time.Minute})
		mu.Lock()
		names = append(names, l.Name())
		mu.Unlock()
		return l
	}
	hooked := new(hookedErrors)
	opts := []grpclimit.Option{grpclimit.WithKey(grpclimit.Metadata("x-user")), grpclimit.WithErrorHook(hooked.hook), grpclimit.WithLimitedGRPCServices()}
	conn := dial(t, serve(t,
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInFlight(limitFor, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInFlight(limitFor, opts...))))
	for _, k := range []kind{unary, stream} {
		if got := call(t, conn, k, "x-user", "a{b"); got.code != codes.OK {
			t.Errorf("%s: %+v", k, got)
		}
	}
	if errs := hooked.get(); len(errs) > 0 {
		t.Errorf("error hook told %v", errs)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"svc:{exports:a%7Bb}", "svc:{exports:a%7Bb}"}; !slices.Equal(names, want) {
		t.Errorf("limits %q, want %q", names, want)
	}
}
