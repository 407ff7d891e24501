package wire

import "testing"

// A member reads back as the id and tag it was made of, whatever the id
// holds; anything else is no member.
func TestHeartbeatMember(t *testing.T) {
	for _, id := range []string{"api-1", "", "a b", "x 0123456789abcdef"} {
		m := HeartbeatMemberOf(id, "0123456789abcdef")
		if got, tag, ok := ParseHeartbeatMember(m); !ok || got != id || tag != "0123456789abcdef" {
			t.Errorf("%q: %q %q %v", m, got, tag, ok)
		}
	}
	for _, m := range []string{"", "api", "api 0123456789abcde", "api0123456789abcdef", "api 0123456789ABCDEF", "api 0123456789abcdeg", " 0123456789abcdef0"} {
		if id, tag, ok := ParseHeartbeatMember(m); ok {
			t.Errorf("%q read as %q %q", m, id, tag)
		}
	}
}
