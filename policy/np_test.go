package policy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// docs/semantics.md, NetworkPolicy matching: ports and peers.
func TestNetworkPolicyPorts(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-ports, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - ports:
    - port: 80                      # protocol defaults to TCP
    - {protocol: UDP}               # every UDP port
    - {port: 30000, endPort: 32767} # inclusive range (KEP-2079)
    - {port: dns, protocol: UDP}    # named port on the destination pod
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: y-named, namespace: a}
spec:
  podSelector: {matchLabels: {app: "y"}}
  ingress:
  - ports: [{port: http}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: z-egress-named, namespace: b}
spec:
  podSelector: {matchLabels: {app: z}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {}}]
    ports: [{port: http}]
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "port 80 TCP", from: "a/y", to: "a/x", port: 80, allowed: true, ingress: npTier},
		{name: "protocol defaults to TCP, not SCTP", from: "a/y", to: "a/x", port: 80, proto: "SCTP", allowed: false},
		{name: "omitted port = all ports of the protocol", from: "a/y", to: "a/x", port: 12345, proto: "UDP", allowed: true},
		{name: "range start inclusive", from: "a/y", to: "a/x", port: 30000, allowed: true},
		{name: "range end inclusive", from: "a/y", to: "a/x", port: 32767, allowed: true},
		{name: "below range", from: "a/y", to: "a/x", port: 29999, allowed: false},
		{name: "above range", from: "a/y", to: "a/x", port: 32768, allowed: false},
		{name: "named port resolves on the destination pod (y: http=8080)", from: "a/x", to: "a/y", port: 8080, allowed: true},
		{name: "named port is not the other pod's number", from: "a/x", to: "a/y", port: 80, allowed: false},
		{name: "egress named port resolves per destination: x http=80", from: "b/z", to: "a/x", port: 80, allowed: true, egress: npTier},
		{name: "egress named port resolves per destination: y http=8080", from: "b/z", to: "a/y", port: 8080, allowed: true, egress: npTier},
		{name: "egress named port: 8080 on x is not http", from: "b/z", to: "a/x", port: 8080, allowed: false, egress: npTier},
		{name: "egress named port matches nothing outside the pod network", from: "b/z", to: "192.168.100.5", port: 80, allowed: false, egress: npTier},
	})
}

func TestNetworkPolicyPeers(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-peers, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: z}}}]                 # own namespace only
    ports: [{port: 1}]
  - from: [{namespaceSelector: {matchLabels: {env: dev}}}]
    ports: [{port: 2}]
  - from: [{namespaceSelector: {matchLabels: {env: dev}}, podSelector: {matchLabels: {app: nope}}}] # AND
    ports: [{port: 3}]
  - from: [{ipBlock: {cidr: 192.168.0.0/16, except: [192.168.100.0/24]}}]
    ports: [{port: 4}]
  - from: [{ipBlock: {cidr: 192.168.100.0/24}}]
    ports: [{port: 5}]
  - ports: [{port: 6}]          # empty from = every source
  - from: [{podSelector: {matchExpressions: [{key: app, operator: In, values: ["y"]}]}}] # empty ports = everything
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: z-egress-cidr, namespace: b}
spec:
  podSelector: {matchLabels: {app: z}}
  egress:
  - to: [{ipBlock: {cidr: "fd00::/16"}}]
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "podSelector is own-namespace: z is in b", from: "b/z", to: "a/x", port: 1, allowed: false, ingress: npTier},
		{name: "namespaceSelector", from: "fd00::1:2", to: "a/x", port: 2, allowed: true},
		{name: "namespaceSelector AND podSelector", from: "fd00::1:2", to: "a/x", port: 3, allowed: false, ingress: npTier},
		{name: "ipBlock except carves out", from: "192.168.100.5", to: "a/x", port: 4, allowed: false},
		{name: "ipBlock", from: "192.168.1.5", to: "a/x", port: 4, allowed: true},
		{name: "second ipBlock", from: "192.168.100.5", to: "a/x", port: 5, allowed: true},
		{name: "empty from: all sources", from: "203.0.113.1", to: "a/x", port: 6, allowed: true},
		{name: "empty ports: all traffic", from: "a/y", to: "a/x", port: 9999, proto: "UDP", allowed: true},
		{name: "policyTypes default: egress rules add Egress", from: "b/z", to: "a/y", port: 80, allowed: false, egress: npTier},
		{name: "IPv6 ipBlock allows v6 destination", from: "b/z", to: "fd00::1:1", port: 2, allowed: true, egress: npTier},
	})
}

// Properties: a NetworkPolicy allowing 1-65535 equals one without ports for
// TCP; NetworkPolicies are order-independent within their tier.
func TestNetworkPolicyProperties(t *testing.T) {
	full := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {}
  ingress: [{ports: [{port: 1, endPort: 65535}]}]
`, policy.Options{})
	bare := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {}
  ingress: [{ports: [{protocol: TCP}]}]
`, policy.Options{})
	for _, port := range []uint16{1, 80, 32768, 65535} {
		for _, from := range []string{"b/z", "192.168.1.1", "a/y"} {
			a := judge(t, full, from, "a/x", port, "TCP")
			b := judge(t, bare, from, "a/x", port, "TCP")
			if a != b || !a {
				t.Errorf("%s -> a/x:%d: range 1-65535 gives %v, no port gives %v (want both true)", from, port, a, b)
			}
		}
	}
	const p1 = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: one, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress: [{from: [{namespaceSelector: {}}], ports: [{port: 80}]}]
`
	const p2 = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: two, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 0.0.0.0/0}}], ports: [{port: 443}]}]
`
	ab := compile(t, p1+"---\n"+p2, policy.Options{})
	ba := compile(t, p2+"---\n"+p1, policy.Options{})
	for _, port := range []uint16{80, 443, 8080} {
		for _, from := range []string{"b/z", "192.168.1.1"} {
			for _, to := range []string{"a/x", "a/y"} {
				if x, y := judge(t, ab, from, to, port, "TCP"), judge(t, ba, from, to, port, "TCP"); x != y {
					t.Errorf("%s -> %s:%d depends on policy order: %v vs %v", from, to, port, x, y)
				}
			}
		}
	}
}

// A pod that many NetworkPolicies select: the reason names the first few,
// Decision.Isolating lists them all, in order.
func TestIsolationReasonNamesFew(t *testing.T) {
	var b strings.Builder
	for i := range 12 {
		fmt.Fprintf(&b, "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: iso-%02d, namespace: a}\nspec:\n  podSelector: {matchLabels: {app: x}}\n  ingress: [{ports: [{port: %d}]}]\n", i, 1000+i)
	}
	prog := compile(t, b.String(), policy.Options{})
	f := judgeFlow(t, prog, "a/y", "a/x", 80, "TCP")
	d := f.Ingress
	if f.Allowed || d.Action != policy.ActionIsolate {
		t.Fatalf("ingress = %+v, want isolation", d)
	}
	if len(d.Isolating) != 12 || d.Isolating[0].Name != "iso-00" || d.Isolating[11].Name != "iso-11" {
		t.Errorf("Isolating = %v, want iso-00..iso-11", d.Isolating)
	}
	if !strings.Contains(d.Reason, "(a/iso-00, a/iso-01,") || !strings.Contains(d.Reason, "a/iso-09 and 2 more)") || strings.Contains(d.Reason, "iso-10") {
		t.Errorf("reason %q: want the first 10 names and \"and 2 more\"", d.Reason)
	}
}
