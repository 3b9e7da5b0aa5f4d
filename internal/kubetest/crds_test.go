package kubetest

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

var cnpResource = schema.GroupVersionResource{Group: "policy.networking.k8s.io", Version: "v1alpha2", Resource: "clusternetworkpolicies"}

// cnpWithPorts is an Admin policy allowing TCP to a port range.
func cnpWithPorts(t *testing.T, name string, start, end int) *unstructured.Unstructured {
	t.Helper()
	doc := `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata:
  name: ` + name + `
spec:
  tier: Admin
  priority: 10
  subject:
    namespaces: {}
  ingress:
  - action: Accept
    from:
    - namespaces: {}
    protocols:
    - tcp:
        destinationPort:
          range:
            start: ` + itoa(start) + `
            end: ` + itoa(end) + `
`
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

func itoa(n int) string {
	b, _ := yaml.Marshal(n)
	return strings.TrimSpace(string(b))
}

// rangeRuleMessage finds the message of the CRD's CEL rule for port ranges,
// so the test follows the CRD the project ships rather than a copy of it.
func rangeRuleMessage(t *testing.T, crds [][]byte) string {
	t.Helper()
	for _, data := range crds {
		lines := strings.Split(string(data), "\n")
		for i, l := range lines {
			if strings.TrimSpace(l) == "rule: self.start < self.end" && i > 0 {
				if m, ok := strings.CutPrefix(strings.TrimSpace(lines[i-1]), "- message: "); ok {
					return m
				}
			}
		}
	}
	t.Fatal("no CEL rule self.start < self.end in the ClusterNetworkPolicy CRD")
	return ""
}

func TestCRDRejectsInvalidPortRangeWithCELMessage(t *testing.T) {
	env := sharedEnv(t)
	crds, err := testCRDs()
	if err != nil {
		t.Fatal(err)
	}
	want := rangeRuleMessage(t, crds)
	ctx := t.Context()
	cnps := env.Dynamic.Resource(cnpResource)

	if _, err := cnps.Create(ctx, cnpWithPorts(t, "valid-range", 8000, 8080), metav1.CreateOptions{}); err != nil {
		t.Fatalf("valid ClusterNetworkPolicy rejected: %v", err)
	}
	for _, tc := range []struct {
		name       string
		start, end int
	}{
		{"reversed", 8080, 8000},
		{"empty", 8080, 8080},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cnps.Create(ctx, cnpWithPorts(t, "invalid-"+tc.name, tc.start, tc.end), metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("range %d-%d: got %v, want an Invalid error", tc.start, tc.end, err)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("range %d-%d: error %q does not carry the CEL message %q", tc.start, tc.end, err, want)
			}
		})
	}
}

func TestInstallCRDsRejectsOtherKinds(t *testing.T) {
	env := &Env{} // the kind check happens before any request
	for _, tc := range []struct {
		name, doc string
	}{
		{"configmap", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"},
		{"v1beta1 CRD", "apiVersion: apiextensions.k8s.io/v1beta1\nkind: CustomResourceDefinition\nmetadata:\n  name: x\n"},
		{"nothing", "---\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := env.InstallCRDs(context.Background(), []byte(tc.doc)); err == nil {
				t.Error("InstallCRDs accepted it")
			}
		})
	}
}
