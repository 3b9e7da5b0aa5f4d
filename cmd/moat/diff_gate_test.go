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

// --after (or -f) given as a link to a directory read as
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

// denyNoNamespace is denyBackend as a repository applied with -n holds it.
const denyNoNamespace = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
`

// A NetworkPolicy without a namespace was judged in default
// whatever kubectl apply would do with it. -n places it, as kubectl apply
// -n does; without -n (and without a live source, see
// TestDiffGateLiveNamespace) it stays in default, with a warning that says
// how to judge it elsewhere.
func TestDiffGateNamespaceFlag(t *testing.T) {
	want, _, code := run(t, denyBackend, "diff", "-f", quickstart, "--after", "-")
	if code != exitChanged {
		t.Fatalf("with its namespace: code %d", code)
	}
	out, errOut, code := run(t, denyNoNamespace, "diff", "-f", quickstart, "-n", "backend", "--after", "-")
	if code != exitChanged || out != want {
		t.Errorf("-n backend: code %d, stderr %q, out:\n%s\nwant:\n%s", code, errOut, out, want)
	}
	if !strings.Contains(errOut, "(objects without a namespace in backend, -n)") || strings.Contains(errOut, "metadata.namespace") {
		t.Errorf("-n backend: stderr %q", errOut)
	}
	out, errOut, code = run(t, denyNoNamespace, "diff", "-f", quickstart, "--namespace=backend", "--after", "-")
	if code != exitChanged || out != want {
		t.Errorf("--namespace=backend: code %d, stderr %q", code, errOut)
	}
	// Without -n: default, and the warning says what to do.
	_, errOut, code = run(t, denyNoNamespace, "diff", "-f", quickstart, "--after", "-")
	if code != 0 || !strings.Contains(errOut, "NetworkPolicy default/deny-all: metadata.namespace: not set: judged in namespace default, but kubectl apply puts it in the namespace of -n or of the current context: give -n NAMESPACE") {
		t.Errorf("no -n: code %d, stderr %q", code, errOut)
	}
	// An object naming another namespace than -n is refused, as kubectl
	// apply -n refuses it: in the current state and in --after.
	_, errOut, code = run(t, denyBackend, "diff", "-f", quickstart, "-n", "frontend", "--after", "-")
	if code != 1 || !strings.Contains(errOut, `the namespace from the provided object "backend" does not match the namespace "frontend" given with -n`) {
		t.Errorf("-n frontend, object in backend: code %d, stderr %q", code, errOut)
	}
	out, _, code = run(t, denyNoNamespace, "check", "-n", "backend", "-f", "-")
	if code != 0 || !strings.Contains(out, "ok: 1 NetworkPolicies") {
		t.Errorf("check -n: code %d, %q", code, out)
	}
	// explain takes -n too; the -f files that are the snapshot itself (a
	// dump of every namespace) only have their objects without a
	// namespace placed.
	out, errOut, code = run(t, denyNoNamespace, "explain", "-f", quickstart, "-f", "-", "-n", "backend", "--from", "backend/api", "--to", "backend/db", "--port", "5432")
	if code != 0 || !strings.Contains(out, "DENIED") || !strings.Contains(out, "backend/deny-all") {
		t.Errorf("explain -n: code %d, stderr %q, out %q", code, errOut, out)
	}
}

// --after replaced a live Namespace or Pod whole. Now it is
// merged as kubectl apply merges it: labels the manifest does not mention
// stay (with a warning naming them), and a pod keeps its status.
func TestDiffGateMergesAsApply(t *testing.T) {
	// The repository's Namespace manifest without the team=web label that
	// api-from-web selects on: apply keeps the label, nothing changes.
	out, errOut, code := run(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: frontend, labels: {owner: web-team}}\n", "diff", "-f", quickstart, "--after", "-")
	if code != 0 || !strings.HasPrefix(out, "0 of ") {
		t.Errorf("namespace manifest without team: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
	if !strings.Contains(errOut, "warning: Namespace frontend: metadata.labels: labels team=web kept from the current state") {
		t.Errorf("kept labels not named: %q", errOut)
	}
	// A Pod manifest (spec only, as in a repository) keeps the running
	// pod's address, so the policy opening it to everyone is judged.
	const podAndPolicy = `apiVersion: v1
kind: Pod
metadata: {name: db, namespace: backend, labels: {app: db}}
spec: {containers: [{name: db, image: postgres}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-open, namespace: backend}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{}]
`
	out, errOut, code = run(t, podAndPolicy, "diff", "-f", quickstart, "--after", "-")
	if code != exitChanged || strings.Contains(out, "pods removed") || !strings.Contains(out, "backend/db-open ingress rule 0 allows it") {
		t.Errorf("pod manifest: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
}

// --delete ns/X kept X's pods, minus their namespace's
// labels, a state Kubernetes cannot reach.
func TestDiffGateDeleteNamespaceCascades(t *testing.T) {
	out, errOut, code := run(t, "", "diff", "-f", quickstart, "--delete", "ns/frontend")
	if !strings.Contains(out, "pods removed (flows not compared): frontend/web") || strings.Contains(out, "frontend/web  backend/api") {
		t.Errorf("code %d, stderr %q, out:\n%s", code, errOut, out)
	}
	if !strings.Contains(errOut, "deleting Namespace frontend (and, as Kubernetes deletes them with it, the 1 Pod(s) and 0 NetworkPolicy(ies) in it)") {
		t.Errorf("stderr %q", errOut)
	}
}

// Pods only one state has are a change: --delete of a namespace whose pod
// no policy judges anew still cuts every flow to and from it, and a new
// pod is reachable by what the policies say. Listed but exit 0 before.
func TestDiffGateAddedOrRemovedPodIsAChange(t *testing.T) {
	out, errOut, code := run(t, "", "diff", "-f", quickstart, "--delete", "ns/frontend")
	if code != exitChanged || !strings.Contains(out, "pods removed (flows not compared): frontend/web") || !strings.Contains(errOut, "1 pod(s) removed") {
		t.Errorf("namespace deleted: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
	const newPod = `apiVersion: v1
kind: Pod
metadata: {name: extra, namespace: frontend, labels: {app: extra}}
spec: {nodeName: node-a, containers: [{name: c, image: i}]}
status: {podIP: 10.244.1.99, podIPs: [{ip: 10.244.1.99}]}
`
	out, errOut, code = run(t, newPod, "diff", "-f", quickstart, "--after", "-")
	if code != exitChanged || !strings.Contains(out, "pods added (flows not compared): frontend/extra") || !strings.Contains(errOut, "1 pod(s) added") {
		t.Errorf("pod added: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
	// A pod without an address is neither: it is not policed and no
	// flow reaches it.
	noIP := strings.Replace(newPod, "status: {podIP: 10.244.1.99, podIPs: [{ip: 10.244.1.99}]}\n", "", 1)
	out, errOut, code = run(t, noIP, "diff", "-f", quickstart, "--after", "-")
	if code != 0 || strings.Contains(out, "pods added") {
		t.Errorf("pod without an address: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
}
