package policy

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/api/v1alpha2"
)

// peerKeys lists the label keys that the peers of the policies read:
// of namespaces (the name label left out: a selector of it picks one
// namespace, which is adjacent anyway) and of pods. A full compile numbers
// pods by their labels on these keys (loadPods). They are read off the
// specs, since rules, and the selectors they intern, are compiled on
// first use, after the pods are numbered.
func (s *state) peerKeys() (nsKeys, podKeys []string) {
	ns, pods := map[string]int{}, map[string]int{}
	add := func(m map[string]int, sel *metav1.LabelSelector) {
		if sel == nil {
			return
		}
		for k := range sel.MatchLabels {
			m[k]++
		}
		for _, e := range sel.MatchExpressions {
			m[e.Key]++
		}
	}
	npPeer := func(p networkingv1.NetworkPolicyPeer) {
		add(ns, p.NamespaceSelector)
		add(pods, p.PodSelector)
	}
	for _, np := range s.nps {
		if np == nil {
			continue
		}
		for _, r := range np.src.Spec.Ingress {
			for _, p := range r.From {
				npPeer(p)
			}
		}
		for _, r := range np.src.Spec.Egress {
			for _, p := range r.To {
				npPeer(p)
			}
		}
	}
	cnpPeer := func(namespaces *metav1.LabelSelector, p *v1alpha2.NamespacedPod) {
		add(ns, namespaces)
		if p != nil {
			add(ns, &p.NamespaceSelector)
			add(pods, &p.PodSelector)
		}
	}
	for _, c := range s.cnps {
		for _, r := range c.src.Spec.Ingress {
			for _, p := range r.From {
				cnpPeer(p.Namespaces, p.Pods)
			}
		}
		for _, r := range c.src.Spec.Egress {
			for _, p := range r.To {
				cnpPeer(p.Namespaces, p.Pods)
			}
		}
	}
	delete(ns, nsNameLabel)
	return sortedKeys(ns), sortedKeys(pods)
}
