package nft

import (
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// crowdedYAML is a namespace of locals pods on node-1, each selected by
// the policies whose number is not its own modulo locals (one pod: all
// of them), so that each pod has a list of its own. Policy p allows port
// 1000+p from 10.p.0.0/16, less excepts /24s of it when excepts > 0.
func crowdedYAML(locals, policies, excepts int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\nstatus: {addresses: [{type: InternalIP, address: 192.168.0.1}]}\n---\n")
	b.WriteString("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n")
	for i := range locals {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata: {name: l%d, namespace: shop, labels: {skip: s%d}}\nspec: {nodeName: node-1, containers: [{name: c}]}\nstatus: {podIPs: [{ip: 172.16.1.%d}]}\n---\n", i, i, 10+i)
	}
	for p := range policies {
		skip := "none"
		if locals > 1 {
			skip = fmt.Sprintf("s%d", p%locals)
		}
		var except []string
		for e := range excepts {
			except = append(except, fmt.Sprintf("10.%d.%d.0/24", p, 2*e+1))
		}
		fmt.Fprintf(&b, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np%d, namespace: shop}\nspec:\n  podSelector: {matchExpressions: [{key: skip, operator: NotIn, values: [%s]}]}\n  ingress: [{from: [{ipBlock: {cidr: 10.%d.0.0/16, except: [%s]}}], ports: [{port: %d}]}]\n---\n",
			p, skip, p, strings.Join(except, ", "), 1000+p)
	}
	return b.String()
}

func unionSets(rs *Ruleset) int {
	n := 0
	for name := range rs.sets {
		if strings.HasPrefix(name, "s-") {
			n++
		}
	}
	return n
}

// TestShareCrowded: runs longer than maxLookups whose addresses (over
// unionFloor) are mostly in peers that other runs match too take shared
// lookups instead of union sets of their own; a run whose peers are its
// own, and a small one, keep their union sets. Either way the rules judge
// as the policies say.
func TestShareCrowded(t *testing.T) {
	const policies = 2*maxLookups + 6
	for _, tc := range []struct {
		name            string
		locals, excepts int
		union           bool
		maxElems        int
	}{
		// 6 lists of 58-59 peers of 31 ranges each: ~1,800 ranges per
		// list, every peer in five lists.
		{"lists sharing large peers", 6, 30, false, policies*31 + 100},
		// The same peers in one list: nothing to share.
		{"one list", 1, 30, true, 2 * policies * 31},
		// Lists sharing peers of one range each: under unionFloor.
		{"lists sharing small peers", 6, 0, true, 6 * policies},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := compileYAML(t, crowdedYAML(tc.locals, policies, tc.excepts))
			rs := Build(prog, "node-1")
			if got := unionSets(rs) > 0; got != tc.union {
				t.Errorf("union sets: %v, want %v", got, tc.union)
			}
			if st := rs.Stats(); st.Elements > tc.maxElems {
				t.Errorf("%d elements, want at most %d", st.Elements, tc.maxElems)
			}
			var extra []netip.Addr
			for p := range policies {
				for _, third := range []int{0, 1, 2, 2*tc.excepts - 1, 2 * tc.excepts, 255} {
					if third >= 0 {
						extra = append(extra, netip.MustParseAddr(fmt.Sprintf("10.%d.%d.7", p, third)))
					}
				}
			}
			var ports []Packet
			for _, p := range []int{80, 1000, 1001, 1000 + policies - 1, 1000 + policies} {
				ports = append(ports, Packet{Proto: 6, Port: uint16(p)})
			}
			if n := checkAgainstEvaluator(t, prog, extra, ports); n == 0 {
				t.Fatal("no flows checked")
			}
		})
	}
}

// BenchmarkCrowdedLists builds the node of crowdedYAML with 110 local
// pods, 80 NetworkPolicies and 30 excepts each: 110 lists of 79-80
// peers of 31 address ranges, every peer in most lists. It reports the
// node's rules and set elements and the build's time.
func BenchmarkCrowdedLists(b *testing.B) {
	prog := compileYAML(b, crowdedYAML(110, 80, 30))
	var rs *Ruleset
	for b.Loop() {
		rs = Build(prog, "node-1")
	}
	st := rs.Stats()
	b.ReportMetric(float64(st.Rules), "rules")
	b.ReportMetric(float64(st.Elements), "elements")
	b.ReportMetric(float64(unionSets(rs)), "union-sets")
}

// longestChain is the most rules a chain of rs renders.
func longestChain(rs *Ruleset) int {
	n := 0
	for _, c := range rs.chains {
		n = max(n, renderedRules(c)-hairpinRules(c))
	}
	return n
}

// hairpinRules counts a chain's rendered Self rules (the Service hairpin
// of NetworkPolicy chains: two per such chain, whatever its policies),
// which the measures of lookups leave out.
func hairpinRules(c *policyChain) int {
	n := 0
	for _, r := range c.Rules {
		if r.Self {
			n += 2
		}
	}
	return n
}

// sharedLookups counts the shared peer set pairs of rs.
func sharedLookups(rs *Ruleset) int {
	n := 0
	for name := range rs.sets {
		if strings.HasPrefix(name, "a-") && strings.HasSuffix(name, "-4") {
			n++
		}
	}
	return n
}

// listProbes are addresses in, between and beside the /24s of apartCIDR
// for n policies, and ports on, between and off the lists.
func listProbes(n, lists int) ([]netip.Addr, []Packet) {
	var extra []netip.Addr
	for _, i := range []int{0, 1, 2, 3, n / 2, n - 2, n - 1, n, n + 1} {
		extra = append(extra,
			netip.MustParseAddr(fmt.Sprintf("10.%d.%d.9", i>>7, 2*(i&127))),
			netip.MustParseAddr(fmt.Sprintf("10.%d.%d.9", i>>7, 2*(i&127)+1)))
	}
	extra = append(extra, netip.MustParseAddr("9.9.9.9"), netip.MustParseAddr("fd00:1::1"))
	var ports []Packet
	for l := range lists + 1 {
		for _, p := range []int{1000, 1001, 1002, 1077, 1099} {
			ports = append(ports, Packet{Proto: policy.ProtoTCP, Port: uint16(p + 100*l)})
		}
	}
	ports = append(ports, Packet{Proto: policy.ProtoTCP, Port: 80}, Packet{Proto: policy.ProtoUDP, Port: 1000})
	return extra, ports
}

// TestLeanByPorts: a union run over budget whose peers share port lists
// takes one shared lookup per list (the union of the list's peers'
// addresses), beside a union of its other terms when they fit; its
// chain grows with its lists, not its peers, and the rules judge every
// probe as the evaluator does.
func TestLeanByPorts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		lists  int
		policy func(int) (string, string)
		union  bool
		// shared lookups, most rules in a chain, most elements.
		shared, rules, maxElems int
	}{
		// 250 x 20 = 5,000 boxes, over 8 x (250 + 20): one list, one
		// lookup (two rules) and the isolation drop.
		{"one list", 250, 1, ownOnList(1), false, 1, 3, 250 + 20 + 20},
		{"three lists", 250, 3, ownOnList(3), false, 3, 7, 250 + 3*20 + 20},
		// The 200 on list 0 are fat together; the 50 on ports of their
		// own keep a union.
		{"one list among own ports", 250, 1, func(i int) (string, string) {
			if i < 200 {
				return ownOnList(1)(i)
			}
			return fmt.Sprintf("{ipBlock: {cidr: %s}}", apartCIDR(i)), fmt.Sprintf("{port: %d}", 3000+i)
		}, true, 1, 2 + 4 + 1, 250 + 20 + 2*50 + 20},
		// All traffic from every tenth /24 (not fat: no ports) stays in
		// the union, the others take the list's lookup.
		{"one list and all traffic", 250, 1, func(i int) (string, string) {
			if i%10 == 0 {
				return fmt.Sprintf("{ipBlock: {cidr: %s}}", apartCIDR(i)), ""
			}
			return ownOnList(1)(i)
		}, true, 1, 2 + 4 + 1, 250 + 20 + 25 + 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := compileYAML(t, unionYAML(tc.n, tc.policy))
			rs := Build(prog, "node-1")
			if got := unionSets(rs) > 0; got != tc.union {
				t.Errorf("union sets: %v, want %v", got, tc.union)
			}
			if got := sharedLookups(rs); got != tc.shared {
				t.Errorf("%d shared lookups, want %d", got, tc.shared)
			}
			if got := longestChain(rs); got > tc.rules {
				t.Errorf("a chain of %d rules, want at most %d", got, tc.rules)
			}
			if st := rs.Stats(); st.Elements > tc.maxElems {
				t.Errorf("%d elements, want at most %d", st.Elements, tc.maxElems)
			}
			extra, ports := listProbes(tc.n, tc.lists)
			if n := checkAgainstEvaluator(t, prog, extra, ports); n == 0 {
				t.Fatal("no flows checked")
			}
		})
	}
}

// TestByPorts: byPorts merges a run's lookups into one per distinct
// ports and matches exactly what they matched, no packet more (a merge
// must never widen what a run allows, nor what it denies); a list with
// one peer keeps that peer's own set.
func TestByPorts(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	lists := []*policy.PortSet{nil} // nil: all traffic
	for range 3 {
		var pb policy.PortSetBuilder
		for range 1 + r.Intn(4) {
			from := uint16(1000 + r.Intn(40))
			pb.Add(policy.PortProtocols[r.Intn(3)], policy.PortRange{From: from, To: from + uint16(r.Intn(4))})
		}
		lists = append(lists, pb.Build())
	}
	addr := func() netip.Addr {
		if r.Intn(4) == 0 {
			return netip.AddrFrom16([16]byte{0xfd, 15: byte(r.Intn(64))})
		}
		return netip.AddrFrom4([4]byte{10, 0, byte(r.Intn(4)), byte(r.Intn(64))})
	}
	for round := range 200 {
		b := newBuilder("node-1", nil)
		var pending []pendingLookup
		used := map[int]int{}
		for k := range 1 + r.Intn(12) {
			var rs []policy.AddrRange
			for range 1 + r.Intn(3) {
				a := addr()
				rs = append(rs, policy.AddrRange{From: a, To: a.Next()})
			}
			g := b.peer(policy.NewAddrSet(rs...))
			if g.used {
				continue // one lookup per peer, as shape makes them
			}
			g.used = true
			li := r.Intn(len(lists))
			used[li]++
			l := lookup{peer: g, ports: lists[li]}
			if l.ports != nil {
				l.key = portsKey(l.ports.ByProto)
			}
			pending = append(pending, pendingLookup{l, []string{fmt.Sprintf("use%d", k)}})
		}
		groups := b.byPorts(pending)
		if len(groups) != len(used) {
			t.Fatalf("round %d: %d groups for %d port lists", round, len(groups), len(used))
		}
		members, uses := 0, 0
		for _, g := range groups {
			members += len(g.members)
			uses += len(g.uses)
			if len(g.members) == 1 && g.peer != g.members[0] {
				t.Errorf("round %d: a list with one peer has a merged set", round)
			}
		}
		if members != len(pending) || uses != len(pending) {
			t.Fatalf("round %d: groups hold %d peers and %d uses of %d", round, members, uses, len(pending))
		}
		matches := func(ls []lookup, a netip.Addr, p policy.Protocol, port uint16) bool {
			for _, l := range ls {
				if l.peer.addrs.Contains(a) && (l.ports == nil || l.ports.Matches(p, port)) {
					return true
				}
			}
			return false
		}
		var before, after []lookup
		for _, l := range pending {
			before = append(before, l.lookup)
		}
		for _, g := range groups {
			after = append(after, g.lookup)
		}
		for range 400 {
			a, p, port := addr(), policy.PortProtocols[r.Intn(3)], uint16(998+r.Intn(48))
			if got, want := matches(after, a, p, port), matches(before, a, p, port); got != want {
				t.Fatalf("round %d: %s %s/%d: merged lookups match %v, the peers' %v", round, a, p, port, got, want)
			}
		}
	}
}

// TestRandomPortListsAgreeWithEvaluator: Admin tiers of random blocks of
// 2 to 150 Accept rules (own or overlapping networks, on a few shared
// port lists, or some on their own ports or all traffic; some judging
// one of the two pods only) between Deny and Pass rules over wider
// networks, so that Accept runs merge their peers by ports (over their
// budget, with a union of the rest or without; short, the peers only
// they match) beside a Deny they must not open; the rules judge every
// probe as the evaluator does.
func TestRandomPortListsAgreeWithEvaluator(t *testing.T) {
	merged := 0
	for seed := int64(1); seed <= 12; seed++ {
		r := rand.New(rand.NewSource(seed))
		lists := 1 + r.Intn(3)
		protocols := func(l int) string {
			var ps []string
			for k := range 12 + r.Intn(10) {
				ps = append(ps, fmt.Sprintf("{tcp: {destinationPort: {range: {start: %d, end: %d}}}}", 1000+100*l+4*k, 1001+100*l+4*k))
			}
			return "[" + strings.Join(ps, ", ") + "]"
		}
		listProtocols := make([]string, lists)
		for l := range lists {
			listProtocols[l] = protocols(l)
		}
		var b strings.Builder
		b.WriteString("apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\nstatus: {addresses: [{type: InternalIP, address: 192.168.0.1}]}\n---\n")
		b.WriteString("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n")
		for i := range 2 {
			fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata: {name: l%d, namespace: shop, labels: {app: a%d}}\nspec: {nodeName: node-1, containers: [{name: c}]}\nstatus: {podIPs: [{ip: 172.16.1.%d}, {ip: 'fd00::%d'}]}\n---\n", i, i, 10+i, 10+i)
		}
		prio, peer := 0, 0
		// onlyL0: the next rules judge pod l0 only, so that the pods'
		// runs differ and share some peers.
		onlyL0 := false
		rule := func(action, network, protocols string) {
			subject := "{namespaces: {}}"
			if onlyL0 && r.Intn(2) == 0 {
				subject = "{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: a0}}}}"
			}
			fmt.Fprintf(&b, "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: c%d}\nspec:\n  tier: Admin\n  priority: %d\n  subject: %s\n  egress: [{name: r, action: %s, to: [{networks: ['%s']}]", prio, prio, subject, action, network)
			if protocols != "" {
				fmt.Fprintf(&b, ", protocols: %s", protocols)
			}
			b.WriteString("}]\n---\n")
			prio++
		}
		for range 2 + r.Intn(3) {
			for range r.Intn(3) {
				action := []string{"Deny", "Deny", "Pass"}[r.Intn(3)]
				network := fmt.Sprintf("10.%d.0.0/16", r.Intn(3))
				if r.Intn(4) == 0 {
					network = "10.0.0.0/8"
				}
				ps := ""
				if r.Intn(2) == 0 {
					ps = listProtocols[r.Intn(lists)]
				}
				rule(action, network, ps)
			}
			// A block on lists alone has only fat port groups (one
			// lookup each, no union); one with some peers on ports of
			// their own or all traffic keeps a union of those.
			listsOnly := r.Intn(2) == 0
			// A short block (up to maxLookups peers) merges the peers
			// on one list that only its run matches (mergeOwn).
			size := 33 + r.Intn(118)
			if r.Intn(3) == 0 {
				size = 2 + r.Intn(maxLookups-1)
			}
			onlyL0 = r.Intn(2) == 0
			for range size {
				network := apartCIDR(peer)
				if r.Intn(6) == 0 {
					network = fmt.Sprintf("10.%d.%d.0/23", r.Intn(3), 2*r.Intn(128))
				}
				peer++
				k := r.Intn(10)
				if listsOnly {
					k = 2
				}
				switch k {
				case 0:
					rule("Accept", network, "")
				case 1:
					rule("Accept", network, fmt.Sprintf("[{tcp: {destinationPort: {number: %d}}}]", 3000+peer))
				default:
					rule("Accept", network, listProtocols[r.Intn(lists)])
				}
			}
		}
		onlyL0 = false
		rule("Deny", "0.0.0.0/0", "")
		prog := compileYAML(t, b.String())
		rs := Build(prog, "node-1")
		// The Deny and Pass rules' peers are one range each: a shared
		// set of more is Accept peers merged by ports.
		many := 0
		for name, s := range rs.sets {
			if strings.HasPrefix(name, "a-") && len(s.Addrs) > 1 {
				many++
			}
		}
		if many > 0 {
			merged++
		}
		t.Logf("seed %d: %d rules, %d lists, %d shared lookups (%d merged sets), %d union sets, longest chain %d: %+v", seed, prio, lists, sharedLookups(rs), many, unionSets(rs), longestChain(rs), rs.Stats())
		extra, ports := listProbes(peer, lists)
		for range 40 {
			extra = append(extra, netip.AddrFrom4([4]byte{10, byte(r.Intn(3)), byte(r.Intn(256)), byte(r.Intn(256))}))
		}
		if checkAgainstEvaluator(t, prog, extra, ports) == 0 {
			t.Fatalf("seed %d: no flows checked", seed)
		}
	}
	if merged == 0 {
		t.Error("no seed merged peers by ports")
	}
}

// TestMergedPeerNameStable: a merged port group's set keeps its name
// when its peers' addresses change, also when one of its peers is
// matched alone elsewhere under the same policy rule (pod l9 is
// selected by np0 only), so that the chains stay and a patch changes
// elements.
func TestMergedPeerNameStable(t *testing.T) {
	yaml := func(moved string) string {
		y := unionYAML(250, func(i int) (string, string) {
			cidr := apartCIDR(i)
			if i == 5 {
				cidr = moved
			}
			return fmt.Sprintf("{ipBlock: {cidr: %s}}", cidr), listPorts(0)
		})
		// np0 selects every pod, the others app=x only.
		y = strings.ReplaceAll(y, "podSelector: {}", "podSelector: {matchLabels: {app: x}}")
		y = strings.Replace(y, "metadata: {name: np0, namespace: shop}\nspec:\n  podSelector: {matchLabels: {app: x}}", "metadata: {name: np0, namespace: shop}\nspec:\n  podSelector: {}", 1)
		return y + "apiVersion: v1\nkind: Pod\nmetadata: {name: l9, namespace: shop, labels: {app: solo}}\nspec: {nodeName: node-1, containers: [{name: c}]}\nstatus: {podIPs: [{ip: 172.16.1.90}]}\n---\n"
	}
	names := func(rs *Ruleset) []string {
		var out []string
		for name := range rs.sets {
			if strings.HasPrefix(name, "a-") {
				out = append(out, name)
			}
		}
		for name := range rs.chains {
			out = append(out, name)
		}
		slices.Sort(out)
		return out
	}
	before := Build(compileYAML(t, yaml(apartCIDR(5))), "node-1")
	if got := sharedLookups(before); got != 2 {
		t.Fatalf("%d shared lookups, want 2 (the merged list and np0's peer alone)", got)
	}
	// Several moves: a name told apart by content would change with
	// the order of the contents' keys, which a few moves flip.
	for k := range 8 {
		moved := fmt.Sprintf("10.%d.0.0/%d", 200+k, 23+k%2)
		after := Build(compileYAML(t, yaml(moved)), "node-1")
		if b, a := names(before), names(after); !slices.Equal(b, a) {
			t.Errorf("peer %s: set or chain names changed:\n%v\n%v", moved, b, a)
		}
	}
}

// splitListsYAML: pod l0 is selected by n NetworkPolicies, pod l1 by
// the last n-own of them; policy i allows its own /24 (apartCIDR) on
// port list 0, or (portsOf) ports of its own.
func splitListsYAML(n, own int, portsOf func(i int) string) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\nstatus: {addresses: [{type: InternalIP, address: 192.168.0.1}]}\n---\n")
	b.WriteString("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n")
	for i, labels := range []string{"{ga: red, gb: red}", "{gb: red}"} {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata: {name: l%d, namespace: shop, labels: %s}\nspec: {nodeName: node-1, containers: [{name: c}]}\nstatus: {podIPs: [{ip: 172.16.1.%d}, {ip: 'fd00::%d'}]}\n---\n", i, labels, 10+i, 10+i)
	}
	for i := range n {
		sel := "gb"
		if i < own {
			sel = "ga"
		}
		fmt.Fprintf(&b, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np%d, namespace: shop}\nspec:\n  podSelector: {matchLabels: {%s: red}}\n  policyTypes: [Ingress]\n  ingress: [{from: [{ipBlock: {cidr: %s}}], ports: [%s]}]\n---\n", i, sel, apartCIDR(i), portsOf(i))
	}
	return b.String()
}

// TestMergeOwn: a short run (up to maxLookups peers) merges its peers on
// equal ports that no other run matches into one lookup, and keeps a
// shared set for each peer another run matches too: merging never
// copies a peer's addresses into a second set. The rules judge every
// probe as the evaluator does.
func TestMergeOwn(t *testing.T) {
	list := func(int) string { return listPorts(0) }
	for _, tc := range []struct {
		name string
		yaml string
		// shared lookups, most rules in a chain.
		shared, rules int
	}{
		// l0's 20 peers are its own: one lookup, its rule pair and
		// the isolation drop.
		{"own peers", splitListsYAML(20, 20, list), 1, 3},
		// l1 matches np10-np19 too: they keep a set each, in both
		// chains; l0's np0-np9 merge.
		{"half shared", splitListsYAML(20, 10, list), 11, 2*11 + 1},
		// Both pods selected by all 20: one run, whose peers are its
		// own.
		{"one list for both pods", splitListsYAML(20, 0, list), 1, 3},
		// Own peers on ports of their own: nothing to merge.
		{"own ports", splitListsYAML(20, 20, func(i int) string { return fmt.Sprintf("{port: %d}", 2000+i) }), 20, 2*20 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := compileYAML(t, tc.yaml)
			rs := Build(prog, "node-1")
			if got := sharedLookups(rs); got != tc.shared {
				t.Errorf("%d shared lookups, want %d", got, tc.shared)
			}
			if got := longestChain(rs); got != tc.rules {
				t.Errorf("a chain of %d rules, want %d", got, tc.rules)
			}
			// Each /24 is in one set: none copied.
			ranges := 0
			for name, s := range rs.sets {
				if strings.HasPrefix(name, "a-") {
					ranges += len(s.Addrs)
				}
			}
			if ranges != 20 {
				t.Errorf("peer sets hold %d ranges, want the 20 peers' own", ranges)
			}
			extra, ports := listProbes(20, 1)
			ports = append(ports, Packet{Proto: policy.ProtoTCP, Port: 2003}, Packet{Proto: policy.ProtoTCP, Port: 2015})
			if n := checkAgainstEvaluator(t, prog, extra, ports); n == 0 {
				t.Fatal("no flows checked")
			}
		})
	}
}
