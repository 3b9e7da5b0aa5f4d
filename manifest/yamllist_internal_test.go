package manifest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/moat-net/moat/decode"
	"github.com/moat-net/moat/internal/clustergen"
)

// wholeDoc is how every YAML document was read before Lists were split:
// converted whole, then decoded (decodeYAML's old body, for one document).
func wholeDoc(res *decode.Result, name string, raw []byte) error {
	js, err := yamlToJSON(raw)
	if err != nil {
		return fmt.Errorf("%s: document 1: invalid YAML: %w%s", name, err, templateHint(raw))
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return nil
	}
	if err := res.DecodeJSONBytes(name+"#1", js); err != nil {
		return fmt.Errorf("%s: document 1: %w", name, err)
	}
	return nil
}

// sameAsWhole reads doc as decodeYAML does and as wholeDoc does, with -n
// given, and fails unless results and errors are the same; it returns
// whether the List was read a batch at a time.
func sameAsWhole(t *testing.T, name, doc string) (split bool) {
	t.Helper()
	results := [2]*decode.Result{}
	errs := [2]string{}
	for i := range results {
		results[i] = &decode.Result{Namespace: "team", EnforceNamespace: true}
		var err error
		if i == 0 {
			err = decodeYAML(results[i], name, bufio.NewReader(strings.NewReader(doc)), 1)
		} else {
			err = wholeDoc(results[i], name, []byte(doc))
		}
		if err != nil {
			errs[i] = err.Error()
		}
	}
	a, b := results[0], results[1]
	if errs[0] != errs[1] {
		t.Fatalf("%s: error %q, read whole %q", name, errs[0], errs[1])
	}
	if errs[0] == "" && (!reflect.DeepEqual(a.Cluster, b.Cluster) || !reflect.DeepEqual(a.Diagnostics, b.Diagnostics) ||
		!reflect.DeepEqual(a.Dropped, b.Dropped) || !reflect.DeepEqual(a.Skipped, b.Skipped) || !reflect.DeepEqual(a.LastApplied, b.LastApplied)) {
		t.Fatalf("%s: read in batches:\n%+v\n%v %v %v\nread whole:\n%+v\n%v %v %v", name, a.Cluster, a.Diagnostics, a.Dropped, a.Skipped, b.Cluster, b.Diagnostics, b.Dropped, b.Skipped)
	}
	_, split = splitYAMLList([]byte(doc))
	if split {
		r := &decode.Result{Namespace: "team", EnforceNamespace: true}
		split = decodeYAMLList(r, name+"#1", []byte(doc))
	}
	// Read from a file, the items are read again from it instead of held:
	// same result, same error, read in batches or not alike.
	path := filepath.Join(t.TempDir(), "doc.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := &decode.Result{Namespace: "team", EnforceNamespace: true}
	streamed, err := decodeYAMLAt(r, name, bufio.NewReader(f), f, 1)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != errs[1] {
		t.Fatalf("%s: read from a file: error %q, read whole %q", name, msg, errs[1])
	}
	if msg == "" && !sameResult(r, b) {
		t.Fatalf("%s: read from a file:\n%+v\n%v %v %v\nread whole:\n%+v\n%v %v %v", name, r.Cluster, r.Diagnostics, r.Dropped, r.Skipped, b.Cluster, b.Diagnostics, b.Dropped, b.Skipped)
	}
	if (streamed == 1) != split {
		t.Fatalf("%s: read from a file in batches: %v, in memory: %v", name, streamed == 1, split)
	}
	return split
}

func sameResult(a, b *decode.Result) bool {
	return reflect.DeepEqual(a.Cluster, b.Cluster) && reflect.DeepEqual(a.Diagnostics, b.Diagnostics) &&
		reflect.DeepEqual(a.Dropped, b.Dropped) && reflect.DeepEqual(a.Skipped, b.Skipped) && reflect.DeepEqual(a.LastApplied, b.LastApplied)
}

// A YAML List was converted to JSON whole (about 25 times its
// size in memory). Its items are now converted a batch at a time and
// streamed to the decoder; whatever the document, the result or the error
// is the whole conversion's, byte for byte, and only a List written as
// kubectl writes it (no alias, no directive) takes the batches.
func TestYAMLListReadAsWhole(t *testing.T) {
	pod := func(name, extra string) string {
		return "- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: " + name + "\n    labels: {app: web}\n  spec:\n    containers:\n    - name: c\n      ports:\n      - containerPort: 80\n" + extra + "  status:\n    podIP: 10.0.0." + name[1:] + "\n"
	}
	np := "- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n  metadata: {name: np}\n  spec:\n    podSelector: {}\n    ingress:\n    - from: [{podSelector: {matchLabels: {app: web}}}]\n      bogus: 1\n"
	list := func(items string) string {
		return "apiVersion: v1\nitems:\n" + items + "kind: List\nmetadata:\n  resourceVersion: \"\"\n"
	}
	for _, tc := range []struct {
		name, doc string
		split     bool // read in batches
	}{
		{"kubectl list", list(pod("p1", "") + np + pod("p2", "")), true},
		{"typed list, items before kind", "apiVersion: v1\nitems:\n- metadata: {name: a}\n  status: {podIP: 10.0.0.1}\n- metadata: {name: b}\nkind: PodList\n", true},
		{"items indented", "kind: List\napiVersion: v1\nitems:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: a}\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: b}\n", true},
		{"comments, blank lines, CRLF", strings.ReplaceAll(list("# first\n"+pod("p1", "")+"\n# between\n\n"+pod("p2", "")+"# last\n"), "\n", "\r\n"), true},
		{"block scalars keeping blank lines", list(pod("p1", "    args:\n    - |+\n      a\n\n\n") + pod("p2", "    args:\n    - |-\n      b\n\n")), true},
		{"a dash alone", list("-\n  apiVersion: v1\n  kind: Namespace\n  metadata: {name: a}\n"), true},
		{"another namespace", list(pod("p1", "") + "- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: c, namespace: other}\n"), true},
		{"nested list", list("- apiVersion: v1\n  kind: List\n  items:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: n}\n"), true},
		{"item not an object", list(pod("p1", "") + "- 5\n"), false}, // an error: read whole for its message
		{"empty list", "apiVersion: v1\nitems: []\nkind: List\n", false},
		{"null items", "apiVersion: v1\nitems:\nkind: List\n", false},
		{"key twice in an item", list(pod("p1", "") + "- apiVersion: v1\n  kind: Namespace\n  kind: Namespace\n  metadata: {name: a}\n"), false},
		{"items twice", list(pod("p1", "")) + "items:\n" + pod("p2", ""), false},
		{"items twice, flow", list(pod("p1", "")) + "items: []\n", false},
		{"key twice at the top", "kind: List\n" + list(pod("p1", "")), false},
		{"anchor and alias across items", list("- apiVersion: v1\n  kind: Namespace\n  metadata: &m {name: a}\n- apiVersion: v1\n  kind: Namespace\n  metadata:\n    <<: *m\n    name: b\n"), false},
		{"directive", "%YAML 1.1\n" + list(pod("p1", "")), false},
		{"stars that are no alias", list(pod("p1", "    args: [sh, -c, 'ls *.log', \"x *\"]\n    command:\n    - echo *\n") + "- apiVersion: batch/v1\n  kind: CronJob\n  metadata: {name: c, namespace: team}\n  spec: {schedule: '*/5 * * * *'}\n"), true},
		{"anchor and alias in one item", list(pod("p1", "") + "- apiVersion: v1\n  kind: Namespace\n  metadata: {name: a, labels: &l {x: y}}\n  spec: {l: *l}\n"), false},
		{"alias at the top", "apiVersion: &v v1\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata: {name: a}\nkind: List\nz: *v\n", false},
		{"quoted scalar hiding items", "apiVersion: v1\nkind: List\nz: \"x\nitems:\n" + pod("p1", "") + "\"\nitems: []\n", false},
		{"quoted scalar across items", list("- apiVersion: v1\n  kind: Namespace\n  metadata: {name: a}\n  z: \"x\n" + pod("p1", "") + "\"\n"), false},
		{"single-quoted across items", list("- apiVersion: v1\n  kind: Namespace\n  metadata: {name: a}\n  z: 'x\n" + pod("p1", "") + "'\n"), false},
		{"quoted scalar across the end", list("- apiVersion: v1\n  kind: Namespace\n  metadata: {name: a}\n  z: \"x\n") + "y\"\n", false},
		{"template", list("- apiVersion: v1\n  kind: Namespace\n  metadata: {name: {{ .Values.name }}}\n"), false},
		{"items not a list", "apiVersion: v1\nkind: List\nitems:\n  a: b\n", false},
		{"less indented inside", "apiVersion: v1\nkind: List\nitems:\n  - apiVersion: v1\n    kind: Namespace\n    metadata: {name: a}\n - x\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if split := sameAsWhole(t, "list.yaml", tc.doc); split != tc.split {
				t.Errorf("read in batches: %v, want %v", split, tc.split)
			}
		})
	}
}

// A cluster dump large enough for many batches, as `kubectl get -A -o
// yaml` prints it, reads as the whole conversion reads it; so does the
// same dump with one item broken at its end, in its middle, and one item
// with a key set twice.
func TestYAMLListDumpReadAsWhole(t *testing.T) {
	var buf bytes.Buffer
	g := clustergen.Generate(clustergen.Config{Nodes: 3, Namespaces: 10, Pods: 120, NetworkPolicies: 20, ClusterPolicies: 4, Seed: 3})
	if err := g.WriteJSON(&buf, clustergen.Kubectl); err != nil {
		t.Fatal(err)
	}
	doc, err := sigsyaml.JSONToYAML(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(doc); n < 4*listBatchBytes {
		t.Fatalf("dump of %d bytes: too small for several batches", n)
	}
	if split := sameAsWhole(t, "dump.yaml", string(doc)); !split {
		t.Fatal("the dump was not read in batches")
	}
	mid := len(doc)/2 + bytes.Index(doc[len(doc)/2:], []byte("\n- ")) + 1 // an item's start
	for name, broken := range map[string]string{
		"bad value at the end": string(doc) + "- apiVersion: v1\n  kind: Namespace\n  metadata: {name: [}\n",
		"key twice mid-way":    string(doc[:mid]) + "- apiVersion: v1\n  kind: Namespace\n  metadata: {name: x}\n  metadata: {name: y}\n" + string(doc[mid:]),
		"item not an object":   string(doc[:mid]) + "- 7\n" + string(doc[mid:]),
	} {
		sameAsWhole(t, name, broken)
	}
}
