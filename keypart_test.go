package redlimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/redlimit/redlimit/internal/redistest"
)

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestKeyPart(t *testing.T) {
	fits := strings.Repeat("a", MaxKeyPart)
	for _, tt := range []struct{ in, want string }{
		// Ordinary keys, as ClientIP and PeerIP make them and users send them.
		{"203.0.113.9", "203.0.113.9"},
		{"2001:db8::/64", "2001:db8::/64"},
		{"198.51.100.0/24", "198.51.100.0/24"},
		{"alice@example.com", "alice@example.com"},
		{"k-123_A.b~c", "k-123_A.b~c"},
		{"YWJj+/d=", "YWJj+/d="}, // base64
		{"!$&'()+,;=", "!$&'()+,;="},
		{"", ""},
		// Braces, '%', spaces, controls, globs, quotes: escaped.
		{"a{b", "a%7Bb"},
		{"{x}", "%7Bx%7D"},
		{"a%7Bb", "a%257Bb"},
		{"100%", "100%25"},
		{"a b\tc", "a%20b%09c"},
		{"\x00\xff", "%00%FF"},
		{"\x7f", "%7F"},
		{`*?[]\"#^|<>` + "`", "%2A%3F%5B%5D%5C%22%23%5E%7C%3C%3E%60"},
		// Every byte above 0x7f, valid UTF-8 or not.
		{"ünï", "%C3%BCn%C3%AF"},
		{"\u202e", "%E2%80%AE"}, // right-to-left override
		{"\xc3", "%C3"},
		// Up to MaxKeyPart bytes once escaped; beyond, the hash of the input.
		{fits, fits},
		{fits + "a", "%sha256:" + sha256Hex(fits+"a")},
		{fits[:MaxKeyPart-3] + "{", fits[:MaxKeyPart-3] + "%7B"},
		{fits[:MaxKeyPart-2] + "{", "%sha256:" + sha256Hex(fits[:MaxKeyPart-2]+"{")},
		{strings.Repeat("{", 43), "%sha256:" + sha256Hex(strings.Repeat("{", 43))},
	} {
		if got := KeyPart(tt.in); got != tt.want {
			t.Errorf("KeyPart(%.40q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := len(KeyPart(strings.Repeat("x", 100<<10))); got != len("%sha256:")+64 {
		t.Errorf("a hashed key part is %d bytes", got)
	}
}

// TestKeyPartAllocs: an ordinary key costs nothing on the way to a limiter.
func TestKeyPartAllocs(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = KeyPart("2001:db8:1:2::/64") }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

// unescapeKeyPart is KeyPart's inverse for the escaped forms: that it
// exists, and gives back the input, is what makes them injective.
func unescapeKeyPart(p string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '%':
			if i+2 >= len(p) || strings.ToUpper(p[i+1:i+3]) != p[i+1:i+3] {
				return "", false
			}
			v, err := strconv.ParseUint(p[i+1:i+3], 16, 8)
			if err != nil || keptInKeyPart(byte(v)) {
				return "", false // a kept byte is never escaped: one form per input
			}
			b.WriteByte(byte(v))
			i += 2
		case keptInKeyPart(c):
			b.WriteByte(c)
		default:
			return "", false
		}
	}
	return b.String(), true
}

// checkKeyPart checks what KeyPart promises of s's key part.
func checkKeyPart(t *testing.T, s string) {
	p := KeyPart(s)
	if len(p) > MaxKeyPart || strings.ContainsAny(p, "{} ") || !utf8.ValidString(p) {
		t.Fatalf("KeyPart(%q) = %q: over %d bytes, a brace, a space or invalid UTF-8", s, p, MaxKeyPart)
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x21 || p[i] > 0x7e {
			t.Fatalf("KeyPart(%q) = %q: byte %#x", s, p, p[i])
		}
	}
	escapedLen := len(s)
	for i := 0; i < len(s); i++ {
		if !keptInKeyPart(s[i]) {
			escapedLen += 2
		}
	}
	if hash, ok := strings.CutPrefix(p, hashedPrefix); ok {
		if hash != sha256Hex(s) || escapedLen <= MaxKeyPart {
			t.Fatalf("KeyPart(%q) = %q: not the input's hash, or hashed though its escaped form fits", s, p)
		}
		return
	}
	if back, ok := unescapeKeyPart(p); !ok || back != s || escapedLen > MaxKeyPart {
		t.Fatalf("KeyPart(%q) = %q, which decodes to %q (%v)", s, p, back, ok)
	}
}

func FuzzKeyPart(f *testing.F) {
	for _, s := range []string{"", "a{b", "{x}", "%7B", "%sha256:00", "\x00\xff", "ünï", "2001:db8::/64", strings.Repeat("%", 43), strings.Repeat("a", 129)} {
		f.Add(s)
	}
	f.Fuzz(checkKeyPart)
}

// TestKeyPartDistinct: inputs that a lossy scheme would join each have
// their own key part: an input and its escaped form, the two sides of the
// bound, long inputs that differ only at the end, a hashed form's text.
func TestKeyPartDistinct(t *testing.T) {
	long := strings.Repeat("a", 1000)
	inputs := []string{
		"a{b", "a%7Bb", "a%7bb", "a%257Bb", "{x}", "%7Bx%7D",
		"\x00\xff", "%00%FF", "%00%ff", "ü", "%C3%BC",
		long, long[:999] + "b", long[:MaxKeyPart], long[:MaxKeyPart+1],
		hashedPrefix + sha256Hex(long), // KeyPart(long), as a client might send it
		"", "%", "%s", "%sha256:",
	}
	seen := map[string]string{}
	for _, s := range inputs {
		checkKeyPart(t, s)
		p := KeyPart(s)
		if other, ok := seen[p]; ok {
			t.Errorf("KeyPart(%.40q) = KeyPart(%.40q) = %q", s, other, p)
		}
		seen[p] = s
	}
}

// TestKeyPartInNames: under a prefix, a name of a fixed part and a key
// part is valid whatever the key, and its hash tag is the one the prefix
// makes, around the whole name; without one, the name holds no tag, and
// its keys' tag is the name.
func TestKeyPartInNames(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Miniredis(t)
	for _, key := range []string{"a{b", "{x}", "}", "{}", "\x00\xff", strings.Repeat("{", 1000)} {
		for _, prefix := range []string{"svc:", ""} {
			client := New(rdb, WithPrefix(prefix))
			l := client.FixedWindow("user:" + KeyPart(key)).WithDefault(PerMinute(1))
			if _, err := l.Allow(ctx, 1); err != nil {
				t.Errorf("prefix %q, key %.20q: %v", prefix, key, err)
			}
			want := prefix + "{user:" + KeyPart(key) + "}"
			if prefix == "" {
				want = "user:" + KeyPart(key)
			}
			if l.Name() != want {
				t.Errorf("prefix %q, key %.20q: name %q, want %q", prefix, key, l.Name(), want)
			}
		}
	}
	// What KeyPart prevents: the key as it came.
	if _, err := New(rdb, WithPrefix("svc:")).FixedWindow("user:a{b").WithDefault(PerMinute(1)).Allow(ctx, 1); !errors.Is(err, ErrInvalidName) {
		t.Errorf("an unclosed brace: %v", err)
	}
}
