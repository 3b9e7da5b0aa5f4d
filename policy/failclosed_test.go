package policy_test

import (
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// docs/semantics.md, Fail closed: parts Moat does not understand make Accept
// rules match nothing and Deny/Pass rules deny everything they could match.
func TestFailClosed(t *testing.T) {
	prog := compile(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: accept-unknown-protocol}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {env: prod}}}
  ingress:
  - action: Accept
    from: [{namespaces: {}}]
    protocols: [{icmp: {type: 8}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: pass-unknown-peer}
spec:
  tier: Admin
  priority: 2
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: x}}}}
  ingress:
  - action: Pass
    from: [{serviceAccounts: {name: foo}}]
    protocols: [{tcp: {destinationPort: {number: 443}}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-empty-peer}
spec:
  tier: Baseline
  priority: 1
  subject: {namespaces: {matchLabels: {env: dev}}}
  egress:
  - action: Deny
    to: [{}]
    protocols: [{udp: {destinationPort: {number: 53}}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: unknown-subject}
spec:
  tier: Baseline
  priority: 2
  subject: {serviceAccounts: {}}
  egress:
  - {action: Accept, to: [{networks: ["0.0.0.0/0"]}]}
  - {action: Deny, to: [{networks: ["203.0.113.0/24"]}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-unknown-port-field, namespace: a}
spec:
  podSelector: {matchLabels: {app: "y"}}
  ingress:
  - ports: [{port: 8080, icmpType: 8}]
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "Accept with unknown protocol matches nothing", from: "192.168.100.5", to: "a/x", port: 80, allowed: true, ingress: deflt},
		{name: "Pass with unknown peer denies its protocols from anyone", from: "192.168.100.5", to: "a/x", port: 443, allowed: false, ingress: admin, reasonHas: "fail-closed"},
		{name: "...but not other ports", from: "192.168.100.5", to: "a/x", port: 8443, allowed: true},
		{name: "Deny with empty peer denies UDP 53 to anywhere", from: "b/z", to: "192.168.100.5", port: 53, proto: "UDP", allowed: false, egress: baseline},
		{name: "unknown subject: Deny applies to every pod", from: "a/x", to: "203.0.113.9", port: 80, allowed: false, egress: baseline},
		{name: "unknown subject: Accept applies to none", from: "a/x", to: "198.51.100.1", port: 80, allowed: true, egress: deflt},
		{name: "NetworkPolicy port with unknown field matches nothing (pod stays isolated)", from: "a/x", to: "a/y", port: 8080, allowed: false, ingress: npTier},
	})
	want := map[string]string{
		"ClusterNetworkPolicy accept-unknown-protocol": "UnknownField",
		"ClusterNetworkPolicy pass-unknown-peer":       "UnknownField",
		"ClusterNetworkPolicy deny-empty-peer":         "InvalidSpec",
		"ClusterNetworkPolicy unknown-subject":         "UnknownField",
		"NetworkPolicy a/np-unknown-port-field":        "UnknownField",
	}
	for _, s := range prog.Status {
		if w, ok := want[s.Policy.String()]; ok {
			if s.Accepted || s.Reason != w {
				t.Errorf("%s: accepted=%v reason=%q, want not accepted with %q (%s)", s.Policy, s.Accepted, s.Reason, w, s.Message)
			}
			delete(want, s.Policy.String())
		}
	}
	if len(want) > 0 {
		t.Errorf("no status for %v", want)
	}
	found := false
	for _, d := range prog.Diagnostics {
		if d.Field == "spec.ingress[0].from[0].serviceAccounts" && strings.Contains(d.Message, "unknown field") {
			found = true
		}
	}
	if !found {
		t.Errorf("no diagnostic names spec.ingress[0].from[0].serviceAccounts: %v", prog.Diagnostics)
	}
}

// Values the API server would reject, arriving anyway: never wider access.
func TestInvalidValuesFailClosed(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad-endport, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - ports: [{port: 100, endPort: 50}]
  - from: [{ipBlock: {cidr: "not-a-cidr"}}]
  - from: [{ipBlock: {cidr: "010.0.0.0/8"}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: bad-range-deny}
spec:
  tier: Admin
  priority: 3
  subject: {namespaces: {matchLabels: {env: dev}}}
  egress:
  - action: Deny
    to: [{networks: ["203.0.113.0/24"]}]
    protocols: [{tcp: {destinationPort: {range: {start: 90, end: 80}}}}]
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "endPort < port: entry matches nothing", from: "a/y", to: "a/x", port: 75, allowed: false, ingress: npTier},
		{name: "bad CIDR peer matches nothing (not everything)", from: "192.168.1.1", to: "a/x", port: 80, allowed: false, ingress: npTier},
		{name: "leading-zero CIDR is not read as decimal", from: "10.9.9.9", to: "a/x", port: 80, allowed: false, ingress: npTier},
		{name: "...nor as octal", from: "8.9.9.9", to: "a/x", port: 80, allowed: false, ingress: npTier},
		{name: "Deny with a bad range denies every port to its peers", from: "b/z", to: "203.0.113.1", port: 443, allowed: false, egress: admin},
		{name: "...and only its peers", from: "b/z", to: "198.51.100.1", port: 443, allowed: true},
	})
}
