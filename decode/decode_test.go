package decode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/moat-net/moat/policy"
)

func decodeString(t *testing.T, js string) *Result {
	t.Helper()
	var r Result
	if err := r.DecodeJSON("t", strings.NewReader(js)); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return &r
}

func diagStrings(ds []policy.Diagnostic) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.String())
	}
	return strings.Join(s, "\n")
}

// Issue 9.5: in a group Moat reads, a kind it does not know is an error
// (most likely a misspelling of one it reads); elsewhere it is skipped.
func TestKinds(t *testing.T) {
	for _, tc := range []struct {
		apiVersion, kind string
		dropped          bool
		diag, skipped    string
	}{
		{"networking.k8s.io/v1", "Networkpolicy", true, `Networkpolicy p: kind: unknown kind "Networkpolicy" in apiVersion "networking.k8s.io/v1" (did you mean NetworkPolicy?): object not loaded`, ""},
		{"policy.networking.k8s.io/v1alpha2", "ClusterNetworkPolicies", true, "did you mean ClusterNetworkPolicy?", ""},
		{"policy.networking.k8s.io/v1alpha2", "NetworkPolicy", true, "unsupported apiVersion", ""},
		{"v1", "pod", true, "did you mean Pod?", ""},
		{"v1", "Nodes", true, "did you mean Node?", ""},
		{"v1", "Widget", true, "Moat reads Namespace, Pod, Node, NetworkPolicy and ClusterNetworkPolicy", ""},
		{"networking.k8s.io/v1beta1", "NetworkPolicy", true, `unsupported apiVersion "networking.k8s.io/v1beta1" for kind NetworkPolicy (want "networking.k8s.io/v1")`, ""},
		{"v1", "ConfigMap", false, "", "kind not used by Moat"},
		{"v1", "Service", false, "", "kind not used by Moat"},
		{"networking.k8s.io/v1", "Ingress", false, "", "kind not used by Moat"},
		{"networking.k8s.io/v1beta1", "IngressClass", false, "", "kind not used by Moat"},
		{"apps/v1", "Deployment", false, "", "kind not used by Moat"},
		{"example.com/v1", "Networkpolicy", false, "", "kind not used by Moat"},
		{"policy.networking.k8s.io/v1alpha1", "AdminNetworkPolicy", false, "policy kind not enforced by Moat", "policy kind not enforced"},
		// Another project's NetworkPolicy is skipped, not
		// an error that blocks every command; a Kubernetes group's
		// version Moat does not read stays one.
		{"projectcalico.org/v3", "NetworkPolicy", false, "", "kind of API group projectcalico.org, not the Kubernetes NetworkPolicy Moat reads (networking.k8s.io/v1)"},
		{"crd.antrea.io/v1beta1", "NetworkPolicy", false, "", "kind of API group crd.antrea.io"},
		{"cilium.io/v2", "Node", false, "", "kind of API group cilium.io"},
		{"extensions/v1beta1", "NetworkPolicy", true, `unsupported apiVersion "extensions/v1beta1"`, ""},
		{"policy/v1beta1", "Pod", true, `unsupported apiVersion "policy/v1beta1"`, ""},
	} {
		t.Run(tc.apiVersion+" "+tc.kind, func(t *testing.T) {
			r := decodeString(t, `{"apiVersion":"`+tc.apiVersion+`","kind":"`+tc.kind+`","metadata":{"name":"p"},"spec":{}}`)
			if (len(r.Dropped) > 0) != tc.dropped {
				t.Errorf("dropped = %v, want %v", r.Dropped, tc.dropped)
			}
			if d := diagStrings(r.Diagnostics); !strings.Contains(d, tc.diag) || (tc.diag == "" && d != "") {
				t.Errorf("diagnostics %q, want %q", d, tc.diag)
			}
			if s := strings.Join(r.Skipped, "\n"); !strings.Contains(s, tc.skipped) || (tc.skipped == "" && s != "") {
				t.Errorf("skipped %q, want %q", s, tc.skipped)
			}
		})
	}
}

// Objects come as kubectl prints them (a List, keys in any order, kind
// after items), as the API server lists them (a PodList whose items carry
// no kind), or one after another.
func TestListsAndOrder(t *testing.T) {
	for _, tc := range []struct {
		name, js string
		pods     int
		cont     string
	}{
		{"kubectl List, kind last", `{"apiVersion":"v1","items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}},{"kind":"Pod","metadata":{"name":"b"},"apiVersion":"v1"}],"kind":"List","metadata":{"resourceVersion":""}}`, 2, ""},
		{"kind after the body", `{"spec":{"nodeName":"n"},"metadata":{"name":"a"},"status":{"podIP":"10.0.0.1"},"kind":"Pod","apiVersion":"v1"}`, 1, ""},
		{"typed list page", `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"5","continue":"abc"},"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}`, 2, "abc"},
		{"nested lists", `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}]}]}`, 1, ""},
		{"a stream of values", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}} {"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"}}`, 2, ""},
		{"empty list", `{"apiVersion":"v1","kind":"List","items":[]}`, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Result
			cont, err := r.decodeJSON("t", strings.NewReader(tc.js))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Cluster.Pods) != tc.pods || cont != tc.cont || len(r.Dropped) > 0 {
				t.Errorf("pods %+v, continue %q, dropped %v %v", r.Cluster.Pods, cont, r.Dropped, r.Diagnostics)
			}
		})
	}
}

// Input that is not JSON, or not objects, fails the whole stream with a
// message naming the place.
func TestSyntaxErrors(t *testing.T) {
	for _, tc := range []struct{ js, want string }{
		{`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},}`, "invalid character '}' looking for an object key"},
		{`{"apiVersion":"v1","kind":"Pod" "metadata":{}}`, "after object member"},
		{"{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"a\x01\"}}", "control character"},
		{`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a\q"}}`, `invalid escape \q`},
		{`{"apiVersion":"v1","kind":"Pod","spec":{"x":[1,2,]}}`, "looking for a value"},
		{`{"apiVersion":"v1","kind":"Pod","spec":{"x":01}}`, `invalid number "01"`},
		{`{"apiVersion":"v1","kind":"Pod","spec":{"x":-}}`, "invalid number"},
		{`{"apiVersion":"v1","kind":"Pod","spec":{"x":tru}}`, "looking for a value"},
		{`{"apiVersion":"v1","kind":"Pod","spec":{"x":"abc`, "unterminated string"},
		{`{"apiVersion":"v1","kind":"Pod","spec":{"x":[}}`, "looking for a value"},
		{`{"apiVersion":"v1","kind":"Pod","spec":{"x":{]}}`, "looking for an object key"},
		{`["a"]`, "not a Kubernetes object"},
		{`{"apiVersion":"v1","kind":"List","items":[1]}`, "items[0]: not a Kubernetes object"},
		{`{"apiVersion":"v1","kind":"List","items":{}}`, "items: must be a list"},
	} {
		var r Result
		err := r.DecodeJSON("t", strings.NewReader(tc.js))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.js, err, tc.want)
		}
	}
}

// Strings decode as encoding/json decodes them: escapes, surrogate pairs,
// lone surrogates and invalid UTF-8 replaced.
func TestStrings(t *testing.T) {
	for _, raw := range []string{`"plain"`, `"a\"b\\c\/d\b\f\n\r\t"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83dx"`, `"\ude00\ud83d"`, "\"\xff\xfe\"", `"\u0000"`} {
		var want string
		if err := json.Unmarshal([]byte(raw), &want); err != nil {
			t.Fatal(err)
		}
		r := decodeString(t, `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"n","labels":{"k":`+raw+`}}}`)
		if got := r.Cluster.Namespaces[0].Labels["k"]; got != want {
			t.Errorf("%s: got %q, want %q", raw, got, want)
		}
	}
}

// A reader that gives one byte at a time decodes like one that gives all:
// tokens straddle every refill of the window.
func TestStreamingOneByteAtATime(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
	for i := range 50 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"p` + strings.Repeat("x", i*37) + `","namespace":"a","annotations":{"big":"` + strings.Repeat(`\u00e9\"`, i*101) + `"}},"spec":{"podSelector":{"matchLabels":{"a":"b"}},"ingress":[{"ports":[{"port":80,"endPort":-1.5e3}]}],"bogus":true}}`)
	}
	b.WriteString(`]}`)
	var whole, bytewise Result
	if err := whole.DecodeJSON("t", bytes.NewReader(b.Bytes())); err != nil {
		t.Fatal(err)
	}
	if err := bytewise.DecodeJSON("t", iotest.OneByteReader(bytes.NewReader(b.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if len(whole.Cluster.NetworkPolicies) != 50 {
		t.Fatalf("%d policies", len(whole.Cluster.NetworkPolicies))
	}
	for i := range whole.Cluster.NetworkPolicies {
		w, g := whole.Cluster.NetworkPolicies[i], bytewise.Cluster.NetworkPolicies[i]
		if w.Name != g.Name || strings.Join(w.UnknownFields(), ",") != strings.Join(g.UnknownFields(), ",") || w.Invalid().ToAggregate().Error() != g.Invalid().ToAggregate().Error() {
			t.Fatalf("policy %d differs: %+v %+v", i, w, g)
		}
	}
	np := whole.Cluster.NetworkPolicies[3]
	if np.UnknownFields()[0] != "spec.bogus" || np.Invalid()[0].Field != "spec.ingress[0].ports[0].endPort" {
		t.Errorf("unknown %v, invalid %v", np.UnknownFields(), np.Invalid())
	}
}

// FuzzScanner: the scanner accepts exactly the documents encoding/json
// accepts, and decoding never panics.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,2.5e-3,"x\u00e9",true,false,null,{}]}`, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"ports":[{"containerPort":80}]}]}}`, `[`, `{"a":01}`, `"\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := newBytesScanner(b)
		err := s.skip()
		if err == nil {
			if _, more, _ := s.ws(); more {
				err = s.errorf("trailing data")
			}
		}
		if (err == nil) != json.Valid(b) {
			t.Fatalf("scanner err %v, json.Valid %v: %q", err, json.Valid(b), b)
		}
		var r Result
		_ = r.DecodeJSON("f", bytes.NewReader(b))
	})
}

// What the dynamic client lists (an UnstructuredList's content with its
// items) decodes like the same JSON.
func TestDecodeUnstructuredList(t *testing.T) {
	list := map[string]any{"apiVersion": "v1", "kind": "List", "items": []any{
		map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "a", "namespace": "n"}, "status": map[string]any{"podIP": "10.0.0.1"}},
		map[string]any{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": map[string]any{"name": "p", "namespace": "n"}, "spec": map[string]any{"podSelector": map[string]any{}, "ingress": "x"}},
	}}
	var r Result
	if err := r.DecodeUnstructured("api", list); err != nil {
		t.Fatal(err)
	}
	if len(r.Cluster.Pods) != 1 || len(r.Cluster.NetworkPolicies) != 1 || r.Cluster.NetworkPolicies[0].Invalid()[0].Field != "spec.ingress" {
		t.Errorf("cluster %+v", r.Cluster)
	}
	if err := r.DecodeUnstructured("api", map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "a", "namespace": "n"}}); err != nil {
		t.Fatal(err)
	}
	if len(r.Dropped) != 1 || !strings.Contains(r.Diagnostics[0].Message, "duplicate object") {
		t.Errorf("a second n/a: dropped %v, %v", r.Dropped, r.Diagnostics)
	}
}

// A List decoded on every core gives what one core gives, in the same
// order, with the same errors.
func TestParallelAgreesWithSequential(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(`{"apiVersion":"v1","items":[`)
	for i := range 3000 {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p%d","namespace":"n%d","labels":{"a":"%d"},"annotations":{"x":"%s"}},"spec":{"nodeName":"n","containers":[{"name":"c","ports":[{"containerPort":%d}]}]},"status":{"podIP":"10.0.%d.%d"}}`, i, i%7, i%3, strings.Repeat(`\"}{][`, i%50), 1+i%60000, i/250, i%250)
		if i%500 == 0 {
			fmt.Fprintf(&b, `,{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"np%d","namespace":"n1"},"spec":{"podSelector":{},"ingress":[{"ports":"x"}],"bogus":1}}`, i)
		}
		if i == 2000 {
			b.WriteString(`,{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p0","namespace":"n0"}}`) // a duplicate
		}
	}
	b.WriteString(`],"kind":"List","metadata":{}}`)
	decodeWith := func(sequential bool, in []byte) (*Result, error) {
		var r Result
		r.decoder().sequential = sequential
		err := r.DecodeJSON("t", bytes.NewReader(in))
		return &r, err
	}
	seq, err := decodeWith(true, b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	par, err := decodeWith(false, b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(seq.Cluster.Pods) != 3000 || len(seq.Cluster.NetworkPolicies) != 6 || len(seq.Dropped) != 1 {
		t.Fatalf("sequential: %d pods, %d policies, dropped %v", len(seq.Cluster.Pods), len(seq.Cluster.NetworkPolicies), seq.Dropped)
	}
	if diff := cmp.Diff(seq, par, cmp.AllowUnexported(Result{}, location{}), cmpopts.IgnoreFields(Result{}, "dec"), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Fatalf("parallel differs (-sequential +parallel):\n%s", diff)
	}
	// A syntax error deep in the list is reported alike.
	broken := bytes.Replace(b.Bytes(), []byte(`"name":"p2500"`), []byte(`"name":"p2500",,`), 1)
	_, errSeq := decodeWith(true, broken)
	_, errPar := decodeWith(false, broken)
	if errSeq == nil || errPar == nil || errSeq.Error() != errPar.Error() {
		t.Fatalf("errors: sequential %v, parallel %v", errSeq, errPar)
	}
}

// Items are taken for objects as they stream by (a dump says "kind" after
// them); if the object holding them turns out not to be a List, it is
// dropped, and commands refuse to judge traffic.
func TestItemsInAnObjectThatIsNotAList(t *testing.T) {
	r := decodeString(t, `{"apiVersion":"networking.k8s.io/v1","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}],"kind":"NetworkPolicy","metadata":{"name":"p","namespace":"n"},"spec":{}}`)
	if len(r.Dropped) != 1 || r.Dropped[0] != "NetworkPolicy n/p" || len(r.Cluster.NetworkPolicies) != 0 {
		t.Errorf("dropped %v, policies %v", r.Dropped, r.Cluster.NetworkPolicies)
	}
	if d := diagStrings(r.Diagnostics); !strings.Contains(d, "items: a list of objects in a NetworkPolicy, which is not a List") {
		t.Errorf("diagnostics %s", d)
	}
}

// A NetworkPolicy decoding learned nothing about carries no Decoding (the
// agent caches tens of thousands of them); one with an unknown field or an
// unreadable part carries what was found.
func TestNetworkPolicyDecodingOnlyWhenFound(t *testing.T) {
	r := decodeString(t, `{"apiVersion": "networking.k8s.io/v1", "kind": "List", "items": [
{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "clean", "namespace": "a"}, "spec": {"podSelector": {}}},
{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "unknown", "namespace": "a"}, "spec": {"podSelector": {}, "bogus": 1}},
{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "wrong", "namespace": "a"}, "spec": {"podSelector": {}, "ingress": "x"}}]}`)
	nps := r.Cluster.NetworkPolicies
	if len(nps) != 3 {
		t.Fatalf("%d policies", len(nps))
	}
	if nps[0].Decoding != nil || nps[0].UnknownFields() != nil || nps[0].Invalid() != nil {
		t.Errorf("clean policy: Decoding %+v", nps[0].Decoding)
	}
	if nps[1].Decoding == nil || strings.Join(nps[1].UnknownFields(), ",") != "spec.bogus" || nps[1].Invalid() != nil {
		t.Errorf("unknown field: Decoding %+v", nps[1].Decoding)
	}
	if nps[2].Decoding == nil || nps[2].UnknownFields() != nil || len(nps[2].Invalid()) == 0 || nps[2].Invalid()[0].Field != "spec.ingress" {
		t.Errorf("unreadable rules: Decoding %+v", nps[2].Decoding)
	}
}

// Nesting is bounded, so that what a document costs grows with its size
// and no input can exhaust the stack: Lists nest at most maxListDepth deep
// (kubectl flattens nested Lists; Moat reads them to that depth), and
// arrays and objects anywhere at most maxNesting deep, as encoding/json
// allows. Deeper is an error for the document naming where it is.
func TestNestingBounded(t *testing.T) {
	lists := func(n int, inner string) string {
		return strings.Repeat(`{"apiVersion":"v1","kind":"List","items":[`, n) + inner + strings.Repeat(`]}`, n)
	}
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}`
	deep := func(n int) string { return strings.Repeat(`[{"a":`, n/2) + "1" + strings.Repeat(`}]`, n/2) }
	itemsOfItems := func(n int) string { return strings.Repeat(`{"items":[`, n) + strings.Repeat(`]}`, n) }
	manyPods := func(extra string) string {
		var b strings.Builder
		b.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
		for i := range 2000 {
			fmt.Fprintf(&b, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p%d"}},`, i)
		}
		b.WriteString(extra + `]}`)
		return b.String()
	}
	tooDeep := fmt.Sprintf("exceeded max depth of %d nested arrays and objects", maxNesting)
	for _, tc := range []struct {
		name, js string
		pods     int
		err      string // what the error says, when decoding fails
	}{
		{"lists at the bound", lists(maxListDepth, pod), 1, ""},
		{"lists past the bound", lists(maxListDepth+1, pod), 0, "t#1: " + strings.Repeat("items[0]: ", maxListDepth) + "items: a List nested in 8 others: Moat reads Lists nested at most 8 deep"},
		{"items of items without kinds", itemsOfItems(20), 0, "items: a List nested in 8 others"},
		// Split off whole on every core, the outer item meets the scanner's
		// bound before a worker decodes it.
		{"items of items, deeper than the scanner allows", itemsOfItems(3 * maxNesting), 0, "items: a List nested in 8 others|t#1: items[0]: invalid JSON at byte 50000: " + tooDeep},
		{"deep value in a pod at the bound", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"x":` + deep(maxNesting-2) + `}}`, 1, ""},
		{"deep value in a pod past the bound", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"x":` + deep(maxNesting) + `}}`, 0, "t#1: invalid JSON at byte 30062: " + tooDeep},
		{"deep value before the kind", `{"spec":{"x":` + deep(4*maxNesting) + `},"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}`, 0, tooDeep},
		{"deep value in a List item", manyPods(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"x":` + deep(4*maxNesting) + `}}`), 0, "t#1: items[2000]: invalid JSON at byte 150988: " + tooDeep},
		{"deep value in a List item, ending the item", manyPods(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"x":` + deep(maxNesting-4) + `}}`), 2001, ""},
		{"deep value at the top", deep(4 * maxNesting), 0, "not a Kubernetes object"},
	} {
		for _, sequential := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/sequential=%v", tc.name, sequential), func(t *testing.T) {
				var r Result
				r.decoder().sequential = sequential
				err := r.DecodeJSON("t", strings.NewReader(tc.js))
				if tc.err == "" && (err != nil || len(r.Cluster.Pods) != tc.pods) {
					t.Fatalf("err %v, %d pods, want %d", err, len(r.Cluster.Pods), tc.pods)
				}
				if tc.err != "" && (err == nil || !slices.ContainsFunc(strings.Split(tc.err, "|"), func(want string) bool { return strings.Contains(err.Error(), want) })) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				var y Result // as a YAML document converted to JSON
				errBytes := y.DecodeJSONBytes("t#1", []byte(tc.js))
				if (errBytes == nil) != (err == nil) || (tc.err == "" && len(y.Cluster.Pods) != tc.pods) {
					t.Fatalf("in memory: err %v, %d pods", errBytes, len(y.Cluster.Pods))
				}
			})
		}
	}
}

// A page of a list from the API server is one List of the kind asked for
// with its items, or an error naming what it is: an empty body or a
// Status answered with 200 (by a proxy in front of the server) is never
// an empty list.
func TestListPage(t *testing.T) {
	for _, tc := range []struct {
		name, js string
		pods     int
		cont     string
		err      string
	}{
		{"page", `{"kind":"PodList","apiVersion":"v1","metadata":{"continue":"abc"},"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}`, 2, "abc", ""},
		{"empty list", `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}`, 0, "", ""},
		{"empty body", "", 0, "", "cluster/pods: empty response, want a v1 PodList"},
		{"blank body", " \n", 0, "", "cluster/pods: empty response, want a v1 PodList"},
		{"a Status", `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"no","reason":"NotFound","code":404}`, 0, "", "cluster/pods: the response is a v1 Status, want a v1 PodList"},
		{"another kind", `{"kind":"NetworkPolicyList","apiVersion":"networking.k8s.io/v1","metadata":{},"items":[]}`, 0, "", "the response is a networking.k8s.io/v1 NetworkPolicyList, want a v1 PodList"},
		{"another version", `{"kind":"PodList","apiVersion":"v2","metadata":{},"items":[]}`, 0, "", "the response is a v2 PodList, want a v1 PodList"},
		{"a generic List", `{"kind":"List","apiVersion":"v1","metadata":{},"items":[]}`, 0, "", "the response is a v1 List, want a v1 PodList"},
		{"no items", `{"kind":"PodList","apiVersion":"v1","metadata":{}}`, 0, "", "the response is a v1 PodList without items"},
		{"no kind", `{"items":[]}`, 0, "", "the response is an object without apiVersion and kind, want a v1 PodList"},
		{"kind given twice", `{"kind":"PodList","kind":"PodList","apiVersion":"v1","items":[]}`, 0, "", "without items"},
		{"two values", `{"kind":"PodList","apiVersion":"v1","items":[]} {"kind":"PodList","apiVersion":"v1","items":[]}`, 0, "", "more than one JSON value, want one v1 PodList"},
		{"not JSON", `<html>`, 0, "", "cluster/pods#1: invalid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Result
			cont, err := r.DecodeListPage("cluster/pods", strings.NewReader(tc.js), "v1", "Pod")
			if tc.err == "" && (err != nil || cont != tc.cont || len(r.Cluster.Pods) != tc.pods) {
				t.Fatalf("err %v, continue %q, %d pods", err, cont, len(r.Cluster.Pods))
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err %v, want one containing %q", err, tc.err)
			}
		})
	}
}
