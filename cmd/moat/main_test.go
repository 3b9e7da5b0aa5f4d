package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// run executes the CLI in-process and returns stdout, stderr and the exit
// status main would use.
func run(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	return runAs(t, false, stdin, args...)
}

// runAs is run, as moat or as the kubectl plugin.
func runAs(t *testing.T, plugin bool, stdin string, args ...string) (string, string, int) {
	t.Helper()
	root := newRootCommand(plugin)
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	code := 0
	if err := root.Execute(); err != nil {
		code = report(&errOut, "moat", err)
	}
	return out.String(), errOut.String(), code
}

func TestCheck(t *testing.T) {
	out, _, code := run(t, "", "check", "-f", "../../examples/passive-ftp")
	if code != 0 || !strings.Contains(out, "ok: 2 NetworkPolicies") {
		t.Errorf("valid example: code %d, out %q", code, out)
	}
	out, _, code = run(t, "", "check", "-f", "../../examples/unknown-field-fail-closed")
	if code != 1 {
		t.Errorf("invalid example: code %d", code)
	}
	for _, want := range []string{
		"ClusterNetworkPolicy allow-icmp-monitoring: spec.ingress[0].protocols[0].icmp: unknown field",
		"ClusterNetworkPolicy deny-by-service-account: spec.ingress[0].from[0].serviceAccounts: unknown field",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	const bad = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: ns1}\nspec: {podSelector: {}, ingress: [{ports: [{port: 80}, {port: 90, endPort: 80}]}]}\n"
	out, _, code = run(t, bad, "check", "-f", "-")
	if code != 1 || !strings.HasPrefix(out, "NetworkPolicy ns1/p: spec.ingress[0].ports[1].endPort: Invalid value: 80: must be greater than or equal to `port`") {
		t.Errorf("stdin: code %d, out %q", code, out)
	}
}

func TestExplain(t *testing.T) {
	out, _, code := run(t, "", "explain", "--from", "frontend/web", "--to", "backend/db", "--port", "5432")
	if code != 0 || !strings.Contains(out, "DENIED") || !strings.Contains(out, "NetworkPolicies select the pod for ingress (backend/db-from-api)") {
		t.Errorf("code %d out:\n%s", code, out)
	}
	out, _, code = run(t, "", "explain", "--from", "backend/api", "--to", "10.244.2.30", "--port", "5432", "-o", "json")
	if code != 0 {
		t.Fatalf("code %d", code)
	}
	var f map[string]any
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatal(err)
	}
	ing := f["ingress"].(map[string]any)
	if f["allowed"] != true || ing["tier"] != "NetworkPolicy" || ing["policy"].(map[string]any)["name"] != "db-from-api" || ing["rule"] != 0.0 {
		t.Errorf("json = %s", out)
	}
	// Isolation: explain's JSON lists every isolating NetworkPolicy; a
	// matrix's cells leave them out (the reason names them).
	out, _, code = run(t, "", "explain", "--from", "frontend/web", "--to", "backend/db", "--port", "5432", "-o", "json")
	if code != 0 || !strings.Contains(out, `"isolating": [`) || !strings.Contains(out, `"name": "db-from-api"`) {
		t.Errorf("explain -o json of an isolated flow: code %d\n%s", code, out)
	}
	out, _, code = run(t, "", "matrix", "--port", "5432/TCP", "-o", "json")
	if code != 0 || strings.Contains(out, "isolating") || !strings.Contains(out, "NetworkPolicies select the pod for ingress (backend/db-from-api)") {
		t.Errorf("matrix -o json: code %d, want the reason and no isolating lists\n%s", code, out)
	}
	for _, args := range [][]string{
		{"explain", "--from", "nope/pod", "--to", "backend/db", "--port", "1"},
		{"explain", "--from", "backend/api", "--to", "backend/db", "--port", "0"},
		{"explain", "--from", "backend/api", "--to", "backend/db", "--port", "1", "--protocol", "ICMP"},
		{"explain", "--from", "backend/api", "--to", "bogus", "--port", "1"},
	} {
		if _, errOut, code := run(t, "", args...); code != 1 || errOut == "" {
			t.Errorf("%v: code %d, stderr %q", args, code, errOut)
		}
	}
	// A bad -o is refused before the input is read, whatever the input.
	for _, cmd := range [][]string{{"matrix"}, {"diff", "--after", "/does/not/exist"}, {"explain", "--from", "a/b", "--to", "c/d", "--port", "80"}} {
		args := append(cmd, "-f", "/does/not/exist", "-o", "yaml")
		if _, errOut, code := run(t, "", args...); code != 1 || !strings.Contains(errOut, "-o: must be") {
			t.Errorf("%v: code %d, stderr %q; want the -o error", args, code, errOut)
		}
	}
}

func TestMatrixJSONSchema(t *testing.T) {
	out, _, code := run(t, "", "matrix", "--port", "5432/TCP", "--peer", "203.0.113.10", "-o", "json")
	if code != 0 {
		t.Fatalf("code %d", code)
	}
	var doc map[string][]map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	flows := doc["flows"]
	// 5 pods (host-network included) + 1 peer, every ordered pair, 1 port.
	if len(doc) != 1 || len(flows) != 36 {
		t.Fatalf("keys %d, flows %d", len(doc), len(flows))
	}
	for _, f := range flows {
		if len(f) != 7 {
			t.Fatalf("flow keys: %v", f)
		}
		for _, k := range []string{"from", "to", "port", "protocol", "allowed", "egress", "ingress"} {
			if _, ok := f[k]; !ok {
				t.Fatalf("flow lacks %q: %v", k, f)
			}
		}
	}
}

func TestMatrixHTMLIsSelfContained(t *testing.T) {
	out, _, code := run(t, "", "matrix", "-o", "html")
	// The page renders from its embedded data (driven in Chromium by the
	// matrix package's tests): the namespaces and pods are in it.
	if code != 0 || !strings.Contains(out, `<table id="summary">`) || !strings.Contains(out, `"groups":["backend","frontend","monitoring","(peers)"]`) || !strings.Contains(out, `"names":["api","db","web",`) {
		t.Fatalf("code %d, html:\n%.4000s", code, out)
	}
	for _, remote := range []string{"http://", "https://", "<script src", "<link"} {
		if strings.Contains(out, remote) {
			t.Errorf("html references %q", remote)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"matrix", "--port", "99999"},
		{"matrix", "--port", "80/ICMP"},
		{"matrix", "--peer", "not-an-ip"},
		{"matrix", "-o", "yaml"},
		{"matrix", "-f", "/does/not/exist"},
	} {
		if _, errOut, code := run(t, "", args...); code != 1 || errOut == "" {
			t.Errorf("%v: code %d, stderr %q", args, code, errOut)
		}
	}
}

// A dual-stack pair is judged over both families: policies may differ.
func TestExplainDualStack(t *testing.T) {
	const in = `apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ds}
status: {podIPs: [{ip: 10.1.0.1}, {ip: "fd00:1::1"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: ds}
status: {podIPs: [{ip: 10.1.0.2}, {ip: "fd00:1::2"}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: v4-deny}
spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, egress: [{action: Deny, to: [{networks: [10.0.0.0/8]}]}]}
`
	out, _, code := run(t, in, "explain", "-f", "-", "--from", "ds/a", "--to", "ds/b", "--port", "80")
	if code != 0 || !strings.Contains(out, "ds/a -> ds/b 80/TCP: DENIED") || !strings.Contains(out, "fd00:1::1 -> fd00:1::2 80/TCP: ALLOWED") {
		t.Errorf("code %d, out:\n%s", code, out)
	}
}

// Past 20 warnings a command counts the rest; -v prints them all. A
// policy enforced fail-closed is reported first, before the other
// warnings can fill the 20 lines.
func TestWarningsCapped(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a, labels: {app: x}}\nspec: {}\nstatus: {podIPs: [{ip: 10.0.0.1}]}\n")
	for i := range 25 {
		fmt.Fprintf(&b, "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np%02d, namespace: a}\nspec:\n  podSelector: {}\n  ingress: [{ports: [{port: nope%d}]}]\n", i, i)
	}
	for i := range 3 {
		fmt.Fprintf(&b, "---\napiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: c%02d}\nspec:\n  tier: Admin\n  priority: %d\n  subject: {namespaces: {}}\n  ingress: [{action: Deny, from: [{serviceAccounts: {}}]}]\n", i, i)
	}
	args := []string{"explain", "-f", "-", "--from", "10.0.0.9", "--to", "a/p", "--port", "80"}
	for _, c := range []struct {
		verbose   bool
		warnings  int
		truncated bool
	}{{false, 20, true}, {true, 35, false}} { // -v adds the validation errors behind the 3 notices, as warnings
		a := args
		if c.verbose {
			a = append(slices.Clone(args), "-v")
		}
		_, errOut, code := run(t, b.String(), a...)
		if code != 0 {
			t.Fatalf("-v=%v: code %d, stderr:\n%s", c.verbose, code, errOut)
		}
		if !strings.Contains(errOut, "ClusterNetworkPolicy c02") {
			t.Errorf("-v=%v: the last fail-closed policy is not reported:\n%s", c.verbose, errOut)
		}
		if n := strings.Count(errOut, "warning: "); n != c.warnings {
			t.Errorf("-v=%v: %d warnings printed, want %d:\n%s", c.verbose, n, c.warnings, errOut)
		}
		if strings.Contains(errOut, "error: ") {
			t.Errorf("-v=%v: an error line, yet the command succeeded:\n%s", c.verbose, errOut)
		}
		if got := strings.Contains(errOut, "... and 9 more warnings"); got != c.truncated {
			t.Errorf("-v=%v: count line printed = %v, want %v:\n%s", c.verbose, got, c.truncated, errOut)
		}
	}
}

// A line labelled "error:" means the command fails, and a command that
// fails says why with one. Commands that judge traffic answer around an
// invalid value of an object they loaded, as moat-agent enforces it (a
// podIP that disagrees with podIPs: podIPs is used; an address that does
// not parse: left out), so they warn and exit 0; check, which validates,
// reports it as an error and exits 1. An object that could not be loaded
// stops every command.
func TestErrorLabelsMatchExitStatus(t *testing.T) {
	const pods = `apiVersion: v1
kind: Pod
metadata: {name: p1, namespace: a}
spec: {nodeName: n1}
status: {podIP: 10.0.0.9, podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: p2, namespace: a}
spec: {nodeName: n1}
status: {podIPs: [{ip: 10.0.0.2}, {ip: "fd00::x"}]}
`
	const dup = "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n"
	explain := []string{"explain", "-f", "-", "--from", "a/p2", "--to", "a/p1", "--port", "80"}
	matrix := []string{"matrix", "-f", "-", "--port", "80/TCP"}
	mismatch := `Pod a/p1: status.podIP: "10.0.0.9" must equal status.podIPs[0].ip "10.0.0.1": status.podIPs is used`
	badIP := `Pod a/p2: status.podIPs[1].ip: invalid IP "fd00::x": left out`
	for _, tc := range []struct {
		name     string
		input    string
		args     []string
		code     int
		want     []string // lines (prefixes) stderr or stdout must hold
		notError bool     // no "error:" line
	}{
		{"explain warns", pods, explain, 0, []string{"warning: " + mismatch, "warning: " + badIP}, true},
		{"matrix warns", pods, matrix, 0, []string{"warning: " + mismatch, "warning: " + badIP}, true},
		{"explain -v warns", pods, append(slices.Clone(explain), "-v"), 0, []string{"warning: " + mismatch}, true},
		{"check fails", pods, []string{"check", "-f", "-"}, 1, []string{mismatch, badIP, "moat: 2 error(s)"}, false},
		{"an object not loaded stops explain", pods + dup, explain, 1, []string{"warning: " + mismatch, "error: Namespace a: duplicate object", "refusing to judge traffic"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, tc.input, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstderr:\n%s", code, tc.code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(out+errOut, w) {
					t.Errorf("no %q in\nstdout:\n%s\nstderr:\n%s", w, out, errOut)
				}
			}
			if tc.notError && strings.Contains(errOut, "error:") {
				t.Errorf("an error line, yet exit 0:\n%s", errOut)
			}
		})
	}
}

// TestExplainHairpin: explain --from X --to X says that a
// pod's connection to its own address is not policed and adds the
// verdict on its connection through a Service back to itself, which an
// Admin Deny denies.
func TestExplainHairpin(t *testing.T) {
	const y = `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {app: p}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {podIP: 10.1.1.1}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin-deny}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: p}}}}
  ingress:
  - {action: Deny, from: [{namespaces: {}}]}
`
	out, _, code := run(t, y, "explain", "-f", "-", "--from", "a/p", "--to", "a/p", "--port", "80")
	if code != 0 || !strings.Contains(out, "a/p -> a/p 80/TCP: ALLOWED") ||
		!strings.Contains(out, "a/p -> a/p through a Service (hairpin) 80/TCP: DENIED") ||
		!strings.Contains(out, "ClusterNetworkPolicy admin-deny ingress rule 0 denies it") {
		t.Errorf("code %d out:\n%s", code, out)
	}
	out, _, _ = run(t, y, "explain", "-f", "-", "--from", "a/p", "--to", "a/p", "--port", "80", "-o", "json")
	var f struct {
		Allowed bool
		Hairpin *struct{ Allowed bool }
	}
	if err := json.Unmarshal([]byte(out), &f); err != nil || !f.Allowed || f.Hairpin == nil || f.Hairpin.Allowed {
		t.Errorf("json: %v %+v\n%s", err, f, out)
	}
}
