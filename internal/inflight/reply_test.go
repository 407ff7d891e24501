package inflight

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/redlimit/redlimit/internal/wire"
)

// Replies the script never sends are wire.ErrUnexpectedReply, not a panic.
func TestInFlightUnexpectedReplies(t *testing.T) {
	for _, reply := range []any{nil, "x", int64(1), []any{}, []any{int64(1), int64(10)},
		[]any{int64(2), int64(10), int64(1)}, []any{int64(1), int64(0), int64(1)}, []any{int64(0), int64(-1), int64(1)},
		[]any{int64(1), int64(10), int64(0)}, []any{"1", int64(10), int64(1)}} {
		_, err := ParseAcquire(reply)
		assert.ErrorIs(t, err, wire.ErrUnexpectedReply, "%#v", reply)
	}
	for _, reply := range []any{nil, int64(2), int64(-1), "1"} {
		_, err := ZeroOrOne(reply)
		assert.ErrorIs(t, err, wire.ErrUnexpectedReply, "%#v", reply)
	}
	for _, reply := range []any{nil, int64(1), []any{}, []any{int64(1)}, []any{int64(1), int64(10), int64(1)},
		[]any{int64(1), int64(9)}, []any{int64(1), int64(maxMS) + 1}, []any{int64(0), int64(10)},
		[]any{int64(2), int64(1)}, []any{int64(3), int64(0)}, []any{int64(-1), int64(0)}, []any{"1", int64(10)}} {
		_, _, err := ParseRefresh(reply)
		assert.ErrorIs(t, err, wire.ErrUnexpectedReply, "%#v", reply)
	}
	for _, reply := range []any{nil, int64(3), int64(-1), "1", []any{int64(1)}} {
		_, err := ParseRelease(reply)
		assert.ErrorIs(t, err, wire.ErrUnexpectedReply, "%#v", reply)
	}
}
