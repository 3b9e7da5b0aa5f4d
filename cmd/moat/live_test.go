package main

import (
	"strings"
	"testing"
)

// TestLiveCluster runs the commands against a real kube-apiserver holding
// the quickstart example: the live matrix is the example's golden matrix,
// -f files are layered on top as a proposed change, and the kubectl plugin
// reads the cluster by default.
func TestLiveCluster(t *testing.T) {
	env, kc := liveQuickstart(t, "")
	golden := readFile(t, quickstart+"/matrix.golden")

	out, errOut, code := run(t, "", "matrix", "--kubeconfig", kc, "--peer", "203.0.113.10")
	if code != 0 || out != golden {
		t.Errorf("live matrix: code %d, stderr %q, out:\n%s\nwant:\n%s", code, errOut, out, golden)
	}
	if !strings.Contains(errOut, "input: cluster "+env.URL+": ") || !strings.Contains(errOut, "5 pods") || !strings.Contains(errOut, "2 clusternetworkpolicies") {
		t.Errorf("stderr does not name the cluster and its contents: %q", errOut)
	}

	// $KUBECONFIG and --context, as kubectl.
	t.Setenv("KUBECONFIG", kc)
	if out, errOut, code := run(t, "", "check", "--context", "moat-test"); code != 0 || !strings.Contains(out, "ok: 2 NetworkPolicies, 2 ClusterNetworkPolicies valid") {
		t.Errorf("live check: code %d, out %q, stderr %q", code, out, errOut)
	}
	if _, errOut, code := run(t, "", "check", "--context", "no-such-context"); code != 1 || !strings.Contains(errOut, "no-such-context") {
		t.Errorf("unknown context: code %d, stderr %q", code, errOut)
	}

	// A proposed change layered on the cluster: dbAlsoFromWeb, db-from-api
	// now also admitting the web tier.
	before, _, _ := run(t, "", "explain", "--live", "--from", "frontend/web", "--to", "backend/db", "--port", "5432")
	after, errOut, code := run(t, dbAlsoFromWeb, "explain", "--live", "-f", "-", "--from", "frontend/web", "--to", "backend/db", "--port", "5432")
	if !strings.Contains(before, "DENIED") || code != 0 || !strings.Contains(after, "ALLOWED") || !strings.Contains(after, "backend/db-from-api ingress rule 0 allows it") {
		t.Errorf("layered change: before:\n%s\nafter (code %d):\n%s%s", before, code, after, errOut)
	}
	if !strings.Contains(errOut, "with - layered on top") {
		t.Errorf("stderr does not say the files are layered: %q", errOut)
	}
	// An invalid change is refused even though the cluster is fine.
	bad := strings.Replace(dbAlsoFromWeb, "port: 5432", "port: 5432, endPort: 80", 1)
	if out, _, code := run(t, bad, "check", "--live", "-f", "-"); code != 1 || !strings.Contains(out, "NetworkPolicy backend/db-from-api: spec.ingress[0].ports[0].endPort") {
		t.Errorf("invalid change: code %d, out %q", code, out)
	}

	// What-if against the cluster: the same change, as moat diff.
	if out, errOut, code := run(t, dbAlsoFromWeb, "diff", "--live", "--after", "-"); code != exitChanged || !strings.Contains(out, "frontend/web  backend/db  5432/TCP  denied  allowed") {
		t.Errorf("live diff: code %d, stderr %q, out:\n%s", code, errOut, out)
	}

	// The kubectl plugin reads the current context's cluster by default.
	if out, errOut, code := runAs(t, true, "", "matrix", "--peer", "203.0.113.10"); code != 0 || out != golden {
		t.Errorf("kubectl moat matrix: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
}
