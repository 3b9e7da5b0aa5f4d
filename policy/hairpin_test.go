package policy_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// hairpinPod is pod a/p (app: p) alone on node n1.
var hairpinPod = manifests(
	fixNode{name: "n1", internal: []string{"10.0.0.1"}},
	fixNamespace("a"),
	fixPod{namespace: "a", name: "p", node: "n1", labels: map[string]string{"app": "p"}, ips: []string{"10.1.1.1"}},
)

const (
	hairpinAdminDeny = `---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin-deny}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: p}}}}
  ingress:
  - {action: Deny, from: [{namespaces: {}}]}
`
	hairpinAdminPass = `---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin-pass}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: p}}}}
  egress:
  - {action: Pass, to: [{namespaces: {}}]}
`
	hairpinBaselineDeny = `---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline-deny}
spec:
  tier: Baseline
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: p}}}}
  egress:
  - {action: Deny, to: [{pods: {namespaceSelector: {}, podSelector: {}}}]}
`
	hairpinIsolateEgress = `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Egress]
`
)

// TestHairpin: a pod's connection to its own address is
// not policed, but its connection through a Service back to itself is
// subject to ClusterNetworkPolicy (network-policy-api api-overview):
// EvaluateHairpin judges it in the Admin tier, lets NetworkPolicies that
// select the pod allow it (a pod cannot block access to itself), and
// judges it in the Baseline tier otherwise.
func TestHairpin(t *testing.T) {
	for _, c := range []struct {
		name, policies string
		allowed        bool
		reasonHas      string
	}{
		{"no policy", "", true, "no policy selects this pod"},
		{"Admin Deny", hairpinAdminDeny, false, "ClusterNetworkPolicy admin-deny ingress rule 0 denies it"},
		{"Admin Deny over NetworkPolicy", hairpinAdminDeny + hairpinIsolateEgress, false, "admin-deny ingress rule 0 denies it"},
		{"Baseline Deny", hairpinBaselineDeny, false, "baseline-deny egress rule 0 denies it"},
		{"NetworkPolicy isolation", hairpinIsolateEgress, true, "a pod cannot block access to itself"},
		{"Baseline Deny under NetworkPolicy isolation", hairpinBaselineDeny + hairpinIsolateEgress, true, "NetworkPolicies select the pod for egress (a/isolate), and a pod cannot block access to itself"},
		{"Admin Pass to Baseline Deny", hairpinAdminPass + hairpinBaselineDeny, false, "baseline-deny egress rule 0 denies it"},
		{"Admin Pass under NetworkPolicy isolation", hairpinAdminPass + hairpinBaselineDeny + hairpinIsolateEgress, true, "cannot block access to itself"},
	} {
		t.Run(c.name, func(t *testing.T) {
			prog := compileWith(t, hairpinPod+c.policies, policy.Options{})
			pi, _ := prog.PodByKey("a/p")
			p := policy.Endpoint{Pod: pi, Addr: netip.MustParseAddr("10.1.1.1")}
			f := policy.Flow{Src: p, Dst: p, Proto: policy.ProtoTCP, Port: 80}
			if v := prog.Evaluate(f); !v.Allowed || v.Egress.Tier != policy.TierNotPoliced {
				t.Errorf("to its own address: %+v, want not policed", v)
			}
			v := prog.EvaluateHairpin(f)
			if v.Allowed != c.allowed || prog.HairpinAllowed(f) != c.allowed {
				t.Errorf("hairpin allowed = %v (HairpinAllowed %v), want %v\negress: %+v\ningress: %+v", v.Allowed, prog.HairpinAllowed(f), c.allowed, v.Egress, v.Ingress)
			}
			if !strings.Contains(v.Egress.Reason+" | "+v.Ingress.Reason, c.reasonHas) {
				t.Errorf("reasons %q | %q lack %q", v.Egress.Reason, v.Ingress.Reason, c.reasonHas)
			}
			if n := testing.AllocsPerRun(10, func() { prog.HairpinAllowed(f) }); n != 0 {
				t.Errorf("HairpinAllowed allocates %v times", n)
			}
		})
	}
}
