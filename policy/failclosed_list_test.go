package policy_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/moat-net/moat/policy"
)

// A problem reported at exactly a NetworkPolicy rule's `from`/`to` or
// `ports` list (the list itself, not one entry) leaves the typed list empty,
// which would read as "every peer" or "every port": the rule must match
// nothing instead.
func TestNetworkPolicyBadListFailsClosed(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		egress     bool
		unknown    bool
	}{
		{name: "invalid from", path: "spec.ingress[0].from"},
		{name: "invalid ports", path: "spec.ingress[0].ports"},
		{name: "unknown to", path: "spec.egress[0].to", egress: true, unknown: true},
		{name: "invalid egress ports", path: "spec.egress[0].ports", egress: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := load(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all-but-broken, namespace: a}
spec:
  podSelector: {matchLabels: {app: "y"}}
  policyTypes: [Ingress, Egress]
  ingress: [{}]
  egress: [{}]
`)
			np := c.NetworkPolicies[0]
			if tc.unknown {
				np.SetDecoding(append(np.UnknownFields(), tc.path), np.Invalid())
			} else {
				np.SetDecoding(np.UnknownFields(), append(np.Invalid(), field.Invalid(field.NewPath(tc.path), "x", "wrong type")))
			}
			prog := policy.Compile(c, policy.Options{})
			// Only the broken direction's rule is voided; the other still
			// allows everything.
			in := flowVerdict(t, prog, "a/x", "a/y", 8080)
			out := flowVerdict(t, prog, "a/y", "a/x", 8080)
			broken, intact := in, out
			if tc.egress {
				broken, intact = out, in
			}
			if broken {
				t.Errorf("%s: the rule still allows traffic", tc.path)
			}
			if !intact {
				t.Errorf("%s: the other direction's rule was voided too", tc.path)
			}
		})
	}
}

func flowVerdict(t *testing.T, prog *policy.Program, from, to string, port uint16) bool {
	t.Helper()
	src, dst := endpoints(t, prog, from, to)
	return prog.Allowed(policy.Flow{Src: src, Dst: dst, Proto: policy.ProtoTCP, Port: port})
}
