package nft

import (
	"context"
	"fmt"
	"math/rand"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

var probePorts = []Packet{
	{Proto: policy.ProtoTCP, Port: 23},
	{Proto: policy.ProtoTCP, Port: 25},
	{Proto: policy.ProtoTCP, Port: 80},
	{Proto: policy.ProtoTCP, Port: 500},
	{Proto: policy.ProtoTCP, Port: 5432},
	{Proto: policy.ProtoTCP, Port: 8080},
	{Proto: policy.ProtoTCP, Port: 9100},
	{Proto: policy.ProtoTCP, Port: 31000},
	{Proto: policy.ProtoUDP, Port: 53},
	{Proto: policy.ProtoUDP, Port: 8080},
	{Proto: policy.ProtoSCTP, Port: 5432},
	{Proto: policy.ProtoICMP},
	{Proto: policy.ProtoICMPv6},
}

var extraAddrs = []netip.Addr{
	netip.MustParseAddr("192.168.0.1"),
	netip.MustParseAddr("fd00::1"),
	netip.MustParseAddr("192.168.0.2"),
	netip.MustParseAddr("203.0.113.7"),
	netip.MustParseAddr("203.0.113.200"),
	netip.MustParseAddr("198.51.100.1"),
	netip.MustParseAddr("2001:db8::1"),
}

func TestRulesetGolden(t *testing.T) {
	for _, tc := range []struct {
		file string
		node string
		opts policy.Options
	}{
		{"tiers.yaml", "node-1", policy.Options{IngressNetworksAndNodes: true}},
		{"tiers.yaml", "node-2", policy.Options{DenyNodeLocal: true, IngressNetworksAndNodes: true}},
	} {
		name := strings.TrimSuffix(tc.file, ".yaml") + "-" + tc.node
		t.Run(name, func(t *testing.T) {
			prog := compileFile(t, tc.file, tc.opts)
			fake := knftables.NewFake(knftables.InetFamily, Table)
			s := New(fake, Options{Node: tc.node})
			res, err := s.Sync(context.Background(), prog)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Full || !res.Applied {
				t.Errorf("first sync: got %+v, want a full replace", res)
			}
			readGolden(t, filepath.Join("testdata", name+".golden"), fake.Dump())
		})
	}
}

func TestRulesAgreeWithEvaluator(t *testing.T) {
	for _, opts := range []policy.Options{{}, {DenyNodeLocal: true}} {
		prog := compileFile(t, "tiers.yaml", opts)
		n := checkAgainstEvaluator(t, prog, extraAddrs, probePorts)
		if n < 1000 {
			t.Errorf("only %d flows compared", n)
		}
	}
}

func TestNPTierIsConstantLookups(t *testing.T) {
	// However many NetworkPolicies select a pod, its NetworkPolicy chain
	// is one set lookup per kind and family plus the drop.
	var b strings.Builder
	b.WriteString(`apiVersion: v1
kind: Pod
metadata: {name: srv, namespace: a, labels: {app: srv}}
spec: {nodeName: n1, containers: [{name: c, ports: [{containerPort: 80}]}]}
status: {podIP: 10.0.0.1}
`)
	for i := 0; i < 50; i++ {
		b.WriteString("---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n")
		fmt.Fprintf(&b, "metadata: {name: np%d, namespace: a}\n", i)
		fmt.Fprintf(&b, "spec:\n  podSelector: {matchLabels: {app: srv}}\n  ingress:\n  - from: [{ipBlock: {cidr: 10.%d.0.0/16}}]\n    ports: [{port: %d}]\n", i, 1000+i)
	}
	prog := compileYAML(t, b.String())
	rs := Build(prog, "n1")
	c := rs.chains[rs.ingress[netip.MustParseAddr("10.0.0.1")]]
	if c == nil {
		t.Fatal("no ingress chain for the selected pod")
	}
	if got := len(renderChainRules(c)); got != 7 {
		t.Errorf("NetworkPolicy chain has %d rules, want 2 for the hairpin + 4 lookups + drop", got)
	}
	for _, pp := range []struct {
		src  string
		port uint16
		want bool
	}{{"10.7.1.1", 1007, true}, {"10.7.1.1", 1008, false}, {"10.49.0.9", 1049, true}, {"10.50.0.9", 1050, false}} {
		got := rs.Allows(Packet{Src: netip.MustParseAddr(pp.src), Dst: netip.MustParseAddr("10.0.0.1"), Proto: policy.ProtoTCP, Port: pp.port})
		if got != pp.want {
			t.Errorf("%s -> srv:%d allowed=%v, want %v", pp.src, pp.port, got, pp.want)
		}
	}
}

// client2 is a second pod web-in's client selector picks.
const client2 = `---
apiVersion: v1
kind: Pod
metadata: {name: client2, namespace: shop, labels: {app: client}}
spec: {nodeName: node-2}
status: {podIPs: [{ip: 10.0.2.11}]}
`

func TestPeerChurnTouchesElementsOnly(t *testing.T) {
	base := mustRead(t, "testdata/tiers.yaml")
	for name, tc := range map[string]struct{ before, after string }{
		"peer address":  {base, strings.ReplaceAll(base, "10.0.2.10", "10.0.2.99")},
		"peer relabel":  {base + client2, strings.Replace(base, "labels: {app: client}}", "labels: {app: other}}", 1) + client2},
		"new peer pod":  {base, base + client2},
		"peer pod goes": {base + client2, base},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			fake := knftables.NewFake(knftables.InetFamily, Table)
			s := New(fake, Options{Node: "node-1"})
			if _, err := s.Sync(ctx, compileYAML(t, tc.before)); err != nil {
				t.Fatal(err)
			}
			res, err := s.Sync(ctx, compileYAML(t, tc.after))
			if err != nil {
				t.Fatal(err)
			}
			tx := fake.LastTransaction.String()
			if res.Full || res.Operations == 0 {
				t.Errorf("got %+v, want a non-empty patch", res)
			}
			for _, line := range strings.Split(strings.TrimSpace(tx), "\n") {
				if !strings.Contains(line, " element ") {
					t.Errorf("patch touches more than elements: %q", line)
				}
			}
		})
	}
}

// TestEmptiedPeerPatches: a selector that stops matching any pod drops
// out of the compiled Match, so the rules that used its set change; the
// patch replaces the chains involved (no full replace) and the rules
// deny what they must.
func TestEmptiedPeerPatches(t *testing.T) {
	ctx := context.Background()
	base := mustRead(t, "testdata/tiers.yaml")
	fake := knftables.NewFake(knftables.InetFamily, Table)
	s := New(fake, Options{Node: "node-1"})
	if _, err := s.Sync(ctx, compileYAML(t, base)); err != nil {
		t.Fatal(err)
	}
	web := Packet{Src: netip.MustParseAddr("10.0.2.10"), Dst: netip.MustParseAddr("10.0.1.10"), Proto: policy.ProtoTCP, Port: 8080}
	if !s.Applied().Allows(web) {
		t.Fatal("client -> web:8080 denied before the relabel")
	}
	res, err := s.Sync(ctx, compileYAML(t, strings.Replace(base, "labels: {app: client}}", "labels: {app: other}}", 1)))
	if err != nil || res.Full || res.Operations == 0 {
		t.Fatalf("got %+v, %v; want a patch", res, err)
	}
	if s.Applied().Allows(web) {
		t.Error("client -> web:8080 allowed after client lost its label")
	}
	if tx := fake.LastTransaction.String(); strings.Contains(tx, " counter inet ") {
		t.Errorf("patch added or deleted counters:\n%s", tx)
	}
}

func TestDuplicateLocalAddressFailsClosed(t *testing.T) {
	prog := compileYAML(t, `apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x}
spec: {nodeName: n1}
status: {podIP: 10.0.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: x}
spec: {nodeName: n1}
status: {podIP: 10.0.0.1}
`)
	// The compiler polices only the first pod with an address; a
	// Program that polices both (built by other means) must not let the
	// backend pick one silently.
	ia, _ := prog.PodByKey("x/a")
	ib, _ := prog.PodByKey("x/b")
	if prog.Policies[ib] != nil {
		t.Log("the compiler now polices both pods")
	}
	prog.Policies[ib] = prog.Policies[ia]
	rs := Build(prog, "n1")
	a := netip.MustParseAddr("10.0.0.1")
	if rs.egress[a] != conflictChain || rs.ingress[a] != conflictChain {
		t.Errorf("duplicate address dispatches to %q/%q, want the conflict chain", rs.egress[a], rs.ingress[a])
	}
	if len(rs.warnings) == 0 || !strings.Contains(rs.warnings[0], "x/a and x/b") {
		t.Errorf("warnings: %v", rs.warnings)
	}
	if rs.Allows(Packet{Src: netip.MustParseAddr("10.0.0.9"), Dst: a, Proto: policy.ProtoTCP, Port: 80}) {
		t.Error("traffic to a duplicated address is allowed")
	}
}

func TestNamesAreShortAndPlain(t *testing.T) {
	prog := compileFile(t, "tiers.yaml", policy.Options{})
	rs := Build(prog, "node-1")
	var names []string
	for n := range rs.sets {
		names = append(names, n)
	}
	for n := range rs.chains {
		names = append(names, n)
	}
	if len(names) == 0 {
		t.Fatal("no names")
	}
	for _, n := range names {
		if len(n) > 31 {
			t.Errorf("%q is longer than old kernels' 31-character limit", n)
		}
		for _, r := range n {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				t.Errorf("%q has %q, which nft would need quoted", n, r)
			}
		}
	}
	// Deterministic: the same Program gives the same names.
	again := Build(compileFile(t, "tiers.yaml", policy.Options{}), "node-1")
	if fmt.Sprint(sortedKeys(again.sets), sortedKeys(again.chains)) != fmt.Sprint(sortedKeys(rs.sets), sortedKeys(rs.chains)) {
		t.Error("names differ between two builds of the same input")
	}
}

// TestContentsMatchTerms: the disjoint elements computed for a union of
// random terms contain exactly the packets the terms match.
func TestContentsMatchTerms(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	addr := func() netip.Addr {
		if r.Intn(3) == 0 {
			return netip.AddrFrom16([16]byte{0xfd, 15: byte(r.Intn(40))})
		}
		return netip.AddrFrom4([4]byte{10, 0, byte(r.Intn(3)), byte(r.Intn(40))})
	}
	for round := 0; round < 300; round++ {
		var m policy.Match
		for i, n := 0, 1+r.Intn(5); i < n; i++ {
			var rs []policy.AddrRange
			for j, k := 0, 1+r.Intn(3); j < k; j++ {
				a, b := addr(), addr()
				if a.Is4() != b.Is4() {
					b = a
				}
				if b.Less(a) {
					a, b = b, a
				}
				rs = append(rs, policy.AddrRange{From: a, To: b})
			}
			var pb policy.PortSetBuilder
			if r.Intn(4) == 0 {
				pb.AddAll()
			}
			for j, k := 0, 1+r.Intn(3); j < k; j++ {
				from := uint16(1 + r.Intn(30))
				pb.Add(policy.PortProtocols[r.Intn(3)], policy.PortRange{From: from, To: from + uint16(r.Intn(8))})
			}
			m = append(m, policy.Term{Addrs: policy.NewAddrSet(rs...), Ports: pb.Build()})
		}
		sc := contentsOf([]policy.Match{m})
		for k := 0; k < 200; k++ {
			a := addr()
			proto := policy.PortProtocols[r.Intn(3)]
			port := uint16(r.Intn(40))
			if k%10 == 0 {
				proto, port = policy.ProtoICMP, 0
			}
			got := false
			for i := range sc {
				got = got || sc[i].contains(a, proto, port)
			}
			if want := m.Matches(a, proto, port); got != want {
				t.Fatalf("round %d: %s %s/%d: sets say %v, terms %v", round, a, proto, port, got, want)
			}
		}
		for _, kind := range []setKind{ports4, ports6} {
			bs := sc[kind].Boxes
			if !strictlySorted(bs, sc[kind].boxOrder()) {
				t.Fatalf("boxes out of order: %v", bs)
			}
			for i := range bs {
				for j := i + 1; j < len(bs); j++ {
					x, y := bs[i], bs[j]
					if x.Proto == y.Proto && !x.Addrs.To.Less(y.Addrs.From) && !y.Addrs.To.Less(x.Addrs.From) && x.Ports.From <= y.Ports.To && y.Ports.From <= x.Ports.To {
						t.Fatalf("overlapping boxes: %v %v", x, y)
					}
				}
			}
		}
	}
}

// TestPeerSetsShared: rules of many policies, for many pods, with the same
// peer selector look up one set pair; the table's elements grow with the
// distinct peers' pods, not with rules x pods.
func TestPeerSetsShared(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 3; i++ {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Pod\nmetadata: {name: client%d, namespace: a, labels: {app: client}}\nspec: {nodeName: n2}\nstatus: {podIP: 10.0.2.%d}\n", i, i+1)
	}
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Pod\nmetadata: {name: srv%d, namespace: a, labels: {app: srv%d}}\nspec: {nodeName: n1}\nstatus: {podIP: 10.0.1.%d}\n", i, i, i+1)
		fmt.Fprintf(&b, "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np%d, namespace: a}\nspec:\n  podSelector: {matchLabels: {app: srv%d}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}}]\n    ports: [{port: %d}]\n", i, i, 1000+i)
	}
	rs := Build(compileYAML(t, b.String()), "n1")
	var withClients []string
	for name, s := range rs.sets {
		for _, r := range s.Addrs {
			if a := netip.MustParseAddr("10.0.2.2"); !a.Less(r.From) && !r.To.Less(a) {
				withClients = append(withClients, name)
			}
		}
	}
	if len(withClients) != 1 {
		t.Errorf("client addresses are in %d sets %v, want one shared set", len(withClients), withClients)
	}
	if got := rs.Stats().Elements; got > 3+20*(2+2+1)+10 {
		t.Errorf("%d elements for 20 pods and 3 peers: peers are duplicated per rule", got)
	}
	for i := 0; i < 20; i++ {
		dst := netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)})
		for _, port := range []uint16{uint16(1000 + i), uint16(1001 + i)} {
			got := rs.Allows(Packet{Src: netip.MustParseAddr("10.0.2.3"), Dst: dst, Proto: policy.ProtoTCP, Port: port})
			if want := port == uint16(1000+i); got != want {
				t.Errorf("client -> srv%d:%d allowed=%v, want %v", i, port, got, want)
			}
		}
	}
}

// TestDuplicateAddressFailsClosedOnEveryNode: an address a local pod and a
// pod on another node both claim, or two remote pods claim, is dropped
// here as the evaluator denies it, whichever pod the compiler policed.
func TestDuplicateAddressFailsClosedOnEveryNode(t *testing.T) {
	prog := compileYAML(t, `apiVersion: v1
kind: Pod
metadata: {name: local, namespace: x}
spec: {nodeName: n1}
status: {podIP: 10.0.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: remote, namespace: x}
spec: {nodeName: n2}
status: {podIP: 10.0.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: r1, namespace: x}
spec: {nodeName: n2}
status: {podIP: 10.0.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: r2, namespace: x}
spec: {nodeName: n3}
status: {podIP: 10.0.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: x}
spec: {nodeName: n1}
status: {podIP: 10.0.0.3}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all, namespace: x}
spec:
  podSelector: {}
  ingress: [{}]
  egress: [{}]
`)
	rs := Build(prog, "n1")
	other := netip.MustParseAddr("192.0.2.9")
	web := netip.MustParseAddr("10.0.0.3")
	for _, tc := range []struct {
		name     string
		src, dst netip.Addr
	}{
		{"to the address a local and a remote pod claim", other, netip.MustParseAddr("10.0.0.1")},
		{"from the address a local and a remote pod claim", netip.MustParseAddr("10.0.0.1"), web},
		{"from an address two remote pods claim", netip.MustParseAddr("10.0.0.2"), web},
	} {
		f := policy.Flow{Src: policy.Endpoint{Addr: tc.src}, Dst: policy.Endpoint{Addr: tc.dst}, Proto: policy.ProtoTCP, Port: 80}
		if prog.Allowed(f) {
			t.Fatalf("%s: the evaluator allows it; the test expects the documented denial", tc.name)
		}
		if rs.Allows(Packet{Src: tc.src, Dst: tc.dst, Proto: policy.ProtoTCP, Port: 80}) {
			t.Errorf("%s: allowed by node n1's ruleset, denied by the evaluator", tc.name)
		}
	}
	if !rs.Allows(Packet{Src: other, Dst: web, Proto: policy.ProtoTCP, Port: 80}) {
		t.Error("traffic to a pod with its own address is dropped")
	}
	if w := strings.Join(rs.warnings, "\n"); !strings.Contains(w, "x/local and x/remote") || !strings.Contains(w, "x/r1 and x/r2") {
		t.Errorf("warnings do not name the claimants: %v", rs.warnings)
	}
}

// TestAdminChainSharedAcrossLaterTiers: web and db on node-1 have one
// Admin tier and different NetworkPolicies; they share the Admin chain,
// and the next-tier maps tell them apart. A relabel that moves db under
// web's NetworkPolicy patches the NetworkPolicy chains and the next-tier
// map elements, never the Admin chain.
func TestAdminChainSharedAcrossLaterTiers(t *testing.T) {
	base := mustRead(t, "testdata/tiers.yaml")
	web, db := netip.MustParseAddr("10.0.1.10"), netip.MustParseAddr("10.0.1.11")
	rs := Build(compileYAML(t, base), "node-1")
	for _, dir := range []struct {
		name       string
		entry, nxt map[netip.Addr]string
	}{{"egress", rs.egress, rs.egressNext}, {"ingress", rs.ingress, rs.ingressNext}} {
		if dir.entry[web] == "" || dir.entry[web] != dir.entry[db] {
			t.Errorf("%s: web enters %q, db %q; want one shared Admin chain", dir.name, dir.entry[web], dir.entry[db])
		}
		if _, ok := dir.nxt[web]; !ok {
			t.Errorf("%s: web has no next-tier entry", dir.name)
		}
	}
	if rs.ingressNext[web] == rs.ingressNext[db] || rs.ingressNext[db] == "" {
		t.Errorf("ingress next tiers: web %q, db %q; want their own NetworkPolicy chains", rs.ingressNext[web], rs.ingressNext[db])
	}
	ctx := context.Background()
	fake := knftables.NewFake(knftables.InetFamily, Table)
	s := New(fake, Options{Node: "node-1"})
	if _, err := s.Sync(ctx, compileYAML(t, base)); err != nil {
		t.Fatal(err)
	}
	moved := strings.Replace(base, "metadata: {name: db, namespace: shop, labels: {app: db}}", "metadata: {name: db, namespace: shop, labels: {app: web}}", 1)
	if moved == base {
		t.Fatal("fixture changed: db's labels not found")
	}
	res, err := s.Sync(ctx, compileYAML(t, moved))
	if err != nil || res.Full || res.Operations == 0 {
		t.Fatalf("relabel: %+v, %v; want a non-empty patch", res, err)
	}
	checkAgainstEvaluator(t, compileYAML(t, base), extraAddrs, probePorts)
	checkAgainstEvaluator(t, compileYAML(t, moved), extraAddrs, probePorts)
	tx := fake.LastTransaction.String()
	for _, admin := range []string{rs.egress[web], rs.ingress[web]} {
		if strings.Contains(tx, admin) {
			t.Errorf("moving db between NetworkPolicies touched the Admin chain %s:\n%s", admin, tx)
		}
	}
	if !strings.Contains(tx, "add element inet moat ingress-next4 { 10.0.1.11 : goto ") {
		t.Errorf("db's next-tier entry was not moved:\n%s", tx)
	}
}
