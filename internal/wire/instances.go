package wire

// A member of a prefix's heartbeat key (HeartbeatKey) is one instance: its
// Client's id, a space, then a tag of HeartbeatTagLen lowercase hex digits
// the instance draws for itself, so that instances sharing an id are told
// apart. The library writes members with HeartbeatMemberOf, the command
// reads them with ParseHeartbeatMember; scripts/heartbeat.lua counts the
// members of one id by the same shape (an id, a space, 16 characters).
const HeartbeatTagLen = 16

// HeartbeatMemberOf is the member of the instance of clientID tagged tag.
func HeartbeatMemberOf(clientID, tag string) string { return clientID + " " + tag }

// ParseHeartbeatMember reads a member: the instance's client id and tag.
// ok is false for a member of another shape. An id may hold spaces: the
// tag is the member's end.
func ParseHeartbeatMember(member string) (clientID, tag string, ok bool) {
	cut := len(member) - HeartbeatTagLen - 1
	if cut < 0 || member[cut] != ' ' {
		return "", "", false
	}
	tag = member[cut+1:]
	for i := range len(tag) {
		if c := tag[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", "", false
		}
	}
	return member[:cut], tag, true
}
