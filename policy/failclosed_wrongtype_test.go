package policy_test

import (
	"testing"

	"github.com/moat-net/moat/policy"
)

// A value of the wrong JSON type is reported at its own path, and the
// compiler fails closed on the part that path belongs to, as for an
// unknown field there (docs/semantics.md, Fail closed): the empty value
// decoding leaves never reads as "every port" or "every peer", and the
// parts beside it keep their meaning.
func TestWrongTypesFailClosed(t *testing.T) {
	const np = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
`
	const cnp = `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: p}
spec:
`
	for _, tc := range []struct {
		name   string
		policy string
		flows  []flowCase
	}{
		{"NP port of the wrong type beside a good one", np + `
  podSelector: {matchLabels: {app: x}}
  ingress: [{ports: [{port: true}, {port: 80}]}]`, []flowCase{
			{name: "the good port still allows", from: "a/y", to: "a/x", port: 80, allowed: true},
			{name: "the bad one is not every port", from: "a/y", to: "a/x", port: 443, allowed: false, ingress: npTier},
		}},
		{"NP endPort of the wrong type", np + `
  podSelector: {matchLabels: {app: x}}
  ingress: [{ports: [{port: 80, endPort: "90"}]}]`, []flowCase{
			{name: "the entry matches nothing", from: "a/y", to: "a/x", port: 80, allowed: false, ingress: npTier},
		}},
		{"NP cidr of the wrong type beside a good peer", np + `
  podSelector: {matchLabels: {app: x}}
  ingress: [{from: [{ipBlock: {cidr: 10}}, {namespaceSelector: {}, podSelector: {matchLabels: {app: z}}}]}]`, []flowCase{
			{name: "the good peer still allows", from: "b/z", to: "a/x", port: 80, allowed: true},
			{name: "the bad peer is not every address", from: "192.168.1.1", to: "a/x", port: 80, allowed: false, ingress: npTier},
		}},
		{"NP from of the wrong type", np + `
  podSelector: {matchLabels: {app: x}}
  ingress: [{from: {namespaceSelector: {}}}, {ports: [{port: 53, protocol: UDP}]}]`, []flowCase{
			{name: "the rule matches nothing", from: "a/y", to: "a/x", port: 80, allowed: false, ingress: npTier},
			{name: "the next rule still allows", from: "a/y", to: "a/x", port: 53, proto: "UDP", allowed: true},
		}},
		{"NP ingress list of the wrong type", np + `
  podSelector: {matchLabels: {app: x}}
  ingress: {from: [{namespaceSelector: {}}]}
  egress: [{}]`, []flowCase{
			{name: "ingress is isolated and nothing is allowed", from: "a/y", to: "a/x", port: 80, allowed: false, ingress: npTier},
			{name: "egress rules keep their meaning", from: "a/x", to: "192.168.1.1", port: 80, allowed: true},
		}},
		{"NP egress list of the wrong type", np + `
  podSelector: {matchLabels: {app: x}}
  ingress: [{}]
  egress: "all"`, []flowCase{
			{name: "egress is isolated and nothing is allowed", from: "a/x", to: "192.168.1.1", port: 80, allowed: false, egress: npTier},
			{name: "ingress rules keep their meaning", from: "a/y", to: "a/x", port: 80, allowed: true},
		}},
		{"NP pod selector of the wrong type", np + `
  podSelector: [app]
  ingress: [{}]`, []flowCase{
			{name: "every pod of the namespace is isolated", from: "b/z", to: "a/y", port: 8080, allowed: false, ingress: npTier},
		}},
		{"CNP Deny with a port of the wrong type", cnp + `
  tier: Admin
  priority: 5
  subject: {namespaces: {matchLabels: {env: prod}}}
  egress: [{action: Deny, to: [{namespaces: {matchLabels: {env: dev}}}], protocols: [{tcp: {destinationPort: {number: "80"}}}]}]`, []flowCase{
			{name: "denies every port to its peers", from: "a/x", to: "b/z", port: 443, allowed: false, egress: admin, reasonHas: "fail-closed"},
			{name: "...and only to its peers", from: "a/x", to: "192.168.1.1", port: 443, allowed: true},
		}},
		{"CNP Accept with a peer of the wrong type", cnp + `
  tier: Baseline
  priority: 5
  subject: {namespaces: {matchLabels: {env: prod}}}
  ingress: [{action: Accept, from: [{networks: [10]}, {namespaces: {}}]}, {action: Deny, from: [{namespaces: {}}]}]`, []flowCase{
			{name: "the Accept matches nothing", from: "b/z", to: "a/x", port: 80, allowed: false, ingress: baseline},
		}},
		{"CNP priority of the wrong type", cnp + `
  tier: Admin
  priority: "5"
  subject: {namespaces: {matchLabels: {env: prod}}}
  ingress: [{action: Pass, from: [{namespaces: {matchLabels: {env: dev}}}]}]`, []flowCase{
			{name: "the whole policy denies", from: "192.168.1.1", to: "a/x", port: 80, allowed: false, ingress: admin},
		}},
		{"CNP rule list of the wrong type", cnp + `
  tier: Admin
  priority: 5
  subject: {namespaces: {matchLabels: {env: prod}}}
  ingress: {action: Accept, from: [{namespaces: {}}]}`, []flowCase{
			{name: "denies everything to the subject", from: "a/y", to: "a/x", port: 80, allowed: false, ingress: admin},
			{name: "...and nothing to other pods", from: "a/x", to: "b/z", port: 80, allowed: true},
		}},
		{"CNP subject of the wrong type", cnp + `
  tier: Admin
  priority: 5
  subject: [prod]
  egress: [{action: Deny, to: [{networks: [192.168.1.0/24]}]}]`, []flowCase{
			{name: "the Deny applies to every pod", from: "b/z", to: "192.168.1.1", port: 80, allowed: false, egress: admin},
			{name: "...to its own peers only", from: "b/z", to: "192.168.2.1", port: 80, allowed: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := compile(t, tc.policy, policy.Options{})
			if len(prog.Status) != 1 || prog.Status[0].Accepted {
				t.Errorf("status %+v, want the policy not accepted", prog.Status)
			}
			runFlows(t, prog, tc.flows)
		})
	}
}
