package agent

import (
	"reflect"
	"slices"
	"testing"

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
		{"NetworkPolicy", npSelectors(&np.Spec), 4, np.labels},
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
	}
	if got := ls.len(); got != 1 {
		t.Errorf("%d label sets for one distinct map", got)
	}
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
