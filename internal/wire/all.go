package wire

import "fmt"

// ---- All-or-nothing (the root's Client.AllowAll) ----
//
// One call of the decision script decides several requests, each on a
// limiter of its own, and counts them all or none. Its ARGV is FrameAll,
// then a string of one byte per request (AllShadow or AllBinds), then the
// requests framed as any decision call's, each op OpAllow; KEYS are theirs,
// in order. The script decides every request first as OpCheck: an allow
// that counts nothing and writes nothing. Only if every binding request
// (not AllShadow, nor a stored config in shadow mode) was granted, and
// each reply is a decision, does it decide them again, as OpAllow, which
// grants each exactly as the check said: the call's requests are on
// distinct keys, and nothing runs between the passes.
//
// Its reply is {1 or 0, one reply per request}: 1, every request was
// decided by the allow pass (the binding ones granted and counted); 0,
// none counted anything, and the replies are the check's (a decision, or
// ReplyPerClient, ReplyCalendar or ReplyAdmin, for the client to act on
// as for a request alone). An error raised in the check pass is the
// call's, with nothing written.
const (
	FrameAll     = "all"
	OpCheck   Op = "check" // the script's own: all-or-nothing's first pass; never sent
	AllBinds     = '.'     // its denial stops the call
	AllShadow    = 's'     // in shadow mode (the Client's or the handle's): its denial does not
)

// AllCall is an all-or-nothing call's KEYS and ARGV, as NewAllCall and Add
// lay them out.
type AllCall struct{ Keys, Args []any }

// NewAllCall begins the call of n requests, shadow saying which are in
// shadow mode.
func NewAllCall(shadow []bool) *AllCall {
	flags := make([]byte, len(shadow))
	for i, on := range shadow {
		flags[i] = AllBinds
		if on {
			flags[i] = AllShadow
		}
	}
	args := make([]any, 2, 2+len(shadow)*(RequestHead+ArgLast))
	args[0], args[1] = FrameAll, string(flags)
	return &AllCall{Args: args}
}

// Add appends one request, framed as any decision call's.
func (c *AllCall) Add(algorithm, op any, keys, args []any) {
	c.Args = append(append(c.Args, algorithm, op, len(keys), len(args)), args...)
	c.Keys = append(c.Keys, keys...)
}

// ParseAll reads the call's reply for n requests: whether every request
// counted, and each one's reply.
func ParseAll(reply any, n int) (counted bool, replies []any, ok bool) {
	v, ok := reply.([]any)
	if !ok || len(v) != 1+n || v[0] != int64(0) && v[0] != int64(1) {
		return false, nil, false
	}
	return v[0] == int64(1), v[1:], true
}

// allConstants are the block's names in the scripts.
func allConstants() []Constant {
	return []Constant{
		{"FRAME_ALL", q(FrameAll)},
		{"OP_CHECK", q(OpCheck)},
		{"BYTE_ALL_SHADOW", fmt.Sprint(AllShadow)},
		{"POS_SHADOW", fmt.Sprint(PosShadow)},
	}
}

// ---- end of all-or-nothing ----
