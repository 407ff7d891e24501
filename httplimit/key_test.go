package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/redlimit/redlimit/httplimit"
)

func TestClientIP(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	tests := []struct {
		name    string
		header  string // the one ClientIP honours; "" for none
		remote  string
		fields  map[string][]string
		want    string
		wantErr error
	}{
		{"no header honoured", "", "192.0.2.1:1234", map[string][]string{"X-Forwarded-For": {"203.0.113.7"}}, "192.0.2.1", nil},
		{"untrusted peer cannot forge", "X-Forwarded-For", "192.0.2.1:1234", map[string][]string{"X-Forwarded-For": {"203.0.113.7"}}, "192.0.2.1", nil},
		{"one trusted proxy", "X-Forwarded-For", "10.0.0.1:1234", map[string][]string{"X-Forwarded-For": {"203.0.113.7"}}, "203.0.113.7", nil},
		{"right-most untrusted wins over a forged left part", "X-Forwarded-For", "10.0.0.1:1234", map[string][]string{"X-Forwarded-For": {"6.6.6.6, 203.0.113.7, 10.0.0.2"}}, "203.0.113.7", nil},
		{"several fields are one list", "X-Forwarded-For", "10.0.0.1:1234", map[string][]string{"X-Forwarded-For": {"6.6.6.6", "203.0.113.7,10.0.0.2"}}, "203.0.113.7", nil},
		{"trusted proxy without the header", "X-Forwarded-For", "10.0.0.1:1234", nil, "10.0.0.1", nil},
		{"all trusted: the left-most", "X-Forwarded-For", "10.0.0.1:1234", map[string][]string{"X-Forwarded-For": {"10.1.1.1, 10.0.0.2"}}, "10.1.1.1", nil},
		{"not an address stops at the proxy that wrote it", "X-Forwarded-For", "10.0.0.1:1234", map[string][]string{"X-Forwarded-For": {"203.0.113.7, unknown, 10.0.0.2"}}, "10.0.0.2", nil},
		{"address with a port", "X-Forwarded-For", "10.0.0.1:1234", map[string][]string{"X-Forwarded-For": {"203.0.113.7:5555"}}, "203.0.113.7", nil},
		{"IPv6 peer and hop", "X-Forwarded-For", "[2001:db8::1]:443", map[string][]string{"X-Forwarded-For": {"[2600::1]:80"}}, "2600::/64", nil},
		{"IPv4-mapped peer is IPv4", "", "[::ffff:192.0.2.1]:80", nil, "192.0.2.1", nil},
		{"lower-case header name", "x-forwarded-for", "10.0.0.1:1234", map[string][]string{"X-Forwarded-For": {"203.0.113.7"}}, "203.0.113.7", nil},
		{"single-valued header", "X-Real-IP", "10.0.0.1:1234", map[string][]string{"X-Real-Ip": {"203.0.113.7"}}, "203.0.113.7", nil},
		{"Forwarded: quoted IPv6 with a port, then IPv4", "Forwarded", "10.0.0.1:1234",
			map[string][]string{"Forwarded": {`for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711"`}}, "192.0.2.60", nil},
		{"Forwarded: obfuscated identifier", "Forwarded", "10.0.0.1:1234", map[string][]string{"Forwarded": {`for=192.0.2.60, for="_hidden"`}}, "10.0.0.1", nil},
		{"Forwarded: element without for", "Forwarded", "10.0.0.1:1234", map[string][]string{"Forwarded": {`for=192.0.2.60, proto=https`}}, "10.0.0.1", nil},
		{"Forwarded honoured, X-Forwarded-For ignored", "Forwarded", "10.0.0.1:1234", map[string][]string{"X-Forwarded-For": {"203.0.113.7"}}, "10.0.0.1", nil},
		{"X-Forwarded-For honoured, Forwarded ignored", "X-Forwarded-For", "10.0.0.1:1234", map[string][]string{"Forwarded": {"for=203.0.113.7"}}, "10.0.0.1", nil},
		{"RemoteAddr not an address", "", "@", nil, "", httplimit.ErrNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for name, values := range tt.fields {
				r.Header[name] = values
			}
			got, err := httplimit.ClientIP(tt.header, proxies...)(r)
			if got != tt.want || !errors.Is(err, tt.wantErr) {
				t.Errorf("key %q, error %v; want %q, %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestHeader(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	if _, err := httplimit.Header("X-API-Key")(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Errorf("without the header: error %v, want ErrNoKey", err)
	}
	r.Header.Set("X-Api-Key", "k1")
	if got, err := httplimit.Header("x-api-key")(r); got != "k1" || err != nil {
		t.Errorf("key %q, error %v; want k1", got, err)
	}
}

// TestClientPrefix: IPv6 clients are keyed by their /64 by default, so the
// addresses of one subscriber share a limit; IPv4 ones, mapped or not, by
// address; ClientPrefix sets other lengths.
func TestClientPrefix(t *testing.T) {
	proxy := netip.MustParsePrefix("10.0.0.0/8")
	tests := []struct {
		key   httplimit.KeyFunc
		addrs []string // RemoteAddr, and the client a trusted proxy names in X-Forwarded-For
		want  string
	}{
		{httplimit.ClientIP("X-Forwarded-For", proxy), []string{"2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff::9"}, "2001:db8:1:2::/64"},
		{httplimit.ClientIP("X-Forwarded-For", proxy), []string{"2001:db8:1:3::1"}, "2001:db8:1:3::/64"},
		{httplimit.ClientIP("X-Forwarded-For", proxy), []string{"1.2.3.4", "::ffff:1.2.3.4"}, "1.2.3.4"},
		{httplimit.ClientIP("X-Forwarded-For", proxy), []string{"1.2.3.5"}, "1.2.3.5"},
		{httplimit.ClientPrefix(24, 48, "X-Forwarded-For", proxy), []string{"1.2.3.4", "::ffff:1.2.3.4", "1.2.3.5"}, "1.2.3.0/24"},
		{httplimit.ClientPrefix(24, 48, "X-Forwarded-For", proxy), []string{"2001:db8:1:2::1", "2001:db8:1:ffff::9"}, "2001:db8:1::/48"},
		{httplimit.ClientPrefix(32, 128, "X-Forwarded-For", proxy), []string{"2001:db8:1:2::1"}, "2001:db8:1:2::1"},
		{httplimit.ClientPrefix(32, 128, "X-Forwarded-For", proxy), []string{"2001:db8:1:2::2"}, "2001:db8:1:2::2"},
		{httplimit.ClientPrefix(32, 128, "X-Forwarded-For", proxy), []string{"::ffff:1.2.3.4"}, "1.2.3.4"},
		{httplimit.ClientPrefix(0, 0, "X-Forwarded-For", proxy), []string{"1.2.3.4"}, "0.0.0.0/0"},
		{httplimit.ClientPrefix(0, 0, "X-Forwarded-For", proxy), []string{"2001:db8:1:2::1"}, "::/0"},
	}
	for i, tt := range tests {
		for _, addr := range tt.addrs {
			direct := httptest.NewRequest("GET", "/", nil)
			direct.RemoteAddr = netip.AddrPortFrom(netip.MustParseAddr(addr), 443).String()
			proxied := httptest.NewRequest("GET", "/", nil)
			proxied.RemoteAddr = "10.0.0.1:443"
			proxied.Header.Set("X-Forwarded-For", addr)
			for _, r := range []*http.Request{direct, proxied} {
				if got, err := tt.key(r); got != tt.want || err != nil {
					t.Errorf("case %d, %s from %s: key %q, error %v; want %q", i, addr, r.RemoteAddr, got, err, tt.want)
				}
			}
		}
	}
	for _, bits := range [][2]int{{-1, 64}, {33, 64}, {32, -1}, {32, 129}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("ClientPrefix(%d, %d): no panic", bits[0], bits[1])
				}
			}()
			httplimit.ClientPrefix(bits[0], bits[1], "")
		}()
	}
}
