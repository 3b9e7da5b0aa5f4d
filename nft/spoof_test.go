package nft

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// A node with overlapping pod CIDRs, its pod, and a pod of another node
// whose address (own IP pools of the CNI) lies in this node's CIDR.
const podCIDRCluster = `apiVersion: v1
kind: Node
metadata: {name: n1}
spec: {podCIDRs: ["10.244.0.0/24", "10.244.0.0/16", "fd00:244::/64"]}
status: {addresses: [{type: InternalIP, address: 192.168.1.1}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a}
spec: {nodeName: n1}
status: {podIP: 10.244.0.5}
---
apiVersion: v1
kind: Pod
metadata: {name: q, namespace: a}
spec: {nodeName: n2}
status: {podIP: 10.244.7.9}
`

// TestSpoofedSources: the pod CIDRs are normalised for an interval set
// (the /16 contains the /24), every known pod address in them is allowed
// as a source and an unknown one is not, as the forward hook decides; a
// change of the CIDRs is a change of the inputs.
func TestSpoofedSources(t *testing.T) {
	prog := compileYAML(t, podCIDRCluster)
	rs := Build(prog, "n1")
	if want := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/64")}; !slices.Equal(rs.podNets, want) {
		t.Errorf("podNets = %v, want %v", rs.podNets, want)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("10.244.7.9")}; !slices.Equal(rs.pods, want) {
		t.Errorf("pods = %v, want %v", rs.pods, want)
	}
	dst := netip.MustParseAddr("192.168.9.9")
	for src, want := range map[string]bool{"10.244.0.5": true, "10.244.7.9": true, "10.244.0.77": false, "fd00:244::77": false, "10.9.0.1": true} {
		if got := rs.Allows(Packet{Src: netip.MustParseAddr(src), Dst: dst, Proto: policy.ProtoUDP, Port: 53}); got != want {
			t.Errorf("Allows from %s = %v, want %v", src, got, want)
		}
	}
	// moat-agent compiles for its node, and its Program lists only that
	// node's pods: the other node's pod in the CIDR must still be known.
	scopedProg := compileYAMLOpts(t, podCIDRCluster, policy.Options{Node: "n1"})
	scoped := Build(scopedProg, "n1")
	if !slices.Equal(scoped.pods, rs.pods) {
		t.Errorf("node-scoped pods = %v, want %v as from the whole cluster", scoped.pods, rs.pods)
	}
	// Sync builds from the inputs it read to compare (the pod addresses
	// are read once): the same lists.
	synced := buildCached(scopedProg, "n1", nil, readInputs(scopedProg, "n1"))
	if !slices.Equal(synced.pods, rs.pods) || !slices.Equal(synced.podNets, rs.podNets) {
		t.Errorf("built from the inputs: pods %v, nets %v; want %v, %v", synced.pods, synced.podNets, rs.pods, rs.podNets)
	}
	other := compileYAML(t, strings.Replace(podCIDRCluster, `"10.244.0.0/16", `, "", 1))
	if readInputs(prog, "n1").equal(readInputs(other, "n1")) {
		t.Error("inputs equal although the pod CIDRs differ")
	}
}

// forgedCluster: n1's pod CIDRs hold its pod x, a pod q of n2 (own IP
// pools of the CNI) and n1's gateway address, which its Node lists; n2's
// hold its pod y. x and y are isolated for ingress but from anywhere.
const forgedCluster = `apiVersion: v1
kind: Node
metadata: {name: n1}
spec: {podCIDRs: ["10.244.1.0/24", "fd00:244:1::/64"]}
status: {addresses: [{type: InternalIP, address: 192.168.1.1}, {type: InternalIP, address: 10.244.1.1}]}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
spec: {podCIDRs: ["10.244.2.0/24"]}
status: {addresses: [{type: InternalIP, address: 192.168.1.2}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: Pod
metadata: {name: x, namespace: a}
spec: {nodeName: n1}
status: {podIPs: [{ip: 10.244.1.5}, {ip: "fd00:244:1::5"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: "y", namespace: a}
spec: {nodeName: n2}
status: {podIP: 10.244.2.5}
---
apiVersion: v1
kind: Pod
metadata: {name: q, namespace: a}
spec: {nodeName: n2}
status: {podIP: 10.244.1.9}
---
apiVersion: v1
kind: Pod
metadata: {name: h, namespace: a}
spec: {nodeName: n1, hostNetwork: true}
status: {podIP: 192.168.1.1}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: in, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{from: [{ipBlock: {cidr: 0.0.0.0/0}}, {ipBlock: {cidr: "::/0"}}]}]
`

// TestForgedSourcesAgreeWithEvaluator: the evaluator denies what the
// anti-spoofing rules drop (it allowed an unowned source in
// the pod CIDRs as "outside the pod network"), and allows what they let
// through: pods' addresses, and the node's own address inside its CIDRs
// (the output hook does not check it, with node-local traffic allowed or
// not). An unowned source in another node's CIDRs lies behind that node,
// which drops it (and the replies to it) too.
func TestForgedSourcesAgreeWithEvaluator(t *testing.T) {
	extra := []netip.Addr{netip.MustParseAddr("10.244.1.77"), netip.MustParseAddr("fd00:244:1::77"), netip.MustParseAddr("10.244.2.77"),
		netip.MustParseAddr("10.244.1.1"), netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("192.168.1.2"), netip.MustParseAddr("203.0.113.1")}
	for _, opts := range []policy.Options{{}, {DenyNodeLocal: true}} {
		prog := compileYAMLOpts(t, forgedCluster, opts)
		if n := checkAgainstEvaluator(t, prog, extra, []Packet{{Proto: policy.ProtoTCP, Port: 80}}); n == 0 {
			t.Fatal("no flows compared")
		}
		x, _ := prog.PodByKey("a/x")
		for src, want := range map[string]bool{"10.244.1.77": false, "fd00:244:1::77": false, "10.244.2.77": false, "10.244.1.1": true, "10.244.1.9": true} {
			dst := "10.244.1.5"
			if netip.MustParseAddr(src).Is6() {
				dst = "fd00:244:1::5"
			}
			s, _ := prog.ParseEndpoint(src)
			f := policy.Flow{Src: s, Dst: policy.Endpoint{Pod: x, Addr: netip.MustParseAddr(dst)}, Proto: policy.ProtoTCP, Port: 80}
			if got := prog.Allowed(f); got != want {
				t.Errorf("DenyNodeLocal=%v: %s to a/x allowed=%v, want %v", opts.DenyNodeLocal, src, got, want)
			}
		}
	}
}

// nodeClaimCluster: node n2's status lists pod a/x's address; pods of
// namespace b may reach nodes only.
const nodeClaimCluster = `apiVersion: v1
kind: Node
metadata: {name: n1}
status: {addresses: [{type: InternalIP, address: 192.168.1.1}]}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
status: {addresses: [{type: InternalIP, address: 192.168.1.2}, {type: ExternalIP, address: 10.244.1.5}]}
---
apiVersion: v1
kind: Pod
metadata: {name: x, namespace: a}
spec: {nodeName: n1}
status: {podIP: 10.244.1.5}
---
apiVersion: v1
kind: Pod
metadata: {name: z, namespace: b}
spec: {nodeName: n1}
status: {podIP: 10.244.1.6}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: only-nodes}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: b}}}
  egress:
  - {name: to-nodes, action: Accept, to: [{nodes: {}}]}
  - {name: deny-rest, action: Deny, to: [{networks: ["0.0.0.0/0"]}]}
`

// TestNodePeerLeavesOutPodAddresses: the rules' `nodes` set, like the
// evaluator, leaves out a node address a pod-network pod claims, so b/z reaches node n2's other address but not pod a/x.
func TestNodePeerLeavesOutPodAddresses(t *testing.T) {
	prog := compileYAML(t, nodeClaimCluster)
	rs := Build(prog, "n1")
	for dst, want := range map[string]bool{"192.168.1.2": true, "10.244.1.5": false} {
		if got := rs.Allows(Packet{Src: netip.MustParseAddr("10.244.1.6"), Dst: netip.MustParseAddr(dst), Proto: policy.ProtoTCP, Port: 80}); got != want {
			t.Errorf("b/z to %s: rules allow=%v, want %v", dst, got, want)
		}
	}
	checkAgainstEvaluator(t, prog, []netip.Addr{netip.MustParseAddr("192.168.1.2")}, []Packet{{Proto: policy.ProtoTCP, Port: 80}})
}

// TestUnknownDestinations: the forward hook drops a new
// connection to an address in the node's pod CIDRs that no pod owns (a
// pod whose address has not reached the agent yet), as the evaluator
// denies it; the node's own connections (output hook) and connections to
// the node's own addresses (input hook) are not checked.
func TestUnknownDestinations(t *testing.T) {
	if !slices.Contains(forwardRules, unknownDstRules[0]) || !slices.Contains(forwardRules, unknownDstRules[1]) {
		t.Fatal("forward does not drop unknown destinations")
	}
	for _, r := range slices.Concat(inputRules, outputRules) {
		if strings.Contains(r, counterUnknownDst) {
			t.Errorf("input or output checks destinations: %s", r)
		}
	}
	prog := compileYAML(t, forgedCluster)
	rs := Build(prog, "n1")
	a := netip.MustParseAddr
	for _, c := range []struct {
		p    Packet
		want bool
	}{
		{Packet{Src: a("10.244.1.5"), Dst: a("10.244.1.77")}, false},                  // a local pod
		{Packet{Src: a("fd00:244:1::5"), Dst: a("fd00:244:1::77")}, false},            // IPv6
		{Packet{Src: a("203.0.113.1"), Dst: a("10.244.1.77")}, false},                 // from outside
		{Packet{Src: a("192.168.1.2"), Dst: a("10.244.1.77")}, false},                 // another node
		{Packet{Src: a("192.168.1.1"), Dst: a("10.244.1.77")}, true},                  // the node itself
		{Packet{Src: a("10.244.1.1"), Dst: a("10.244.1.77")}, true},                   // its gateway address, listed
		{Packet{Src: a("10.244.1.254"), Dst: a("10.244.1.77"), Local: true}, true},    // a local address, not listed
		{Packet{Src: a("203.0.113.1"), Dst: a("10.244.1.1")}, true},                   // the node's listed gateway (input)
		{Packet{Src: a("203.0.113.1"), Dst: a("10.244.1.254"), DstLocal: true}, true}, // an unlisted local address (input)
		{Packet{Src: a("203.0.113.1"), Dst: a("10.244.1.9")}, true},                   // another node's pod in n1's CIDR
		{Packet{Src: a("203.0.113.1"), Dst: a("10.244.2.77")}, true},                  // another node's CIDR: its business
	} {
		c.p.Proto, c.p.Port = policy.ProtoTCP, 80
		if got := rs.Allows(c.p); got != c.want {
			t.Errorf("%s -> %s (local %v/%v): rules allow=%v, want %v", c.p.Src, c.p.Dst, c.p.Local, c.p.DstLocal, got, c.want)
		}
	}
	x, _ := prog.PodByKey("a/x")
	v := prog.Evaluate(policy.Flow{Src: policy.Endpoint{Pod: x, Addr: a("10.244.1.5")}, Dst: policy.Endpoint{Pod: -1, Addr: a("10.244.1.77")}, Proto: policy.ProtoTCP, Port: 80})
	if v.Allowed || !strings.Contains(v.Ingress.Reason, "node n1 drops new connections to it") {
		t.Errorf("evaluator: %+v", v)
	}
}
