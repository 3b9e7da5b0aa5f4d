package decode

import (
	"slices"
	"testing"
)

// A member seen before apiVersion and kind (YAML converted to JSON sorts
// keys: a mis-indented top-level "ingress" comes before "kind") is read
// once the kind is known, whatever member starts the object.
func TestMembersBeforeKindAreRead(t *testing.T) {
	for _, doc := range []string{
		`{"apiVersion":"policy.networking.k8s.io/v1alpha2","kind":"ClusterNetworkPolicy","metadata":{"name":"m"},"ingress":[{"action":"Deny"}]}`,
		`{"apiVersion":"policy.networking.k8s.io/v1alpha2","ingress":[{"action":"Deny"}],"kind":"ClusterNetworkPolicy","metadata":{"name":"m"}}`,
		`{"egress":[],"ingress":[{"action":"Deny"}],"apiVersion":"policy.networking.k8s.io/v1alpha2","kind":"ClusterNetworkPolicy","metadata":{"name":"m"}}`,
	} {
		var r Result
		if err := r.DecodeJSONBytes("x", []byte(doc)); err != nil {
			t.Fatal(err)
		}
		if len(r.Cluster.ClusterNetworkPolicies) != 1 || !slices.Contains(r.Cluster.ClusterNetworkPolicies[0].UnknownFields, "ingress") {
			t.Errorf("%s: unknown fields %v", doc, r.Cluster.ClusterNetworkPolicies)
		}
	}
}
