package nft

import (
	"context"
	"fmt"
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
		{"tiers.yaml", "node-1", policy.Options{}},
		{"tiers.yaml", "node-2", policy.Options{DenyNodeLocal: true}},
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
	c := rs.Chains[rs.Ingress[netip.MustParseAddr("10.0.0.1")]]
	if c == nil {
		t.Fatal("no ingress chain for the selected pod")
	}
	if got := len(renderChainRules(c)); got != 5 {
		t.Errorf("NetworkPolicy chain has %d rules, want 4 lookups + drop", got)
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

func TestPeerChurnTouchesElementsOnly(t *testing.T) {
	base := mustRead(t, "testdata/tiers.yaml")
	for name, edit := range map[string]func(string) string{
		"peer address": func(s string) string { return strings.ReplaceAll(s, "10.0.2.10", "10.0.2.99") },
		"peer relabel": func(s string) string {
			return strings.Replace(s, "labels: {app: client}}", "labels: {app: other}}", 1)
		},
		"new peer pod": func(s string) string {
			return s + `---
apiVersion: v1
kind: Pod
metadata: {name: client2, namespace: shop, labels: {app: client}}
spec: {nodeName: node-2}
status: {podIPs: [{ip: 10.0.2.11}]}
`
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			fake := knftables.NewFake(knftables.InetFamily, Table)
			s := New(fake, Options{Node: "node-1"})
			if _, err := s.Sync(ctx, compileYAML(t, base)); err != nil {
				t.Fatal(err)
			}
			res, err := s.Sync(ctx, compileYAML(t, edit(base)))
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
