package grpclimit

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// KeyFunc names the caller a call counts against; the limiter is
// limiterFor(method, redlimit.KeyPart(key)). An error fails the call
// even with WithFailOpen (the key comes from the call, and failing open
// would let a caller skip the limit by leaving out what the key is made
// of): with the error's own code when it is a gRPC status
// (status.FromError), else with codes.InvalidArgument.
//
// The key is the caller's text (metadata, a claim), so the interceptors
// escape it with redlimit.KeyPart before limiterFor sees it, whatever the
// KeyFunc: no brace, '%', space or control byte, no byte above 0x7f, at most
// redlimit.MaxKeyPart bytes. A caller can then neither fail the call (a '{'
// of its own would make an invalid name: codes.Internal for every such
// call), nor choose the hash tag, and so the Redis Cluster slot, of its
// limiter, nor make a key as long as its metadata. Keys as PeerIP makes
// them, and ordinary ones ("alice@example.com"), pass unchanged.
type KeyFunc func(ctx context.Context, method string) (string, error)

// PeerIP keys a call by the IP address of the connection's peer: an IPv4
// address, or an IPv6 address's /64 network ("2001:db8:1:2::/64"). A /64 is
// what an ISP gives one subscriber, and any address in it is the
// subscriber's to use: keyed by address, each would be a fresh limit.
// IPv4-mapped IPv6 addresses (::ffff:192.0.2.1) are IPv4 callers
// ("192.0.2.1") and zones are local detail, so both are normalised away. A
// peer that is not an IP address (a Unix socket, an in-memory listener) is
// ErrNoKey. Behind a proxy every call has the proxy's address: key by
// Metadata the proxy sets instead. PeerPrefix keys by other prefix lengths.
func PeerIP() KeyFunc { return PeerPrefix(32, 64) }

// PeerPrefix is PeerIP keying IPv4 peers by their /bits4 network and IPv6
// ones by their /bits6: PeerPrefix(32, 128) keys each address on its own,
// PeerPrefix(24, 48) a whole site. A full-length prefix keys by the bare
// address ("192.0.2.1"), any other by the network in CIDR notation
// ("192.0.2.0/24", "2001:db8:1::/48"). It panics unless 0 <= bits4 <= 32 and
// 0 <= bits6 <= 128.
func PeerPrefix(bits4, bits6 int) KeyFunc {
	if bits4 < 0 || bits4 > 32 || bits6 < 0 || bits6 > 128 {
		panic(fmt.Sprintf("grpclimit: prefix lengths /%d for IPv4 and /%d for IPv6 are out of range", bits4, bits6))
	}
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fmt.Errorf("%w: no peer", ErrNoKey)
		}
		var addr netip.Addr
		switch a := p.Addr.(type) {
		case *net.TCPAddr:
			addr, ok = netip.AddrFromSlice(a.IP)
		default: // a transport of its own making: parse what it prints
			ap, err := netip.ParseAddrPort(a.String())
			addr, ok = ap.Addr(), err == nil
		}
		if !ok {
			return "", fmt.Errorf("%w: peer %q is not an IP address", ErrNoKey, p.Addr)
		}
		addr = addr.Unmap().WithZone("")
		bits := bits6
		if addr.Is4() {
			bits = bits4
		}
		if bits == addr.BitLen() {
			return addr.String(), nil
		}
		prefix, _ := addr.Prefix(bits) // bits is in range, checked above
		return prefix.String(), nil
	}
}

// Metadata keys a call by the value of a request metadata key, such as an API
// key; the first non-empty value if it has several. A call without it is
// ErrNoKey (codes.InvalidArgument). The value is the caller's to choose,
// braces, any bytes in a -bin key, 100 KB and all: the interceptors escape
// it (redlimit.KeyPart) before limiterFor sees it, so "user:"+key is a safe
// limiter name, and "a{b" a caller like any other.
func Metadata(key string) KeyFunc {
	return func(ctx context.Context, _ string) (string, error) {
		for _, v := range metadata.ValueFromIncomingContext(ctx, key) {
			if v != "" {
				return v, nil
			}
		}
		return "", fmt.Errorf("%w: no %s metadata", ErrNoKey, key)
	}
}
