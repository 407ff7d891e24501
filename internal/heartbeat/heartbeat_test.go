package heartbeat

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/wire"
)

// A beat sends its member, the clock in ms, Expire in ms and its client id
// under the key, and keeps the counts Redis answers; a lower count replaces
// a higher one only once that is more than Expire old, and a beat that
// fails, or that Redis answers oddly, keeps what the last one counted. The
// package redlimit's TestDegradedHeartbeatKey runs the same on the script.
func TestBeat(t *testing.T) {
	ctx := context.Background()
	epoch := time.UnixMilli(1_700_000_000_000)
	now := epoch
	var reply any
	var err error
	var sent [][]any
	h := &Heart{cfg: Config{Every: 10 * time.Second, Expire: 25 * time.Second, Key: "svc:redlimit:instances",
		Member: "api 0123456789abcdef", ClientID: "api", Now: func() time.Time { return now },
		Run: func(_ context.Context, keys, args []any) (any, error) {
			sent = append(sent, append(keys, args...))
			return reply, err
		}}}
	assert.True(t, h.BeatAt().IsZero())
	counts := func() [2]int64 { return [2]int64{h.Instances(), h.Same()} }

	reply = []any{int64(3), int64(2)}
	require.NoError(t, h.Beat(ctx))
	assert.Equal(t, []any{"svc:redlimit:instances", "api 0123456789abcdef", epoch.UnixMilli(), int64(25_000), "api"}, sent[0])
	assert.Equal(t, [2]int64{3, 2}, counts())
	assert.Equal(t, epoch, h.BeatAt())

	now = epoch.Add(25 * time.Second)
	reply = []any{int64(1), int64(1)}
	require.NoError(t, h.Beat(ctx))
	assert.Equal(t, [2]int64{3, 2}, counts(), "Expire old, not older: held")
	now = now.Add(time.Millisecond)
	reply = []any{int64(2), int64(1)}
	require.NoError(t, h.Beat(ctx))
	assert.Equal(t, [2]int64{2, 1}, counts(), "older: replaced")
	assert.Equal(t, now, h.BeatAt())

	err = errors.Join(wire.ErrUnavailable, errors.New("down"))
	assert.ErrorIs(t, h.Beat(ctx), wire.ErrUnavailable)
	err = nil
	for _, odd := range []any{nil, "x", []any{}, []any{int64(1)}, []any{int64(0), int64(0)}, []any{int64(1), int64(2)},
		[]any{int64(2), "1"}, []any{int64(2), int64(1), int64(1)}} {
		reply = odd
		assert.ErrorIs(t, h.Beat(ctx), wire.ErrUnexpectedReply, "%#v", odd)
	}
	assert.Equal(t, [2]int64{2, 1}, counts(), "kept")
	assert.Equal(t, now, h.BeatAt())
}

// Without a clock, Redis's TIME: the clock argument is empty.
func TestBeatOnRedisTime(t *testing.T) {
	var args []any
	h := &Heart{cfg: Config{Expire: time.Second, Run: func(_ context.Context, _, a []any) (any, error) {
		args = a
		return []any{int64(1), int64(1)}, nil
	}}}
	require.NoError(t, h.Beat(context.Background()))
	assert.Equal(t, "", args[wire.HeartbeatNow-1])
	assert.WithinDuration(t, time.Now(), h.BeatAt(), time.Minute)
}

// Start beats at once, and Stop ends the loop.
func TestStartStop(t *testing.T) {
	beats := make(chan struct{}, 10)
	h := Start(Config{Every: time.Hour, Expire: 3 * time.Hour, Run: func(context.Context, []any, []any) (any, error) {
		beats <- struct{}{}
		return []any{int64(1), int64(1)}, nil
	}})
	select {
	case <-h.First():
	case <-time.After(10 * time.Second):
		t.Fatal("no first beat")
	}
	assert.Len(t, beats, 1)
	assert.Equal(t, int64(1), h.Instances())
	h.Stop()
	h.Stop() // once
}
