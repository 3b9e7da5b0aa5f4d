package flowdiff

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// forgedNode has the pod CIDR 10.244.0.0/24 (or none) and pod x on it.
func forgedNode(cidr string) string {
	spec := ""
	if cidr != "" {
		spec = "\nspec: {podCIDRs: [" + cidr + "]}"
	}
	return `apiVersion: v1
kind: Node
metadata: {name: n1}` + spec + `
status: {addresses: [{type: InternalIP, address: 192.168.1.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: x, namespace: a}
spec: {nodeName: n1}
status: {podIP: 10.244.0.5}
`
}

func xIngressFrom(cidr string) string {
	return `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-in, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{from: [{ipBlock: {cidr: ` + cidr + `}}]}]
`
}

// TestForgedSourcesSplitClasses: an implied peer must not stand for
// addresses both inside and outside a node's pod CIDR, where a source
// that no pod owns is dropped as forged whatever the policies: 10.244.0.0,
// the first address of 10.244.0.0/16, is forged towards x in both states,
// so the change for the rest of the /16 hid behind it.
func TestForgedSourcesSplitClasses(t *testing.T) {
	before := compileYAML(t, forgedNode("10.244.0.0/24"), xIngressFrom("10.244.0.0/16"))
	after := compileYAML(t, forgedNode("10.244.0.0/24"), xIngressFrom("192.168.0.0/16"))
	got := Compute(before, after, Options{})
	var lines []string
	for _, c := range got.Changes {
		lines = append(lines, line(c))
	}
	if !slices.ContainsFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, "10.244.1.0-10.244.255.255 -> a/x") && strings.HasSuffix(l, "true->false")
	}) {
		t.Errorf("no change from the /16 outside the pod CIDR to a/x; changes:\n%s", strings.Join(lines, "\n"))
	}
	if full := Full(before, after, Options{}); len(full.Changes) != len(got.Changes) {
		t.Errorf("Compute found %d changes, Full %d", len(got.Changes), len(full.Changes))
	}
}

// TestPodCIDRChangeIsAFact: a node gaining pod CIDRs changes whether a
// peer inside them reaches its pods, with no policy changed.
func TestPodCIDRChangeIsAFact(t *testing.T) {
	before := compileYAML(t, forgedNode(""))
	after := compileYAML(t, forgedNode("10.244.0.0/24"))
	opts := Options{Peers: []netip.Addr{netip.MustParseAddr("10.244.0.99")}}
	got := Compute(before, after, opts)
	found := false
	for _, c := range got.Changes {
		found = found || line(c) == "10.244.0.99 -> a/x "+portOf(c)+" true->false"
	}
	if !found {
		t.Errorf("no change from the peer to a/x: %+v", got.Changes)
	}
	if full := Full(before, after, opts); len(full.Changes) != len(got.Changes) {
		t.Errorf("Compute found %d changes, Full %d", len(got.Changes), len(full.Changes))
	}
}
