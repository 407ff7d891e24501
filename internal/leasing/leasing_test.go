package leasing

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/requestid"
)

// fakeRedis grants every take from a limit of its own, and records the
// takes and refunds.
type fakeRedis struct {
	left     int64 // permits Redis has
	limit    int64
	retry    time.Duration
	takes    [][2]int64 // want, least
	refunded []int64
}

func (f *fakeRedis) Take(_ context.Context, want, least int64, _ *requestid.ID) (Taken[string], error) {
	f.takes = append(f.takes, [2]int64{want, least})
	n := min(want, f.left)
	if n < least {
		return Taken[string]{Answer: "denied", Limit: f.limit, RetryAfter: f.retry}, nil
	}
	f.left -= n
	return Taken[string]{Answer: "granted", Limit: f.limit, At: int64(len(f.takes)), Permits: n}, nil
}

func (f *fakeRedis) Refund(_ context.Context, b Block) (int64, error) {
	f.refunded = append(f.refunded, b.Held)
	f.left += b.Held
	return b.Held, nil
}

// On a controlled clock: the first request takes a block of its own size;
// once one runs out early the next is sized to twice its pace over a lease
// Time, within Share of the limit (10 of 100); requests are served from
// it; a denied take denies requests as large until its retry; Close gives
// back what is held.
func TestLeaseBlocks(t *testing.T) {
	ctx := context.Background()
	start := time.Unix(1_000_000, 0)
	now := start
	at := func(ms int) { now = start.Add(time.Duration(ms) * time.Millisecond) }
	redis := &fakeRedis{left: 100, limit: 100, retry: 300 * time.Millisecond}
	s := New[string](Config{Time: time.Second, Share: 0.1}, redis, func() time.Time { return now })
	allow := func(permits int64) Answer[string] {
		t.Helper()
		a, err, served := s.Allow(ctx, permits)
		require.NoError(t, err)
		require.True(t, served)
		return a
	}
	assert.Equal(t, Answer[string]{Kind: Took, Last: "granted"}, allow(1), "a block of 1: all the request's")
	at(100) // it ran out at a pace of 10 a Time: 20 wanted, 10 the cap
	assert.Equal(t, Answer[string]{Kind: Took, Last: "granted", Held: 9}, allow(1))
	at(200)
	assert.Equal(t, Answer[string]{Kind: FromBlock, Last: "granted", Held: 8, Since: 100 * time.Millisecond}, allow(1))
	assert.Equal(t, [][2]int64{{1, 1}, {10, 1}}, redis.takes)

	_, _, served := s.Allow(ctx, 11)
	assert.False(t, served, "above a block's cap, 10: to Redis")
	held, most := s.Holding()
	assert.Equal(t, [2]int64{8, 10}, [2]int64{held, most})

	at(300)
	assert.Equal(t, Answer[string]{Kind: FromBlock, Last: "granted", Since: 200 * time.Millisecond}, allow(8))
	redis.left = 0
	at(400)
	assert.Equal(t, Answer[string]{Kind: TookDenied, Last: "denied"}, allow(2))
	at(500)
	assert.Equal(t, Answer[string]{Kind: Denied, Last: "denied", Since: 100 * time.Millisecond}, allow(2), "denied here until the retry")
	assert.Len(t, redis.takes, 3)
	s.ForgetDenial()
	assert.Equal(t, TookDenied, allow(2).Kind, "forgotten: asked again")
	assert.Equal(t, [][2]int64{{1, 1}, {10, 1}, {10, 2}, {10, 2}}, redis.takes)

	redis.left = 100
	at(1500)
	assert.Equal(t, Answer[string]{Kind: Took, Last: "granted", Held: 9}, allow(1))
	require.NoError(t, s.Close(ctx))
	assert.Equal(t, []int64{9}, redis.refunded, "what the block held goes back")
	_, _, served = s.Allow(ctx, 1)
	assert.False(t, served, "closed")
	assert.Equal(t, Stats{Calls: 6, Taken: 21, Used: 12, Returned: 9}, s.Stats())
}
