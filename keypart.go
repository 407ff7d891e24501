package redlimit

import (
	"crypto/sha256"
	"encoding/hex"
)

// MaxKeyPart is the longest KeyPart returns, in bytes: longer escaped forms
// are hashed. It is far above ordinary keys (an IPv6 /64 is at most 43
// bytes, a UUID 36, an API key some 40) and keeps a limiter's keys short: a
// key part is in each of them, sent to Redis on every call, and in every
// name a Client keeps of its limiters.
const MaxKeyPart = 128

// hashedPrefix starts a hashed key part. A '%' that KeyPart escapes is
// always followed by two upper-case hex digits, never by an 's', so no
// escaped form starts so.
const hashedPrefix = "%sha256:"

// KeyPart returns s in a form safe to be part of a limiter name, for keys
// that come from requests (a header, a metadata value, a claim of a token):
//
//	client.FixedWindow("user:" + redlimit.KeyPart(r.Header.Get("X-User")))
//
// A name made of a client's text as it is lets the client fail the call
// (an unclosed '{' is ErrInvalidName), pick the hash tag and so the Redis
// Cluster slot its limit lives on ("{x}"), and make Redis keys as long as
// its header. KeyPart's result holds no brace, so the name's hash tag is the
// one the Client's prefix makes (or the caller's own, outside the key part),
// and is at most MaxKeyPart bytes.
//
// Letters, digits and -._~:@/!$&'()+,;= are kept, so that ordinary keys
// read as they are in redis-cli and in SCAN MATCH: "alice@example.com",
// "203.0.113.9" and "2001:db8::/64" are unchanged. Every other byte is
// percent-escaped as %XX (upper-case hex): '{', '}', '%' itself, spaces,
// control bytes, '*', '?', '[', ']' and '\' (glob characters in SCAN
// MATCH and ACL key patterns), quotes, and every byte above 0x7f, valid
// UTF-8 or not (redis-cli shows those as \xNN anyway, and escaping them
// keeps bidi and invisible characters out of keys and logs): "a{b" is
// "a%7Bb". A form longer than MaxKeyPart is replaced by "%sha256:" and
// the SHA-256 of s in hex (72 bytes).
//
// Two different strings never give the same key part: '%' is escaped, so
// an escaped form decodes to one string only; a hashed form starts with
// "%s", which no escaped form does; and two hashed forms are the same only
// if SHA-256 collides. The hash is unkeyed so that every instance, of any
// version, maps a key to the same limit.
//
// httplimit and grpclimit pass every key through KeyPart before their
// limiterFor sees it; do not escape those again.
func KeyPart(s string) string {
	if len(s) > MaxKeyPart { // escaping never shortens
		return hashedKeyPart(s)
	}
	escapes := 0
	for i := 0; i < len(s); i++ {
		if !keptInKeyPart(s[i]) {
			escapes++
		}
	}
	switch {
	case escapes == 0:
		return s // the common case: an IP address, a user name; no allocation
	case len(s)+2*escapes > MaxKeyPart:
		return hashedKeyPart(s)
	}
	const hexDigits = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*escapes)
	for i := 0; i < len(s); i++ {
		if c := s[i]; keptInKeyPart(c) {
			b = append(b, c)
		} else {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&0xf])
		}
	}
	return string(b)
}

// keptInKeyPart reports whether KeyPart keeps c as it is: RFC 3986's
// unreserved characters and those a URI path may hold unescaped (pchar and
// '/'), but for '*', a glob in SCAN MATCH and ACL patterns. None is a
// brace, '%', a space or a control byte.
func keptInKeyPart(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '-', '.', '_', '~', ':', '@', '/', '!', '$', '&', '\'', '(', ')', '+', ',', ';', '=':
		return true
	}
	return false
}

func hashedKeyPart(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hashedPrefix + hex.EncodeToString(sum[:])
}
