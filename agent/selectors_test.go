package agent

import (
	"reflect"
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
		{"NetworkPolicy", npSelectors(np.NetworkPolicy.NetworkPolicy), 4, np.labels},
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
			if reflect.ValueOf(s.MatchLabels).UnsafePointer() != reflect.ValueOf(shared.m).UnsafePointer() {
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
