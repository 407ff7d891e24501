package httplimit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP keys a request by its client's IP address.
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
			return client.String(), nil
		}
		hops := forwardedFor(r.Header.Values(header), header == "Forwarded")
		for i := len(hops) - 1; i >= 0 && isTrusted(client); i-- {
			hop, ok := parseAddr(hops[i])
			if !ok {
				break
			}
			client = hop
		}
		return client.String(), nil
	}
}

// Header keys a request by the value of a header, such as an API key. A
// request without it is rejected (ErrNoKey, 400 Bad Request).
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
