package policy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Protocol is an IANA protocol number, so backends can use it directly as
// nftables' meta l4proto.
type Protocol uint8

// The protocols whose ports Kubernetes policies can name.
const (
	ProtoICMP   Protocol = 1
	ProtoTCP    Protocol = 6
	ProtoUDP    Protocol = 17
	ProtoICMPv6 Protocol = 58
	ProtoSCTP   Protocol = 132
)

// PortProtocols are the protocols with ports, in a stable order.
var PortProtocols = [...]Protocol{ProtoTCP, ProtoUDP, ProtoSCTP}

// ParseProtocol accepts TCP, UDP, SCTP, ICMP and ICMPv6 in any case.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToUpper(s) {
	case "TCP":
		return ProtoTCP, nil
	case "UDP":
		return ProtoUDP, nil
	case "SCTP":
		return ProtoSCTP, nil
	case "ICMP":
		return ProtoICMP, nil
	case "ICMPV6":
		return ProtoICMPv6, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want TCP, UDP, SCTP, ICMP or ICMPv6)", s)
}

// String is the Kubernetes spelling (TCP, UDP, SCTP) or the IANA number.
func (p Protocol) String() string {
	switch p {
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	case ProtoICMP:
		return "ICMP"
	case ProtoICMPv6:
		return "ICMPv6"
	}
	return strconv.Itoa(int(p))
}

// HasPorts reports whether the protocol carries ports that policies match.
func (p Protocol) HasPorts() bool {
	return p == ProtoTCP || p == ProtoUDP || p == ProtoSCTP
}

// PortRange is an inclusive range of ports.
type PortRange struct {
	From, To uint16
}

// String renders "80" or "8000-9000".
func (r PortRange) String() string {
	if r.From == r.To {
		return strconv.Itoa(int(r.From))
	}
	return fmt.Sprintf("%d-%d", r.From, r.To)
}

// AllPorts is 1-65535: a protocol named with no port. Port 0 is never a
// valid destination, so it is left out.
var AllPorts = PortRange{1, 65535}

// PortSet is what a rule matches beyond addresses: either all traffic
// (any protocol, ICMP included) or port ranges per protocol. It is immutable
// once built; a zero PortSet matches nothing.
type PortSet struct {
	// All matches every packet regardless of protocol: a rule without
	// ports or protocols.
	All bool
	// ByProto holds sorted, disjoint, non-adjacent ranges per protocol.
	ByProto map[Protocol][]PortRange
}

// AllTraffic is the PortSet of a rule that names no ports.
func AllTraffic() *PortSet { return &PortSet{All: true} }

// PortSetBuilder accumulates ranges; Build normalises them.
type PortSetBuilder struct {
	all bool
	m   map[Protocol][]PortRange
}

// AddAll makes the set match all traffic.
func (b *PortSetBuilder) AddAll() { b.all = true }

// Add adds one range for one protocol; reversed ranges are ignored.
func (b *PortSetBuilder) Add(p Protocol, r PortRange) {
	if r.To < r.From {
		return
	}
	if b.m == nil {
		b.m = map[Protocol][]PortRange{}
	}
	b.m[p] = append(b.m[p], r)
}

// Build returns the normalised set.
func (b *PortSetBuilder) Build() *PortSet {
	if b.all {
		return AllTraffic()
	}
	out := &PortSet{ByProto: map[Protocol][]PortRange{}}
	for p, rs := range b.m {
		out.ByProto[p] = mergePorts(rs)
	}
	return out
}

func mergePorts(rs []PortRange) []PortRange {
	rs = append([]PortRange(nil), rs...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].From < rs[j].From })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && int(out[n-1].To)+1 >= int(r.From) {
			if r.To > out[n-1].To {
				out[n-1].To = r.To
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// Empty reports whether the set matches no packet.
func (s *PortSet) Empty() bool {
	if s == nil {
		return true
	}
	if s.All {
		return false
	}
	for _, rs := range s.ByProto {
		if len(rs) > 0 {
			return false
		}
	}
	return true
}

// Matches reports whether a packet of protocol p to port matches.
func (s *PortSet) Matches(p Protocol, port uint16) bool {
	if s == nil {
		return false
	}
	if s.All {
		return true
	}
	rs := s.ByProto[p]
	i := sort.Search(len(rs), func(i int) bool { return rs[i].To >= port })
	return i < len(rs) && rs[i].From <= port
}

// String renders the set, e.g. "all" or "TCP:80,8000-9000 UDP:53".
func (s *PortSet) String() string {
	if s == nil {
		return "none"
	}
	if s.All {
		return "all"
	}
	var parts []string
	for _, p := range []Protocol{ProtoTCP, ProtoUDP, ProtoSCTP} {
		rs := s.ByProto[p]
		if len(rs) == 0 {
			continue
		}
		ss := make([]string, len(rs))
		for i, r := range rs {
			ss[i] = r.String()
		}
		parts = append(parts, p.String()+":"+strings.Join(ss, ","))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}
