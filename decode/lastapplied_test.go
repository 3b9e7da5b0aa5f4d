package decode

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
)

// Of a Namespace's, Pod's or Node's annotations, kubectl's
// last-applied-configuration is read (the labels it names), from files
// and from unstructured maps alike; other annotations, and one that is not
// a string or not JSON, change nothing.
func TestLastAppliedLabels(t *testing.T) {
	const doc = `{"apiVersion":"v1","kind":"List","items":[
{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a","labels":{"x":"1"},"annotations":{"z":"y","kubectl.kubernetes.io/last-applied-configuration":"{\"metadata\":{\"labels\":{\"x\":\"1\",\"gone\":\"2\"}}}"}}},
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"a","annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"metadata\":{}}"}}},
{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","annotations":{"kubectl.kubernetes.io/last-applied-configuration":7}}},
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"q","namespace":"a","annotations":{"kubectl.kubernetes.io/last-applied-configuration":"not json"}}}
]}`
	var tree map[string]any
	if err := json.Unmarshal([]byte(doc), &tree); err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"stream", "tree"} {
		r := &Result{}
		var err error
		if how == "stream" {
			err = r.DecodeJSON("doc", strings.NewReader(doc))
		} else {
			err = r.DecodeUnstructured("doc", tree)
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Dropped) != 0 || len(r.Diagnostics) != 0 {
			t.Errorf("%s: dropped %v, %v", how, r.Dropped, r.Diagnostics)
		}
		if !maps.Equal(r.LastApplied["Namespace a"], map[string]bool{"x": true, "gone": true}) {
			t.Errorf("%s: namespace %v", how, r.LastApplied["Namespace a"])
		}
		if l, ok := r.LastApplied["Pod a/p"]; !ok || len(l) != 0 {
			t.Errorf("%s: pod with an annotation naming no labels: %v, %v", how, l, ok)
		}
		if _, ok := r.LastApplied["Node n"]; ok {
			t.Errorf("%s: a number was taken for the annotation", how)
		}
		if _, ok := r.LastApplied["Pod a/q"]; ok {
			t.Errorf("%s: text that is not JSON was taken for the annotation", how)
		}
	}
}
