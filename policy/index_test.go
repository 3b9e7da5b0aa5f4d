package policy

import (
	"math/rand/v2"
	"net/netip"
	"testing"
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
