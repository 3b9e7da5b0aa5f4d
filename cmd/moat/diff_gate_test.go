package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tests here hold moat diff to its use as a CI gate (exit 0 = the
// change alters no traffic): every way of giving the proposed manifests
// that kubectl apply would act on must be judged, and input that cannot be
// judged must fail, never pass as "no change".

const quickstart = "../../examples/quickstart"

// denyBackend isolates backend both ways: 13 of the quickstart's flows
// change.
const denyBackend = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: backend}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
`

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Review 9 F1: --after (or -f) given as a link to a directory read as
// nothing, and an empty directory too: "0 flows change", exit 0.
func TestDiffGateReadsLinkedDirectories(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "newpol", "deny.yaml"), denyBackend)
	if err := os.Symlink("newpol", filepath.Join(dir, "newpol-link")); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(quickstart)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(abs, filepath.Join(dir, "cur-link")); err != nil {
		t.Fatal(err)
	}
	want, _, code := run(t, "", "diff", "-f", quickstart, "--after", filepath.Join(dir, "newpol"))
	if code != exitChanged || !strings.Contains(want, "flows change verdict") {
		t.Fatalf("the directory itself: code %d, %q", code, want)
	}
	for _, args := range [][]string{
		{"-f", quickstart, "--after", filepath.Join(dir, "newpol-link")},
		{"-f", filepath.Join(dir, "cur-link"), "--after", filepath.Join(dir, "newpol")},
		// The current state named twice is read once, not as duplicates.
		{"-f", quickstart, "-f", abs, "-f", filepath.Join(dir, "cur-link"), "--after", filepath.Join(dir, "newpol")},
	} {
		out, errOut, code := run(t, "", append([]string{"diff"}, args...)...)
		if code != exitChanged || out != want {
			t.Errorf("%v: code %d, stderr %q, out:\n%s", args, code, errOut, out)
		}
	}
}

// An --after or -f that yields no object is an error naming it, for diff
// as for every command that reads manifests.
func TestDiffGateRefusesEmptyInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(dir, "comments.yaml"), "# rendered nothing\n")
	for _, args := range [][]string{
		{"diff", "-f", quickstart, "--after", empty},
		{"diff", "-f", quickstart, "--after", filepath.Join(dir, "comments.yaml")},
		{"diff", "-f", empty, "--after", quickstart},
		{"diff", "-f", quickstart, "-f", empty, "--delete", "ns/backend"},
		{"matrix", "-f", empty},
		{"explain", "-f", empty, "--from", "frontend/web", "--to", "backend/api", "--port", "8080"},
		{"nft", "-f", empty, "--node", "node-a"},
	} {
		_, errOut, code := run(t, "", args...)
		if code != 1 || !strings.Contains(errOut, "no Kubernetes objects in ") {
			t.Errorf("%v: code %d, stderr %q", args, code, errOut)
		}
	}
	_, errOut, code := run(t, "", "diff", "-f", quickstart, "--after", "-")
	if code != 1 || !strings.Contains(errOut, "--after: no Kubernetes objects in - (standard input)") {
		t.Errorf("empty stdin: code %d, stderr %q", code, errOut)
	}
}
