package wire

import (
	"strings"
)

// Op is what a request asks a script for.
type Op string

// The decision script's ops (scripts/decide.lua): each decides on a
// limiter's rates, and any number of them share a call.
const (
	OpAllow   Op = "allow"   // take permits if they fit; 0 permits peeks
	OpCharge  Op = "charge"  // take permits whatever the limit says: a debt past it
	OpReserve Op = "reserve" // take permits (or as many as fit, if Least or more), and log the id for a release
	OpRelease Op = "release" // give back what a reservation's grant still counts
)

// The admin script's ops (scripts/admin.lua): each acts on a limiter as a
// whole, one per call.
const (
	OpGet      Op = "get"      // the stored config (GetReply), or {}
	OpSet      Op = "set"      // store the config given (SourceNew); keep usage
	OpTrySet   Op = "tryset"   // store it unless one is stored: 1, else 0
	OpReset    Op = "reset"    // forget every client's usage
	OpDelete   Op = "delete"   // remove every key: 1 if there were any
	OpExpire   Op = "expire"   // cap every key's TTL at Value ms: 1 if any key
	OpPersist  Op = "persist"  // remove the config's expiry: 1 if it had one
	OpTTL      Op = "ttl"      // the config's PTTL, or the longest state key's
	OpClients  Op = "clients"  // the registry's client ids
	OpShadow   Op = "shadow"   // shadow mode on (Value 1) or off, in the stored config
	OpDiagnose Op = "diagnose" // raise what a decision refused ('admin' reply)
)

// A decision call's ARGV is its requests, one after another: each a head
// of RequestHead values (its algorithm, its op, how many keys and how many
// arguments it has), then its arguments. Its keys follow the last
// request's in KEYS.
const RequestHead = 4

// A decision request's arguments, by position (1-based after its head).
// Trailing ones a request does not use are left out: each costs Redis.
const (
	ArgNow       = 1 + iota // µs, or "" for Redis TIME
	ArgPermits              // permits; a reservation's want
	ArgConfig               // the handle's config (ConfigArg), or "" for the stored one only
	ArgCalendar             // a calendar config's windows (calendar.go), or ""
	ArgID                   // the request id: the token bucket's record, the request log's entry
	ArgLogWindow            // ms the request log keeps the id, or "" for no log
	ArgClientID             // this client's id (sent with the whole key list only)
	ArgLeast                // reserve: the fewest permits it takes
	ArgGrantAt              // release: the grant's time, µs on Redis's clock
	ArgGrantSize            // release: the grant's permits
)

// The admin script's arguments, by position. Its keys are a decision's
// whole list, then each other client's state keys, in AdminOthers' order.
const (
	AdminAlgorithm = 1 + iota
	AdminOp
	AdminNow      // µs, or "" for Redis TIME
	AdminValue    // expire: the TTL in ms; shadow: 1 or 0
	AdminConfig   // as ArgConfig
	AdminClientID // this client's id
	AdminOthers   // other clients' ids, to the end
)

// Source says which config a request's ArgConfig stands for.
type Source string

const (
	// SourceDefault: the handle's default, while none is stored; its
	// limiter's key held no hash at its last decision, so the script reads
	// it as a string first.
	SourceDefault Source = "default"
	// SourceStored: the same default from a handle whose last decision met a
	// hash at the limiter's key: read as a hash first.
	SourceStored Source = "stored"
	// SourceFixed: in force whatever is stored (Throttle's).
	SourceFixed Source = "fixed"
	// SourceNew: SetRate's, about to be stored.
	SourceNew Source = "new"
)

func init() {
	// The scripts tell sources apart by their first byte.
	seen := map[byte]bool{}
	for _, s := range []Source{SourceDefault, SourceStored, SourceFixed, SourceNew} {
		if seen[s[0]] {
			panic("wire: two sources begin with " + string(s[0]))
		}
		seen[s[0]] = true
	}
}

// WithSource returns the encoded config arg with another source.
func WithSource(arg string, source Source) string {
	_, rest, _ := strings.Cut(arg, " ")
	return string(source) + " " + rest
}
