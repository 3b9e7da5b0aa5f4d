package decode

import (
	"strings"
	"testing"
)

const namespacelessList = `{"apiVersion":"v1","kind":"List","items":[
{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"deny"},"spec":{"podSelector":{}}},
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"status":{"podIP":"10.0.0.1"}},
{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"other","namespace":"elsewhere"},"spec":{"podSelector":{}}}
]}`

// Objects without a namespace go to Result.Namespace (kubectl's -n or
// context namespace), on every path through the decoder (a streamed List
// is decoded on several cores); EnforceNamespace drops those naming
// another, as kubectl apply -n refuses them.
func TestResultNamespace(t *testing.T) {
	for _, enforce := range []bool{false, true} {
		for _, how := range []string{"stream", "bytes"} {
			r := &Result{Namespace: "team", EnforceNamespace: enforce}
			var err error
			if how == "stream" {
				err = r.DecodeJSON("list", strings.NewReader(namespacelessList))
			} else {
				err = r.DecodeJSONBytes("list", []byte(namespacelessList))
			}
			if err != nil {
				t.Fatal(err)
			}
			c := &r.Cluster
			if len(c.Pods) != 1 || c.Pods[0].Namespace != "team" {
				t.Errorf("%s: pods %+v", how, c.Pods)
			}
			wantNPs := 2
			if enforce {
				wantNPs = 1
			}
			if len(c.NetworkPolicies) != wantNPs || c.NetworkPolicies[0].Namespace != "team" {
				t.Fatalf("%s, enforce %v: policies %+v", how, enforce, c.NetworkPolicies)
			}
			if enforce != (len(r.Dropped) == 1 && r.Dropped[0] == "NetworkPolicy elsewhere/other") {
				t.Errorf("%s, enforce %v: dropped %v", how, enforce, r.Dropped)
			}
			for _, d := range r.Diagnostics {
				if d.Field == "metadata.namespace" && !strings.Contains(d.Message, `does not match the namespace "team"`) {
					t.Errorf("%s: placed by the caller, yet warned: %v", how, d)
				}
			}
		}
	}
	// Without a namespace: default, with a warning for the policy.
	r := &Result{}
	if err := r.DecodeJSON("list", strings.NewReader(namespacelessList)); err != nil {
		t.Fatal(err)
	}
	if r.Cluster.Pods[0].Namespace != "default" || r.Cluster.NetworkPolicies[0].Namespace != "default" || len(r.Diagnostics) != 1 {
		t.Errorf("no namespace given: %+v, %v", r.Cluster.Pods, r.Diagnostics)
	}
}

// With EnforceNamespace, kubectl apply -n refuses a namespaced object of
// another namespace whatever its kind: so does the decoder, for the kinds
// Moat skips too (they were skipped unchecked). A cluster-scoped kind's
// namespace is ignored, as kubectl ignores it; a kind Moat does not know
// is taken for namespaced.
func TestEnforceNamespaceSkippedKinds(t *testing.T) {
	const docs = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"elsewhere","namespace":"other"}}
{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"here","namespace":"team"}}
{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"placed"}}
{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","namespace":"other"}}
{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"other"}}
{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"cr","namespace":"other"}}
{"apiVersion":"policy.networking.k8s.io/v1alpha1","kind":"AdminNetworkPolicy","metadata":{"name":"anp","namespace":"other"}}
{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"other"}}]}
`
	for _, enforce := range []bool{false, true} {
		r := &Result{Namespace: "team", EnforceNamespace: enforce}
		if err := r.DecodeJSON("docs", strings.NewReader(docs)); err != nil {
			t.Fatal(err)
		}
		want := []string{}
		if enforce {
			want = []string{"ConfigMap elsewhere", "Deployment d", "Widget w", "Secret s"}
		}
		if strings.Join(r.Dropped, ",") != strings.Join(want, ",") {
			t.Errorf("enforce %v: dropped %q, want %q", enforce, r.Dropped, want)
		}
		if len(r.Skipped)+len(r.Dropped) != 8 {
			t.Errorf("enforce %v: skipped %q", enforce, r.Skipped)
		}
		for _, d := range r.Diagnostics {
			if d.Field == "metadata.namespace" && (!enforce || !strings.Contains(d.Message, `"other" does not match the namespace "team"`)) {
				t.Errorf("enforce %v: %v", enforce, d)
			}
		}
	}
}
