package nft

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/moat-net/moat/policy"
)

// setContents is the union of some terms split into the four set kinds.
type setContents [4]namedSet

// contentsOf computes the elements of a union run's four sets from the
// union of its matches. nftables refuses overlapping elements in an
// interval set, so terms with ports are cut into disjoint boxes (sweep).
// A port range is always one element, however wide.
func contentsOf(matches []policy.Match) *setContents {
	var sc setContents
	for i, k := range setKinds {
		sc[i].Kind = k
	}
	all, withPorts := splitTerms(matches)
	for _, r := range all.Ranges() {
		if r.From.Is4() {
			sc[addr4].Addrs = append(sc[addr4].Addrs, r)
		} else {
			sc[addr6].Addrs = append(sc[addr6].Addrs, r)
		}
	}
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
	}
	sc[ports4].Boxes = sweep(v4)
	sc[ports6].Boxes = sweep(v6)
	for i := range sc {
		sc[i].hash = elementsHash(&sc[i])
	}
	return &sc
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

// sweepGroup is a set of address ranges (disjoint, one family) that all
// carry the same ports.
type sweepGroup struct {
	ranges []policy.AddrRange
	ports  map[policy.Protocol][]policy.PortRange
}

type sweepEvent struct {
	at    netip.Addr
	end   bool // at is one past the last address of the family
	group int
	delta int
}

// segment is a maximal range of addresses covered by groups whose ports
// union to the same set.
type segment struct {
	r     policy.AddrRange
	key   string
	ports map[policy.Protocol][]policy.PortRange
}

// sweep cuts the groups' ranges into disjoint boxes: 1. every range
// becomes a start and an end event; 2. the events are walked in address
// order, and each piece between two consecutive event addresses gets the
// union of the ports of the groups covering it, neighbours with equal
// ports merged; 3. each piece gives one box per protocol and port range.
func sweep(groups []sweepGroup) []box {
	if len(groups) == 0 {
		return nil
	}
	return boxesOf(segments(groups, sweepEvents(groups)))
}

// sweepEvents lists where each group's ranges start and end, in address
// order. A range ending at the family's last address ends "past" it,
// after every other event.
func sweepEvents(groups []sweepGroup) []sweepEvent {
	var evs []sweepEvent
	for gi, g := range groups {
		for _, r := range g.ranges {
			evs = append(evs, sweepEvent{at: r.From, group: gi, delta: 1})
			if next := r.To.Next(); next.IsValid() && next.Is4() == r.To.Is4() {
				evs = append(evs, sweepEvent{at: next, group: gi, delta: -1})
			} else {
				evs = append(evs, sweepEvent{at: r.To, end: true, group: gi, delta: -1})
			}
		}
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].end != evs[j].end {
			return !evs[i].end
		}
		return evs[i].at.Less(evs[j].at)
	})
	return evs
}

// segments walks the events, keeping count of the groups covering the
// current piece of the address space.
func segments(groups []sweepGroup, evs []sweepEvent) []segment {
	active := make([]int, len(groups))
	u := portUnions{groups: groups, byCover: map[string]portUnion{}}
	var segs []segment
	for i := 0; i < len(evs); {
		j := i
		for j < len(evs) && evs[j].end == evs[i].end && evs[j].at == evs[i].at {
			active[evs[j].group] += evs[j].delta
			j++
		}
		if j == len(evs) || evs[i].end {
			break
		}
		from := evs[i].at
		to := evs[j].at
		if !evs[j].end {
			to = to.Prev()
		}
		i = j
		pu, covered := u.of(active)
		if !covered {
			continue
		}
		if n := len(segs); n > 0 && segs[n-1].key == pu.key && segs[n-1].r.To.Next() == from {
			segs[n-1].r.To = to
			continue
		}
		segs = append(segs, segment{r: policy.AddrRange{From: from, To: to}, key: pu.key, ports: pu.ports})
	}
	return segs
}

// portUnions computes the union of the ports of a combination of groups
// once: pieces covered by the same groups have the same ports.
type portUnions struct {
	groups  []sweepGroup
	byCover map[string]portUnion
	sig     []byte
}

type portUnion struct {
	ports map[policy.Protocol][]policy.PortRange
	key   string
}

// of returns the union for the groups active counts as covering; false
// when none does.
func (u *portUnions) of(active []int) (portUnion, bool) {
	u.sig = u.sig[:0]
	for gi, n := range active {
		if n > 0 {
			u.sig = binary.AppendUvarint(u.sig, uint64(gi))
		}
	}
	if len(u.sig) == 0 {
		return portUnion{}, false
	}
	if pu, ok := u.byCover[string(u.sig)]; ok {
		return pu, true
	}
	var b policy.PortSetBuilder
	for gi, n := range active {
		if n <= 0 {
			continue
		}
		for p, rs := range u.groups[gi].ports {
			for _, r := range rs {
				b.Add(p, r)
			}
		}
	}
	pu := portUnion{ports: b.Build().ByProto}
	pu.key = portsKey(pu.ports)
	u.byCover[string(u.sig)] = pu
	return pu, true
}

// boxesOf expands segments into boxes, protocols in numeric order.
func boxesOf(segs []segment) []box {
	var out []box
	for _, s := range segs {
		protos := make([]int, 0, len(s.ports))
		for p := range s.ports {
			protos = append(protos, int(p))
		}
		sort.Ints(protos)
		for _, p := range protos {
			for _, pr := range s.ports[policy.Protocol(p)] {
				out = append(out, box{Addrs: s.r, Proto: policy.Protocol(p), Ports: pr})
			}
		}
	}
	return out
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
	i := sort.Search(len(s.Boxes), func(i int) bool { return !s.Boxes[i].Addrs.To.Less(remote) })
	for ; i < len(s.Boxes) && !remote.Less(s.Boxes[i].Addrs.From); i++ {
		b := s.Boxes[i]
		if b.Proto == proto && b.Ports.From <= port && port <= b.Ports.To {
			return true
		}
	}
	return false
}
