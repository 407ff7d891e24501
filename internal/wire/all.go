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
