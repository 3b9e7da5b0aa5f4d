package agent

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestChangedComparesRefusedParts: two versions of a policy with the same
// generation whose specs decode alike but whose refused parts differ (a
// CRD schema change can bring an object again so) are a change: the
// compiler fails closed on the refused part, and skipping the update
// would keep the old enforcement until the next resync.
func TestChangedComparesRefusedParts(t *testing.T) {
	obj := func(t *testing.T, y string) *unstructured.Unstructured {
		t.Helper()
		var m map[string]any
		if err := yaml.Unmarshal([]byte(y), &m); err != nil {
			t.Fatal(err)
		}
		return &unstructured.Unstructured{Object: m}
	}
	np := func(ports string) string {
		return `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a, uid: u1, generation: 3}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {}}]` + ports + `}]
`
	}
	cnp := func(extra string) string {
		return `apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: c, uid: u2, generation: 3}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  ingress: [{action: Deny, from: [{namespaces: {}}]` + extra + `}]
`
	}
	for _, tc := range []struct {
		name     string
		old, cur any
		want     bool
	}{
		{"NetworkPolicy: the same", decodeNP(obj(t, np(""))), decodeNP(obj(t, np(""))), false},
		{"NetworkPolicy: ports refused", decodeNP(obj(t, np(""))), decodeNP(obj(t, np(`, ports: "x"`))), true},
		{"ClusterNetworkPolicy: the same", decodeCNP(obj(t, cnp(""))), decodeCNP(obj(t, cnp(""))), false},
		{"ClusterNetworkPolicy: protocols refused", decodeCNP(obj(t, cnp(""))), decodeCNP(obj(t, cnp(`, protocols: "x"`))), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := npChanged
			if _, ok := tc.old.(*decodedCNP); ok {
				changed = cnpChanged
			}
			if got := changed(tc.old, tc.cur); got != tc.want {
				t.Errorf("changed = %v, want %v", got, tc.want)
			}
		})
	}
}
