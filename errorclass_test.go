package redlimit

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"

	"github.com/redlimit/redlimit/internal/evalsha"
)

// Every error reply of Redis is classed by its kind, wherever a script met
// it: at the top level, or passed on by a script as "corrupt <key>: <reply>".
func TestErrorClassOfReplies(t *testing.T) {
	ctx := context.Background()
	keys := []any{"svc:{x}", "{svc:{x}}:clients", "{svc:{x}}:requests"}
	trailer := " script: 880f195f5a99ec5a9fb74e0b1d0d615bd14f030a, on @user_script:1."
	for _, tc := range []struct {
		reply    string
		want     error
		contains []string // in the message
	}{
		// Redis 7.0 and 7.2 pcall replies passed on by the scripts.
		{"ERR REDLIMIT corrupt {svc:{x}}:requests: OOM command not allowed when used memory > 'maxmemory'." + trailer,
			ErrUnavailable, []string{"OOM command not allowed", "{svc:{x}}:requests"}},
		{"ERR REDLIMIT corrupt {svc:{x}}:clients: ERR The user executing the script can't run this command or subcommand" + trailer,
			ErrMisconfigured, []string{"{svc:{x}}:clients", "ACL LOG"}},
		{"ERR REDLIMIT corrupt {svc:{x}}:clients: ERR ACL failure in script: User svc has no permissions to run the 'zrange' command" + trailer,
			ErrMisconfigured, []string{"ZRANGE", "{svc:{x}}:clients"}},
		{"ERR REDLIMIT corrupt svc:{x}: WRONGTYPE Operation against a key holding the wrong kind of value" + trailer,
			ErrCorruptState, []string{"corrupt state: svc:{x}: WRONGTYPE"}},
		{"ERR REDLIMIT corrupt svc:{x}: LOADING Redis is loading the dataset in memory" + trailer, ErrUnavailable, []string{"LOADING"}},
		// Redis 6.2's.
		{"ERR Error running script (call to f_880f): @user_script:1: REDLIMIT corrupt {svc:{x}}:requests: @user_script: 1: -OOM command not allowed when used memory > 'maxmemory'.",
			ErrUnavailable, []string{"OOM command not allowed", "{svc:{x}}:requests"}},
		{"ERR Error running script (call to f_880f): @user_script:1: REDLIMIT corrupt {svc:{x}}:clients: @user_script: 876: The user executing the script can't run this command or subcommand",
			ErrMisconfigured, []string{"{svc:{x}}:clients", "ACL LOG"}},
		// miniredis's wording.
		{"ERR Error compiling script (new function): REDLIMIT corrupt svc:{x}: WRONGTYPE Operation against a key holding the wrong kind of value stack traceback: [G]: in function 'error'",
			ErrCorruptState, []string{"WRONGTYPE"}},
		// The scripts' own findings stay corrupt state.
		{"ERR REDLIMIT corrupt svc:{x}: field tat = \"x\"" + trailer, ErrCorruptState, []string{"field tat"}},
		{"ERR REDLIMIT corrupt svc:{x}: rate or interval missing" + trailer, ErrCorruptState, nil},
		// A key that is not the call's cannot make a finding pass for a reply.
		{"ERR REDLIMIT corrupt svc:{y}: OOM is in the name: field tat = \"x\"" + trailer, ErrCorruptState, nil},
		// Top-level replies.
		{"OOM command not allowed when used memory > 'maxmemory'." + trailer, ErrUnavailable, []string{"OOM"}},
		{"WRONGTYPE Operation against a key holding the wrong kind of value" + trailer, ErrCorruptState, nil},
		{"ERR ACL failure in script: User svc has no permissions to run the 'zadd' command" + trailer, ErrMisconfigured, nil},
		{"NOPERM User svc has no permissions to run the 'evalsha' command", ErrMisconfigured, nil},
		{"CROSSSLOT Keys in request don't hash to the same slot", ErrMisconfigured, nil},
	} {
		err := evalsha.Classify(ctx, fakeRefusal(tc.reply), keys)
		assert.ErrorIs(t, err, tc.want, tc.reply)
		for _, other := range []error{ErrUnavailable, ErrMisconfigured, ErrCorruptState} {
			if other != tc.want {
				assert.NotErrorIs(t, err, other, tc.reply)
			}
		}
		if tc.want != ErrCorruptState { // which says what it found, in the scripts' words
			var rerr redis.Error
			assert.ErrorAs(t, err, &rerr, "%s: the reply is kept as the cause", tc.reply)
			assert.NotContains(t, err.Error(), "corrupt", tc.reply)
		}
		for _, s := range tc.contains {
			assert.Contains(t, err.Error(), s, tc.reply)
		}
	}
}

// fakeRefusal is a reply from Redis, for scriptError's table.
type fakeRefusal string

func (e fakeRefusal) Error() string { return string(e) }

func (fakeRefusal) RedisError() {}

// Which replies are misconfiguration, which are outages.
func TestScriptErrorKinds(t *testing.T) {
	background := context.Background()
	canceled, cancel := context.WithCancel(background)
	cancel()
	expired, cancelExpired := context.WithDeadline(background, time.Now().Add(-time.Second))
	defer cancelExpired()
	type reply struct {
		ctx context.Context
		err error
	}
	refusals := func(texts ...string) (replies []reply) {
		for _, text := range texts {
			replies = append(replies, reply{background, fakeRefusal(text)})
		}
		return replies
	}
	for _, kind := range []struct {
		want    []error
		replies []reply
	}{
		{[]error{ErrMisconfigured}, refusals(
			"NOPERM this user has no permissions to access one of the keys used as arguments",
			"NOPERM this user has no permissions to run the 'evalsha' command",
			"NOAUTH Authentication required.",
			"WRONGPASS invalid username-password pair or user is disabled.",
			"ERR unknown command 'EVALSHA', with args beginning with: ",
			"ERR unknown subcommand 'LOAD'. Try SCRIPT HELP.",
			"ERR DB index is out of range",
			"ERR The user executing the script can't access at least one of the keys mentioned in the command arguments script: 3b0b, on @user_script:1.",
		)},
		{[]error{ErrUnavailable}, append(refusals(
			"LOADING Redis is loading the dataset in memory",
			"OOM command not allowed when used memory > 'maxmemory'.",
			"READONLY You can't write against a read only replica.",
			"BUSY Redis is busy running a script.",
		), reply{background, &net.OpError{Op: "dial", Err: errors.New("connection refused")}})},
		{[]error{ErrNotInitialized}, refusals("ERR REDLIMIT not initialized x")},
		// The caller's own cancellation is not an outage: WithFailOpen
		// must not grant a caller that is gone.
		{[]error{context.Canceled}, []reply{
			{canceled, context.Canceled},
			{canceled, &net.OpError{Op: "read", Err: errors.New("i/o timeout")}},
		}},
		// A deadline that passed while Redis hung is one.
		{[]error{ErrUnavailable, context.DeadlineExceeded}, []reply{
			{expired, context.DeadlineExceeded},
			{expired, &net.OpError{Op: "read", Err: errors.New("i/o timeout")}},
		}},
	} {
		for _, r := range kind.replies {
			err := evalsha.Classify(r.ctx, r.err, nil)
			for _, want := range kind.want {
				assert.ErrorIs(t, err, want, "%v", r.err)
			}
			for _, other := range []error{ErrMisconfigured, ErrUnavailable, ErrNotInitialized, context.Canceled, context.DeadlineExceeded} {
				if !slices.Contains(kind.want, other) {
					assert.NotErrorIs(t, err, other, "%v", r.err)
				}
			}
			if !slices.Contains(kind.want, ErrNotInitialized) { // the scripts' own errors keep their detail only
				assert.ErrorIs(t, err, r.err, "the cause is kept")
			}
		}
	}
}
