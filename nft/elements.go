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
type setContents [4]Set

// contentsOf computes the elements of a run's four sets from the union of
// its matches. nftables refuses overlapping elements in an interval set, so
// terms with ports are cut into disjoint boxes: the address axis is split
// where any term's ranges start or end, each piece gets the union of the
// ports of the terms covering it, and neighbouring pieces with equal ports
// are merged again. A port range is always one element, however wide.
func contentsOf(matches []policy.Match) *setContents {
	var sc setContents
	for i, k := range setKinds {
		sc[i].Kind = k
	}
	var all []policy.AddrRange
	type group struct {
		ports *policy.PortSet
		addrs []policy.AddrRange
	}
	groups := map[string]*group{}
	var order []string
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
				order = append(order, key)
			}
			g.addrs = append(g.addrs, t.Addrs.Ranges()...)
		}
	}
	for _, r := range policy.NewAddrSet(all...).Ranges() {
		if r.From.Is4() {
			sc[Addr4].Addrs = append(sc[Addr4].Addrs, r)
		} else {
			sc[Addr6].Addrs = append(sc[Addr6].Addrs, r)
		}
	}
	sort.Strings(order)
	var v4, v6 []sweepGroup
	for _, key := range order {
		g := groups[key]
		var a4, a6 []policy.AddrRange
		for _, r := range policy.NewAddrSet(g.addrs...).Ranges() {
			if r.From.Is4() {
				a4 = append(a4, r)
			} else {
				a6 = append(a6, r)
			}
		}
		if len(a4) > 0 {
			v4 = append(v4, sweepGroup{ranges: a4, ports: g.ports.ByProto})
		}
		if len(a6) > 0 {
			v6 = append(v6, sweepGroup{ranges: a6, ports: g.ports.ByProto})
		}
	}
	sc[Ports4].Boxes = sweep(v4)
	sc[Ports6].Boxes = sweep(v6)
	for i := range sc {
		sc[i].hash = elementsHash(&sc[i])
	}
	return &sc
}

// elementsHash identifies a set's elements, so a diff can skip sets whose
// elements did not change without comparing them one by one.
func elementsHash(s *Set) string {
	h := sha256.New()
	var buf []byte
	addr := func(a netip.Addr) {
		b, _ := a.MarshalBinary()
		buf = append(buf, b...)
	}
	buf = append(buf, byte(s.Kind))
	for _, r := range s.Addrs {
		addr(r.From)
		addr(r.To)
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

func sweep(groups []sweepGroup) []Box {
	if len(groups) == 0 {
		return nil
	}
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
	active := make([]int, len(groups))
	type union struct {
		ports map[policy.Protocol][]policy.PortRange
		key   string
	}
	unions := map[string]union{}
	var sig []byte
	type segment struct {
		r     policy.AddrRange
		key   string
		ports map[policy.Protocol][]policy.PortRange
	}
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
		var to netip.Addr
		if evs[j].end {
			to = evs[j].at
		} else {
			to = evs[j].at.Prev()
		}
		sig = sig[:0]
		for gi, n := range active {
			if n > 0 {
				sig = binary.AppendUvarint(sig, uint64(gi))
			}
		}
		i = j
		if len(sig) == 0 {
			continue
		}
		// Pieces covered by the same groups have the same ports: compute
		// each union once.
		u, ok := unions[string(sig)]
		if !ok {
			var b policy.PortSetBuilder
			for gi, n := range active {
				if n <= 0 {
					continue
				}
				for p, rs := range groups[gi].ports {
					for _, r := range rs {
						b.Add(p, r)
					}
				}
			}
			u.ports = b.Build().ByProto
			u.key = portsKey(u.ports)
			unions[string(sig)] = u
		}
		ps, key := u.ports, u.key
		if n := len(segs); n > 0 && segs[n-1].key == key && segs[n-1].r.To.Next() == from {
			segs[n-1].r.To = to
			continue
		}
		segs = append(segs, segment{r: policy.AddrRange{From: from, To: to}, key: key, ports: ps})
	}
	var out []Box
	for _, s := range segs {
		protos := make([]int, 0, len(s.ports))
		for p := range s.ports {
			protos = append(protos, int(p))
		}
		sort.Ints(protos)
		for _, p := range protos {
			for _, pr := range s.ports[policy.Protocol(p)] {
				out = append(out, Box{Addrs: s.r, Proto: policy.Protocol(p), Ports: pr})
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
func (s *Set) elementKeys() [][]string {
	if s.Kind == Services {
		out := make([][]string, len(s.Services))
		for i, sv := range s.Services {
			out[i] = []string{protoName(sv.Proto), sv.Ports.String()}
		}
		return out
	}
	if s.Kind == Addr4 || s.Kind == Addr6 {
		out := make([][]string, len(s.Addrs))
		for i, r := range s.Addrs {
			out[i] = []string{r.String()}
		}
		return out
	}
	out := make([][]string, len(s.Boxes))
	for i, b := range s.Boxes {
		out[i] = []string{b.Addrs.String(), protoName(b.Proto), b.Ports.String()}
	}
	return out
}

// contains reports whether the set holds the remote address (and, for
// ports sets, protocol and port): the Go twin of an nftables lookup.
func (s *Set) contains(remote netip.Addr, proto policy.Protocol, port uint16) bool {
	if s.Kind == Services {
		i := sort.Search(len(s.Services), func(i int) bool {
			sv := s.Services[i]
			return sv.Proto > proto || sv.Proto == proto && sv.Ports.To >= port
		})
		return i < len(s.Services) && s.Services[i].Proto == proto && s.Services[i].Ports.From <= port
	}
	if remote.Is4() != s.Kind.ipv4() {
		return false
	}
	if s.Kind == Addr4 || s.Kind == Addr6 {
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
