package nft

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/policy"
)

// TestSetDiffMatchesKeyDiff: on random pairs of sets of every kind,
// setDiff's walk finds exactly the elements (in the same order) that
// comparing every rendered key finds; and lists out of order still diff
// right (the fallback).
func TestSetDiffMatchesKeyDiff(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	addr := func(v6 bool, i int) netip.Addr {
		if v6 {
			return netip.AddrFrom16([16]byte{0xfd, 15: byte(i), 14: byte(i >> 8)})
		}
		return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
	}
	// universe of sorted, disjoint elements; a set is a random subset.
	ranges := func(v6 bool) []policy.AddrRange {
		var out []policy.AddrRange
		for i := 0; i < 400; i += 4 {
			to := i + r.IntN(3)
			out = append(out, policy.AddrRange{From: addr(v6, i), To: addr(v6, to)})
		}
		return out
	}
	v4, v6 := ranges(false), ranges(true)
	var boxes []box
	for _, a := range v4[:40] {
		for _, proto := range []policy.Protocol{policy.ProtoTCP, policy.ProtoUDP} {
			boxes = append(boxes, box{a, proto, policy.PortRange{From: 80, To: 80}}, box{a, proto, policy.PortRange{From: 8000, To: 9000}})
		}
	}
	var svcs []service
	for _, proto := range []policy.Protocol{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP} {
		for p := uint16(1); p < 2000; p += 37 {
			svcs = append(svcs, service{proto, policy.PortRange{From: p, To: p + uint16(r.IntN(30))}})
		}
	}
	subset := func(n int) []int {
		var idx []int
		keep := r.Float64()
		for i := range n {
			if r.Float64() < keep {
				idx = append(idx, i)
			}
		}
		return idx
	}
	pick := func(kind setKind) *namedSet {
		s := &namedSet{Name: "s", Kind: kind}
		switch kind {
		case addr4:
			for _, i := range subset(len(v4)) {
				s.Addrs = append(s.Addrs, v4[i])
			}
		case addr6:
			for _, i := range subset(len(v6)) {
				s.Addrs = append(s.Addrs, v6[i])
			}
		case services:
			for _, i := range subset(len(svcs)) {
				s.Services = append(s.Services, svcs[i])
			}
		default:
			for _, i := range subset(len(boxes)) {
				s.Boxes = append(s.Boxes, boxes[i])
			}
		}
		return s
	}
	shuffle := func(s *namedSet) {
		r.Shuffle(len(s.Addrs), func(i, j int) { s.Addrs[i], s.Addrs[j] = s.Addrs[j], s.Addrs[i] })
		r.Shuffle(len(s.Boxes), func(i, j int) { s.Boxes[i], s.Boxes[j] = s.Boxes[j], s.Boxes[i] })
		r.Shuffle(len(s.Services), func(i, j int) { s.Services[i], s.Services[j] = s.Services[j], s.Services[i] })
	}
	walked := 0
	for round := range 400 {
		kind := []setKind{addr4, addr6, ports4, services}[round%4]
		old, cur := pick(kind), pick(kind)
		if round%5 == 4 {
			shuffle(old)
		} else {
			walked++
		}
		del, add := setDiff(old, cur)
		wantDel, wantAdd := diffKeys(old.elementKeys(), cur.elementKeys())
		if fmt.Sprint(del) != fmt.Sprint(wantDel) || fmt.Sprint(add) != fmt.Sprint(wantAdd) {
			t.Fatalf("round %d (%v): setDiff del %v add %v, keys say del %v add %v", round, kind, del, add, wantDel, wantAdd)
		}
	}
	if walked == 0 {
		t.Fatal("no sorted pair was diffed")
	}
}

// TestBuiltSetsAreSorted: the sets Build makes are in the order setDiff
// walks, so diffs never take the slow path.
func TestBuiltSetsAreSorted(t *testing.T) {
	cfg := randcluster.Default()
	checked := 0
	for seed := int64(1); seed <= 40; seed++ {
		y, err := randcluster.Generate(seed, cfg).Manifests()
		if err != nil {
			t.Fatal(err)
		}
		prog := compileYAMLOpts(t, string(y), policy.Options{IngressNetworksAndNodes: true})
		for _, node := range []string{"node-0", "node-1"} {
			rs := Build(prog, node)
			for _, name := range sortedKeys(rs.sets) {
				s := rs.sets[name]
				ok := strictlySorted(s.Addrs, cmpAddrRange) && strictlySorted(s.Boxes, s.boxOrder()) && strictlySorted(s.Services, cmpService)
				if !ok {
					t.Fatalf("seed %d node %s: set %s is not in setDiff's order", seed, node, name)
				}
				checked += len(s.Addrs) + len(s.Boxes) + len(s.Services)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no set element was checked")
	}
}
