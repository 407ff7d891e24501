package wire

import "fmt"

// The heartbeat script's contract (scripts/heartbeat.lua, degraded mode):
// its key is a prefix's instances (HeartbeatKey); its arguments, by
// position:
const (
	HeartbeatMember   = 1 + iota // this instance: its client id, a space, 16 hex digits
	HeartbeatNow                 // ms, or "" for Redis TIME
	HeartbeatExpire              // ms after its last beat an instance is forgotten
	HeartbeatClientID            // this client's id: the reply counts the members that have it
)

// HeartbeatReplyLen is the length of the heartbeat's reply: the instances
// live, and how many of them have this client's id.
const HeartbeatReplyLen = 2

// HeartbeatKey is the zset of a prefix's live instances. Under a prefix
// without braces every limiter's name gets a hash tag (FullName), so this
// key is no limiter's; otherwise no limiter may be called
// "redlimit:instances".
func HeartbeatKey(prefix string) string { return prefix + "redlimit:instances" }

// HeartbeatHeader declares the heartbeat script's contract.
func HeartbeatHeader() string {
	return fmt.Sprintf("-- The contract, declared by internal/wire.\nlocal HB_MEMBER, HB_NOW, HB_EXPIRE, HB_CLIENT_ID = %d, %d, %d, %d -- ARGV's\n"+
		"local HB_TAG_LEN = %d -- a member is the client id, a space and a tag of this many hex digits\n",
		HeartbeatMember, HeartbeatNow, HeartbeatExpire, HeartbeatClientID, HeartbeatTagLen)
}
