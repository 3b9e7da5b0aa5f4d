package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// dbAlsoFromWeb is a proposed change to the quickstart: the database also
// admits the web tier.
const dbAlsoFromWeb = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-api, namespace: backend}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: api}}}, {namespaceSelector: {matchLabels: {team: web}}}]
    ports: [{port: 5432}]
`

func TestDiff(t *testing.T) {
	const qs = "../../examples/quickstart"
	out, errOut, code := run(t, dbAlsoFromWeb, "diff", "-f", qs, "--after", "-", "--peer", "203.0.113.10")
	if code != exitChanged || !strings.HasPrefix(out, "1 of 48 flows change verdict") ||
		!strings.Contains(out, "frontend/web  backend/db  5432/TCP  denied  allowed  ingress: NetworkPolicies select the pod for ingress (backend/db-from-api) and no rule allows it  ingress: NetworkPolicy backend/db-from-api ingress rule 0 allows it") {
		t.Errorf("code %d, stderr %q, out:\n%s", code, errOut, out)
	}
	if !strings.Contains(errOut, "input: files "+qs) || !strings.Contains(errOut, "proposed: the input with - layered on top") {
		t.Errorf("stderr does not name both states: %q", errOut)
	}

	// No change: exit 0. The same object applied again changes nothing.
	out, _, code = run(t, readFile(t, qs+"/policy.yaml"), "diff", "-f", qs, "--after", "-")
	if code != 0 || !strings.HasPrefix(out, "0 of 20 flows change verdict") {
		t.Errorf("no change: code %d, out %q", code, out)
	}

	// Deletions, as JSON.
	out, _, code = run(t, "", "diff", "-f", qs, "--delete", "cnp/allow-monitoring", "-o", "json")
	var doc struct {
		Changes []struct {
			From, To      string
			Port          int
			Protocol      string
			Before, After struct {
				Allowed         bool
				Egress, Ingress struct{ Reason string }
			}
		}
		Flows, Judged int
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != exitChanged {
		t.Fatalf("code %d, %v: %s", code, err, out)
	}
	if len(doc.Changes) != 2 || doc.Flows != 20 || doc.Judged == 0 || doc.Judged > doc.Flows {
		t.Errorf("json: %+v", doc)
	}
	for _, c := range doc.Changes {
		if c.From != "monitoring/prometheus" || !c.Before.Allowed || c.After.Allowed || !strings.Contains(c.Before.Ingress.Reason, "allow-monitoring") {
			t.Errorf("change %+v", c)
		}
	}

	// --prune: --after is the complete set of policies; here only one of
	// the four is kept.
	out, _, code = run(t, dbAlsoFromWeb, "diff", "-f", qs, "--after", "-", "--prune", "-o", "html")
	if code != exitChanged || !strings.Contains(out, "<table>") || strings.Contains(out, "<script src") || strings.Contains(out, "http://") {
		t.Errorf("prune html: code %d:\n%.3000s", code, out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"diff", "-f", qs}, "nothing proposed"},
		{[]string{"diff", "--after", qs}, "no input"},
		{[]string{"diff", "-f", qs, "--delete", "netpol/backend/nope"}, "NetworkPolicy backend/nope: no such object"},
		{[]string{"diff", "-f", qs, "--delete", "service/x"}, "unknown kind"},
		{[]string{"diff", "-f", "-", "--after", "-"}, "cannot both read stdin"},
		{[]string{"diff", "-f", qs, "--delete", "cnp/allow-monitoring", "-o", "yaml"}, "-o"},
		{[]string{"diff", "-f", qs, "--prune", "--delete", "cnp/allow-monitoring"}, "--prune needs --after"},
	} {
		if _, errOut, code := run(t, "", tc.args...); code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: code %d, stderr %q, want %q", tc.args, code, errOut, tc.want)
		}
	}
}
