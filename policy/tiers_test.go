package policy_test

import (
	"testing"

	"github.com/moat-net/moat/policy"
)

const (
	admin    = policy.TierAdmin
	npTier   = policy.TierNetworkPolicy
	baseline = policy.TierBaseline
	deflt    = policy.TierDefault
	notPol   = policy.TierNotPoliced
	nodeLoc  = policy.TierNodeLocal
)

// docs/semantics.md, The verdict: allowed iff egress and ingress allow; each judged only at
// pod-network pods; no policy = default allow.
func TestDirectionsAndDefault(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-no-egress, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  policyTypes: [Egress]
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "no policy on either end: default allow", from: "a/y", to: "b/z", port: 80, allowed: true, egress: deflt, ingress: deflt},
		{name: "egress isolation of the source denies", from: "a/x", to: "a/y", port: 8080, allowed: false, egress: npTier, ingress: deflt},
		{name: "ingress of x untouched by an egress-only policy", from: "a/y", to: "a/x", port: 80, allowed: true, ingress: deflt},
		{name: "external source: egress not policed", from: "192.168.100.5", to: "a/y", port: 8080, allowed: true, egress: notPol, ingress: deflt},
		{name: "external destination: ingress not policed", from: "a/y", to: "192.168.100.5", port: 443, allowed: true, egress: deflt, ingress: notPol},
		{name: "egress to external denied by isolation", from: "a/x", to: "192.168.100.5", port: 443, allowed: false, egress: npTier, ingress: notPol},
		{name: "host-network pod source not policed", from: "kube-system/h", to: "a/y", port: 8080, allowed: true, egress: notPol},
		{name: "host-network pod destination not policed", from: "a/y", to: "kube-system/h", port: 9100, allowed: true, ingress: notPol},
		{name: "a pod reaching its own IP is not policed", from: "a/x", to: "a/x", port: 80, allowed: true, egress: notPol, ingress: notPol},
	})
}

// docs/semantics.md, Evaluation of one direction: Admin first-match Accept/Deny/Pass, then
// NetworkPolicy, then Baseline, then default.
func TestTierOrder(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-only-from-y, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress: [{from: [{podSelector: {matchLabels: {app: "y"}}}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin-10}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {env: prod}}}
  ingress:
  - {name: accept-z-80, action: Accept, from: [{namespaces: {matchLabels: {env: dev}}}], protocols: [{tcp: {destinationPort: {number: 80}}}]}
  - {name: pass-z-81, action: Pass, from: [{namespaces: {matchLabels: {env: dev}}}], protocols: [{tcp: {destinationPort: {number: 81}}}]}
  - {name: deny-y-82, action: Deny, from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: "y"}}}}], protocols: [{tcp: {destinationPort: {number: 82}}}]}
  - {name: pass-all-dev, action: Pass, from: [{namespaces: {matchLabels: {env: dev}}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin-20}
spec:
  tier: Admin
  priority: 20
  subject: {namespaces: {}}
  ingress:
  - {name: deny-dev-83, action: Deny, from: [{namespaces: {matchLabels: {env: dev}}}], protocols: [{tcp: {destinationPort: {number: 83}}}]}
  - {name: deny-prod-83, action: Deny, from: [{namespaces: {matchLabels: {env: prod}}}], protocols: [{tcp: {destinationPort: {number: 83}}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline}
spec:
  tier: Baseline
  priority: 1
  subject: {namespaces: {}}
  ingress:
  - {name: deny-prod-84, action: Deny, from: [{namespaces: {matchLabels: {env: prod}}}], protocols: [{tcp: {destinationPort: {number: 84}}}]}
  - {name: pass-85, action: Pass, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 85}}}]}
  - {name: deny-85, action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 85}}}]}
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "Admin Accept overrides NetworkPolicy isolation", from: "b/z", to: "a/x", port: 80, allowed: true, ingress: admin, reasonHas: "accept-z-80"},
		{name: "Admin Pass hands over to NetworkPolicy, which denies", from: "b/z", to: "a/x", port: 81, allowed: false, ingress: npTier, reasonHas: "no rule allows it"},
		{name: "Admin Deny overrides a NetworkPolicy allow", from: "a/y", to: "a/x", port: 82, allowed: false, ingress: admin, reasonHas: "deny-y-82"},
		{name: "NetworkPolicy allow when Admin does not match", from: "a/y", to: "a/x", port: 8000, allowed: true, ingress: npTier},
		{name: "Pass skips lower-precedence Admin policies", from: "b/z", to: "a/x", port: 83, allowed: false, ingress: npTier},
		{name: "lower priority value evaluated first", from: "a/x", to: "a/y", port: 83, allowed: false, ingress: admin, reasonHas: "deny-prod-83"},
		{name: "Baseline applies where no NetworkPolicy selects", from: "a/x", to: "a/y", port: 84, allowed: false, ingress: baseline},
		{name: "NetworkPolicy selection shields from Baseline", from: "a/y", to: "a/x", port: 84, allowed: true, ingress: npTier},
		{name: "Baseline Pass goes to default allow", from: "a/x", to: "b/z", port: 85, allowed: true, ingress: deflt},
		{name: "nothing matches: default", from: "a/x", to: "b/z", port: 86, allowed: true, ingress: deflt},
	})
}

// Policies of the same priority are ordered by name, deterministically.
func TestPriorityTieBreaksByName(t *testing.T) {
	prog := compile(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: b-accept}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {}}
  ingress: [{action: Accept, from: [{namespaces: {}}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: a-deny}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {}}
  ingress: [{action: Deny, from: [{namespaces: {}}]}]
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "a-deny sorts first", from: "a/x", to: "b/z", port: 80, allowed: false, ingress: admin, reasonHas: "a-deny"},
	})
}
