package wire

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A decision's reply is one string, its kind then integers, so that the
// client reads one value, not many.
const (
	// ReplyHash: a hash held the limiter's config or state (so its next
	// decision reads the key as a hash first): FullFields, with the bound
	// and the further rates when it has several.
	ReplyHash = "h"
	// ReplyFull: no hash holds it, but the client cannot know every limit
	// and window (a calendar's windows differ in length): FullFields.
	ReplyFull = "f"
	// ReplyDefault: the handle's default decided and no hash holds the
	// state, so the client knows every limit and window: DefaultFields, with
	// the bound when it has several rates.
	ReplyDefault = "d"
)

// Other replies of a decision request, each a string.
const (
	// ReplyPerClient: sent the short key list, the limiter is PerClient;
	// the client sends the whole list from then on.
	ReplyPerClient = "perclient"
	// ReplyCalendar begins a reply that asks for calendar windows: the
	// config in force has calendar rates (what follows, FieldCalendar's
	// format) that the request sent no windows for.
	ReplyCalendar = "calendar "
	// ReplyAdmin: the decision refused the config (missing, corrupt,
	// another algorithm's); the admin script's diagnose says why.
	ReplyAdmin = "admin"
	// ReplyFullScript: the lean script (the common decision alone) met what
	// it does not decide; the client sends the request again to the
	// decision script, as it does from then on for that limiter.
	ReplyFullScript = "full"
	// ReplyMissing begins the admin script's reply to an op that must reach
	// every client: {ReplyMissing, {ids…}}, the clients it was not sent.
	ReplyMissing = "missing"
)

// The fields of a full reply, by position after its kind.
const (
	PosAllowed   = iota // 0 or 1
	PosLimit            // the most one request may take, of the first rate
	PosRemaining        // what is left of every rate's, the least
	PosRetry            // µs until a denied request fits; -1: never
	PosReset            // µs until every rate is full again
	PosWindow           // ms: the span the first rate's limit applies to
	PosShadow           // 1: the stored config is in shadow mode
	PosBound            // several rates: the rate that bound the answer
	// With several rates, PosBound is followed by each rate's reset (µs
	// until it is full again), in config order, then, in a full reply, the
	// further rates, four numbers each (FieldMore's format).
	PosResets
)

// FullFields names each field of a full reply by the Lua local that holds
// it, up to the bound.
var FullFields = [...]string{PosAllowed: "allowed", PosLimit: "limit", PosRemaining: "remaining",
	PosRetry: "retry", PosReset: "reset", PosWindow: "window", PosShadow: "shadow", PosBound: "bound"}

// DefaultFields are a default reply's fields, as positions in FullFields:
// the bound comes only with several rates.
var DefaultFields = [...]int{PosAllowed, PosRemaining, PosRetry, PosReset, PosBound}

// A reservation's reply is a decision's, then ReserveTail: the grant's
// time on Redis's clock (µs; a funnel's, when it starts to drain), the
// permits taken (0: denied), and the µs until the first of the windows its
// permits count in ends (a fixed window's), or 0 when they count by no
// window's edge.
const ReserveTail = " @%d %d %d"

// Decision is a decision's reply, read.
type Decision struct {
	Kind                   string // ReplyHash, ReplyFull or ReplyDefault
	Allowed                bool
	Limit, Remaining       int64
	Retry, Reset           int64 // µs; Retry -1: never
	WindowMS               int64
	Shadow                 bool
	Bound                  int
	Resets                 []int64 // several rates: each one's µs until it is full again
	More                   []Rate  // several rates: the further ones
	GrantAt, Taken, EndsUS int64   // a reservation's tail
	reserved               bool
}

// ParseDecision reads a decision's reply. A default reply is completed from
// dflt, the handle's default (its rates, its own first), as the full reply
// of the same decision would be. reserved: the reply ends in ReserveTail.
func ParseDecision(reply any, dflt []Rate, reserved bool) (Decision, bool) {
	s, _ := reply.(string)
	var d Decision
	if reserved {
		head, tail, found := strings.Cut(s, " @")
		var n [3]int64
		if !found || !Spaced(tail, n[:]) || n[0] < 0 || n[1] < 0 || n[2] < 0 {
			return Decision{}, false
		}
		s, d.GrantAt, d.Taken, d.EndsUS, d.reserved = head, n[0], n[1], n[2], true
	}
	kind, s, _ := strings.Cut(s, " ")
	var n [PosResets + 5*MaxRates]int64
	fields, rates := 0, 1
	switch kind {
	case ReplyHash, ReplyFull:
		fields = 1 + strings.Count(s, " ")
		if fields > PosBound {
			// The bound, a reset per rate, four numbers per further rate.
			rates = (fields - PosResets + 4) / 5
		}
		if fields != PosBound && (rates < 2 || rates > MaxRates || fields != PosResets+5*rates-4) || !Spaced(s, n[:fields]) {
			return Decision{}, false
		}
	case ReplyDefault:
		if len(dflt) == 0 || dflt[0].Rate < 1 {
			return Decision{}, false
		}
		rates = len(dflt)
		at := DefaultFields[:len(DefaultFields)-1]
		if rates > 1 {
			at = DefaultFields[:]
		}
		var v [len(DefaultFields) + MaxRates]int64
		given := len(at)
		if rates > 1 {
			given += rates
		}
		if 1+strings.Count(s, " ") != given || !Spaced(s, v[:given]) {
			return Decision{}, false
		}
		for i, field := range at {
			n[field] = v[i]
		}
		limit, window := Quota(dflt[0])
		n[PosLimit], n[PosWindow] = limit, window
		fields = PosBound
		if rates > 1 {
			copy(n[PosResets:], v[len(at):given])
			fields = PosResets + rates
			for _, o := range dflt[1:] {
				n[fields], n[fields+1], n[fields+2], n[fields+3] = o.Rate, o.IntervalMS, o.Burst, o.Buckets
				fields += 4
			}
		}
	default:
		return Decision{}, false
	}
	if !micros(n[PosRetry:PosReset+1]) || n[PosWindow] < 0 || n[PosWindow] > maxWindowMS ||
		n[PosShadow] != 0 && n[PosShadow] != 1 || n[PosAllowed] != 0 && n[PosAllowed] != 1 {
		return Decision{}, false
	}
	d.Kind, d.Allowed, d.Limit, d.Remaining = kind, n[PosAllowed] == 1, n[PosLimit], n[PosRemaining]
	d.Retry, d.Reset, d.WindowMS, d.Shadow = n[PosRetry], n[PosReset], n[PosWindow], n[PosShadow] == 1
	if fields > PosBound {
		d.Bound = int(n[PosBound])
		d.Resets = append([]int64(nil), n[PosResets:PosResets+rates]...) // a copy: n stays on the stack
		if !micros(d.Resets) || slices.Min(d.Resets) < 0 {
			return Decision{}, false
		}
		for i := PosResets + rates; i < fields; i += 4 {
			r := Rate{Rate: n[i], IntervalMS: n[i+1], Burst: n[i+2], Buckets: n[i+3]}
			if r.Rate < 1 || r.IntervalMS < 1 || r.Burst < 0 || !windowFits(r) {
				return Decision{}, false
			}
			d.More = append(d.More, r)
		}
		if d.Bound < 0 || d.Bound > len(d.More) {
			return Decision{}, false
		}
	}
	return d, true
}

// maxWindowMS is the longest window a time.Duration holds (ms).
const maxWindowMS = math.MaxInt64 / int64(time.Millisecond)

// windowFits reports whether r's window, as Quota computes it, is one a
// Result can hold: a reply naming a rate whose window is longer than a
// Duration is not one the scripts write.
func windowFits(r Rate) bool {
	limit := r.Rate
	if r.Burst > 0 {
		limit = r.Burst
	}
	return math.Ceil(float64(limit)*float64(r.IntervalMS)/float64(r.Rate)) <= float64(maxWindowMS)
}

// Quota is a rate's limit and window (ms) as the scripts report them: the
// most one request may take (a funnel's burst; the rate when it has none,
// the other algorithms always) and the span it applies to, computed in
// doubles as the scripts do.
func Quota(r Rate) (limit, windowMS int64) {
	limit = r.Rate
	if r.Burst > 0 {
		limit = r.Burst
	}
	return limit, int64(math.Ceil(float64(limit) * float64(r.IntervalMS) / float64(r.Rate)))
}

// Integers copies v into n, reporting whether every element was an
// integer: a reply's numbers, read without trusting its shape.
func Integers(v []any, n []int64) bool {
	for i := range n {
		x, ok := v[i].(int64)
		if !ok {
			return false
		}
		n[i] = x
	}
	return true
}

// Spaced parses s as exactly len(n) integers separated by single spaces.
func Spaced(s string, n []int64) bool {
	for i := range n {
		field := s
		if i < len(n)-1 {
			at := strings.IndexByte(s, ' ')
			if at < 0 {
				return false
			}
			field, s = s[:at], s[at+1:]
		}
		x, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return false
		}
		n[i] = x
	}
	return true
}

// micros reports whether each of us is a wait in µs that a Duration holds,
// or negative (never): the scripts send nothing else.
func micros(us []int64) bool {
	for _, x := range us {
		if x > math.MaxInt64/int64(time.Microsecond) {
			return false
		}
	}
	return true
}

// MissingClients reads a ReplyMissing reply: the ids the op must be sent
// again with.
func MissingClients(reply any) ([]string, bool) {
	v, ok := reply.([]any)
	if !ok || len(v) != 2 || v[0] != ReplyMissing {
		return nil, false
	}
	return Strings(v[1])
}

// Strings reads a reply that lists strings (client ids).
func Strings(reply any) ([]string, bool) {
	v, ok := reply.([]any)
	if !ok {
		return nil, false
	}
	list := make([]string, len(v))
	for i, s := range v {
		if list[i], ok = s.(string); !ok {
			return nil, false
		}
	}
	return list, true
}
