package decode

import (
	"encoding/json"
	"strings"
	"testing"
)

// A typed List whose items carry no apiVersion and kind (as the API server
// lists them: `kubectl get --raw`, curl) gives its items their kind even
// when its own kind comes after them, as in a YAML document converted to
// JSON (keys sorted) or an unstructured map; the items of anything else
// keep being refused without a kind, and an item's own kind must agree.
func TestTypedListKindAfterItems(t *testing.T) {
	for _, tc := range []struct {
		name, js string
		nps      int
		diag     string // a diagnostic that must appear, "" for none at all
	}{
		{"NetworkPolicyList, kind last", `{"apiVersion":"networking.k8s.io/v1","items":[{"metadata":{"name":"z","namespace":"default"},"spec":{"podSelector":{}}}],"kind":"NetworkPolicyList"}`, 1, ""},
		{"apiVersion last too", `{"items":[{"metadata":{"name":"z","namespace":"default"},"spec":{"podSelector":{}}}],"kind":"NetworkPolicyList","apiVersion":"networking.k8s.io/v1"}`, 1, ""},
		{"wrong apiVersion for the kind", `{"apiVersion":"v1","items":[{"metadata":{"name":"z"},"spec":{"podSelector":{}}}],"kind":"NetworkPolicyList"}`, 0, `unsupported apiVersion "v1" for kind NetworkPolicy`},
		{"item of another kind", `{"apiVersion":"networking.k8s.io/v1","items":[{"kind":"Pod","metadata":{"name":"z"}}],"kind":"NetworkPolicyList"}`, 0, `kind: "Pod" in a list of networking.k8s.io/v1 NetworkPolicy`},
		{"generic List still needs item kinds", `{"apiVersion":"v1","items":[{"metadata":{"name":"z"},"spec":{"podSelector":{}}}],"kind":"List"}`, 0, "missing apiVersion and kind"},
		{"kind given twice", `{"apiVersion":"networking.k8s.io/v1","items":[{"metadata":{"name":"z"},"spec":{"podSelector":{}}}],"kind":"NetworkPolicyList","kind":"NetworkPolicyList"}`, 0, "missing apiVersion and kind"},
		{"items not a list", `{"apiVersion":"networking.k8s.io/v1","items":{},"kind":"NetworkPolicyList"}`, 0, "NetworkPolicyList: items: must be a list, found an object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Result
			err := r.DecodeJSONBytes("t", []byte(tc.js))
			got := diagStrings(r.Diagnostics)
			if err != nil {
				got += "error: " + err.Error()
			}
			if len(r.Cluster.NetworkPolicies) != tc.nps || tc.diag == "" && got != "" || !strings.Contains(got, tc.diag) {
				t.Errorf("bytes: %d policies, diagnostics %q; want %d and %q", len(r.Cluster.NetworkPolicies), got, tc.nps, tc.diag)
			}
			var obj map[string]any
			if json.Unmarshal([]byte(tc.js), &obj) != nil || strings.Contains(tc.name, "twice") {
				return // a map cannot hold a key twice
			}
			var u Result
			err = u.DecodeUnstructured("t", obj)
			got = diagStrings(u.Diagnostics)
			if err != nil {
				got += "error: " + err.Error()
			}
			if len(u.Cluster.NetworkPolicies) != tc.nps || tc.diag == "" && got != "" || !strings.Contains(got, tc.diag) {
				t.Errorf("unstructured: %d policies, diagnostics %q; want %d and %q", len(u.Cluster.NetworkPolicies), got, tc.nps, tc.diag)
			}
		})
	}
}

// A dropped object is named even when it lacks a kind or a name, and a
// document with neither apiVersion nor kind is called what it is.
func TestMissingKindAndNameAreNamed(t *testing.T) {
	for _, tc := range []struct{ doc, js, want string }{
		{"ci.yaml#1", `{"on":"push","jobs":{}}`, "<no kind> <no name>: not a Kubernetes object (no apiVersion or kind): object not loaded"},
		{"repo/kustomization.yaml#1", `{"resources":["a.yaml"]}`, "not a Kubernetes object (no apiVersion or kind): a kustomization; render it first (kustomize build, kubectl kustomize)"},
		{"t#1", `{"apiVersion":"v1","metadata":{"name":"x"}}`, "<no kind> x: kind: missing kind: object not loaded"},
		{"t#1", `{"apiVersion":"v1","kind":"List","items":[{"metadata":{"name":"x"}}]}`, "<no kind> x: kind: missing apiVersion and kind (only the items of a typed List"},
		{"t#1", `{"apiVersion":"v1","kind":"Namespace","metadata":{"labels":{"env":true}}}`, "Namespace <no name>: metadata.labels.env: cannot decode"},
		{"t#1", `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":true}}`, "NetworkPolicy default/<no name>: metadata.name: cannot decode"},
	} {
		var r Result
		err := r.DecodeJSONBytes(tc.doc, []byte(tc.js))
		got := diagStrings(r.Diagnostics)
		if err != nil || !strings.Contains(got, tc.want) || len(r.Dropped) != 1 {
			t.Errorf("%s: err %v, dropped %v, diagnostics %q; want one containing %q", tc.js, err, r.Dropped, got, tc.want)
		}
	}
}
