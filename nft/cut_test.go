package nft

import (
	"context"
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// TestUnionCutAxis: a union run's boxes are cut along the axis that
// needs fewer, and a run whose union would need far more elements than
// its policies have ranges takes shared lookups for its fat port groups
// (all of them when the rest is still over budget); either way the
// rules judge as the policies say.
func TestUnionCutAxis(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n         int
		policy    func(int) (string, string)
		union     bool
		portMajor bool
		maxElems  int
		// shared is the number of shared lookups (peers on equal
		// ports merge into one).
		shared int
	}{
		// Cut along addresses ~80*80 = 6,400 boxes, along ports 160.
		{"all but own /24, own port", 80, allButOwn24, true, true, 3 * 80, 0},
		// Cut along ports ~160*80 boxes, along addresses 160.
		{"own /24, all but own port", 80, own24AllButOwnPort, true, false, 3 * 80, 0},
		// 40 x 820 = 32,800 boxes either way, from 40 x 61 ranges, all
		// on one port list: one shared lookup of their union.
		{"excepts times port ranges", 40, exceptsTimesPorts, false, false, 40*41 + 21, 1},
		// 3 x 820 boxes from 3 x 61 ranges, and 60 boxes: the 3 (on one
		// port list) take one shared lookup, the 60 keep their union.
		{"three fat among lean", 63, fatAmongLean(3), true, false, 60 + 3*41 + 20 + 40, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := compileYAML(t, unionYAML(tc.n, tc.policy))
			rs := Build(prog, "node-1")
			if got := unionSets(rs) > 0; got != tc.union {
				t.Errorf("union sets: %v, want %v", got, tc.union)
			}
			for name, s := range rs.sets {
				if s.Kind == ports4 && len(s.Boxes) > 0 && s.PortMajor != tc.portMajor {
					t.Errorf("set %s: port major %v, want %v", name, s.PortMajor, tc.portMajor)
				}
			}
			if st := rs.Stats(); st.Elements > tc.maxElems {
				t.Errorf("%d elements, want at most %d", st.Elements, tc.maxElems)
			}
			shared := 0
			for name := range rs.sets {
				if strings.HasPrefix(name, "a-") && strings.HasSuffix(name, "-4") {
					shared++
				}
			}
			if shared != tc.shared {
				t.Errorf("%d shared lookups, want %d", shared, tc.shared)
			}
			var extra []netip.Addr
			for _, a := range []string{"11.0.0.1", "11.0.1.1", "11.0.2.255", "11.0.3.0", "11.0.158.9", "11.0.159.9", "11.0.160.0", "10.0.0.1", "10.0.0.4", "10.1.0.2", "10.39.0.160", "10.40.0.1", "9.9.9.9", "11.0.5.1", "11.0.62.7", "11.0.63.7", "10.2.0.3", "10.2.0.5", "10.3.0.4"} {
				extra = append(extra, netip.MustParseAddr(a))
			}
			var ports []Packet
			for _, p := range []int{80, 999, 1000, 1001, 1002, 1003, 1004, 1078, 1079, 1080, 1158, 1160, 1193, 1194, 2003, 2005, 2062, 2063, 65535} {
				ports = append(ports, Packet{Proto: policy.ProtoTCP, Port: uint16(p)}, Packet{Proto: policy.ProtoUDP, Port: uint16(p)})
			}
			if n := checkAgainstEvaluator(t, prog, extra, ports); n == 0 {
				t.Fatal("no flows checked")
			}
		})
	}
}

// cutBoxesAlong cuts along one axis only, without a limit: for tests that
// compare the two.
func cutBoxesAlong(groups []sweepGroup, portMajor bool) []box {
	ax := newAxes(groups)
	if portMajor {
		bs, _ := ax.cut(ax.portItems(), len(ax.ports), len(ax.addrs), ax.protoStarts, nil, -1)
		out := make([]box, len(bs))
		for i, b := range bs {
			out[i] = ax.box(b.sec, b.prim)
		}
		return out
	}
	bs, _ := ax.cut(ax.addrItems(), len(ax.addrs), len(ax.ports), nil, ax.protoStarts, -1)
	out := make([]box, len(bs))
	for i, b := range bs {
		out[i] = ax.box(b.prim, b.sec)
	}
	return out
}

// TestCutAxesAgree: both cuts of random groups are disjoint boxes in
// their set's order that match what the groups match, and cutBoxes
// takes the one with fewer boxes.
func TestCutAxesAgree(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	addr := func(v6 bool) netip.Addr {
		if v6 {
			return netip.AddrFrom16([16]byte{0xfd, 15: byte(r.Intn(40))})
		}
		if r.Intn(10) == 0 {
			return netip.AddrFrom4([4]byte{255, 255, 255, 250 + byte(r.Intn(6))})
		}
		return netip.AddrFrom4([4]byte{10, 0, 0, byte(r.Intn(40))})
	}
	for round := range 400 {
		v6 := round%2 == 1
		var groups []sweepGroup
		for range 1 + r.Intn(6) {
			var rs []policy.AddrRange
			for range 1 + r.Intn(3) {
				a, b := addr(v6), addr(v6)
				if b.Less(a) {
					a, b = b, a
				}
				rs = append(rs, policy.AddrRange{From: a, To: b})
			}
			var pb policy.PortSetBuilder
			for range 1 + r.Intn(3) {
				from := uint16(r.Intn(30))
				if r.Intn(8) == 0 {
					from = 65530
				}
				pb.Add(policy.PortProtocols[r.Intn(3)], policy.PortRange{From: from, To: from + uint16(r.Intn(6))})
			}
			groups = append(groups, sweepGroup{ranges: policy.NewAddrSet(rs...).Ranges(), ports: pb.Build().ByProto})
		}
		matches := func(a netip.Addr, p policy.Protocol, port uint16) bool {
			for _, g := range groups {
				for _, rg := range g.ranges {
					if !a.Less(rg.From) && !rg.To.Less(a) {
						for _, pr := range g.ports[p] {
							if pr.From <= port && port <= pr.To {
								return true
							}
						}
					}
				}
			}
			return false
		}
		kind := ports4
		if v6 {
			kind = ports6
		}
		var sizes [2]int
		for i, portMajor := range []bool{false, true} {
			s := &namedSet{Kind: kind, Boxes: cutBoxesAlong(groups, portMajor), PortMajor: portMajor}
			sizes[i] = len(s.Boxes)
			if !strictlySorted(s.Boxes, s.boxOrder()) {
				t.Fatalf("round %d, port major %v: boxes out of order: %v", round, portMajor, s.Boxes)
			}
			for x := range s.Boxes {
				for y := x + 1; y < len(s.Boxes); y++ {
					bx, by := s.Boxes[x], s.Boxes[y]
					if bx.Proto == by.Proto && !bx.Addrs.To.Less(by.Addrs.From) && !by.Addrs.To.Less(bx.Addrs.From) && bx.Ports.From <= by.Ports.To && by.Ports.From <= bx.Ports.To {
						t.Fatalf("round %d, port major %v: overlapping boxes %v %v", round, portMajor, bx, by)
					}
				}
			}
			for k := 0; k < 300; k++ {
				a := addr(v6)
				p := policy.PortProtocols[r.Intn(3)]
				port := uint16(r.Intn(40))
				if k%7 == 0 {
					port = 65525 + uint16(r.Intn(11))
				}
				if got, want := s.contains(a, p, port), matches(a, p, port); got != want {
					t.Fatalf("round %d, port major %v: %s %s/%d: boxes say %v, groups %v\n%v", round, portMajor, a, p, port, got, want, s.Boxes)
				}
			}
		}
		boxes, portMajor, ok := cutBoxes(groups, 1<<20)
		if want := sizes[1] < sizes[0]; !ok || portMajor != want || len(boxes) != min(sizes[0], sizes[1]) {
			t.Fatalf("round %d: cutBoxes took %d boxes (port major %v, ok %v) of %v", round, len(boxes), portMajor, ok, sizes)
		}
	}
}

// unionFlips are Programs for node-1 whose union run changes shape from
// one to the next (address cut, port cut, shared lookups over budget, a
// union of the lean terms beside lookups for the fat ones, peers merged
// by port list, and back) or keeps its cut with other boxes (a diff in
// the set's order).
var unionFlips = []struct {
	name   string
	n      int
	policy func(int) (string, string)
}{
	{"port cut", 40, allButOwn24},
	{"address cut", 40, own24AllButOwnPort},
	{"port cut again", 41, allButOwn24},
	{"shared lookups", 40, exceptsTimesPorts},
	{"address cut again", 39, own24AllButOwnPort},
	{"shared lookups again", 36, exceptsTimesPorts},
	{"port cut last", 40, allButOwn24},
	// The same policies with other ports or addresses: the same sets
	// with other elements, diffed in the set's order.
	{"port cut, other ports", 40, func(i int) (string, string) {
		from, _ := allButOwn24(i)
		return from, fmt.Sprintf("{port: %d}", 1001+2*i)
	}},
	{"fat among lean", 40, fatAmongLean(3)},
	{"address cut", 40, own24AllButOwnPort},
	{"fat among lean again", 40, fatAmongLean(3)},
	// Peers on shared port lists over budget: one merged lookup per
	// list, whose sets change members from one step to the next.
	{"one port list", 120, ownOnList(1)},
	{"three port lists", 120, ownOnList(3)},
	{"one port list, fewer peers", 100, ownOnList(1)},
	{"address cut, other addresses", 40, func(i int) (string, string) {
		_, ports := own24AllButOwnPort(i)
		return fmt.Sprintf("{ipBlock: {cidr: 11.0.%d.0/24}}", 2*i+1), ports
	}},
}

// TestUnionShapeFlips: each patched table of unionFlips equals a fresh
// sync's.
func TestUnionShapeFlips(t *testing.T) {
	ctx := context.Background()
	fake := knftables.NewFake(knftables.InetFamily, Table)
	s := New(fake, Options{Node: "node-1"})
	for i, st := range unionFlips {
		prog := compileYAML(t, unionYAML(st.n, st.policy))
		res, err := s.Sync(ctx, prog)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if i > 0 && res.Full {
			t.Fatalf("%s: sync fell back to a full replace", st.name)
		}
		checkSyncedAsFresh(t, fake, "node-1", prog, st.name)
	}
}

// TestKernelUnionShapeFlips: the kernel takes each patch of unionFlips
// (deleted boxes and the new ones overlapping them in one transaction),
// and lists the table a fresh sync in another namespace lists.
func TestKernelUnionShapeFlips(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		nft, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		s := New(nft, Options{Node: "node-1"})
		for i, st := range unionFlips {
			prog := compileYAML(t, unionYAML(st.n, st.policy))
			res, err := s.Sync(ctx, prog)
			if err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			if i > 0 && res.Full {
				t.Fatalf("%s: sync fell back to a full replace", st.name)
			}
			patched := canonicalTable(t)
			var fresh []string
			inPrivateNetns(t, func() {
				other, err := NewInterface()
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := New(other, Options{Node: "node-1"}).Sync(ctx, prog); err != nil {
					t.Error(err)
					return
				}
				fresh = canonicalTable(t)
			})
			// nft lists objects in creation order, and a concatenated
			// interval set's elements in insertion order: compare them
			// as sorted sets.
			if !slices.Equal(patched, fresh) {
				t.Fatalf("%s: the patched table differs from a fresh one:\npatched:\n%s\nfresh:\n%s", st.name, strings.Join(patched, "\n"), strings.Join(fresh, "\n"))
			}
		}
	})
}

// TestRandomUnionsAgreeWithEvaluator: runs of 33 to 80 random ipBlock
// policies (excepts, port ranges, some all traffic, IPv4 and IPv6), so
// that unions are cut along either axis, lean or over budget; the rules
// judge every probe as the evaluator does.
func TestRandomUnionsAgreeWithEvaluator(t *testing.T) {
	shapes := map[string]int{}
	for seed := int64(1); seed <= 30; seed++ {
		r := rand.New(rand.NewSource(seed))
		n := 33 + r.Intn(48)
		wide := r.Intn(3) // 0: own /16s, 1: overlapping /8s, 2: 0.0.0.0/0 less
		v6 := r.Intn(2) == 0
		// fatEvery > 0: every fatEvery-th policy has 60 more excepts on
		// 25 port ranges (its own boxes ~1,500, from ~86 ranges).
		fatEvery := []int{0, 0, 1, 4, 10}[r.Intn(5)]
		gen := func(i int) (string, string) {
			var cidr string
			var except []string
			excepts := r.Intn(3) * r.Intn(15)
			fat := fatEvery > 0 && i%fatEvery == 0
			if fat {
				excepts = 0
			}
			switch wide {
			case 0:
				cidr = fmt.Sprintf("10.%d.%d.0/24", i%7, i)
				for range excepts {
					except = append(except, fmt.Sprintf("10.%d.%d.%d/30", i%7, i, 4*r.Intn(64)))
				}
			case 1:
				cidr = fmt.Sprintf("%d.0.0.0/8", 10+i%3)
				except = append(except, fmt.Sprintf("%d.%d.0.0/30", 10+i%3, i))
				for range excepts {
					except = append(except, fmt.Sprintf("%d.%d.%d.%d/30", 10+i%3, i, r.Intn(2), 4*r.Intn(64)))
				}
			default:
				cidr = "0.0.0.0/0"
				except = append(except, fmt.Sprintf("11.0.%d.0/24", i))
				for range excepts {
					except = append(except, fmt.Sprintf("10.%d.%d.%d/30", i%7, i, 4*r.Intn(64)))
				}
			}
			if fat {
				o := strings.Split(strings.TrimSuffix(cidr, "/8"), ".")[0]
				if wide != 1 {
					o = "10"
				}
				for k := range 60 {
					if wide == 0 {
						except = append(except, fmt.Sprintf("10.%d.%d.%d/31", i%7, i, 4*k))
					} else {
						except = append(except, fmt.Sprintf("%s.%d.1.%d/31", o, i, 4*k))
					}
				}
			}
			from := fmt.Sprintf("{ipBlock: {cidr: %s, except: [%s]}}", cidr, strings.Join(except, ", "))
			if v6 && i%4 == 0 {
				from += fmt.Sprintf(", {ipBlock: {cidr: 'fd00:%x::/32'}}", i%5)
			}
			var ports []string
			switch r.Intn(8) {
			case 0:
				if fat {
					for k := range 25 {
						ports = append(ports, fmt.Sprintf("{port: %d, endPort: %d}", 1000+4*k, 1001+4*k))
					}
					break
				}
				return from, "" // all traffic
			case 1:
				ports = append(ports, fmt.Sprintf("{port: 1, endPort: %d}, {port: %d, endPort: 65535}", 999+i, 1001+i))
			default:
				if fat {
					for k := range 25 {
						ports = append(ports, fmt.Sprintf("{port: %d, endPort: %d}", 1000+4*k, 1001+4*k))
					}
					break
				}
				for range 1 + r.Intn(3)*r.Intn(10) {
					p := 1000 + r.Intn(60)
					proto := []string{"TCP", "UDP", "SCTP"}[r.Intn(3)]
					ports = append(ports, fmt.Sprintf("{port: %d, endPort: %d, protocol: %s}", p, p+r.Intn(4), proto))
				}
			}
			return from, strings.Join(ports, ", ")
		}
		y := unionYAML(n, gen)
		prog := compileYAML(t, y)
		rs := Build(prog, "node-1")
		shape := "shared"
		if unionSets(rs) > 0 {
			shape = "union"
			for _, s := range rs.sets {
				if s.PortMajor && len(s.Boxes) > 0 {
					shape = "union, port cut"
				}
			}
			for name := range rs.sets {
				if strings.HasPrefix(name, "a-") {
					shape += ", lean"
					break
				}
			}
		}
		shapes[shape]++
		t.Logf("seed %d: %d policies, %s: %+v", seed, n, shape, rs.Stats())
		var extra []netip.Addr
		for range 80 {
			a := [4]byte{byte(9 + r.Intn(4)), byte(r.Intn(8)), byte(r.Intn(n + 2)), byte(r.Intn(256))}
			if r.Intn(2) == 0 {
				a[1], a[2] = byte(r.Intn(n+2)), byte(r.Intn(2))
			}
			extra = append(extra, netip.AddrFrom4(a))
		}
		extra = append(extra, netip.MustParseAddr("fd00:1::1"), netip.MustParseAddr("fd00:4:ffff::1"), netip.MustParseAddr("fd01::1"))
		var ports []Packet
		for _, p := range []int{80, 999, 1000, 1001, 1002, 1013, 1030, 1041, 1059, 1062, 1063, 65535} {
			for _, proto := range policy.PortProtocols {
				ports = append(ports, Packet{Proto: proto, Port: uint16(p)})
			}
		}
		ports = append(ports, Packet{Proto: policy.ProtoICMP})
		if checkAgainstEvaluator(t, prog, extra, ports) == 0 {
			t.Fatalf("seed %d: no flows checked", seed)
		}
	}
	t.Logf("shapes: %v", shapes)
}
