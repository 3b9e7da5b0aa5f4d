package policy_test

import (
	"net/netip"
	"testing"

	"github.com/moat-net/moat/policy"
)

// docs/semantics.md, ClusterNetworkPolicy matching: subjects, the four peer kinds in both directions (NPEP-127),
// and the protocols list (NPEP-187).
func TestClusterNetworkPolicyPeersAndProtocols(t *testing.T) {
	prog := compile(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: x-ingress}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {matchLabels: {env: prod}}, podSelector: {matchLabels: {app: x}}}}
  ingress:
  - {name: nodes-1, action: Accept, from: [{nodes: {matchLabels: {compromised: "true"}}}], protocols: [{tcp: {destinationPort: {number: 1}}}]}
  - {name: networks-2, action: Accept, from: [{networks: ["10.1.2.0/24", "2001:db8::/32"]}], protocols: [{tcp: {destinationPort: {number: 2}}}]}
  - {name: named-http, action: Accept, from: [{namespaces: {}}], protocols: [{destinationNamedPort: http}]}
  - {name: udp-range, action: Accept, from: [{namespaces: {}}], protocols: [{udp: {destinationPort: {range: {start: 1000, end: 2000}}}}, {sctp: {destinationPort: {number: 9}}}]}
  - {name: deny-rest, action: Deny, from: [{networks: ["0.0.0.0/0", "::/0"]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: z-egress}
spec:
  tier: Baseline
  priority: 1
  subject: {namespaces: {matchLabels: {env: dev}}}
  egress:
  - {name: to-nodes, action: Accept, to: [{nodes: {}}], protocols: [{tcp: {destinationPort: {number: 10250}}}]}
  - {name: named-to-pods, action: Accept, to: [{pods: {namespaceSelector: {}, podSelector: {}}}], protocols: [{destinationNamedPort: http}]}
  - {name: deny-all, action: Deny, to: [{networks: ["0.0.0.0/0"]}]}
`, policy.Options{IngressNetworksAndNodes: true})
	runFlows(t, prog, []flowCase{
		{name: "subject pods: y is not a subject", from: "b/z", to: "a/y", port: 8080, allowed: true, ingress: deflt},
		{name: "ingress nodes peer: node n2's address", from: "10.0.0.2", to: "a/x", port: 1, allowed: true, ingress: admin, reasonHas: "nodes-1"},
		{name: "ingress nodes peer: other ports hit deny-rest", from: "10.0.0.2", to: "a/x", port: 3, allowed: false, ingress: admin, reasonHas: "deny-rest"},
		{name: "ingress networks peer matches cluster-internal pod IPs", from: "a/y", to: "a/x", port: 2, allowed: true, ingress: admin, reasonHas: "networks-2"},
		{name: "ingress networks IPv6", from: "2001:db8::7", to: "fd00::1:1", port: 2, allowed: true, ingress: admin},
		{name: "ingress networks miss", from: "192.168.100.5", to: "a/x", port: 2, allowed: false, ingress: admin, reasonHas: "deny-rest"},
		{name: "destinationNamedPort on the subject: x http=80", from: "a/y", to: "a/x", port: 80, allowed: true, reasonHas: "named-http"},
		{name: "udp range start", from: "a/y", to: "a/x", port: 1000, proto: "UDP", allowed: true, reasonHas: "udp-range"},
		{name: "udp range end", from: "a/y", to: "a/x", port: 2000, proto: "UDP", allowed: true, reasonHas: "udp-range"},
		{name: "udp range is not tcp", from: "a/y", to: "a/x", port: 1500, proto: "TCP", allowed: false, reasonHas: "deny-rest"},
		{name: "sctp entry", from: "a/y", to: "a/x", port: 9, proto: "SCTP", allowed: true, reasonHas: "udp-range"},
		{name: "egress nodes peer: every node", from: "b/z", to: "10.0.0.2", port: 10250, allowed: true, egress: baseline, reasonHas: "to-nodes"},
		{name: "egress nodes peer covers host-network pods", from: "b/z", to: "kube-system/h", port: 10250, allowed: true, egress: baseline},
		{name: "egress named port per destination pod: y http=8080", from: "b/z", to: "a/y", port: 8080, allowed: true, egress: baseline, reasonHas: "named-to-pods"},
		{name: "egress named port: 80 on y is not http", from: "b/z", to: "a/y", port: 80, allowed: false, egress: baseline, reasonHas: "deny-all"},
		{name: "egress deny networks 0.0.0.0/0 catches external", from: "b/z", to: "192.168.100.5", port: 443, allowed: false, egress: baseline},
		{name: "egress deny IPv4 only: IPv6 falls through to default", from: "fd00::1:2", to: "2001:db8::1", port: 443, allowed: true, egress: deflt},
	})
}

// docs/semantics.md, Node-local traffic and Dataplane guarantees (Deny = drop).
func TestNodeLocal(t *testing.T) {
	const isolate = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: a}
spec:
  podSelector: {}
`
	on := compile(t, isolate, policy.Options{})
	runFlows(t, on, []flowCase{
		{name: "own node's address reaches its pod", from: "10.0.0.1", to: "a/x", port: 80, allowed: true, ingress: nodeLoc},
		{name: "own node's IPv6 address", from: "fd00::a:1", to: "fd00::1:1", port: 80, allowed: true, ingress: nodeLoc},
		{name: "host-network pod on the same node", from: "kube-system/h", to: "a/x", port: 80, allowed: true, ingress: nodeLoc},
		{name: "another node's address is policed", from: "10.0.0.2", to: "a/x", port: 80, allowed: false, ingress: npTier},
		{name: "host-network pod on another node is policed", from: "kube-system/h", to: "a/y", port: 8080, allowed: false, ingress: npTier},
	})
	off := compile(t, isolate, policy.Options{DenyNodeLocal: true})
	runFlows(t, off, []flowCase{
		{name: "switched off: node address policed", from: "10.0.0.1", to: "a/x", port: 80, allowed: false, ingress: npTier},
	})
	// A pod-network pod (on n2) that claims n1's address: the address is
	// judged as the pod's on n1 too, not let through as node-local.
	claimed := compile(t, isolate+`
---
apiVersion: v1
kind: Pod
metadata: {name: claims-n1, namespace: b, labels: {app: c}}
spec: {nodeName: n2, containers: [{name: c}]}
status: {podIPs: [{ip: 10.0.0.1}]}
`, policy.Options{})
	runFlows(t, claimed, []flowCase{
		{name: "node address a pod claims is policed", from: "10.0.0.1", to: "a/x", port: 80, allowed: false, ingress: npTier},
		{name: "the pod itself is policed", from: "b/claims-n1", to: "a/x", port: 80, allowed: false, ingress: npTier},
		{name: "the node's other address stays node-local", from: "fd00::a:1", to: "fd00::1:1", port: 80, allowed: true, ingress: nodeLoc},
	})
	if got := claimed.NodeLocalAddrs("n1"); len(got) != 1 || got[0].String() != "fd00::a:1" {
		t.Errorf("NodeLocalAddrs(n1) = %v, want [fd00::a:1]", got)
	}
	if got := on.NodeLocalAddrs("n1"); len(got) != 2 {
		t.Errorf("NodeLocalAddrs(n1) without the claim = %v, want both addresses", got)
	}
}

// docs/semantics.md: host-network pods are never subjects or pod/namespace peers;
// a rule without protocols matches all traffic, ICMP included, while a
// protocols list matches only its ports.
func TestHostNetworkAndAllTraffic(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: y-from-all-pods, namespace: a}
spec:
  podSelector: {matchLabels: {app: "y"}}
  ingress: [{from: [{namespaceSelector: {}}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-icmp-like}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {env: dev}}}
  egress:
  - {name: all-traffic, action: Deny, to: [{networks: ["192.168.100.0/24"]}]}
  - {name: tcp-only, action: Deny, to: [{networks: ["192.168.200.0/24"]}], protocols: [{tcp: {destinationPort: {range: {start: 1, end: 65535}}}}]}
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "host-network pod is not a namespaceSelector peer", from: "kube-system/h", to: "a/y", port: 8080, allowed: false, ingress: npTier},
		{name: "pod-network pods are", from: "b/z", to: "a/y", port: 8080, allowed: true, ingress: npTier},
	})
	z, _ := prog.PodByKey("b/z")
	src := policy.Endpoint{Pod: z, Addr: prog.Pods[z].IPs[0]}
	for _, c := range []struct {
		dst     string
		proto   policy.Protocol
		port    uint16
		allowed bool
	}{
		{"192.168.100.1", policy.ProtoICMP, 0, false},
		{"192.168.100.1", policy.ProtoUDP, 53, false},
		{"192.168.200.1", policy.ProtoICMP, 0, true},
		{"192.168.200.1", policy.ProtoUDP, 53, true},
		{"192.168.200.1", policy.ProtoTCP, 1, false},
	} {
		f := policy.Flow{Src: src, Dst: policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr(c.dst)}, Proto: c.proto, Port: c.port}
		if got := prog.Evaluate(f); got.Allowed != c.allowed || prog.Allowed(f) != c.allowed {
			t.Errorf("b/z -> %s %s/%d: allowed %v, want %v (%s)", c.dst, c.proto, c.port, got.Allowed, c.allowed, got.Egress.Reason)
		}
	}
}
