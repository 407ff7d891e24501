package wire

import "strconv"

// Settling a reservation with its actual cost (the root package's
// Reservation.Settle): the op and the arguments it adds to the contract,
// declared here in one block. A refund is a release (OpRelease); a cost
// above what the reservation holds is a settle.

// OpSettle counts Permits more for a reservation's grant (GrantAt,
// GrantSize): its actual cost past what it holds, each rate where the grant
// counts while it does, else as a grant made now, and no more than leaves
// MaxDebt owed on any rate (a fixed window owes nothing: no more than its
// rate). ID names the reservation's entry in the request log; the settle
// moves it to Next, keeping its expiry, so that it counts once however
// often it is sent, and nothing once the entry has expired (Timeout) or
// gone (Reset, Delete, new rates). Its reply is the permits counted, an
// integer from 0 to Permits, or SettledBefore.
const OpSettle Op = "settle"

// SettledBefore is a settle's reply when its entry has moved on to Next
// already: a settle sent again, whose first run counted.
const SettledBefore = -1

// The arguments a reservation and a settle add, after ArgGrantSize.
const (
	ArgTimeout = ArgGrantSize + 1 + iota // reserve: ms its entry lasts, its time to settle; "": as long as the grant counts
	ArgNext                              // settle: the id the entry moves to, and the token bucket's record of a cost counted now
	ArgMaxDebt                           // settle: the most any rate may owe after it, or "" for no cap

	ArgLast = ArgMaxDebt // the last argument of any decision request
)

// settleConstants are the names the scripts use for the above.
func settleConstants() []Constant {
	cs := []Constant{{"OP_SETTLE", q(OpSettle)}, {"SETTLED_BEFORE", strconv.Itoa(SettledBefore)}}
	for i, name := range []string{"A_TIMEOUT", "A_NEXT", "A_MAX_DEBT"} {
		cs = append(cs, Constant{name, strconv.Itoa(ArgTimeout + i)})
	}
	return cs
}
