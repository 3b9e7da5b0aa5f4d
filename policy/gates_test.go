package policy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/policy"
)

// The gate's name in policy is the registry's.
func TestGateNameMatchesRegistry(t *testing.T) {
	if policy.GateIngressNetworksAndNodes != string(features.IngressNetworksAndNodes) {
		t.Errorf("policy names the gate %q, the registry %q", policy.GateIngressNetworksAndNodes, features.IngressNetworksAndNodes)
	}
}

// With IngressNetworksAndNodes off, ingress networks and nodes peers are
// unknown fields: an Accept rule with them matches nothing, a Deny or Pass
// rule denies everything, the policy is not Accepted and the diagnostic
// names the gate. Egress networks and nodes are not gated.
func TestIngressNetworksAndNodesGate(t *testing.T) {
	const cnps = `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: accept-nodes}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: x}}}}
  ingress:
  - {name: from-n2, action: Accept, from: [{nodes: {matchLabels: {compromised: "true"}}}], protocols: [{tcp: {destinationPort: {number: 1}}}]}
  - {name: from-net, action: Accept, from: [{networks: ["10.1.2.0/24"]}], protocols: [{tcp: {destinationPort: {number: 2}}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-outside}
spec:
  tier: Admin
  priority: 2
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: z}}}}
  ingress:
  - {name: outside, action: Deny, from: [{networks: ["203.0.113.0/24"]}], protocols: [{tcp: {destinationPort: {number: 80}}}]}
  egress:
  - {name: out, action: Deny, to: [{networks: ["203.0.113.0/24"]}, {nodes: {}}]}
`
	for _, gate := range []bool{false, true} {
		prog := compile(t, cnps, policy.Options{IngressNetworksAndNodes: gate})
		// Nothing denies node n2 -> a/x; the Deny of 203.0.113.0/24 to
		// b/z port 80 widens to every source (not port) when gated.
		if got := judge(t, prog, "10.0.0.2", "a/x", 1, "TCP"); got != true {
			t.Errorf("gate %v: node n2 -> a/x:1 allowed = %v (no rule denies it either way)", gate, got)
		}
		if got := judge(t, prog, "a/x", "b/z", 81, "TCP"); got != true {
			t.Errorf("gate %v: a/x -> b/z:81 allowed = %v: the gated peer must not widen the rule's protocols", gate, got)
		}
		if got := judge(t, prog, "a/x", "b/z", 80, "TCP"); got != gate {
			t.Errorf("gate %v: a/x -> b/z:80 allowed = %v, want %v (the gated Deny widens to every peer)", gate, got, gate)
		}
		var gated []string
		for _, d := range prog.Diagnostics {
			if strings.Contains(d.Message, "feature gate IngressNetworksAndNodes") {
				gated = append(gated, d.Object+" "+d.Field)
			}
		}
		want := []string{
			"ClusterNetworkPolicy accept-nodes spec.ingress[0].from[0].nodes",
			"ClusterNetworkPolicy accept-nodes spec.ingress[1].from[0].networks",
			"ClusterNetworkPolicy deny-outside spec.ingress[0].from[0].networks",
		}
		if gate {
			want = nil
		}
		if !slices.Equal(gated, want) {
			t.Errorf("gate %v: gated diagnostics %v, want %v", gate, gated, want)
		}
		for _, st := range prog.Status {
			if st.Accepted != gate || (!gate && st.Reason != "UnknownField") {
				t.Errorf("gate %v: status %+v", gate, st)
			}
		}
	}
}

// An Accept rule whose only peer is gated must match nothing: the pod it
// would have let in is then judged by the next tier.
func TestGatedAcceptMatchesNothing(t *testing.T) {
	const cnps = `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: a}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: x}}}}
  ingress:
  - {name: from-net, action: Accept, from: [{networks: ["10.1.2.0/24"]}]}
  - {name: deny-all, action: Deny, from: [{namespaces: {}}]}
`
	for _, gate := range []bool{false, true} {
		prog := compile(t, cnps, policy.Options{IngressNetworksAndNodes: gate})
		if got := judge(t, prog, "a/y", "a/x", 80, "TCP"); got != gate {
			t.Errorf("gate %v: a/y -> a/x allowed = %v, want %v", gate, got, gate)
		}
		got := policy.GatedFields(&policy.ClusterNetworkPolicy{ClusterNetworkPolicy: nil}, policy.Options{})
		if got != nil {
			t.Errorf("GatedFields of a nil object = %v", got)
		}
	}
}
