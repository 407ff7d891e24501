package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// Every key starts with the Client's prefix: a Redis user whose ACL allows
// only ~prefix* can run every op of every algorithm, PerClient and with the
// request log, and SCAN MATCH prefix* finds every key the limiter wrote.
func TestEveryKeyStartsWithThePrefix(t *testing.T) {
	srv := redistest.Shared(t)
	ctx := context.Background()
	admin := srv.Client(t)
	prefix := fmt.Sprintf("svc%x:", rand.Uint32())
	user := "redlimit-" + prefix[:len(prefix)-1]
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~"+prefix+"*", "+@all").Err())
	t.Cleanup(func() { admin.Do(ctx, "ACL", "DELUSER", user) })
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: "pw"})
	t.Cleanup(func() { rdb.Close() })

	for _, a := range algorithms {
		t.Run(a.name, func(t *testing.T) {
			name := fmt.Sprintf("partner-%s-%x", a.name, rand.Uint32())
			clk := newClock()
			cfg := Config{Type: PerClient, Rate: 5, Interval: time.Minute}
			var limiters []*Limiter
			for _, id := range []string{"a", "b"} {
				limiters = append(limiters, a.new(newClient(rdb, clk, WithPrefix(prefix), WithClientID(id), WithRetryWindow(time.Minute)), name))
			}
			l := limiters[0]
			assert.Equal(t, prefix+"{"+name+"}", l.Name())
			require.NoError(t, l.SetRate(ctx, cfg))
			for _, l := range limiters {
				_, err := l.Allow(ctx, 2)
				require.NoError(t, err)
				require.NoError(t, l.Release(ctx, 1))
			}
			overall := l.WithDefault(Per(5, time.Minute))
			_, err := overall.Allow(ctx, 0)
			require.NoError(t, err)
			_, err = l.Config(ctx)
			require.NoError(t, err)
			_, err = l.RemainTimeToLive(ctx)
			require.NoError(t, err)
			_, err = l.Expire(ctx, time.Hour)
			require.NoError(t, err)

			var all []string
			iter := admin.Scan(ctx, 0, "*"+escapeGlob(name)+"*", 100).Iterator()
			for iter.Next(ctx) {
				all = append(all, iter.Val())
			}
			require.NoError(t, iter.Err())
			var prefixed []string
			iter = admin.Scan(ctx, 0, escapeGlob(prefix)+"*"+escapeGlob(name)+"*", 100).Iterator()
			for iter.Next(ctx) {
				prefixed = append(prefixed, iter.Val())
			}
			require.NoError(t, iter.Err())
			slices.Sort(all)
			slices.Sort(prefixed)
			// The config, the registry, the request log and two clients' state.
			assert.GreaterOrEqual(t, len(all), 5, "%v", all)
			assert.Equal(t, all, prefixed, "SCAN MATCH prefix* finds every key")

			ok, err := l.Delete(ctx)
			require.NoError(t, err)
			assert.True(t, ok)
			n, err := admin.Exists(ctx, all...).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "Delete removes every key, the request log too")
		})
	}
}
