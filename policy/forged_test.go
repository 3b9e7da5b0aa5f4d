package policy_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// forgedCluster has pod CIDRs: n1 10.1.1.0/24 and fd00::1:0/112, n2
// 10.1.2.0/24, whose Node lists its gateway 10.1.2.1 among its addresses.
// Pod a/q runs on n2 with an address from n1's CIDR (a CNI with IP pools
// of its own). a/x is ingress-isolated except from pods and nodes.
var forgedCluster = manifests(
	fixNode{name: "n1", podCIDRs: []string{"10.1.1.0/24", "fd00::1:0/112"}, internal: []string{"10.0.0.1"}},
	fixNode{name: "n2", podCIDRs: []string{"10.1.2.0/24"}, internal: []string{"10.0.0.2", "10.1.2.1"}},
	fixNamespace("a"),
	fixPod{namespace: "a", name: "x", node: "n1", ips: []string{"10.1.1.1", "fd00::1:1"}},
	fixPod{namespace: "a", name: "y", node: "n2", ips: []string{"10.1.2.10"}},
	fixPod{namespace: "a", name: "q", node: "n2", ips: []string{"10.1.1.50"}},
	fixPod{namespace: "a", name: "h", node: "n1", hostNetwork: true, ips: []string{"10.0.0.1"}},
)

// TestForgedSources: a new connection from an address inside a node's
// pod CIDRs, which no pod owns, is denied before any policy, as that
// node's anti-spoofing rules drop it (docs/agent.md); the review found
// explain calling it "outside the pod network: not policed". So is one
// to such an address, unless the node itself connects.
// Pods' addresses and the nodes' own are not.
func TestForgedSources(t *testing.T) {
	const np = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-in, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{from: [{ipBlock: {cidr: 0.0.0.0/0}}, {ipBlock: {cidr: "::/0"}}]}]
`
	notPol := policy.TierNotPoliced
	cases := []flowCase{
		{name: "unowned source in the destination node's CIDR", from: "10.1.1.99", to: "a/x", port: 80, allowed: false, egress: notPol, ingress: notPol,
			reasonHas: "the source 10.1.1.99 is in node n1's pod CIDR 10.1.1.0/24 but no pod owns it: node n1, which holds the destination, drops it as a forged source"},
		{name: "IPv6", from: "fd00::1:99", to: "fd00::1:1", port: 80, allowed: false, reasonHas: "node n1's pod CIDR fd00::1:0/112"},
		{name: "to the node itself (input hook)", from: "10.1.1.99", to: "10.0.0.1", port: 22, allowed: false, reasonHas: "forged"},
		{name: "to a host-network pod of the node", from: "10.1.1.99", to: "a/h", port: 9100, allowed: false, reasonHas: "forged"},
		{name: "another node's CIDR: the address lies behind that node, which drops it", from: "10.1.1.99", to: "a/y", port: 80, allowed: false, egress: notPol, ingress: notPol,
			reasonHas: "node n1, where the pod network routes it (and its replies), drops it as a forged source"},
		{name: "an unowned address to itself crosses no node", from: "10.1.1.99", to: "10.1.1.99", port: 80, allowed: true, reasonHas: "not policed"},
		{name: "a pod of another node with an address in the CIDR", from: "a/q", to: "a/x", port: 80, allowed: true, ingress: policy.TierNetworkPolicy},
		{name: "a pod's own address", from: "a/y", to: "a/x", port: 80, allowed: true},
		{name: "the node's gateway address, listed in its status, to its pods", from: "10.1.2.1", to: "a/y", port: 80, allowed: true, ingress: policy.TierNodeLocal},
		{name: "the node's gateway address to another node's pod", from: "10.1.2.1", to: "a/x", port: 80, allowed: true, ingress: policy.TierNetworkPolicy},
		{name: "the node's gateway address to itself", from: "10.1.2.1", to: "10.0.0.2", port: 80, allowed: true},
		{name: "a host-network pod of the node", from: "a/h", to: "a/x", port: 80, allowed: true},
		{name: "outside the pod CIDRs", from: "192.0.2.7", to: "a/x", port: 80, allowed: true, reasonHas: "outside the pod network"},
		// A pod whose address has not reached the agents
		// is unreachable, not unpoliced.
		{name: "an unowned destination is dropped by its node", from: "a/x", to: "10.1.1.99", port: 80, allowed: false, ingress: notPol,
			reasonHas: "the destination 10.1.1.99 is in node n1's pod CIDR 10.1.1.0/24 but no pod owns it: node n1 drops new connections to it before any policy"},
		{name: "from another node's pod", from: "a/y", to: "10.1.1.99", port: 80, allowed: false, reasonHas: "node n1 drops new connections"},
		{name: "from outside", from: "2001:db8::7", to: "fd00::1:99", port: 80, allowed: false, reasonHas: "node n1's pod CIDR fd00::1:0/112"},
		{name: "from another node", from: "10.0.0.2", to: "10.1.1.99", port: 80, allowed: false, reasonHas: "node n1 drops new connections"},
		{name: "from the node itself (output hook)", from: "10.0.0.1", to: "10.1.1.99", port: 80, allowed: true,
			reasonHas: "the destination 10.1.1.99 is in node n1's pod CIDR 10.1.1.0/24 but no pod owns it: not policed"},
		{name: "from a host-network pod of the node", from: "a/h", to: "10.1.1.99", port: 80, allowed: true},
		{name: "to the node's gateway address in its CIDR (input hook)", from: "a/x", to: "10.1.2.1", port: 80, allowed: true},
	}
	for _, opts := range []policy.Options{{}, {DenyNodeLocal: true}} {
		prog := compileWith(t, forgedCluster+"---\n"+np, opts)
		c := slices.Clone(cases)
		if opts.DenyNodeLocal {
			i := slices.IndexFunc(c, func(f flowCase) bool { return strings.HasPrefix(f.name, "the node's gateway address, listed") })
			c[i].ingress = policy.TierNetworkPolicy // judged, and allowed, by x-in
		}
		runFlows(t, prog, c)
	}
}

// TestForgedVerdictAllocatesNothing: the Allowed hot path stays free of
// allocations for forged sources too.
func TestForgedVerdictAllocatesNothing(t *testing.T) {
	prog := compileWith(t, forgedCluster, policy.Options{})
	x, _ := prog.PodByKey("a/x")
	f := policy.Flow{Src: policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr("10.1.1.99")}, Dst: policy.Endpoint{Pod: x, Addr: netip.MustParseAddr("10.1.1.1")}, Proto: policy.ProtoTCP, Port: 80}
	if prog.Allowed(f) {
		t.Fatal("forged source allowed")
	}
	if n := testing.AllocsPerRun(100, func() { prog.Allowed(f) }); n != 0 {
		t.Errorf("Allowed allocates %v times per forged flow", n)
	}
}
