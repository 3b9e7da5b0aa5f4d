package policy_test

import (
	"testing"

	"github.com/moat-net/moat/policy"
)

// An IPv4-mapped IPv6 CIDR in an ipBlock is the IPv4 CIDR it maps, as the
// API server reads it: kept as IPv6, `cidr` matched no IPv4
// packet and `except` was refused as no subset of an IPv4 `cidr`, so the
// peer matched nothing. The API server stores both.
func TestMappedIPBlock(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: eg, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 0.0.0.0/0, except: ["::ffff:10.1.2.0/120"]}}]
    ports: [{port: 80}]
  - to: [{ipBlock: {cidr: "::ffff:10.1.2.0/120"}}]
    ports: [{port: 8080}]
`, policy.Options{})
	if d := prog.Diagnostics; len(d) != 0 {
		t.Errorf("diagnostics %+v, want none (the API server accepts both blocks)", d)
	}
	runFlows(t, prog, []flowCase{
		{name: "outside the mapped except", from: "a/x", to: "198.51.100.7", port: 80, allowed: true, egress: policy.TierNetworkPolicy},
		{name: "inside the mapped except", from: "a/x", to: "a/y", port: 80, allowed: false, egress: policy.TierNetworkPolicy},
		{name: "mapped cidr matches IPv4", from: "a/x", to: "a/y", port: 8080, allowed: true, egress: policy.TierNetworkPolicy},
		{name: "mapped cidr is not IPv6", from: "a/x", to: "fd00::1:2", port: 8080, allowed: false, egress: policy.TierNetworkPolicy},
	})
}
