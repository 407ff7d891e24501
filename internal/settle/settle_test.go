package settle

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/requestid"
	"github.com/redlimit/redlimit/internal/wire"
)

// fakeRedis answers settles and releases as told, and records them.
type fakeRedis struct {
	settles  [][2]*requestid.ID // from, next
	amounts  []int64
	charge   func(amount int64) (int64, error)
	released []int64
}

func (f *fakeRedis) Settle(_ context.Context, from, next *requestid.ID, amount int64) (int64, error) {
	f.settles = append(f.settles, [2]*requestid.ID{from, next})
	f.amounts = append(f.amounts, amount)
	return f.charge(amount)
}

func (f *fakeRedis) Release(_ context.Context, _ *requestid.ID, permits int64) (int64, error) {
	f.released = append(f.released, permits)
	return permits, nil
}

// Reports follow the running cost up, charging what passes the grant as it
// comes, each step moving the log entry on; an older report changes
// nothing; the final settle closes the ledger, after which nothing is sent.
func TestLedgerReports(t *testing.T) {
	ctx := context.Background()
	grant := requestid.New()
	redis := &fakeRedis{charge: func(amount int64) (int64, error) { return amount, nil }}
	s := New(grant, 10, true)
	res, err := s.Settle(ctx, redis, 8, 0, false)
	require.NoError(t, err)
	assert.Equal(t, Result{Held: 10}, res, "within the grant: nothing asked")
	res, err = s.Settle(ctx, redis, 14, 0, false)
	require.NoError(t, err)
	assert.Equal(t, Result{Charged: 4, Held: 14}, res)
	res, err = s.Settle(ctx, redis, 12, 0, false)
	require.NoError(t, err)
	assert.Equal(t, Result{Held: 14}, res, "an older report")
	_, err = s.Settle(ctx, redis, 12, 0, true)
	assert.ErrorIs(t, err, wire.ErrInvalidPermits, "a final cost below one reported")
	res, err = s.Settle(ctx, redis, 15, 0, true)
	require.NoError(t, err)
	assert.Equal(t, Result{Charged: 1, Held: 15}, res)
	assert.Equal(t, []int64{4, 1}, redis.amounts)
	assert.Same(t, grant, redis.settles[0][0])
	assert.Same(t, redis.settles[0][1], redis.settles[1][0], "each step from where the last left the entry")
	res, err = s.Settle(ctx, redis, 20, 0, true)
	require.NoError(t, err)
	assert.Equal(t, Result{Uncharged: 5, Held: 15}, res, "closed")
	assert.Len(t, redis.amounts, 2)
	assert.Empty(t, redis.released)
}

// A settle whose reply was lost is sent again, the same step, before the
// next; Redis's "settled before" counts it in full only when nothing could
// have capped it. One Redis refused is not pending, and its report is not
// taken.
func TestLedgerLostReplies(t *testing.T) {
	ctx := context.Background()
	for _, uncapped := range []bool{true, false} {
		var replies []error
		redis := &fakeRedis{}
		redis.charge = func(amount int64) (int64, error) {
			if len(replies) > 0 {
				err := replies[0]
				replies = replies[1:]
				return 0, err
			}
			if len(redis.amounts) == 2 {
				return wire.SettledBefore, nil
			}
			return amount, nil
		}
		s := New(requestid.New(), 10, uncapped)
		replies = []error{errors.Join(wire.ErrUnavailable, errors.New("timeout"))}
		_, err := s.Settle(ctx, redis, 13, 0, false)
		assert.ErrorIs(t, err, wire.ErrUnavailable)
		res, err := s.Settle(ctx, redis, 13, 0, false)
		require.NoError(t, err)
		assert.Equal(t, redis.settles[0], redis.settles[1], "the same step again")
		if uncapped {
			assert.Equal(t, Result{Charged: 3, Held: 13}, res)
		} else {
			assert.Equal(t, Result{Held: 10}, res, "how much counted is not known")
		}

		replies = []error{wire.ErrInvalidPermits}
		_, err = s.Settle(ctx, redis, 20, 0, false)
		assert.ErrorIs(t, err, wire.ErrInvalidPermits)
		res, err = s.Settle(ctx, redis, 14, 0, false)
		require.NoError(t, err, "20 was refused: 14 is no older report")
		assert.Equal(t, int64(1), res.Charged)
	}
}

// A Release gives back the grant less the permits released, finally, once,
// and never below a cost reported.
func TestLedgerRelease(t *testing.T) {
	ctx := context.Background()
	redis := &fakeRedis{charge: func(amount int64) (int64, error) { return amount, nil }}
	s := New(requestid.New(), 10, true)
	res, err := s.Settle(ctx, redis, 0, 4, true)
	require.NoError(t, err)
	assert.Equal(t, Result{Refunded: 4, Held: 6}, res)
	res, err = s.Settle(ctx, redis, 0, 4, true)
	require.NoError(t, err)
	assert.Equal(t, Result{Held: 6}, res, "once")

	s = New(requestid.New(), 10, true)
	_, err = s.Settle(ctx, redis, 9, 0, false)
	require.NoError(t, err)
	res, err = s.Settle(ctx, redis, 0, 5, true)
	require.NoError(t, err)
	assert.Equal(t, Result{Refunded: 1, Held: 9}, res, "not below the 9 reported")
	assert.Equal(t, []int64{4, 1}, redis.released)
}
