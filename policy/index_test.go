package policy

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/RoaringBitmap/roaring/v2"
)

// linearFirst is the reference: the first match, in order, that contains
// the packet.
func linearFirst(ms []Match, a netip.Addr, proto Protocol, port uint16) int32 {
	for i, m := range ms {
		if m.Matches(a, proto, port) {
			return int32(i)
		}
	}
	return -1
}

// TestIndexAgreesWithLinearScan builds random matches (overlapping
// ranges, both families, all-traffic and port terms) and checks the index
// against the linear scan on random and boundary packets.
func TestIndexAgreesWithLinearScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	addr := func() netip.Addr {
		if r.IntN(4) == 0 {
			return netip.AddrFrom16([16]byte{0xfd, 0, 15: byte(r.IntN(64))})
		}
		return netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(2)), byte(r.IntN(64))})
	}
	for round := 0; round < 300; round++ {
		var ms []Match
		var probes []netip.Addr
		for range 1 + r.IntN(6) {
			var m Match
			for range 1 + r.IntN(3) {
				var rs []AddrRange
				for range 1 + r.IntN(3) {
					a, b := addr(), addr()
					if a.Is4() != b.Is4() {
						b = a
					}
					if b.Less(a) {
						a, b = b, a
					}
					rs = append(rs, AddrRange{a, b})
					probes = append(probes, a, b, a.Prev(), b.Next())
				}
				if r.IntN(8) == 0 {
					rs = append(rs, AddrRange{netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255")})
				}
				var pb PortSetBuilder
				if r.IntN(5) == 0 {
					pb.AddAll()
				}
				for range r.IntN(3) {
					lo := uint16(1 + r.IntN(100))
					pb.Add(PortProtocols[r.IntN(3)], PortRange{lo, lo + uint16(r.IntN(20))})
				}
				m = append(m, Term{Addrs: NewAddrSet(rs...), Ports: pb.Build()})
			}
			ms = append(ms, m)
		}
		ix := buildIndex(ms)
		for range 200 {
			probes = append(probes, addr())
		}
		for _, a := range probes {
			if !a.IsValid() {
				continue
			}
			for _, proto := range []Protocol{ProtoTCP, ProtoUDP, ProtoSCTP, ProtoICMP} {
				for _, port := range []uint16{1, 5, 50, 99, 100, 119, 120, 121} {
					if got, want := ix.lookup(a, -1, proto, port), linearFirst(ms, a, proto, port); got != want {
						t.Fatalf("round %d: %s %s/%d: index %d, linear %d", round, a, proto, port, got, want)
					}
				}
			}
		}
	}
}

// bruteFirst is the reference for an index with split terms: the first
// match with a term whose ports hold the packet and whose addresses hold
// the remote address (a split term: its CIDRs, or the remote's pod slot).
func bruteFirst(ms []Match, a netip.Addr, ord int32, proto Protocol, port uint16) int32 {
	for i, m := range ms {
		for _, t := range m {
			if !t.Ports.Matches(proto, port) {
				continue
			}
			if t.split == nil && t.Addrs.Contains(a) ||
				t.split != nil && (t.split.cidrs.Contains(a) || ord >= 0 && t.split.pods.Contains(uint32(ord))) {
				return int32(i)
			}
		}
	}
	return -1
}

// TestIndexBoundaries checks the index against bruteFirst on heavily
// overlapping random matches at every range end and one past it, in all
// three key spaces (IPv4 and IPv6 addresses, pod slots) and on every port
// range end: terms reach the first and last address and port, share port
// sets (by pointer and by content) and mix all-traffic terms in, so cells
// hold many intervals with lower and higher tags crossing at their ends.
func TestIndexBoundaries(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	v4 := func() netip.Addr {
		switch r.IntN(8) {
		case 0:
			return netip.IPv4Unspecified()
		case 1:
			return netip.AddrFrom4([4]byte{255, 255, 255, 255})
		}
		return netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(40))})
	}
	v6 := func() netip.Addr {
		switch r.IntN(8) {
		case 0:
			return netip.IPv6Unspecified()
		case 1:
			return netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
		}
		return netip.AddrFrom16([16]byte{0xfd, 15: byte(r.IntN(40))})
	}
	// One round in 80 is big: many rules, many port ranges each over a
	// wider band and no all-traffic terms, so that cells hold 256 port
	// intervals or more and are painted through the radix sort, with
	// port groups merged and intervals an all-traffic term wins dropped
	// on the way.
	big := false
	port := func() uint16 {
		switch r.IntN(6) {
		case 0:
			return 1
		case 1:
			return 65535
		}
		if big {
			return uint16(1 + r.IntN(2000))
		}
		return uint16(1 + r.IntN(30))
	}
	for round := range 400 {
		big = round%80 == 79
		rules, ranges := 1+r.IntN(12), 4
		if big {
			rules, ranges = 40, 120
		}
		var shared []*PortSet
		var ms []Match
		addrProbes := map[netip.Addr]bool{}
		ordProbes := map[int32]bool{-1: true}
		portProbes := map[uint16]bool{1: true, 65535: true}
		probeAddr := func(a netip.Addr) {
			for _, p := range []netip.Addr{a.Prev(), a, a.Next()} {
				if p.IsValid() {
					addrProbes[p] = true
				}
			}
		}
		for range rules {
			var m Match
			for range 1 + r.IntN(3) {
				var rs []AddrRange
				n := r.IntN(4)
				if big {
					n = max(n, 1)
				}
				for range n {
					gen := v4
					if r.IntN(3) == 0 {
						gen = v6
					}
					a, b := gen(), gen()
					if b.Less(a) {
						a, b = b, a
					}
					if big {
						// Deep overlap: most terms cover 10.0.0.10-29.
						a, b = netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(10))}), netip.AddrFrom4([4]byte{10, 0, 0, byte(30 + r.IntN(10))})
					}
					rs = append(rs, AddrRange{a, b})
					probeAddr(a)
					probeAddr(b)
				}
				var ports *PortSet
				switch {
				case len(shared) > 0 && r.IntN(3) == 0:
					ports = shared[r.IntN(len(shared))]
				case r.IntN(8) == 0 && (!big || r.IntN(10) == 0):
					ports = AllTraffic()
				default:
					var pb PortSetBuilder
					for range 1 + r.IntN(ranges) {
						a, b := port(), port()
						if big && a < 65535 {
							b = a + uint16(r.IntN(2))
						}
						if b < a {
							a, b = b, a
						}
						pb.Add(PortProtocols[r.IntN(len(PortProtocols))], PortRange{a, b})
						for _, p := range []uint16{a - 1, a, b, b + 1} {
							portProbes[p] = true
						}
					}
					ports = pb.Build()
					shared = append(shared, ports)
				}
				term := Term{Addrs: NewAddrSet(rs...), Ports: ports}
				if r.IntN(3) == 0 {
					pods := roaring.New()
					for range 1 + r.IntN(3) {
						lo := uint32(r.IntN(20))
						hi := lo + uint32(r.IntN(5))
						pods.AddRange(uint64(lo), uint64(hi)+1)
						for _, o := range []int32{int32(lo) - 1, int32(lo), int32(hi), int32(hi) + 1} {
							ordProbes[o] = true
						}
					}
					term.split = newSplit(term.Addrs, pods)
				}
				m = append(m, term)
			}
			ms = append(ms, m)
		}
		ix := buildIndex(ms)
		protos := append([]Protocol{ProtoICMP}, PortProtocols[:]...)
		// Every address with no slot, every slot with a random address (in
		// sorted order: the test is deterministic).
		type probe struct {
			a   netip.Addr
			ord int32
		}
		var probes []probe
		addrs := slices.SortedFunc(maps.Keys(addrProbes), netip.Addr.Compare)
		for _, a := range addrs {
			probes = append(probes, probe{a, -1})
		}
		for _, ord := range slices.Sorted(maps.Keys(ordProbes)) {
			a := netip.AddrFrom4([4]byte{192, 0, 2, 1})
			if len(addrs) > 0 && r.IntN(2) == 0 {
				a = addrs[r.IntN(len(addrs))]
			}
			probes = append(probes, probe{a, ord})
		}
		for _, pr := range probes {
			for _, proto := range protos {
				for p := range portProbes {
					if p == 0 {
						continue
					}
					if got, want := ix.lookup(pr.a, pr.ord, proto, p), bruteFirst(ms, pr.a, pr.ord, proto, p); got != want {
						t.Fatalf("round %d: %s slot %d %s/%d: index %d, brute force %d", round, pr.a, pr.ord, proto, p, got, want)
					}
				}
			}
		}
	}
}

// TestPaintAgreesWithBruteForce paints random overlapping port intervals,
// few (comparison sort) and many (radix sort), against the lowest tag
// covering each port, at every interval end and one past it, at the first
// and last port, and at random ports.
func TestPaintAgreesWithBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	b := &indexBuilder{}
	for round := range 300 {
		n := 1 + r.IntN(12)
		if round%3 == 0 {
			n = 256 + r.IntN(800)
		}
		// Most intervals in a narrow band, so that they overlap deeply;
		// some reach the first or the last port.
		var spans []span
		var packed []uint64
		probes := []uint32{1, 2, 65534, 65535}
		for range n {
			from := uint32(1 + r.IntN(300))
			to := from + 1 + uint32(r.IntN(40))
			switch r.IntN(10) {
			case 0:
				from = 1
			case 1:
				to = 65536
			case 2:
				from = uint32(1 + r.IntN(65535))
				to = from + 1 + uint32(r.IntN(int(65536-from)))
			}
			s := span{from, to, int32(r.IntN(60))}
			spans = append(spans, s)
			packed = append(packed, packSpan(s.from, s.to, s.tag))
			probes = append(probes, from-1, from, to-1, to)
		}
		for range 100 {
			probes = append(probes, uint32(1+r.IntN(65535)))
		}
		cells := b.paint(packed)
		c := &cell{any: -1}
		c.ports[0] = cells
		for _, p := range probes {
			if p < 1 || p > 65535 {
				continue
			}
			want := int32(-1)
			for _, s := range spans {
				if s.from <= p && p < s.to && (want < 0 || s.tag < want) {
					want = s.tag
				}
			}
			if got := c.tag(PortProtocols[0], uint16(p)); got != want {
				t.Fatalf("round %d (%d intervals): port %d: painted %d, brute force %d", round, n, p, got, want)
			}
		}
		for i := 1; i < len(cells); i++ {
			if cells[i-1].from >= cells[i].from || cells[i-1].tag == cells[i].tag {
				t.Fatalf("round %d: cells %d and %d: %v, %v: not increasing or not merged", round, i-1, i, cells[i-1], cells[i])
			}
		}
	}
}
