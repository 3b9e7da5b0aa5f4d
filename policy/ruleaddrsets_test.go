package policy_test

import (
	"net/netip"
	"testing"

	"github.com/moat-net/moat/policy"
)

// TestRuleAddrSets: the sets of the rules that judge pods come out, each
// DirPolicy read once, and the walk stops when asked.
func TestRuleAddrSets(t *testing.T) {
	prog := policy.Compile(load(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-net, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/24}}]}]
`), policy.Options{})
	in := func(a string) bool {
		for s := range prog.RuleAddrSets() {
			if s != nil && s.Contains(netip.MustParseAddr(a)) {
				return true
			}
		}
		return false
	}
	if !in("192.0.2.7") {
		t.Error("no rule's set holds 192.0.2.7, the ipBlock of a/from-net")
	}
	if in("198.51.100.7") {
		t.Error("a rule's set holds 198.51.100.7, which no rule names")
	}
	n := 0
	for range prog.RuleAddrSets() {
		n++
		break
	}
	if n != 1 {
		t.Errorf("the walk went on after break: %d", n)
	}
}
