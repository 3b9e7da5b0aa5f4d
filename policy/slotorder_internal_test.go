package policy

import (
	"fmt"
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A full compile numbers pods so that the pods a cross-namespace peer
// picks (pods by label in namespaces picked by label) are adjacent: the
// evaluator's index then holds a run of slots per peer, not one per
// namespace it spans (at 100,000 pods, 13.7 million segments in the
// indexes 1,024 flows touch, against 76,000). The keys come from the
// policies' specs: rules, and the selectors they intern, are compiled
// after the pods are numbered, and reading the interned selectors left
// every pod in namespace order.
func TestSlotsGroupPeerLabels(t *testing.T) {
	c := &Cluster{}
	for i := range 6 {
		c.Namespaces = append(c.Namespaces, Namespace{Name: fmt.Sprintf("ns-%d", i), Labels: map[string]string{"team": fmt.Sprintf("t%d", i%2)}})
		for j := range 4 {
			c.Pods = append(c.Pods, &Pod{
				Namespace: fmt.Sprintf("ns-%d", i), Name: fmt.Sprintf("p%d", j),
				Labels: map[string]string{"app": fmt.Sprintf("a%d", j%2), "pod-template-hash": fmt.Sprintf("h%d%d", i, j)},
				IPs:    []netip.Addr{netip.AddrFrom4([4]byte{10, 0, byte(i), byte(j + 1)})},
			})
		}
	}
	c.NetworkPolicies = []*NetworkPolicy{{Namespace: "ns-0", Name: "from-team", Spec: networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "t1"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a0"}},
		}}}},
	}}}
	s := build(c, Options{})
	groups := map[string]bool{}
	changes := 0
	prev := ""
	for _, ps := range s.slots {
		k := ps.ns.labels["team"] + "/" + ps.pod.Labels["app"]
		if k != prev {
			changes++
			prev = k
		}
		groups[k] = true
	}
	if changes != len(groups) {
		t.Errorf("pods by slot change (team, app) %d times for %d distinct pairs: a peer of team t1, app a0 is not one run of slots", changes, len(groups))
	}
}
