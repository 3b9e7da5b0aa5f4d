// Package dest parses and normalises TCP destinations (host:port) so that the
// server's --allowed-destination list and the agent's --target flags compare
// equal exactly when they name the same destination, whatever the spelling.
package dest

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Dest is a normalised destination. Host is a lower-case DNS name without a
// trailing dot, or an IP address in canonical form (IPv4-mapped IPv6 unmapped).
type Dest struct {
	Host string
	Port uint16
}

// String renders d as host:port, with IPv6 in brackets (RFC 3986).
func (d Dest) String() string {
	return net.JoinHostPort(d.Host, strconv.Itoa(int(d.Port)))
}

// IsIP reports whether Host is an IP literal.
func (d Dest) IsIP() bool {
	_, err := netip.ParseAddr(d.Host)
	return err == nil
}

// wellKnown are the only port names accepted; nothing is read from
// /etc/services so the result never depends on the host.
var wellKnown = map[string]uint16{"https": 443, "http": 80}

// Parse normalises "host:port". IPv6 hosts must be bracketed. Names are
// lower-cased and lose one trailing dot; IP literals are canonicalised; the
// port may be decimal (leading zeros allowed) or "http"/"https". Zones,
// empty parts and anything else are errors.
func Parse(s string) (Dest, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return Dest{}, fmt.Errorf("destination %q: %w", s, err)
	}
	h, err := normHost(host)
	if err != nil {
		return Dest{}, fmt.Errorf("destination %q: %w", s, err)
	}
	p, err := parsePort(portStr)
	if err != nil {
		return Dest{}, fmt.Errorf("destination %q: %w", s, err)
	}
	return Dest{Host: h, Port: p}, nil
}

func parsePort(s string) (uint16, error) {
	if p, ok := wellKnown[strings.ToLower(s)]; ok {
		return p, nil
	}
	if s == "" {
		return 0, fmt.Errorf("missing port")
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("port %q: not a number", s)
		}
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q: must be 1-65535", s)
	}
	return uint16(n), nil
}

func normHost(h string) (string, error) {
	if h == "" {
		return "", fmt.Errorf("missing host")
	}
	if strings.Contains(h, "%") {
		return "", fmt.Errorf("host %q: IPv6 zones are not allowed", h)
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String(), nil
	}
	if strings.Contains(h, ":") {
		return "", fmt.Errorf("host %q: not a valid IPv6 address", h)
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if h == "" || len(h) > 253 {
		return "", fmt.Errorf("host %q: invalid length", h)
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return "", fmt.Errorf("host %q: empty or long label", h)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return "", fmt.Errorf("host %q: invalid character %q", h, r)
			}
		}
	}
	return h, nil
}

// AllowList is the server's set of destinations node clients may reach.
// The zero value allows nothing.
type AllowList struct{ set map[Dest]struct{} }

// NewAllowList parses each entry; the error names the bad entry.
func NewAllowList(entries []string) (*AllowList, error) {
	a := &AllowList{set: make(map[Dest]struct{}, len(entries))}
	for _, e := range entries {
		d, err := Parse(e)
		if err != nil {
			return nil, fmt.Errorf("--allowed-destination: %w", err)
		}
		a.set[d] = struct{}{}
	}
	return a, nil
}

// Match normalises address and returns the destination to dial if the list
// names it. The caller dials the returned (canonical) form, never the
// peer's spelling, so resolution only ever happens for names on the list.
func (a *AllowList) Match(address string) (Dest, error) {
	d, err := Parse(address)
	if err != nil {
		return Dest{}, err
	}
	if a == nil {
		return Dest{}, fmt.Errorf("destination %s is not allowed: no --allowed-destination configured", d)
	}
	if _, ok := a.set[d]; !ok {
		return Dest{}, fmt.Errorf("destination %s is not in --allowed-destination", d)
	}
	return d, nil
}

// Len is the number of allowed destinations.
func (a *AllowList) Len() int {
	if a == nil {
		return 0
	}
	return len(a.set)
}

// Target is one agent --target: node clients connecting to LocalPort on the
// bind address are tunneled to Dest.
type Target struct {
	LocalPort uint16
	Dest      Dest
}

// ParseTarget parses "local_port:dst_host:dst_port" (IPv6 hosts in brackets).
func ParseTarget(s string) (Target, error) {
	i := strings.IndexByte(s, ':')
	if i < 0 {
		return Target{}, fmt.Errorf("--target %q: want local_port:dst_host:dst_port", s)
	}
	lp, err := parsePort(s[:i])
	if err != nil {
		return Target{}, fmt.Errorf("--target %q: local port: %w", s, err)
	}
	d, err := Parse(s[i+1:])
	if err != nil {
		return Target{}, fmt.Errorf("--target %q: %w", s, err)
	}
	return Target{LocalPort: lp, Dest: d}, nil
}
