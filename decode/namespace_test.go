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
