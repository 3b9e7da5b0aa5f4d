package manifest_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

func TestLoadDirectoryRecursiveYAMLJSONList(t *testing.T) {
	var l manifest.Loader
	res, err := l.Load("testdata/tree")
	if err != nil {
		t.Fatal(err)
	}
	c := res.Cluster
	if len(c.Namespaces) != 1 || c.Namespaces[0].Name != "one" {
		t.Errorf("namespaces = %+v", c.Namespaces)
	}
	if len(c.Pods) != 2 {
		t.Fatalf("pods = %+v", c.Pods)
	}
	p := c.Pods[0]
	want := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}
	if p.Name != "p" || p.NodeName != "n1" || p.Labels["a"] != "b" || len(p.IPs) != 2 || p.IPs[0] != want[0] || p.IPs[1] != want[1] {
		t.Errorf("pod = %+v", p)
	}
	if len(p.Ports) != 2 || p.Ports[0] != (policy.ContainerPort{Name: "dns", Protocol: policy.ProtoUDP, Port: 53}) || p.Ports[1].Protocol != policy.ProtoTCP {
		t.Errorf("ports = %+v", p.Ports)
	}
	if len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0], "ConfigMap skipped") {
		t.Errorf("skipped = %v", res.Skipped)
	}
	// A pod without an IP is loaded and reported by the compiler.
	prog := policy.Compile(&c, policy.Options{})
	found := false
	for _, d := range prog.Diagnostics {
		if d.Object == "Pod one/noip" && strings.Contains(d.Message, "no IP") {
			found = true
		}
	}
	if !found {
		t.Errorf("pod without IP not reported: %v", prog.Diagnostics)
	}
}

func TestLoadBadInput(t *testing.T) {
	cases := []struct {
		name, doc string
		// fatal: Load itself fails; otherwise wantDiag must appear and
		// dropped says whether the object is left out.
		fatal    string
		wantDiag string
		dropped  bool
	}{
		{name: "malformed YAML", doc: "kind: [oops", fatal: "document 1"},
		{name: "scalar document", doc: "just a string", fatal: "not a Kubernetes object"},
		{name: "wrong apiVersion", doc: "apiVersion: extensions/v1beta1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}}",
			wantDiag: `NetworkPolicy default/p: apiVersion: unsupported apiVersion "extensions/v1beta1"`, dropped: true},
		{name: "missing kind", doc: "apiVersion: v1\nmetadata: {name: p}", wantDiag: "kind: missing kind", dropped: true},
		{name: "wrong metadata type", doc: "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: [c]}\nspec: {priority: 1}",
			wantDiag: "ClusterNetworkPolicy <no name>: metadata.name: cannot decode: must be a string, found a list: object not loaded", dropped: true},
		{name: "misspelled kind", doc: "apiVersion: networking.k8s.io/v1\nkind: Networkpolicy\nmetadata: {name: p}\nspec: {podSelector: {}}",
			wantDiag: `Networkpolicy p: kind: unknown kind "Networkpolicy" in apiVersion "networking.k8s.io/v1" (did you mean NetworkPolicy?): object not loaded`, dropped: true},
		{name: "duplicate object", doc: "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}",
			wantDiag: "Namespace a: : duplicate object, also defined at <stdin>#1", dropped: true},
		{name: "AdminNetworkPolicy warned", doc: "apiVersion: policy.networking.k8s.io/v1alpha1\nkind: AdminNetworkPolicy\nmetadata: {name: anp}", wantDiag: "AdminNetworkPolicy anp: kind: policy kind not enforced by Moat"},
		{name: "duplicate field", doc: "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}, podSelector: {}}",
			fatal: "document 1"},
		{name: "NetworkPolicy without namespace", doc: "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}}",
			wantDiag: "NetworkPolicy default/p: metadata.namespace: not set: judged in namespace default, but kubectl apply puts it in the namespace of -n or of the current context: give -n NAMESPACE"},
		{name: "bad pod IP", doc: "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nstatus: {podIP: 10.0.0.300}", wantDiag: `Pod default/p: status.podIP: invalid IP "10.0.0.300"`},
		{name: "bad pod IPs", doc: "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nstatus: {podIPs: [{ip: 10.0.0.1}, {ip: fd00::x}]}", wantDiag: `Pod default/p: status.podIPs[1].ip: invalid IP "fd00::x"`},
		{name: "pod IP not the first of pod IPs", doc: "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nstatus: {podIP: 10.0.0.2, podIPs: [{ip: 10.0.0.1}]}", wantDiag: `Pod default/p: status.podIP: "10.0.0.2" must equal status.podIPs[0].ip "10.0.0.1": status.podIPs is used`},
		// Nesting is bounded in YAML as in JSON: Lists in
		// Lists 8 deep, values 10,000 deep (the YAML decoder's own limit).
		{name: "Lists nested too deep", doc: "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n" + strings.Repeat("{items: [", 9) + strings.Repeat("]}", 9),
			fatal: "<stdin>: document 2: " + strings.Repeat("items[0]: ", 8) + "items: a List nested in 8 others: Moat reads Lists nested at most 8 deep"},
		{name: "value nested too deep", doc: "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {x: " + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + "}",
			fatal: "<stdin>: document 1: invalid YAML: yaml: line 4: exceeded max depth of 10000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := manifest.Loader{Stdin: strings.NewReader(c.doc)}
			res, err := l.Load("-")
			if c.fatal != "" {
				if err == nil || !strings.Contains(err.Error(), c.fatal) {
					t.Fatalf("err = %v, want one containing %q", err, c.fatal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var all []string
			for _, d := range res.Diagnostics {
				all = append(all, d.Object+": "+d.Field+": "+d.Message)
			}
			joined := strings.Join(all, "\n")
			if !strings.Contains(joined, c.wantDiag) {
				t.Errorf("diagnostics:\n%s\nwant one containing %q", joined, c.wantDiag)
			}
			if (len(res.Dropped) > 0) != c.dropped {
				t.Errorf("dropped = %v, want dropped=%v", res.Dropped, c.dropped)
			}
		})
	}
}

func TestLoadMissingFileNamesIt(t *testing.T) {
	var l manifest.Loader
	_, err := l.Load("testdata/nope.yaml")
	if err == nil || !strings.Contains(err.Error(), "testdata/nope.yaml") {
		t.Fatalf("err = %v", err)
	}
}

// A finished pod's address may already belong to a new pod: like the
// agent, the loader leaves it out.
func TestFinishedPodsSkipped(t *testing.T) {
	l := manifest.Loader{Stdin: strings.NewReader("apiVersion: v1\nkind: Pod\nmetadata: {name: done}\nstatus: {phase: Succeeded, podIP: 10.0.0.9}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: live}\nstatus: {phase: Running, podIP: 10.0.0.9}")}
	res, err := l.Load("-")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cluster.Pods) != 1 || res.Cluster.Pods[0].Name != "live" || len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0], "phase Succeeded") {
		t.Errorf("pods %+v, skipped %v", res.Cluster.Pods, res.Skipped)
	}
}

// StdinCopy receives stdin as read: a command loads "-" and keeps it.
func TestStdinCopy(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n",
		`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}]}`,
	} {
		var kept strings.Builder
		res, err := (&manifest.Loader{Stdin: strings.NewReader(doc), StdinCopy: &kept}).Load("-")
		if err != nil {
			t.Fatal(err)
		}
		if kept.String() != doc || len(res.Cluster.Namespaces) != 1 {
			t.Errorf("kept %q, namespaces %v", kept.String(), res.Cluster.Namespaces)
		}
	}
}

// A file named twice, directly or through its directory, is read once: its
// objects are not reported as duplicates of themselves. Two files that
// define one object still are.
func TestFileNamedTwiceReadOnce(t *testing.T) {
	for _, paths := range [][]string{
		{"testdata/tree/a.yaml", "testdata/tree/a.yaml"},
		{"testdata/tree", "testdata/tree/a.yaml"},
		{"testdata/tree/sub/b.json", "testdata/tree/sub/../sub/b.json", "testdata/tree"},
	} {
		var l manifest.Loader
		res, err := l.Load(paths...)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Dropped) > 0 {
			t.Errorf("%v: dropped %v: %v", paths, res.Dropped, res.Diagnostics)
		}
	}
	dir := t.TempDir()
	doc := []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n")
	for _, f := range []string{"x.yaml", "y.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, f), doc, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var l manifest.Loader
	res, err := l.Load(filepath.Join(dir, "x.yaml"), filepath.Join(dir, "y.yaml"))
	if err != nil || len(res.Dropped) != 1 {
		t.Errorf("one object in two files: err %v, dropped %v", err, res.Dropped)
	}
}
