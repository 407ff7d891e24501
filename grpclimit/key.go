package grpclimit

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// PeerIP keys a call by the IP address of the connection's peer. IPv4-mapped
// IPv6 addresses are IPv4 callers and zones are local detail, so both are
// normalised away: one caller, one key. A peer that is not an IP address (a
// Unix socket, an in-memory listener) is ErrNoKey. Behind a proxy every call
// has the proxy's address: key by Metadata the proxy sets instead.
func PeerIP() KeyFunc {
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
		return addr.Unmap().WithZone("").String(), nil
	}
}

// Metadata keys a call by the value of a request metadata key, such as an API
// key; the first non-empty value if it has several. A call without it is
// ErrNoKey (codes.InvalidArgument).
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
