package grpclimit_test

import (
	"maps"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// A limiter in shadow mode lets every call through; its metadata is set
// only with WithShadowHeaders.
func TestShadowMode(t *testing.T) {
	for _, headers := range []bool{false, true} {
		now := new(redistest.Clock)
		now.Set(redistest.WindowStart)
		client := redlimit.New(redistest.Miniredis(t), redlimit.WithClock(now.Now))
		name := redistest.UniqueName(t, "grpclimit-test:")
		opts := []grpclimit.Option{grpclimit.WithPolicy("rpc")}
		if headers {
			opts = append(opts, grpclimit.WithShadowHeaders())
		}
		conn := limitedServer(t, func(_, key string) *redlimit.Limiter {
			return client.FixedWindow(name + key).WithDefault(redlimit.PerMinute(1)).WithShadow()
		}, opts...)
		for i, rateLimit := range []string{`"rpc";r=0;t=60`, `"rpc";r=0;t=60`} { // the second: denied, enforcing
			want := answer{code: codes.OK}
			if headers {
				want.fields = map[string]string{grpclimit.PolicyKey: `"rpc";q=1;w=60`, grpclimit.RateLimitKey: rateLimit}
			}
			for _, k := range []kind{unary, stream} {
				got := call(t, conn, k)
				if got.code != want.code || got.msg != want.msg || got.retry != want.retry || !maps.Equal(got.fields, want.fields) {
					t.Errorf("headers %v, call %d (%s): %+v\nwant %+v", headers, i, k, got, want)
				}
			}
			now.Set(now.Now().Add(time.Millisecond))
		}
	}
}
