package decode

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// A value of the wrong JSON type, or a field given twice, is reported at
// the path of that value (never at the rule or list holding it), saying
// what it must be and what it is; files and informers (the CLI and the
// agent) report it alike.
func TestWrongTypeNamesTheField(t *testing.T) {
	const np = `{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": "a"}, "spec": `
	const cnp = `{"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy", "metadata": {"name": "p"}, "spec": `
	for _, tc := range []struct {
		name, head, spec string
		want             []string // field: error body, sorted by field
	}{
		{"NP spec", np, `[]`, []string{
			"spec: Invalid value: must be an object, found a list; the whole policy is enforced fail-closed",
			"spec.egress[0]: Invalid value: the spec could not be read; enforced fail-closed",
			"spec.ingress[0]: Invalid value: the spec could not be read; enforced fail-closed",
			"spec.podSelector: Invalid value: the spec could not be read; enforced fail-closed",
		}},
		{"NP spec.podSelector", np, `{podSelector: [app]}`, []string{"spec.podSelector: Invalid value: must be an object, found a list"}},
		{"NP matchLabels value", np, `{podSelector: {matchLabels: {app: 5}}}`, []string{"spec.podSelector.matchLabels.app: Invalid value: must be a string, found a number"}},
		{"NP spec.ingress", np, `{podSelector: {}, ingress: {from: []}}`, []string{"spec.ingress: Invalid value: must be a list, found an object"}},
		{"NP spec.egress", np, `{podSelector: {}, egress: "all"}`, []string{"spec.egress: Invalid value: must be a list, found a string"}},
		{"NP rule", np, `{podSelector: {}, ingress: [{}, 7]}`, []string{"spec.ingress[1]: Invalid value: must be an object, found a number"}},
		{"NP from", np, `{podSelector: {}, ingress: [{from: {podSelector: {}}}]}`, []string{"spec.ingress[0].from: Invalid value: must be a list, found an object"}},
		{"NP ports[0].port", np, `{podSelector: {}, ingress: [{ports: [{port: true}]}]}`, []string{"spec.ingress[0].ports[0].port: Invalid value: must be an integer or a string, found a boolean"}},
		{"NP port out of int32", np, `{podSelector: {}, ingress: [{ports: [{port: 3000000000}]}]}`, []string{"spec.ingress[0].ports[0].port: Invalid value: must be an integer between -2147483648 and 2147483647, found 3000000000"}},
		{"NP endPort", np, `{podSelector: {}, egress: [{ports: [{port: 80, endPort: "90"}]}]}`, []string{"spec.egress[0].ports[0].endPort: Invalid value: must be an integer, found a string"}},
		{"NP endPort fraction", np, `{podSelector: {}, egress: [{ports: [{port: 80, endPort: 90.5}]}]}`, []string{"spec.egress[0].ports[0].endPort: Invalid value: must be an integer, found 90.5"}},
		{"NP ipBlock.cidr", np, `{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10}}]}]}`, []string{"spec.ingress[0].from[0].ipBlock.cidr: Invalid value: must be a string, found a number"}},
		{"NP ipBlock.except", np, `{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: 10.1.0.0/16}}]}]}`, []string{"spec.ingress[0].from[0].ipBlock.except: Invalid value: must be a list, found a string"}},
		{"NP policyTypes entry", np, `{podSelector: {}, policyTypes: [Ingress, 1]}`, []string{"spec.policyTypes[1]: Invalid value: must be a string, found a number"}},
		{"NP two problems", np, `{podSelector: {}, ingress: [{ports: [{port: true}], from: [{ipBlock: {cidr: 10}}]}]}`, []string{
			"spec.ingress[0].from[0].ipBlock.cidr: Invalid value: must be a string, found a number",
			"spec.ingress[0].ports[0].port: Invalid value: must be an integer or a string, found a boolean",
		}},
		{"CNP spec", cnp, `5`, []string{
			"spec: Invalid value: must be an object, found a number; the whole policy is enforced fail-closed",
			"spec.egress[0]: Invalid value: the spec could not be read; enforced fail-closed",
			"spec.ingress[0]: Invalid value: the spec could not be read; enforced fail-closed",
			"spec.subject: Invalid value: the spec could not be read; enforced fail-closed",
		}},
		{"CNP spec.priority", cnp, `{tier: Admin, priority: "5", subject: {namespaces: {}}}`, []string{"spec.priority: Invalid value: must be an integer, found a string"}},
		{"CNP spec.tier", cnp, `{tier: [Admin], priority: 5, subject: {namespaces: {}}}`, []string{"spec.tier: Invalid value: must be a string, found a list"}},
		{"CNP spec.subject", cnp, `{tier: Admin, priority: 5, subject: []}`, []string{"spec.subject: Invalid value: must be an object, found a list"}},
		{"CNP spec.ingress", cnp, `{tier: Admin, priority: 5, subject: {namespaces: {}}, ingress: {action: Deny}}`, []string{"spec.ingress: Invalid value: must be a list, found an object"}},
		{"CNP action", cnp, `{tier: Admin, priority: 5, subject: {namespaces: {}}, ingress: [{action: 1, from: [{namespaces: {}}]}]}`, []string{"spec.ingress[0].action: Invalid value: must be a string, found a number"}},
		{"CNP protocols", cnp, `{tier: Admin, priority: 5, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}], protocols: {tcp: {destinationPort: {number: 80}}}}]}`, []string{"spec.ingress[0].protocols: Invalid value: must be a list, found an object"}},
		{"CNP port number", cnp, `{tier: Admin, priority: 5, subject: {namespaces: {}}, egress: [{action: Deny, to: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: "80"}}}]}]}`, []string{"spec.egress[0].protocols[0].tcp.destinationPort.number: Invalid value: must be an integer, found a string"}},
		{"CNP networks entry", cnp, `{tier: Admin, priority: 5, subject: {namespaces: {}}, egress: [{action: Deny, to: [{networks: [10]}]}]}`, []string{"spec.egress[0].to[0].networks[0]: Invalid value: must be a string, found a number"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, err := yaml.YAMLToJSON([]byte(tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			doc := tc.head + string(js) + "}"
			var obj map[string]any
			if err := json.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatal(err)
			}
			var informer Result
			if err := informer.DecodeUnstructured("api", obj); err != nil {
				t.Fatal(err)
			}
			for src, r := range map[string]*Result{"file": decodeString(t, doc), "informer": &informer} {
				var errs field.ErrorList
				switch {
				case len(r.Cluster.NetworkPolicies) == 1:
					errs = r.Cluster.NetworkPolicies[0].Invalid()
				case len(r.Cluster.ClusterNetworkPolicies) == 1:
					errs = r.Cluster.ClusterNetworkPolicies[0].Invalid
				default:
					t.Fatalf("%s: not loaded: %s", src, diagStrings(r.Diagnostics))
				}
				var got []string
				for _, e := range errs {
					got = append(got, e.Field+": "+e.ErrorBody())
				}
				if !slices.Equal(got, tc.want) {
					t.Errorf("%s:\n got %q\nwant %q", src, got, tc.want)
				}
			}
		})
	}
}

// A field given twice is a Duplicate at its own path.
func TestDuplicateFieldNamesTheField(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": "a"}, "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 80, "port": 81}]}]}}`,
			"spec.ingress[0].ports[0].port: Duplicate value: the field is given more than once"},
		{`{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": "a"}, "spec": {"podSelector": {}, "ingress": [], "ingress": [{}]}}`,
			"spec.ingress: Duplicate value: the field is given more than once"},
	} {
		r := decodeString(t, tc.doc)
		if len(r.Cluster.NetworkPolicies) != 1 {
			t.Fatalf("not loaded: %s", diagStrings(r.Diagnostics))
		}
		errs := r.Cluster.NetworkPolicies[0].Invalid()
		if len(errs) != 1 || errs[0].Type != field.ErrorTypeDuplicate || errs[0].Field+": "+errs[0].ErrorBody() != tc.want {
			t.Errorf("got %v, want %q", errs, tc.want)
		}
	}
}

// An apiVersion or kind given twice drops the object; when the two
// differ, the object is named by the first and the message gives both
// (it was named by the last alone).
func TestDuplicateKindNamesBoth(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","kind":"Pod","metadata":{"name":"p","namespace":"a"},"spec":{"podSelector":{}}}`,
			`NetworkPolicy a/p: kind: duplicate field, given as "NetworkPolicy" and as "Pod": object not loaded`},
		{`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","kind":"NetworkPolicy","metadata":{"name":"p","namespace":"a"},"spec":{"podSelector":{}}}`,
			`NetworkPolicy a/p: kind: duplicate field: object not loaded`},
		{`{"apiVersion":"networking.k8s.io/v1","apiVersion":"v1","kind":"NetworkPolicy","metadata":{"name":"p","namespace":"a"},"spec":{"podSelector":{}}}`,
			`NetworkPolicy a/p: apiVersion: duplicate field, given as "networking.k8s.io/v1" and as "v1": object not loaded`},
	} {
		r := decodeString(t, tc.doc)
		if got := diagStrings(r.Diagnostics); len(r.Dropped) != 1 || !strings.HasPrefix(got, tc.want) {
			t.Errorf("dropped %v, diagnostics %q; want %q", r.Dropped, got, tc.want)
		}
	}
}
