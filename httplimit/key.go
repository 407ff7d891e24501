package httplimit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// KeyFunc names the client a request counts against: the limiter used is
// limiterFor(redlimit.KeyPart(key)). An error rejects the request with 400
// Bad Request, even with WithFailOpen: the key comes from the request, and
// failing open would let a client skip the limit by leaving out what the key
// is made of.
//
// The key is the client's text (a header, a claim), so the middleware
// escapes it with redlimit.KeyPart before limiterFor sees it, whatever the
// KeyFunc: no brace, '%', space or control byte, no byte above 0x7f, at most
// redlimit.MaxKeyPart bytes. A client can then neither fail the request (a
// '{' of its own would make an invalid name: a 500 for every such request),
// nor choose the hash tag, and so the Redis Cluster slot, of its limiter,
// nor make a key as long as its header. Keys as ClientIP makes them, and
// ordinary ones ("alice@example.com"), pass unchanged.
type KeyFunc func(r *http.Request) (string, error)

// ClientIP keys a request by its client's IP address: an IPv4 address, or
// an IPv6 address's /64 network ("2001:db8:1:2::/64"). A /64 is what an ISP
// gives one subscriber, and any address in it is the subscriber's to use:
// keyed by address, each of them would be a fresh limit. IPv4-mapped IPv6
// addresses (::ffff:192.0.2.1) are IPv4 clients ("192.0.2.1"). ClientPrefix
// keys by other prefix lengths.
//
// Without trusted proxies that is RemoteAddr's. When RemoteAddr is inside one
// of the trusted prefixes, the request came through a proxy that appended the
// address it saw to header: "X-Forwarded-For", "Forwarded" (RFC 7239, its for=
// parameters), or any header holding a comma-separated list of addresses
// (X-Real-IP is a list of one). The client is then the right-most address that
// is not a trusted proxy: everything left of it is whatever the client chose
// to send. Name only the header your proxies overwrite or append to; any other
// is the client's to forge. An entry that is not an address (RFC 7239's
// "unknown" or an obfuscated name) ends the walk at the proxy that wrote it,
// so such clients share that proxy's limit rather than escape it.
func ClientIP(header string, trusted ...netip.Prefix) KeyFunc {
	return ClientPrefix(32, 64, header, trusted...)
}

// ClientPrefix is ClientIP keying IPv4 clients by their /bits4 network and
// IPv6 ones by their /bits6: ClientPrefix(32, 128, ...) keys each address on
// its own, ClientPrefix(24, 48, ...) a whole site. A full-length prefix keys
// by the bare address ("192.0.2.1"), any other by the network in CIDR
// notation ("192.0.2.0/24", "2001:db8:1::/48"). It panics unless 0 <= bits4
// <= 32 and 0 <= bits6 <= 128.
func ClientPrefix(bits4, bits6 int, header string, trusted ...netip.Prefix) KeyFunc {
	if bits4 < 0 || bits4 > 32 || bits6 < 0 || bits6 > 128 {
		panic(fmt.Sprintf("httplimit: prefix lengths /%d for IPv4 and /%d for IPv6 are out of range", bits4, bits6))
	}
	header = http.CanonicalHeaderKey(header)
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, error) {
		client, ok := parseAddr(r.RemoteAddr)
		if !ok {
			return "", fmt.Errorf("%w: RemoteAddr %q is not an IP address", ErrNoKey, r.RemoteAddr)
		}
		if header == "" || !isTrusted(client) {
			return network(client, bits4, bits6), nil
		}
		hops := forwardedFor(r.Header.Values(header), header == "Forwarded")
		for i := len(hops) - 1; i >= 0 && isTrusted(client); i-- {
			hop, ok := parseAddr(hops[i])
			if !ok {
				break
			}
			client = hop
		}
		return network(client, bits4, bits6), nil
	}
}

// network is the key of an address: itself at full length, else its
// network's prefix.
func network(a netip.Addr, bits4, bits6 int) string {
	bits := bits6
	if a.Is4() {
		bits = bits4
	}
	if bits == a.BitLen() {
		return a.String()
	}
	p, _ := a.Prefix(bits) // bits is in range, checked by ClientPrefix
	return p.String()
}

// Header keys a request by the value of a header, such as an API key. A
// request without it is rejected (ErrNoKey, 400 Bad Request). The value is
// the client's to choose, braces, control bytes, 100 KB and all: the
// middleware escapes it (redlimit.KeyPart) before limiterFor sees it, so
// "user:"+key is a safe limiter name, and "a{b" a user like any other.
func Header(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		if v := r.Header.Get(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: no %s header", ErrNoKey, name)
	}
}

// forwardedFor returns the addresses a chain of proxies recorded, the
// nearest last. Several fields of one name are one list, in order (RFC 9110
// section 5.3).
func forwardedFor(values []string, rfc7239 bool) []string {
	var hops []string
	for _, v := range values {
		for _, elem := range strings.Split(v, ",") {
			if !rfc7239 {
				hops = append(hops, strings.TrimSpace(elem))
				continue
			}
			hop := "" // an element without for= is not an address
			for _, pair := range strings.Split(elem, ";") {
				name, value, _ := strings.Cut(strings.TrimSpace(pair), "=")
				if strings.EqualFold(name, "for") {
					hop = strings.Trim(value, `"`)
				}
			}
			hops = append(hops, hop)
		}
	}
	return hops
}

// parseAddr reads an address as the headers and RemoteAddr write it: bare,
// with a port, IPv6 in brackets with or without a port. IPv4-mapped IPv6
// addresses are IPv4 clients and zones are local detail, so both are
// normalised away: one client, one key.
func parseAddr(s string) (netip.Addr, bool) {
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}
