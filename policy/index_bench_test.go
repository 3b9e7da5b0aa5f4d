package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/moat-net/moat/internal/cputime"
)

// exceptOwn24 is every IPv4 address except 11.<c/256>.<c%256>.0/24.
func exceptOwn24(c int) *AddrSet {
	hole := netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(c >> 8), byte(c), 0}), 24)
	return AllAddrs().Subtract(NewAddrSet(PrefixRange(hole))).Subtract(NewAddrSet(PrefixRange(netip.MustParsePrefix("::/0"))))
}

// denyExceptShape is the probe's shape5c: c matches, each one term to
// "everything but its own /24" on 25 TCP ports of its own.
func denyExceptShape(c, ports int) []Match {
	ms := make([]Match, c)
	for i := range ms {
		var pb PortSetBuilder
		for k := range ports {
			p := uint16(10000 + (i*ports+k)*2)
			pb.Add(ProtoTCP, PortRange{p, p})
		}
		ms[i] = Match{{Addrs: exceptOwn24(i), Ports: pb.Build()}}
	}
	return ms
}

// heavyShape is the probe's shape5 without its selector peers: c
// policies of 25 rules, each rule 25 nested CIDRs of both families (every
// fifth rule also 0.0.0.0/0), 12 TCP ranges, 12 UDP ports and one SCTP port.
func heavyShape(c int) []Match {
	var ms []Match
	for p := range c {
		for r := range 25 {
			var rs []AddrRange
			for j := range 12 {
				rs = append(rs, PrefixRange(netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(100 + (p+r+j)%100), byte((r*7 + j) % 256), 0, 0}), 16+j%8).Masked()))
				v6 := [16]byte{0x20, 0x01, 0x0d, 0xb8, byte((p*31 + r + j) >> 8), byte(p*31 + r + j)}
				rs = append(rs, PrefixRange(netip.PrefixFrom(netip.AddrFrom16(v6), 48+j%16).Masked()))
			}
			if r%5 == 0 {
				rs = append(rs, PrefixRange(netip.MustParsePrefix("0.0.0.0/0")))
			} else {
				rs = append(rs, PrefixRange(netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + r%16), 0, 0}), 16)))
			}
			var pb PortSetBuilder
			for k := range 12 {
				lo := uint16(1000 + p + 10*k)
				pb.Add(ProtoTCP, PortRange{lo, lo + 5})
				pb.Add(ProtoUDP, PortRange{uint16(2000 + p + k), uint16(2000 + p + k)})
			}
			pb.Add(ProtoSCTP, PortRange{uint16(3000 + p), uint16(3000 + p)})
			ms = append(ms, Match{{Addrs: NewAddrSet(rs...), Ports: pb.Build()}})
		}
	}
	return ms
}

// nestedShape is n rules on one set of 25 TCP ports, rule i to
// [10.0.0.0+i, 10.255.255.255-i]: 2n cells, each with up to n active terms
// but one port set, so each cell's ports are few.
func nestedShape(n int) []Match {
	var pb PortSetBuilder
	for k := range 25 {
		pb.Add(ProtoTCP, PortRange{uint16(8000 + 2*k), uint16(8000 + 2*k)})
	}
	ports := pb.Build()
	lo, hi := v4key(netip.MustParseAddr("10.0.0.0")), v4key(netip.MustParseAddr("10.255.255.255"))
	ms := make([]Match, n)
	for i := range ms {
		from, to := lo+uint32(i), hi-uint32(i)
		r := AddrRange{
			netip.AddrFrom4([4]byte{byte(from >> 24), byte(from >> 16), byte(from >> 8), byte(from)}),
			netip.AddrFrom4([4]byte{byte(to >> 24), byte(to >> 16), byte(to >> 8), byte(to)}),
		}
		ms[i] = Match{{Addrs: NewAddrSet(r), Ports: ports}}
	}
	return ms
}

type indexShape struct {
	name  string
	sizes []int
	gen   func(int) []Match
}

// indexShapes are the probe shapes whose terms all overlap.
var indexShapes = []indexShape{
	{"deny-except-25ports", []int{25, 50, 100, 200}, func(n int) []Match { return denyExceptShape(n, 25) }},
	{"np-except-1port", []int{160, 320, 640, 1280}, func(n int) []Match { return denyExceptShape(n, 1) }},
	{"heavy", []int{10, 20, 40}, heavyShape},
	{"nested-shared-ports", []int{1000, 2000, 4000, 8000}, nestedShape},
}

// BenchmarkBuildIndex measures building one tier's index and painting
// every cell, as if every segment were looked up (BENCHMARKS.md,
// "evaluator index"): what a build cost before cells were painted on
// first lookup.
func BenchmarkBuildIndex(b *testing.B) {
	for _, s := range indexShapes {
		for _, n := range s.sizes {
			ms := s.gen(n)
			b.Run(fmt.Sprintf("%s/n=%d", s.name, n), func(b *testing.B) {
				cpu := cputime.Process()
				for b.Loop() {
					buildIndex(ms).paintAll()
				}
				b.ReportMetric((cputime.Process()-cpu).Seconds()/float64(b.N), "cpu-s/op")
			})
		}
	}
}

// BenchmarkBuildIndexOneLookup measures what one explained flow pays:
// building the index and looking one address up (outside every "except"
// hole, where every term holds), with the bytes allocated per op; also
// the 10,240 NetworkPolicies of the review.
func BenchmarkBuildIndexOneLookup(b *testing.B) {
	shapes := append(slices.Clone(indexShapes), indexShape{"np-except-1port", []int{10240}, func(n int) []Match { return denyExceptShape(n, 1) }})
	a := netip.MustParseAddr("203.0.113.5")
	for _, s := range shapes {
		for _, n := range s.sizes {
			ms := s.gen(n)
			b.Run(fmt.Sprintf("%s/n=%d", s.name, n), func(b *testing.B) {
				b.ReportAllocs()
				cpu := cputime.Process()
				for b.Loop() {
					buildIndex(ms).lookup(a, -1, ProtoTCP, 10000)
				}
				b.ReportMetric((cputime.Process()-cpu).Seconds()/float64(b.N), "cpu-s/op")
			})
		}
	}
}
