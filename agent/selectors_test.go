package agent

import (
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSelectorsShared: every selector of a policy (all the places a
// NetworkPolicy and a ClusterNetworkPolicy hold one) shares its
// matchLabels map with equal maps, pods' labels included, and reads the
// same afterwards.
func TestSelectorsShared(t *testing.T) {
	ls := newLabelSets()
	want := map[string]string{"app": "web"}
	shared := ls.intern(map[string]string{"app": "web"}) // as a pod's labels would be
	np := ls.decodeNP(unstructuredFrom(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: web}}
      namespaceSelector: {matchLabels: {app: web}}
  egress:
  - to:
    - podSelector: {matchLabels: {app: web}}
`))
	cnp := ls.decodeCNP(unstructuredFrom(t, cnpHead+`spec:
  tier: Admin
  priority: 1
  subject:
    pods:
      namespaceSelector: {matchLabels: {app: web}}
      podSelector: {matchLabels: {app: web}}
  ingress:
  - action: Accept
    from:
    - namespaces: {matchLabels: {app: web}}
    - pods:
        namespaceSelector: {matchLabels: {app: web}}
        podSelector: {matchLabels: {app: web}}
  egress:
  - action: Deny
    to:
    - nodes: {matchLabels: {app: web}}
    - namespaces: {matchLabels: {app: web}}
`))
	for _, tc := range []struct {
		name string
		sels []*metav1.LabelSelector
		n    int
		keep []*labelSet
	}{
		// A NetworkPolicy keeps its podSelector's set, the shared peer
		// selectors theirs.
		{"NetworkPolicy", npSelectors(&np.Spec), 4, []*labelSet{np.labels, peerSet(ls, np.Spec.Ingress[0].From[0].PodSelector),
			peerSet(ls, np.Spec.Ingress[0].From[0].NamespaceSelector), peerSet(ls, np.Spec.Egress[0].To[0].PodSelector)}},
		{"ClusterNetworkPolicy", cnpSelectors(cnp.ClusterNetworkPolicy.ClusterNetworkPolicy), 7, cnp.labels},
	} {
		n := 0
		for _, s := range tc.sels {
			if s == nil {
				continue
			}
			n++
			if !reflect.DeepEqual(s.MatchLabels, want) {
				t.Errorf("%s: selector reads %v after sharing", tc.name, s.MatchLabels)
			}
			if reflect.ValueOf(s.MatchLabels).UnsafePointer() != reflect.ValueOf(shared.v).UnsafePointer() {
				t.Errorf("%s: a selector's map is not the shared one", tc.name)
			}
		}
		if n != tc.n || len(tc.keep) != tc.n {
			t.Errorf("%s: %d selectors found, %d kept alive; want %d", tc.name, n, len(tc.keep), tc.n)
		}
		for _, keep := range tc.keep {
			if keep != shared {
				t.Errorf("%s: a selector's map is kept alive by %p, not the shared set %p", tc.name, keep, shared)
			}
		}
	}
	if got := ls.len(); got != 1 {
		t.Errorf("%d label sets for one distinct map", got)
	}
}

// peerSet is the set the shared peer selector sel points to keeps
// alive; nil if sel is not the shared one.
func peerSet(ls *labelSets, sel *metav1.LabelSelector) *labelSet {
	if p := ls.selectors.intern(peerSelector{sel: *sel}); &p.v.sel == sel {
		return p.v.labels
	}
	return nil
}

// TestPortsShared: NetworkPolicies naming the same port number point to
// one shared value, which reads the same; named ports and out-of-range
// numbers are left alone. The decoded
// policy carries the label keys its selectors read.
func TestPortsShared(t *testing.T) {
	ls := newLabelSets()
	decode := func(name string) *decodedNP {
		return ls.decodeNP(unstructuredFrom(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: `+name+`, namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - ports: [{port: 80}, {port: http}, {port: 70000}]
    from: [{podSelector: {matchExpressions: [{key: tier, operator: Exists}]}}]
  egress:
  - ports: [{port: 80, endPort: 90}]
`))
	}
	a, b := decode("a"), decode("b")
	in, out := a.Spec.Ingress[0].Ports, b.Spec.Ingress[0].Ports
	if in[0].Port != out[0].Port || a.Spec.Egress[0].Ports[0].Port != in[0].Port {
		t.Error("port 80 is not shared between policies and rules")
	}
	if in[0].Port.IntValue() != 80 || in[1].Port.String() != "http" || in[2].Port.IntValue() != 70000 {
		t.Errorf("ports read %v, %v, %v after sharing", in[0].Port, in[1].Port, in[2].Port)
	}
	if in[1].Port == out[1].Port || in[2].Port == out[2].Port {
		t.Error("a named port or an out-of-range number is shared")
	}
	if got := slices.Collect(a.readKeys().all()); !slices.Equal(got, []string{"app", "tier"}) || a.readKeys() != b.readKeys() {
		t.Errorf("keys %v (shared: %v), want [app tier], shared", got, a.readKeys() == b.readKeys())
	}
}

// TestPolicyPartsShared: NetworkPolicies with equal peer selectors of
// matchLabels only, equal valid protocols, equal valid policyTypes lists
// and one namespace point to one shared value of each, and decode to what
// they decode to unshared; selectors with matchExpressions, unknown
// protocols and invalid policyTypes are left alone.
func TestPolicyPartsShared(t *testing.T) {
	ls := newLabelSets()
	doc := func(name, ns string) string {
		return `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ` + name + `, namespace: ` + ns + `}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress, Egress]
  ingress:
  - ports: [{protocol: TCP, port: 80}, {protocol: ICMP, port: 1}]
    from:
    - podSelector: {matchLabels: {app: api}}
      namespaceSelector: {}
    - podSelector: {matchExpressions: [{key: tier, operator: Exists}]}
  egress:
  - ports: [{protocol: TCP, port: 443}]
    to: [{podSelector: {matchLabels: {app: api}}}]
`
	}
	a := ls.decodeNP(unstructuredFrom(t, doc("a", "team-a")))
	runtime.GC() // a cached policy keeps its namespace's name shared across collections
	b := ls.decodeNP(unstructuredFrom(t, doc("b", strings.Clone("team-a"))))
	bad := ls.decodeNP(unstructuredFrom(t, strings.Replace(doc("c", "team-a"), "[Ingress, Egress]", "[Ingress, Sideways]", 1)))
	for _, d := range []*decodedNP{a, b, bad} {
		plain := decodeNP(unstructuredFrom(t, map[*decodedNP]string{a: doc("a", "team-a"), b: doc("b", "team-a"),
			bad: strings.Replace(doc("c", "team-a"), "[Ingress, Egress]", "[Ingress, Sideways]", 1)}[d]))
		if !equality.Semantic.DeepEqual(d.NetworkPolicy, plain.NetworkPolicy) {
			t.Errorf("%s: shared decoding %+v differs from plain %+v", d.Name, d.Spec, plain.Spec)
		}
	}
	ai, bi := a.Spec.Ingress[0], b.Spec.Ingress[0]
	if ai.From[0].PodSelector != bi.From[0].PodSelector || ai.From[0].PodSelector != b.Spec.Egress[0].To[0].PodSelector {
		t.Error("equal matchLabels peer selectors are not one shared selector")
	}
	if ai.From[0].NamespaceSelector != bi.From[0].NamespaceSelector {
		t.Error("empty peer selectors are not one shared selector")
	}
	if ai.From[0].PodSelector == ai.From[0].NamespaceSelector {
		t.Error("a selector of matchLabels shares with the empty one")
	}
	if ai.From[1].PodSelector == bi.From[1].PodSelector {
		t.Error("a selector with matchExpressions is shared")
	}
	if ai.Ports[0].Protocol != bi.Ports[0].Protocol || ai.Ports[0].Protocol != b.Spec.Egress[0].Ports[0].Protocol {
		t.Error("protocol TCP is not shared")
	}
	if ai.Ports[1].Protocol == bi.Ports[1].Protocol {
		t.Error("an unknown protocol is shared")
	}
	if unsafe.SliceData(a.Spec.PolicyTypes) != unsafe.SliceData(b.Spec.PolicyTypes) {
		t.Error("equal policyTypes lists are not shared")
	}
	if unsafe.SliceData(a.Spec.PolicyTypes) == unsafe.SliceData(bad.Spec.PolicyTypes) || len(ls.policyTypes) != 1 {
		t.Errorf("an invalid policyTypes list is shared or kept (%d lists kept)", len(ls.policyTypes))
	}
	if unsafe.StringData(a.Namespace) != unsafe.StringData(b.Namespace) {
		t.Error("the namespace's name is not shared")
	}
}
