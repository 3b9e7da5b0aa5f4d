package manifest_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/manifest"
)

const denyAll = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: backend}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
`

const backendNS = `apiVersion: v1
kind: Namespace
metadata: {name: backend}
`

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// A directory given through a symbolic link is read as the directory it
// points to (filepath.WalkDir alone reads such a root as nothing).
func TestLoadSymlinkedDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "real", "deny.yaml"), denyAll)
	symlink(t, "real", filepath.Join(dir, "link"))
	res, err := (&manifest.Loader{}).Load(filepath.Join(dir, "link"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cluster.NetworkPolicies) != 1 || len(res.Dropped) != 0 {
		t.Fatalf("policies %d, dropped %v", len(res.Cluster.NetworkPolicies), res.Dropped)
	}
	files, err := manifest.Files(nil, filepath.Join(dir, "link"))
	if err != nil || len(files) != 1 || files[0] != filepath.Join(dir, "link", "deny.yaml") {
		t.Errorf("Files = %v, %v; want the file by the link's path", files, err)
	}
}

// Links inside a directory are followed too: to a file, and to a
// directory (a loop back up is not entered again).
func TestLoadFollowsLinksInside(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "elsewhere", "ns.yaml"), backendNS)
	write(t, filepath.Join(dir, "other", "deny.yaml"), denyAll)
	root := filepath.Join(dir, "root")
	write(t, filepath.Join(root, "README.md"), "not read")
	symlink(t, filepath.Join(dir, "elsewhere", "ns.yaml"), filepath.Join(root, "ns.yaml"))
	symlink(t, filepath.Join(dir, "other"), filepath.Join(root, "policies"))
	symlink(t, root, filepath.Join(root, "policies-loop"))
	files, err := manifest.Files(nil, root)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(root, "ns.yaml"), filepath.Join(root, "policies", "deny.yaml")}
	if !slices.Equal(files, want) {
		t.Errorf("Files = %v, want %v", files, want)
	}
	res, err := (&manifest.Loader{}).Load(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cluster.Namespaces) != 1 || len(res.Cluster.NetworkPolicies) != 1 || len(res.Dropped) != 0 {
		t.Errorf("namespaces %d, policies %d, dropped %v", len(res.Cluster.Namespaces), len(res.Cluster.NetworkPolicies), res.Dropped)
	}
}

// A ConfigMap volume (kubelet's layout: a timestamped directory, ..data
// linking to it, and a link per key into ..data) is read once, by the
// keys' names.
func TestLoadConfigMapVolume(t *testing.T) {
	dir := t.TempDir()
	ts := "..2026_11_26_00_00_00.000"
	write(t, filepath.Join(dir, ts, "deny.yaml"), denyAll)
	write(t, filepath.Join(dir, ts, "ns.yaml"), backendNS)
	symlink(t, ts, filepath.Join(dir, "..data"))
	symlink(t, filepath.Join("..data", "deny.yaml"), filepath.Join(dir, "deny.yaml"))
	symlink(t, filepath.Join("..data", "ns.yaml"), filepath.Join(dir, "ns.yaml"))
	res, err := (&manifest.Loader{}).Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Dropped) != 0 || len(res.Cluster.NetworkPolicies) != 1 || len(res.Cluster.Namespaces) != 1 {
		t.Fatalf("dropped %v, diagnostics %v", res.Dropped, res.Diagnostics)
	}
	if src := res.Cluster.NetworkPolicies[0].Source; src != filepath.Join(dir, "deny.yaml")+"#1" {
		t.Errorf("policy read as %s, want it by its key's name", src)
	}
}

// One file under two spellings (relative and absolute, a link and its
// target) is read once: its objects are not duplicates of themselves.
func TestLoadSameFileTwoSpellings(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "d", "deny.yaml"), denyAll)
	symlink(t, "d", filepath.Join(dir, "d-link"))
	t.Chdir(dir)
	res, err := (&manifest.Loader{}).Load("d", filepath.Join(dir, "d"), "d-link", "d-link/deny.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Dropped) != 0 || len(res.Cluster.NetworkPolicies) != 1 {
		t.Errorf("dropped %v: %v", res.Dropped, res.Diagnostics)
	}
}

// A path that yields no object is an error naming it, whatever it is: an
// empty directory, one without manifests, a manifest of comments only,
// stdin with nothing.
func TestLoadNothingIsAnError(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "docs", "README.md"), "no manifests")
	write(t, filepath.Join(dir, "comments", "a.yaml"), "# nothing yet\n---\n")
	write(t, filepath.Join(dir, "good.yaml"), denyAll)
	symlink(t, "empty", filepath.Join(dir, "empty-link"))
	for _, p := range []string{empty, filepath.Join(dir, "docs"), filepath.Join(dir, "comments"), filepath.Join(dir, "comments", "a.yaml"), filepath.Join(dir, "empty-link")} {
		_, err := (&manifest.Loader{}).Load(filepath.Join(dir, "good.yaml"), p)
		if err == nil || !strings.Contains(err.Error(), "no Kubernetes objects in "+p) {
			t.Errorf("%s: err %v, want no Kubernetes objects in it", p, err)
		}
	}
	_, err := (&manifest.Loader{Stdin: strings.NewReader("# nothing\n")}).Load("-")
	if err == nil || !strings.Contains(err.Error(), "no Kubernetes objects in -") {
		t.Errorf("stdin: %v", err)
	}
	// A path whose files were all read before is not empty.
	if _, err := (&manifest.Loader{}).Load(dir+"/good.yaml", dir+"/./good.yaml"); err != nil {
		t.Errorf("a file named twice: %v", err)
	}
}

// kubectl -f takes a quoted pattern ('dir/*.yaml') and
// reads each match; moat said "no such file". A pattern nothing matches
// is an error, a URL is refused with what to do instead.
func TestLoadPattern(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a", "deny.yaml"), denyAll)
	write(t, filepath.Join(dir, "a", "ns.yaml"), backendNS)
	write(t, filepath.Join(dir, "a", "notes.txt"), "not read")
	write(t, filepath.Join(dir, "b", "c", "ns.yml"), "apiVersion: v1\nkind: Namespace\nmetadata: {name: other}\n")
	for _, tc := range []struct {
		pattern  string
		ns, nps  int
		files    int
		errMatch string
	}{
		{pattern: "a/*.yaml", ns: 1, nps: 1, files: 2},
		{pattern: "a/d*", nps: 1, files: 1},
		{pattern: "[ab]", ns: 2, nps: 1, files: 3}, // directories, read whole
		{pattern: "a/*.json", errMatch: "no path matches it as a pattern"},
		{pattern: "a/[", errMatch: "pattern"},
	} {
		p := filepath.Join(dir, tc.pattern)
		files, err := manifest.Files(nil, p)
		res, lerr := (&manifest.Loader{}).Load(p)
		if tc.errMatch != "" {
			if err == nil || lerr == nil || !strings.Contains(lerr.Error(), tc.errMatch) {
				t.Errorf("%s: files %v, %v; load %v", tc.pattern, files, err, lerr)
			}
			continue
		}
		if err != nil || lerr != nil || len(files) != tc.files || len(res.Cluster.Namespaces) != tc.ns || len(res.Cluster.NetworkPolicies) != tc.nps {
			t.Errorf("%s: files %v, %v; load %v", tc.pattern, files, err, lerr)
		}
	}
	// A file whose name holds pattern characters is read as named.
	write(t, filepath.Join(dir, "lit[1].yaml"), backendNS)
	if res, err := (&manifest.Loader{}).Load(filepath.Join(dir, "lit[1].yaml")); err != nil || len(res.Cluster.Namespaces) != 1 {
		t.Errorf("literal name: %v", err)
	}
	_, err := (&manifest.Loader{}).Load("https://example.com/policies.yaml")
	if err == nil || !strings.Contains(err.Error(), "moat reads files only: download it first") {
		t.Errorf("URL: %v", err)
	}
}
