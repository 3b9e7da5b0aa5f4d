package nft

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/moat-net/moat/policy"
)

// setContents is the union of some terms split into the four set kinds.
type setContents [4]namedSet

// unionBudgetFactor and unionBudgetFloor bound a union run's elements:
// at most unionBudgetFactor times the address and port ranges its terms
// are made of, or unionBudgetFloor if that is more. Cutting terms into
// disjoint boxes can multiply them (address pieces times the ports over
// them), and a few kilobytes of policies could otherwise ask for
// millions of elements, more than nft loads in reasonable time. Past the
// budget the run takes shared lookups (fitUnion), whose elements are
// its terms' own. The floor keeps small unions whole; it is low because
// every local pod can have a union run of its own: 110 pods (a kubelet's
// default) can then hold about 110,000 elements beyond 8 times their
// policies' ranges, not millions.
const (
	unionBudgetFactor = 8
	unionBudgetFloor  = 1024
)

// contentsOf computes the elements of a union run's four sets from the
// union of its matches; nil when they would exceed the run's budget
// (unionBudgetFactor). nftables refuses overlapping elements in an
// interval set, so terms with ports are cut into disjoint boxes
// (cutBoxes). A port range is always one element, however wide.
func contentsOf(matches []policy.Match) *setContents {
	var sc setContents
	for i, k := range setKinds {
		sc[i].Kind = k
	}
	all, withPorts := splitTerms(matches)
	input := len(all.Ranges())
	var v4, v6 []sweepGroup
	for _, g := range withPorts {
		var a4, a6 []policy.AddrRange
		for _, r := range g.addrs.Ranges() {
			if r.From.Is4() {
				a4 = append(a4, r)
			} else {
				a6 = append(a6, r)
			}
		}
		if len(a4) > 0 {
			v4 = append(v4, sweepGroup{ranges: a4, ports: g.ports})
		}
		if len(a6) > 0 {
			v6 = append(v6, sweepGroup{ranges: a6, ports: g.ports})
		}
		input += len(g.addrs.Ranges()) + portRanges(g.ports)
	}
	for _, r := range all.Ranges() {
		if r.From.Is4() {
			sc[addr4].Addrs = append(sc[addr4].Addrs, r)
		} else {
			sc[addr6].Addrs = append(sc[addr6].Addrs, r)
		}
	}
	left := max(unionBudgetFloor, unionBudgetFactor*input) - len(all.Ranges())
	for _, f := range []struct {
		kind   setKind
		groups []sweepGroup
	}{{ports4, v4}, {ports6, v6}} {
		boxes, portMajor, ok := cutBoxes(f.groups, left)
		if !ok {
			return nil
		}
		left -= len(boxes)
		sc[f.kind].Boxes, sc[f.kind].PortMajor = boxes, portMajor
	}
	for i := range sc {
		sc[i].hash = elementsHash(&sc[i])
	}
	return &sc
}

// portRanges counts the ranges of ports by protocol.
func portRanges(ports map[policy.Protocol][]policy.PortRange) int {
	n := 0
	for _, rs := range ports {
		n += len(rs)
	}
	return n
}

// portGroup is the addresses of all terms with the same ports.
type portGroup struct {
	ports map[policy.Protocol][]policy.PortRange
	addrs *policy.AddrSet
}

// splitTerms returns the addresses of the terms that match all traffic,
// and the other terms' addresses grouped by ports (in ports key order).
func splitTerms(matches []policy.Match) (*policy.AddrSet, []portGroup) {
	var all []policy.AddrRange
	type group struct {
		ports *policy.PortSet
		addrs []policy.AddrRange
	}
	groups := map[string]*group{}
	for _, m := range matches {
		for _, t := range m {
			if t.Ports == nil || t.Addrs.Empty() || t.Ports.Empty() {
				continue
			}
			if t.Ports.All {
				all = append(all, t.Addrs.Ranges()...)
				continue
			}
			key := portsKey(t.Ports.ByProto)
			g := groups[key]
			if g == nil {
				g = &group{ports: t.Ports}
				groups[key] = g
			}
			g.addrs = append(g.addrs, t.Addrs.Ranges()...)
		}
	}
	out := make([]portGroup, 0, len(groups))
	for _, key := range sortedKeys(groups) {
		g := groups[key]
		out = append(out, portGroup{ports: g.ports.ByProto, addrs: policy.NewAddrSet(g.addrs...)})
	}
	return policy.NewAddrSet(all...), out
}

// elementsHash identifies a set's elements, so a diff can skip sets whose
// elements did not change without comparing them one by one.
func elementsHash(s *namedSet) string {
	h := sha256.New()
	buf := make([]byte, 0, 4096+64)
	addr := func(a netip.Addr) {
		buf, _ = a.AppendBinary(buf) // as MarshalBinary, without a slice per address
	}
	buf = append(buf, byte(s.Kind))
	if s.PortMajor {
		buf = append(buf, 'p')
	}
	for _, r := range s.Addrs {
		addr(r.From)
		addr(r.To)
		if len(buf) > 4096 {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	for _, b := range s.Boxes {
		addr(b.Addrs.From)
		addr(b.Addrs.To)
		buf = append(buf, byte(b.Proto), byte(b.Ports.From>>8), byte(b.Ports.From), byte(b.Ports.To>>8), byte(b.Ports.To))
		if len(buf) > 4096 {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	for _, sv := range s.Services {
		buf = append(buf, byte(sv.Proto), byte(sv.Ports.From>>8), byte(sv.Ports.From), byte(sv.Ports.To>>8), byte(sv.Ports.To))
	}
	h.Write(buf)
	return hex.EncodeToString(h.Sum(nil))[:hashLen]
}

// portsKey is a canonical string for ports by protocol.
func portsKey(m map[policy.Protocol][]policy.PortRange) string {
	protos := make([]int, 0, len(m))
	for p, rs := range m {
		if len(rs) > 0 {
			protos = append(protos, int(p))
		}
	}
	sort.Ints(protos)
	var b strings.Builder
	for _, p := range protos {
		b.WriteString(strconv.Itoa(p))
		b.WriteByte(':')
		for _, r := range m[policy.Protocol(p)] {
			b.WriteString(r.String())
			b.WriteByte(',')
		}
		b.WriteByte(';')
	}
	return b.String()
}

// protoName is the nftables spelling of an inet_proto value.
func protoName(p policy.Protocol) string {
	switch p {
	case policy.ProtoTCP:
		return "tcp"
	case policy.ProtoUDP:
		return "udp"
	case policy.ProtoSCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// elementKeys renders the set's elements as knftables keys.
func (s *namedSet) elementKeys() [][]string {
	switch s.Kind {
	case services:
		return renderKeys(s.Services, serviceKey)
	case addr4, addr6:
		return renderKeys(s.Addrs, s.addrKey)
	}
	return renderKeys(s.Boxes, boxKey)
}

func renderKeys[T any](elems []T, key func(T) []string) [][]string {
	out := make([][]string, len(elems))
	for i, e := range elems {
		out[i] = key(e)
	}
	return out
}

func serviceKey(sv service) []string { return []string{protoName(sv.Proto), sv.Ports.String()} }

func boxKey(b box) []string {
	return []string{b.Addrs.String(), protoName(b.Proto), b.Ports.String()}
}

// addrKey is the key of an element of an addr4 or addr6 set.
func (s *namedSet) addrKey(r policy.AddrRange) []string {
	fam := "ipv4"
	if s.Kind == addr6 {
		fam = "ipv6"
	}
	return []string{r.String(), fam}
}

// contains reports whether the set holds the remote address (and, for
// ports sets, protocol and port): the Go twin of an nftables lookup.
func (s *namedSet) contains(remote netip.Addr, proto policy.Protocol, port uint16) bool {
	if s.Kind == services {
		i := sort.Search(len(s.Services), func(i int) bool {
			sv := s.Services[i]
			return sv.Proto > proto || sv.Proto == proto && sv.Ports.To >= port
		})
		return i < len(s.Services) && s.Services[i].Proto == proto && s.Services[i].Ports.From <= port
	}
	if remote.Is4() != s.Kind.ipv4() {
		return false
	}
	if s.Kind == addr4 || s.Kind == addr6 {
		i := sort.Search(len(s.Addrs), func(i int) bool { return !s.Addrs[i].To.Less(remote) })
		return i < len(s.Addrs) && !remote.Less(s.Addrs[i].From)
	}
	if s.PortMajor {
		return s.containsPortMajor(remote, proto, port)
	}
	i := sort.Search(len(s.Boxes), func(i int) bool { return !s.Boxes[i].Addrs.To.Less(remote) })
	for ; i < len(s.Boxes) && !remote.Less(s.Boxes[i].Addrs.From); i++ {
		b := s.Boxes[i]
		if b.Proto == proto && b.Ports.From <= port && port <= b.Ports.To {
			return true
		}
	}
	return false
}

// containsPortMajor is contains for boxes in port order: the boxes of the
// port piece holding the port are next to each other, in address order.
func (s *namedSet) containsPortMajor(remote netip.Addr, proto policy.Protocol, port uint16) bool {
	bs := s.Boxes
	i := sort.Search(len(bs), func(i int) bool {
		return bs[i].Proto > proto || bs[i].Proto == proto && bs[i].Ports.To >= port
	})
	if i == len(bs) || bs[i].Proto != proto || bs[i].Ports.From > port {
		return false
	}
	piece := bs[i].Ports
	end := i + sort.Search(len(bs)-i, func(j int) bool { return bs[i+j].Proto != proto || bs[i+j].Ports != piece })
	j := i + sort.Search(end-i, func(j int) bool { return !bs[i+j].Addrs.To.Less(remote) })
	return j < end && !remote.Less(bs[j].Addrs.From)
}
