package policy_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/moat-net/moat/policy"
)

// A policy's status message (the agent's Accepted=False condition and the
// CLI's warning line) names every problem with its field path, up to a
// bound, and names the feature gate behind a gated field: an operator
// fixes everything in one run instead of one error per run.
func TestStatusMessageNamesEveryProblem(t *testing.T) {
	const cnp = "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: c}\n"
	const np = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: a}\n"
	var many strings.Builder
	for i := range 12 {
		fmt.Fprintf(&many, "{ipBlock: {cidr: 10.0.%d.300/24}}, ", i)
	}
	var long string
	for _, c := range "abcde" {
		long += fmt.Sprintf("%c%s: 1, ", c, strings.Repeat("x", 300))
	}
	for _, tc := range []struct {
		name, doc string
		reason    string
		has       []string
		hasNot    []string
	}{
		{"gated field names the gate", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{networks: [10.0.0.0/8]}]}]}`,
			"UnknownField", []string{"spec.ingress[0].from[0].networks: needs feature gate IngressNetworksAndNodes (off)", ": enforced fail-closed"}, []string{"unknown field"}},
		{"unknown field", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, egress: [{action: Deny, to: [{fqdn: x}]}]}`,
			"UnknownField", []string{"spec.egress[0].to[0].fqdn: unknown field"}, nil},
		{"every invalid field", cnp + `spec: {tier: admin, priority: -1, subject: {namespaces: {}}, egress: [{action: Allow, to: [{namespaces: {}}]}]}`,
			"InvalidSpec", []string{"spec.tier: Unsupported value", "; spec.priority: Invalid value: -1", "; spec.egress[0].action: Unsupported value"}, []string{"more"}},
		{"unknown and invalid together", cnp + `spec: {tier: Admin, priority: 5000, subject: {namespaces: {}}, egress: [{action: Deny, to: [{fqdn: x}]}]}`,
			"UnknownField", []string{"spec.egress[0].to[0].fqdn: unknown field; spec.priority: Invalid value: 5000"}, nil},
		{"bounded count", np + "spec: {podSelector: {}, ingress: [{from: [" + many.String() + "]}]}",
			"InvalidSpec", []string{"spec.ingress[0].from[0].ipBlock.cidr", "; and ", " more (moat check lists them all): enforced fail-closed"}, []string{"from[11]"}},
		{"bounded bytes", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ` + long + `}`,
			"UnknownField", []string{"spec.a" + strings.Repeat("x", 300) + ": unknown field; spec.b", "; and 3 more (moat check lists them all): enforced fail-closed"}, nil},
		{"one long field cut on a character", cnp + `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ` + strings.Repeat("é", 1000) + `: 1}`,
			"UnknownField", []string{"spec.éé", "é...: enforced fail-closed"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := compile(t, tc.doc, policy.Options{})
			if len(prog.Status) != 1 {
				t.Fatalf("statuses: %+v", prog.Status)
			}
			st := prog.Status[0]
			if st.Accepted || st.Reason != tc.reason {
				t.Errorf("status %+v, want not accepted with reason %s", st, tc.reason)
			}
			for _, h := range tc.has {
				if !strings.Contains(st.Message, h) {
					t.Errorf("message %q lacks %q", st.Message, h)
				}
			}
			for _, h := range tc.hasNot {
				if strings.Contains(st.Message, h) {
					t.Errorf("message %q has %q", st.Message, h)
				}
			}
			if len(st.Message) > 1024 || !utf8.ValidString(st.Message) {
				t.Errorf("message is %d bytes (valid UTF-8: %v), want at most 1024 (the agent's cut) and whole characters", len(st.Message), utf8.ValidString(st.Message))
			}
		})
	}
}

// The explain note of a part enforced fail-closed because of a gated
// field names the gate too.
func TestFailClosedNoteNamesGate(t *testing.T) {
	prog := compile(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: c}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: x}}}}
  ingress: [{name: outside, action: Deny, from: [{networks: ["203.0.113.0/24"]}]}]
`, policy.Options{})
	runFlows(t, prog, []flowCase{{name: "gated deny widens", from: "a/y", to: "a/x", port: 80, allowed: false, ingress: policy.TierAdmin,
		reasonHas: "(fail-closed: spec.ingress[0].from[0].networks: needs feature gate IngressNetworksAndNodes (off))"}})
}
