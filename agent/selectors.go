package agent

import (
	"hash/maphash"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/moat-net/moat/api/v1alpha2"
)

// Policies repeat a few selectors many times (every namespace's
// NetworkPolicies select {app: web}, {role: db}...), and a matchLabels
// map of one label costs some 300 bytes. The informers' transforms share
// each selector's matchLabels map with equal ones through the same table
// as pod labels (labelsets.go); the decoded policy keeps the shared sets
// alive. Nothing writes to a selector once decoded.

// internSelectors shares the matchLabels maps of sels and returns the
// sets that keep them alive.
func (t *labelSets) internSelectors(sels []*metav1.LabelSelector) []*labelSet {
	if t == nil {
		return nil
	}
	var keep []*labelSet
	for _, s := range sels {
		if s == nil {
			continue
		}
		if set := t.intern(s.MatchLabels); set != nil {
			s.MatchLabels = set.v
			keep = append(keep, set)
		}
	}
	return keep
}

// internPodSelector shares a NetworkPolicy's podSelector's matchLabels
// map and returns the set that keeps it alive; nil when it has none or t
// is nil.
func (t *labelSets) internPodSelector(s *metav1.LabelSelector) *labelSet {
	if t == nil {
		return nil
	}
	return t.intern(s.MatchLabels)
}

// sharePorts makes a NetworkPolicy's numeric ports, their protocols and
// its policyTypes list point to values shared with every other policy
// naming the same: a cluster's policies name a few dozen ports, three
// protocols and two or three policyTypes lists thousands of times. The
// values are never changed in place.
func (t *labelSets) sharePorts(spec *networkingv1.NetworkPolicySpec) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	share := func(ports []networkingv1.NetworkPolicyPort) {
		for i := range ports {
			if p := ports[i].Protocol; p != nil {
				switch *p {
				case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP: // only valid ones: bounded
					if v, ok := t.protocols[*p]; ok {
						ports[i].Protocol = v
					} else {
						t.protocols[*p] = p
					}
				}
			}
			p := ports[i].Port
			if p == nil || p.Type != intstr.Int || p.StrVal != "" || p.IntVal < 0 || p.IntVal > 65535 {
				continue // only valid port numbers: the map stays bounded
			}
			if v, ok := t.ports[p.IntVal]; ok {
				ports[i].Port = v
			} else {
				t.ports[p.IntVal] = p
			}
		}
	}
	if types := spec.PolicyTypes; len(types) > 0 && len(types) <= 2 {
		// Only lists of valid types, at most two: the table stays tiny.
		valid := true
		for _, pt := range types {
			valid = valid && (pt == networkingv1.PolicyTypeIngress || pt == networkingv1.PolicyTypeEgress)
		}
		if valid {
			found := false
			for _, v := range t.policyTypes {
				if slices.Equal(v, types) {
					spec.PolicyTypes, found = v, true
					break
				}
			}
			if !found {
				t.policyTypes = append(t.policyTypes, slices.Clip(types))
			}
		}
	}
	for i := range spec.Ingress {
		share(spec.Ingress[i].Ports)
	}
	for i := range spec.Egress {
		share(spec.Egress[i].Ports)
	}
}

// sharePeerSelectors makes a NetworkPolicy's peer selectors that have
// only matchLabels point to one selector shared with every policy that
// has an equal one, its map shared as pods' labels are: most peers
// repeat a few selectors ({app: web} in every namespace), each a 32-byte
// struct of its own. The shared selector lives while a policy points
// into it (intern.go), and keeps its map's set alive, so that the policy
// needs no list of the sets it uses; it is never changed. Peer selectors
// with matchExpressions (rare) are left as decoded, maps included.
func (t *labelSets) sharePeerSelectors(spec *networkingv1.NetworkPolicySpec) {
	if t == nil {
		return
	}
	share := func(sel **metav1.LabelSelector) {
		if s := *sel; s != nil && len(s.MatchExpressions) == 0 {
			keep := t.intern(s.MatchLabels)
			if keep != nil {
				s.MatchLabels = keep.v
			}
			*sel = &t.selectors.intern(peerSelector{sel: *s, labels: keep}).v.sel
		}
	}
	peers := func(ps []networkingv1.NetworkPolicyPeer) {
		for i := range ps {
			share(&ps[i].PodSelector)
			share(&ps[i].NamespaceSelector)
		}
	}
	for i := range spec.Ingress {
		peers(spec.Ingress[i].From)
	}
	for i := range spec.Egress {
		peers(spec.Egress[i].To)
	}
}

// peerSelector is a shared peer selector and the set that keeps its
// map alive (nil for an empty selector).
type peerSelector struct {
	sel    metav1.LabelSelector
	labels *labelSet
}

// hashSelector and equalSelector compare selectors of matchLabels only
// (an empty matchExpressions list means what none does).
func hashSelector(h *maphash.Hash, s peerSelector) { hashLabels(h, s.sel.MatchLabels) }

func equalSelector(a, b peerSelector) bool {
	return len(a.sel.MatchExpressions) == 0 && len(b.sel.MatchExpressions) == 0 && maps.Equal(a.sel.MatchLabels, b.sel.MatchLabels)
}

// npSelectors lists the label selectors of a NetworkPolicy's spec.
func npSelectors(spec *networkingv1.NetworkPolicySpec) []*metav1.LabelSelector {
	out := []*metav1.LabelSelector{&spec.PodSelector}
	peers := func(ps []networkingv1.NetworkPolicyPeer) {
		for i := range ps {
			out = append(out, ps[i].PodSelector, ps[i].NamespaceSelector)
		}
	}
	for i := range spec.Ingress {
		peers(spec.Ingress[i].From)
	}
	for i := range spec.Egress {
		peers(spec.Egress[i].To)
	}
	return out
}

// cnpSelectors lists the label selectors of a ClusterNetworkPolicy.
func cnpSelectors(c *v1alpha2.ClusterNetworkPolicy) []*metav1.LabelSelector {
	if c == nil {
		return nil
	}
	var out []*metav1.LabelSelector
	pods := func(p *v1alpha2.NamespacedPod) {
		if p != nil {
			out = append(out, &p.NamespaceSelector, &p.PodSelector)
		}
	}
	out = append(out, c.Spec.Subject.Namespaces)
	pods(c.Spec.Subject.Pods)
	for i := range c.Spec.Ingress {
		for _, p := range c.Spec.Ingress[i].From {
			out = append(out, p.Namespaces, p.Nodes)
			pods(p.Pods)
		}
	}
	for i := range c.Spec.Egress {
		for _, p := range c.Spec.Egress[i].To {
			out = append(out, p.Namespaces, p.Nodes)
			pods(p.Pods)
		}
	}
	return out
}
