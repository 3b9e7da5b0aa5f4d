package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without -f and without a live cluster, check is an error: validating the
// embedded example would be a false green in CI.
func TestCheckNeedsInput(t *testing.T) {
	out, errOut, code := run(t, "", "check")
	if code != 1 || out != "" || !strings.Contains(errOut, "no input") || !strings.Contains(errOut, "-f FILE") {
		t.Errorf("check without input: code %d, out %q, stderr %q", code, out, errOut)
	}
}

// check and nft refuse to pass or print nothing: check on input without a
// single Kubernetes object, check on policy kinds Moat does not enforce,
// nft without input (its output goes to "nft -f" as root; the embedded
// example's ruleset must not get there by accident).
func TestNothingToCheckOrPrint(t *testing.T) {
	empty := t.TempDir()
	anp := "apiVersion: policy.networking.k8s.io/v1alpha1\nkind: AdminNetworkPolicy\nmetadata: {name: anp}\nspec: {priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}]}]}\n"
	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"check", "-f", empty}, "", "no Kubernetes objects in " + empty},
		{[]string{"check", "-f", "-"}, "", "no Kubernetes objects in -"},
		{[]string{"check", "-f", "-"}, "# only a comment\n---\n", "no Kubernetes objects in -"},
		{[]string{"check", "-f", "-"}, anp, "1 error(s)"},
		{[]string{"nft", "--node", "node-a"}, "", "no input"},
	} {
		_, errOut, code := run(t, tc.stdin, tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: code %d, stderr %q, want 1 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

// check counts an AdminNetworkPolicy as an error, so its line does not
// call it "ignored"; it says the rules are not applied,
// and names the file and document as every line of check does.
func TestCheckAdminNetworkPolicyLine(t *testing.T) {
	anp := "apiVersion: policy.networking.k8s.io/v1alpha1\nkind: AdminNetworkPolicy\nmetadata: {name: anp}\nspec: {priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}]}]}\n"
	out, errOut, code := run(t, anp, "check", "-f", "-")
	want := "AdminNetworkPolicy anp: kind: policy kind not enforced by Moat (use ClusterNetworkPolicy, policy.networking.k8s.io/v1alpha2): none of its rules is applied (<stdin>#1)\n"
	if code != 1 || out != want {
		t.Errorf("code %d, stderr %q, out %q, want %q", code, errOut, out, want)
	}
}

// Every command that reads input says on stderr which input it used.
func TestInputIsNamed(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"check", "-f", "../../examples/passive-ftp"}, "", "input: files ../../examples/passive-ftp\n"},
		{[]string{"matrix"}, "", `input: the embedded example "quickstart" (no -f and no live cluster given)`},
		{[]string{"explain", "--from", "frontend/web", "--to", "backend/db", "--port", "5432"}, "", `input: the embedded example "quickstart"`},
		{[]string{"matrix", "-f", "-", "--port", "80"}, readFile(t, "../../examples/quickstart/cluster.yaml"), "input: files -\n"},
	} {
		_, errOut, code := run(t, tc.stdin, tc.args...)
		if code != 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: code %d, stderr %q, want it to contain %q", tc.args, code, errOut, tc.want)
		}
	}
}

// The embedded example's matrix uses its matrix.args, so `moat matrix`
// alone prints the example's golden matrix.
func TestMatrixDefaultsToExampleArgs(t *testing.T) {
	out, errOut, code := run(t, "", "matrix")
	want := readFile(t, "../../examples/quickstart/matrix.golden")
	if code != 0 || out != want {
		t.Errorf("code %d, stderr %q, out:\n%s\nwant:\n%s", code, errOut, out, want)
	}
	if !strings.Contains(errOut, "ports and peers: the example's matrix.args (--peer 203.0.113.10)") {
		t.Errorf("stderr does not say where the ports came from: %q", errOut)
	}
}

func TestMatrixNamespaces(t *testing.T) {
	out, _, code := run(t, "", "matrix", "-n", "backend", "--port", "5432", "--peer", "203.0.113.10", "-o", "json")
	if code != 0 {
		t.Fatalf("code %d", code)
	}
	var doc struct {
		Flows []struct{ From, To string }
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	// backend/api, backend/db and the peer: 3 x 3.
	if len(doc.Flows) != 9 {
		t.Errorf("flows %d, want 9", len(doc.Flows))
	}
	for _, f := range doc.Flows {
		for _, e := range []string{f.From, f.To} {
			if !strings.HasPrefix(e, "backend/") && e != "203.0.113.10" {
				t.Errorf("endpoint %q outside -n backend", e)
			}
		}
	}
	if _, errOut, code := run(t, "", "matrix", "-n", "nosuch"); code != 1 || !strings.Contains(errOut, `namespace "nosuch"`) {
		t.Errorf("unknown namespace: code %d, stderr %q", code, errOut)
	}
}

func TestFeatureGatesFlag(t *testing.T) {
	for _, cmd := range [][]string{
		{"check", "-f", "../../examples/quickstart"},
		{"explain", "--from", "frontend/web", "--to", "backend/db", "--port", "5432"},
		{"matrix"},
		{"lab", "run"},
	} {
		args := append(append([]string(nil), cmd...), "--feature-gates", "NoSuchGate=true")
		if _, errOut, code := run(t, "", args...); code != 1 || !strings.Contains(errOut, "NoSuchGate") {
			t.Errorf("%v: unknown gate: code %d, stderr %q", cmd, code, errOut)
		}
	}
	if _, errOut, code := run(t, "", "check", "-f", "../../examples/quickstart", "--feature-gates", "IngressNetworksAndNodes=true"); code != 0 {
		t.Errorf("known gate: code %d, stderr %q", code, errOut)
	}
}

// --feature-gates offers and takes only the gates the CLI honours (review
// 13 F8): not the logging gates (the CLI has no logging flags), not the
// tunnel's, and not AllAlpha or AllBeta, which would turn
// IngressNetworksAndNodes on without naming it and change verdicts.
func TestFeatureGatesOnlyHonoured(t *testing.T) {
	out, _, code := run(t, "", "check", "--help")
	if code != 0 || !strings.Contains(out, "IngressNetworksAndNodes=true|false") {
		t.Fatalf("check --help: code %d, out %q", code, out)
	}
	for _, gate := range []string{"AllAlpha", "AllBeta", "ContextualLogging", "LoggingAlphaOptions", "LoggingBetaOptions", "EnableClusterToMasterTraffic"} {
		if strings.Contains(out, gate) {
			t.Errorf("check --help offers %s", gate)
		}
		for _, cmd := range [][]string{
			{"check", "-f", "../../examples/unknown-field-fail-closed"},
			{"matrix"},
		} {
			args := append(append([]string(nil), cmd...), "--feature-gates", gate+"=true")
			if _, errOut, code := run(t, "", args...); code != 1 || !strings.Contains(errOut, gate) {
				t.Errorf("%v: code %d, stderr %q, want 1 naming %s", args, code, errOut, gate)
			}
		}
	}
}

// As the kubectl plugin, the live cluster is the default source; with no
// cluster configured that is an error naming the kubeconfig, never a
// silent fallback to the example.
func TestPluginReadsLiveClusterByDefault(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "missing"))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, errOut, code := runAs(t, true, "", "matrix")
	if code != 1 || !strings.Contains(errOut, "kubeconfig") {
		t.Errorf("plugin without a cluster: code %d, stderr %q", code, errOut)
	}
	out, errOut, code := runAs(t, true, "", "check", "--live=false", "-f", "../../examples/passive-ftp")
	if code != 0 || !strings.Contains(out, "ok:") {
		t.Errorf("plugin with --live=false: code %d, out %q, stderr %q", code, out, errOut)
	}
	// lab up and apply read files only: given -f, they take it (here a
	// missing file, so that no lab is built); without, they say to pass -f.
	for _, sub := range []string{"up", "apply"} {
		_, errOut, code = runAs(t, true, "", "lab", sub, "-f", "no-such-file.yaml")
		if code != 1 || !strings.Contains(errOut, "no-such-file.yaml") || strings.Contains(errOut, "files only") {
			t.Errorf("plugin lab %s -f: code %d, stderr %q", sub, code, errOut)
		}
	}
	if _, errOut, code = runAs(t, true, "", "lab", "up"); code != 1 || !strings.Contains(errOut, "pass it with -f") {
		t.Errorf("plugin lab up: code %d, stderr %q", code, errOut)
	}
	out, _, _ = runAs(t, true, "", "--help")
	if !strings.Contains(out, "kubectl moat") {
		t.Errorf("plugin help does not say kubectl moat:\n%s", out)
	}
}

func TestVersion(t *testing.T) {
	out, _, code := run(t, "", "version", "-o", "json")
	var v buildVersion
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("code %d, out %q", code, out)
	}
	// A test binary's main module is this one.
	if v.Module != "github.com/moat-net/moat" || v.GoVersion == "" {
		t.Errorf("version %+v", v)
	}
	if out, _, code := run(t, "", "version"); code != 0 || !strings.HasPrefix(out, "github.com/moat-net/moat ") {
		t.Errorf("text: code %d, out %q", code, out)
	}
}

func TestCompletion(t *testing.T) {
	out, _, code := run(t, "", "completion", "bash")
	if code != 0 || !strings.Contains(out, "__start_moat") {
		t.Errorf("bash completion: code %d, %.200s", code, out)
	}
	out, _, code = run(t, "", "__complete", "matrix", "-o", "")
	if code != 0 || !strings.Contains(out, "html\n") || !strings.Contains(out, "json\n") {
		t.Errorf("-o completion: code %d, %q", code, out)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config")
	if err := os.WriteFile(cfg, []byte("apiVersion: v1\nkind: Config\ncontexts:\n- name: prod\n  context: {cluster: c}\n- name: dev\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, code = run(t, "", "__complete", "matrix", "--kubeconfig", cfg, "--context", "")
	if code != 0 || !strings.Contains(out, "dev\nprod\n") {
		t.Errorf("--context completion: code %d, %q", code, out)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Each example's matrix.args given to the CLI reproduce its golden matrix,
// --feature-gates included; without the gate, some examples' matrices
// differ (the gate reaches the compiler).
func TestExamplesThroughCLI(t *testing.T) {
	dirs, err := filepath.Glob("../../examples/*/matrix.args")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("%d examples, %v", len(dirs), err)
	}
	differ := 0
	for _, argsFile := range dirs {
		dir := filepath.Dir(argsFile)
		args := append([]string{"matrix", "-f", dir}, strings.Fields(readFile(t, argsFile))...)
		out, errOut, code := run(t, "", args...)
		if want := readFile(t, filepath.Join(dir, "matrix.golden")); code != 0 || out != want {
			t.Errorf("%v: code %d, stderr %q, out:\n%s\nwant:\n%s", args, code, errOut, out, want)
		}
		for i, a := range args {
			if a == "--feature-gates" {
				off := append(append([]string(nil), args[:i]...), args[i+2:]...)
				if out2, _, _ := run(t, "", off...); out2 != out {
					differ++
				}
			}
		}
	}
	if differ == 0 {
		t.Error("no example's matrix depends on its --feature-gates")
	}
}

func TestInvocation(t *testing.T) {
	for _, tc := range []struct {
		argv0      string
		args, want []string
		plugin     bool
	}{
		{"/usr/bin/moat", []string{"matrix"}, []string{"matrix"}, false},
		{"/home/u/.krew/bin/kubectl-moat", []string{"matrix", "-n", "x"}, []string{"matrix", "-n", "x"}, true},
		{"kubectl-moat.exe", nil, nil, true},
		{"/usr/local/bin/kubectl_complete-moat", []string{"matrix", "-o", ""}, []string{"__complete", "matrix", "-o", ""}, true},
	} {
		plugin, args := invocation(tc.argv0, tc.args)
		if plugin != tc.plugin || strings.Join(args, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s %v: plugin %v, args %q", tc.argv0, tc.args, plugin, args)
		}
	}
}

// Flag mistakes are reported in words, naming the flag: no Go parser
// names, no "got 0" for a flag that was not given.
func TestFlagErrorsInWords(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"matrix", "--feature-gates", "IngressNetworksAndNodes=maybe"}, `"--feature-gates" flag: IngressNetworksAndNodes=maybe: want true or false`},
		{[]string{"check", "-f", "../../examples/quickstart", "--feature-gates", "IngressNetworksAndNodes=true,IngressNetworksAndNodes=1x"}, "IngressNetworksAndNodes=1x: want true or false"},
		{[]string{"explain", "--from", "frontend/web", "--to", "backend/db"}, "--port is required"},
		{[]string{"explain", "--from", "frontend/web", "--to", "backend/db", "--port", "0"}, "--port: must be between 1 and 65535, got 0"},
	} {
		_, errOut, code := run(t, "", tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "strconv") {
			t.Errorf("%v: code %d, stderr %q, want 1 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestMatrixMaxEndpoints: past --max-endpoints (default 2000) matrix
// refuses before judging anything, with the sizes and how to narrow it;
// -n narrows it, and --max-endpoints 0 lifts the limit.
func TestMatrixMaxEndpoints(t *testing.T) {
	_, errOut, code := run(t, "", "matrix", "-n", "backend", "--port", "5432", "--peer", "203.0.113.10", "--max-endpoints", "2")
	if code != 1 || !strings.Contains(errOut, "3 endpoints") || !strings.Contains(errOut, "-n NAMESPACE") || !strings.Contains(errOut, "--max-endpoints 0") {
		t.Errorf("3 endpoints, --max-endpoints 2: code %d, stderr %q", code, errOut)
	}
	if _, errOut, code := run(t, "", "matrix", "-n", "backend", "--port", "5432", "--peer", "203.0.113.10", "--max-endpoints", "3"); code != 0 {
		t.Errorf("3 endpoints, --max-endpoints 3: code %d, stderr %q", code, errOut)
	}
	// 2,001 pods in two namespaces: refused by default, printed for one
	// namespace or without the limit.
	var b strings.Builder
	b.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
	b.WriteString(`{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}},{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"b"}}`)
	for i := range 2001 {
		ns := "a"
		if i%2 == 1 {
			ns = "b"
		}
		fmt.Fprintf(&b, `,{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p%d","namespace":"%s"},"spec":{"containers":[{"name":"c","image":"x"}]},"status":{"phase":"Running","podIP":"10.1.%d.%d"}}`, i, ns, i/256, i%256)
	}
	b.WriteString(`]}`)
	_, errOut, code = run(t, b.String(), "matrix", "-f", "-", "--port", "80")
	if code != 1 || !strings.Contains(errOut, "2001 endpoints (in 2 classes the policies tell apart) make 4004001 cells on each of 1 port(s), a table of about 20.1 MB, more than --max-endpoints 2000") {
		t.Errorf("2,001 pods by default: code %d, stderr %q", code, errOut)
	}
	out, errOut, code := run(t, b.String(), "matrix", "-f", "-", "--port", "80", "-n", "b")
	if code != 0 || strings.Count(out, "\n") != 1002 {
		t.Errorf("-n b: code %d, %d lines, stderr %q", code, strings.Count(out, "\n"), errOut)
	}
	out, errOut, code = run(t, b.String(), "matrix", "-f", "-", "--port", "80", "--max-endpoints", "0")
	if code != 0 || strings.Count(out, "\n") != 2003 || strings.Count(out, "X") != 1 {
		t.Errorf("--max-endpoints 0: code %d, %d lines, stderr %q", code, strings.Count(out, "\n"), errOut)
	}
}

// moat check prints at most maxFindingsPerObject findings of one object
// and maxFindings in all, then a count, unless -v: its output stays within
// a small multiple of its input (60 KB printed 113 MB).
func TestCheckFindingsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"p","namespace":"a"},"spec":{"podSelector":{}`)
	for i := range 30 {
		fmt.Fprintf(&b, `,"u%d":0`, i)
	}
	b.WriteString("}}\n")
	out, _, code := run(t, b.String(), "check", "-f", "-")
	if code != 1 || strings.Count(out, "NetworkPolicy a/p: spec.u") != maxFindingsPerObject || !strings.HasSuffix(out, "\n... and 10 more findings (shown: at most 20 per object, 1000 in all; -v lists every one)\n") {
		t.Errorf("one object: code %d, out:\n%s", code, out)
	}
	b.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
	for i := range 1500 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"metadata":{"name":"x%d"}}`, i)
	}
	b.WriteString("]}\n")
	out, errOut, code := run(t, b.String(), "check", "-f", "-")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || !strings.Contains(errOut, "1530 error(s)") || len(lines) != maxFindings+1 ||
		lines[len(lines)-1] != "... and 530 more findings (shown: at most 20 per object, 1000 in all; -v lists every one)" {
		t.Errorf("code %d, stderr %q, %d lines, last %q", code, errOut, len(lines), lines[len(lines)-1])
	}
	out, _, code = run(t, b.String(), "check", "-v", "-f", "-")
	if code != 1 || strings.Count(out, "\n") != 1530 {
		t.Errorf("-v: code %d, %d lines", code, strings.Count(out, "\n"))
	}
}

// kubectl's -v=N was refused ("strconv.ParseBool"); it is
// verbose for N > 0, quiet for 0, and anything else is still an error.
func TestVerboseTakesKubectlLevels(t *testing.T) {
	const in = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: a}\n"
	for _, tc := range []struct {
		flag    string
		code    int
		skipped bool
	}{
		{"-v", 0, true}, {"-v=6", 0, true}, {"--verbose=2", 0, true}, {"-v=true", 0, true},
		{"-v=0", 0, false}, {"--verbose=false", 0, false}, {"-v=-1", 1, false}, {"-v=lots", 1, false},
	} {
		_, errOut, code := run(t, in, "check", "-f", "-", tc.flag)
		if code != tc.code || strings.Contains(errOut, "skipped: ConfigMap c") != tc.skipped {
			t.Errorf("%s: code %d, stderr %q", tc.flag, code, errOut)
		}
	}
}
