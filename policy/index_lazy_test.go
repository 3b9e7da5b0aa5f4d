package policy

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"sync"
	"testing"

	"github.com/RoaringBitmap/roaring/v2"
)

// cellList lists an index's distinct cells, in the order of their first
// segment (IPv4, IPv6, slots), which is the order the sweep made them.
func (ix *matchIndex) cellList() []*cell {
	out := make([]*cell, len(ix.cells))
	for i := range ix.cells {
		out[i] = &ix.cells[i]
	}
	return out
}

// paintAll paints every cell of the index, in segment order: the index
// as it was built before cells were painted on first lookup.
func (ix *matchIndex) paintAll() {
	for _, c := range ix.cellList() {
		if c.pending.Load() {
			c.paint()
		}
	}
}

// painted counts the painted cells of an index and their port cells.
func (ix *matchIndex) painted() (cells, portCells int) {
	for _, c := range ix.cellList() {
		if c.pending.Load() {
			continue
		}
		cells++
		for _, pcs := range c.ports {
			portCells += len(pcs)
		}
	}
	return cells, portCells
}

// randomMatches makes overlapping matches over a few IPv4 and IPv6
// addresses and pod slots: terms reach the first and last address, share
// port sets, mix all-traffic terms and terms that match no port in.
func randomMatches(r *rand.Rand) (ms []Match, addrs []netip.Addr, ords []int32) {
	v4 := func() netip.Addr {
		switch r.IntN(10) {
		case 0:
			return netip.IPv4Unspecified()
		case 1:
			return netip.AddrFrom4([4]byte{255, 255, 255, 255})
		}
		return netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(30))})
	}
	v6 := func() netip.Addr {
		if r.IntN(10) == 0 {
			return netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
		}
		return netip.AddrFrom16([16]byte{0xfd, 15: byte(r.IntN(30))})
	}
	var shared []*PortSet
	for range 1 + r.IntN(15) {
		var m Match
		for range 1 + r.IntN(3) {
			var rs []AddrRange
			for range r.IntN(4) {
				gen := v4
				if r.IntN(3) == 0 {
					gen = v6
				}
				a, b := gen(), gen()
				if b.Less(a) {
					a, b = b, a
				}
				rs = append(rs, AddrRange{a, b})
				for _, p := range []netip.Addr{a.Prev(), a, b, b.Next()} {
					if p.IsValid() {
						addrs = append(addrs, p)
					}
				}
			}
			var ports *PortSet
			switch k := r.IntN(10); {
			case k == 0:
				ports = AllTraffic()
			case k == 1:
				ports = (&PortSetBuilder{}).Build() // no port at all
			case k < 4 && len(shared) > 0:
				ports = shared[r.IntN(len(shared))]
			default:
				var pb PortSetBuilder
				for range 1 + r.IntN(4) {
					a := uint16(1 + r.IntN(40))
					pb.Add(PortProtocols[r.IntN(len(PortProtocols))], PortRange{a, a + uint16(r.IntN(5))})
				}
				ports = pb.Build()
				shared = append(shared, ports)
			}
			t := Term{Addrs: NewAddrSet(rs...), Ports: ports}
			if r.IntN(3) == 0 {
				pods := roaring.New()
				for range r.IntN(3) {
					lo := uint64(r.IntN(20))
					hi := lo + uint64(r.IntN(4))
					pods.AddRange(lo, hi+1)
					ords = append(ords, int32(lo)-1, int32(lo), int32(hi), int32(hi)+1)
				}
				t.split = newSplit(t.Addrs, pods)
			}
			m = append(m, t)
		}
		ms = append(ms, m)
	}
	return ms, addrs, append(ords, -1)
}

// TestLazyPaintAgreesWithEager builds each random input twice, paints
// one index whole first and the other cell by cell as random lookups
// touch them, checks both against bruteFirst, then checks that the two
// hold the same cells, and that the slots' lowest tag, known before any
// cell is painted, is the lowest tag their painted cells hold.
func TestLazyPaintAgreesWithEager(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	protos := append([]Protocol{ProtoICMP}, PortProtocols[:]...)
	for round := range 400 {
		ms, addrs, ords := randomMatches(r)
		addrs = append(addrs, netip.AddrFrom4([4]byte{192, 0, 2, 1}))
		eager, lazy := buildIndex(ms), buildIndex(ms)
		eager.paintAll()
		for range 300 {
			a := addrs[r.IntN(len(addrs))]
			ord := ords[r.IntN(len(ords))]
			proto := protos[r.IntN(len(protos))]
			port := uint16(1 + r.IntN(50))
			want := bruteFirst(ms, a, ord, proto, port)
			if got := lazy.lookup(a, ord, proto, port); got != want {
				t.Fatalf("round %d: lazy %s slot %d %s/%d: %d, brute force %d", round, a, ord, proto, port, got, want)
			}
			if got := eager.lookup(a, ord, proto, port); got != want {
				t.Fatalf("round %d: eager %s slot %d %s/%d: %d, brute force %d", round, a, ord, proto, port, got, want)
			}
		}
		lazy.paintAll()
		ec, lc := eager.cellList(), lazy.cellList()
		if len(ec) != len(lc) {
			t.Fatalf("round %d: %d cells painted eagerly, %d lazily", round, len(ec), len(lc))
		}
		for i := range ec {
			if ec[i].any != lc[i].any || !reflect.DeepEqual(ec[i].ports, lc[i].ports) {
				t.Fatalf("round %d: cell %d: eager %d %v, lazy %d %v", round, i, ec[i].any, ec[i].ports, lc[i].any, lc[i].ports)
			}
		}
		low := int32(-1)
		for _, s := range lazy.podsSegs {
			if s.cell >= 0 {
				c := &lazy.cells[s.cell]
				for _, t := range append([]int32{c.any}, portTags(c)...) {
					if t >= 0 && (low < 0 || t < low) {
						low = t
					}
				}
			}
		}
		if low != lazy.podsMin {
			t.Fatalf("round %d: podsMin %d, painted slot cells' lowest tag %d", round, lazy.podsMin, low)
		}
	}
}

func portTags(c *cell) []int32 {
	var out []int32
	for _, pcs := range c.ports {
		for _, pc := range pcs {
			out = append(out, pc.tag)
		}
	}
	return out
}

// TestConcurrentFirstLookups looks cells of fresh indexes up first from
// eight goroutines at once, each in its own order, against bruteFirst
// worked out beforehand (run with -race: painting must be safe).
func TestConcurrentFirstLookups(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	type probe struct {
		a     netip.Addr
		ord   int32
		proto Protocol
		port  uint16
		want  int32
	}
	for round := range 40 {
		ms, addrs, ords := randomMatches(r)
		var probes []probe
		for _, a := range addrs {
			for range 3 {
				p := probe{a, ords[r.IntN(len(ords))], PortProtocols[r.IntN(len(PortProtocols))], uint16(1 + r.IntN(50)), 0}
				p.want = bruteFirst(ms, p.a, p.ord, p.proto, p.port)
				probes = append(probes, p)
			}
		}
		ix := buildIndex(ms)
		var wg sync.WaitGroup
		errs := make(chan string, 8)
		for g := range 8 {
			order := r.Perm(len(probes))
			wg.Go(func() {
				for _, i := range order {
					p := probes[i]
					if got := ix.lookup(p.a, p.ord, p.proto, p.port); got != p.want {
						errs <- "goroutine " + string(rune('0'+g)) + ": " + p.a.String() + " " + p.proto.String()
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatalf("round %d: %s: lookup disagrees with brute force", round, e)
		}
	}
}

// TestLazyIndexStaysSmall: N rules "every IPv4 address but my own /24, on
// my own port" have N+1 distinct cells of up to N port intervals each
// (N^2 in all when painted whole: 10,240 NetworkPolicies took 1.5 GB
// for one explain). Built, the index paints nothing; a lookup paints
// the one cell it reads.
func TestLazyIndexStaysSmall(t *testing.T) {
	const n = 2000
	ix := buildIndex(denyExceptShape(n, 1))
	if cells := len(ix.cellList()); cells < n {
		t.Fatalf("%d distinct cells, want at least %d (one per hole)", cells, n)
	}
	if c, pc := ix.painted(); c != 0 || pc != 0 {
		t.Fatalf("built index has %d painted cells (%d port cells), want none", c, pc)
	}
	// Outside every hole: every rule holds; the first rule's port is
	// its (lowest) tag.
	if got := ix.lookup(netip.MustParseAddr("203.0.113.5"), -1, ProtoTCP, 10000); got != 0 {
		t.Fatalf("lookup outside the holes: %d, want 0", got)
	}
	// In rule 5's hole: every rule but 5 holds.
	if got := ix.lookup(netip.MustParseAddr("11.0.5.9"), -1, ProtoTCP, 10010); got != -1 {
		t.Fatalf("lookup in rule 5's hole on its port: %d, want -1", got)
	}
	c, pc := ix.painted()
	if c != 2 || pc > 4*n+4 {
		t.Fatalf("after two lookups: %d painted cells, %d port cells; want 2 cells of at most %d", c, pc, 4*n+4)
	}
	t.Logf("%d distinct cells, two painted: %d port cells (painted whole: about %d)", len(ix.cellList()), pc, 2*n*n)
}
