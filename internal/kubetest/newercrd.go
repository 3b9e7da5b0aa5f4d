package kubetest

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/moat-net/moat/deploy"
)

// CRDWithNewerFields is the experimental ClusterNetworkPolicy CRD with two
// fields a newer release of the API might add, which Moat's types lack:
// ingress peers' serviceAccounts and protocols' icmp. Installed with
// WithCRDs, it lets a test store a policy written for that newer API, as a
// cluster would, and check that Moat fails closed on it.
func CRDWithNewerFields(t testing.TB) []byte {
	t.Helper()
	data, err := deploy.CRDs(deploy.Experimental)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := DecodeYAML(data)
	if err != nil || len(objs) != 1 {
		t.Fatalf("experimental CRDs: %d objects, %v", len(objs), err)
	}
	crd := objs[0]
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for i, v := range versions {
		vm := v.(map[string]any)
		ingress := []string{"schema", "openAPIV3Schema", "properties", "spec", "properties", "ingress", "items", "properties"}
		for _, add := range []struct {
			path  []string
			field string
		}{
			{append(append([]string(nil), ingress...), "from", "items", "properties"), "serviceAccounts"},
			{append(append([]string(nil), ingress...), "protocols", "items", "properties"), "icmp"},
		} {
			props, found, err := unstructured.NestedMap(vm, add.path...)
			if err != nil || !found {
				t.Fatalf("CRD has no properties at %v: %v", add.path, err)
			}
			props[add.field] = map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
			if err := unstructured.SetNestedMap(vm, props, add.path...); err != nil {
				t.Fatal(err)
			}
		}
		versions[i] = vm
	}
	if err := unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(crd.Object)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
