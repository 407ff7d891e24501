package httplimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// hostileKeys are header values a client chooses to break a limiter name,
// each with the key part the middleware must give limiterFor for it. Each
// is followed by the text its escaped form would have were escaping not
// injective ("a%7Bb" for "a{b"), so that a shared limit between the two
// shows as a denial of the second.
func hostileKeys() []struct{ value, key string } {
	long := strings.Repeat("a", 100<<10)
	longToo := long[:len(long)-1] + "b" // the same but for its last byte: no truncation may join them
	hashed := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "%sha256:" + hex.EncodeToString(sum[:])
	}
	return []struct{ value, key string }{
		{"a{b", "a%7Bb"}, // an unclosed '{': was ErrInvalidName, a 500
		{"a%7Bb", "a%257Bb"},
		{"{x}", "%7Bx%7D"}, // was the key's hash tag: the client's pick of shard
		{"%7Bx%7D", "%257Bx%257D"},
		{"\x00\xff", "%00%FF"},
		{"%00%FF", "%2500%25FF"},
		{"a b", "a%20b"},
		{long, hashed(long)}, // 100 KB: was a 100 KB key, sent on every call
		{longToo, hashed(longToo)},
		// Ordinary keys stay as they are.
		{"alice@example.com", "alice@example.com"},
		{"2001:db8::/64", "2001:db8::/64"},
	}
}

// keysUnder lists the keys that start with prefix, on every primary of a
// Cluster.
func keysUnder(t *testing.T, rdb redis.UniversalClient, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	var keys []string
	scan := func(c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		return iter.Err()
	}
	var err error
	if cluster, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex // ForEachMaster runs f on every primary at once
		err = cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(c)
		})
	} else {
		err = scan(rdb)
	}
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

// TestKeysFromRequests: a header value is a key like any other, whatever
// it holds. Each of the hostile ones above is limited as any user is (200,
// 200, then 429 at the limit of 2), never a 500 nor an error hook call; its
// limiter's key in Redis is the prefix's hash tag around "user:" and the
// escaped value, so no client picks the Cluster slot its limit lives in nor
// makes a key longer than the bound; and no two values share a limit.
func TestKeysFromRequests(t *testing.T) {
	redistest.EachBackend(t, redistest.WithCluster, func(t *testing.T, newRDB func() redis.UniversalClient) {
		now := redistest.NewClock(redistest.WindowStart.Add(10 * time.Second))
		prefix := uniqueName(t)
		rdb := newRDB()
		client := redlimit.New(rdb, redlimit.WithPrefix(prefix), redlimit.WithClock(now.Now))
		var given []string
		var hooked []error
		handler := httplimit.New(func(key string) *redlimit.Limiter {
			given = append(given, key)
			// As docs/operations.md writes it: the key part is the middleware's to make safe.
			return client.FixedWindow("user:" + key).WithDefault(redlimit.PerMinute(2))
		}, httplimit.WithPolicy("per-user"), httplimit.WithKey(httplimit.Header("X-User")),
			httplimit.WithErrorHook(func(_ *http.Request, err error) { hooked = append(hooked, err) }),
		)(http.NotFoundHandler())

		const policy = `"per-user";q=2;w=60`
		want := []struct {
			status int
			fields map[string]string
		}{
			{404, map[string]string{"RateLimit-Policy": policy, "RateLimit": `"per-user";r=1;t=50`}},
			{404, map[string]string{"RateLimit-Policy": policy, "RateLimit": `"per-user";r=0;t=50`}},
			{429, map[string]string{"RateLimit-Policy": policy, "RateLimit": `"per-user";r=0;t=50`, "Retry-After": "50"}},
		}
		var wantGiven, wantKeys []string
		for _, hostile := range hostileKeys() {
			for i, w := range want {
				req := httptest.NewRequest("GET", "/", nil)
				req.Header["X-User"] = []string{hostile.value} // as the client sent it: Set would not reject it either
				rec := httptest.NewRecorder()
				handler.ServeHTTP(rec, req)
				if got := fieldsOf(rec.Header()); rec.Code != w.status || !maps.Equal(got, w.fields) {
					t.Errorf("X-User %.40q, request %d: %d %v\nwant %d %v", hostile.value, i, rec.Code, got, w.status, w.fields)
				}
				wantGiven = append(wantGiven, hostile.key)
			}
			// The prefix made the hash tag, around the whole name: the slot
			// is that of "user:" and the escaped value, whatever the client sent.
			wantKeys = append(wantKeys, prefix+"{user:"+hostile.key+"}")
		}
		if len(hooked) > 0 {
			t.Errorf("error hook told %v", hooked)
		}
		if !slices.Equal(given, wantGiven) {
			t.Errorf("limiterFor given %.200q\nwant %.200q", given, wantGiven)
		}
		slices.Sort(wantKeys)
		if got := keysUnder(t, rdb, prefix); !slices.Equal(got, wantKeys) {
			t.Errorf("keys in Redis %.300q\nwant %.300q", got, wantKeys)
		}
		for _, k := range wantKeys {
			if len(k) > len(prefix)+len("{user:}")+128 {
				t.Errorf("key of %d bytes", len(k))
			}
		}
	})
}

// TestInFlightKeysFromRequests: InFlight escapes its keys as New does: a
// hostile value holds a slot of its own limit, never a 500.
func TestInFlightKeysFromRequests(t *testing.T) {
	client := redlimit.New(redistest.Miniredis(t), redlimit.WithPrefix("svc:"))
	var names []string
	hooked := false
	handler := httplimit.InFlight(func(key string) *redlimit.InFlight {
		l := client.InFlight("exports:" + key).WithDefault(redlimit.InFlightConfig{Limit: 1, TTL: time.Minute})
		names = append(names, l.Name())
		return l
	}, httplimit.WithKey(httplimit.Header("X-User")), httplimit.WithErrorHook(func(*http.Request, error) { hooked = true }))(http.NotFoundHandler())
	for _, user := range []string{"a{b", "{x}"} {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-User", user)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusNotFound || hooked {
			t.Errorf("X-User %q: %d, hook called: %v", user, rec.Code, hooked)
		}
	}
	if want := []string{"svc:{exports:a%7Bb}", "svc:{exports:%7Bx%7D}"}; !slices.Equal(names, want) {
		t.Errorf("limits %q, want %q", names, want)
	}
}
