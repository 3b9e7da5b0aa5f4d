package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	if code != exitChanged || !strings.HasPrefix(out, "1 of 129 flows change verdict") ||
		!strings.Contains(out, "frontend/web  backend/db  5432/TCP  denied  allowed  ingress: NetworkPolicies select the pod for ingress (backend/db-from-api) and no rule allows it  ingress: NetworkPolicy backend/db-from-api ingress rule 0 allows it") {
		t.Errorf("code %d, stderr %q, out:\n%s", code, errOut, out)
	}
	if !strings.Contains(errOut, "input: files "+qs) || !strings.Contains(errOut, "proposed: the input with - layered on top") {
		t.Errorf("stderr does not name both states: %q", errOut)
	}

	// No change: exit 0. The same object applied again changes nothing.
	out, _, code = run(t, readFile(t, qs+"/policy.yaml"), "diff", "-f", qs, "--after", "-")
	if code != 0 || !strings.HasPrefix(out, "0 of 107 flows change verdict") {
		t.Errorf("no change: code %d, out %q", code, out)
	}

	// Deletions, as JSON: prometheus loses every port of the api and the
	// database: the port their NetworkPolicies allow others on, and the
	// rest.
	out, _, code = run(t, "", "diff", "-f", qs, "--delete", "cnp/allow-monitoring", "-o", "json")
	var doc struct {
		Changes []struct {
			From, To        string
			Port            int
			Protocol, Ports string
			Before, After   struct {
				Allowed         bool
				Egress, Ingress struct{ Reason string }
			}
		}
		Flows, Judged int
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != exitChanged {
		t.Fatalf("code %d, %v: %s", code, err, out)
	}
	if len(doc.Changes) != 4 || doc.Flows != 107 || doc.Judged == 0 || doc.Judged > doc.Flows {
		t.Errorf("json: %+v", doc)
	}
	var ports []string
	for _, c := range doc.Changes {
		if c.From != "monitoring/prometheus" || !c.Before.Allowed || c.After.Allowed || !strings.Contains(c.Before.Ingress.Reason, "allow-monitoring") {
			t.Errorf("change %+v", c)
		}
		ports = append(ports, fmt.Sprintf("%s %d/%s (%s)", c.To, c.Port, c.Protocol, c.Ports))
	}
	if want := "backend/db 1/TCP (any port or protocol but TCP 5432)"; !slices.Contains(ports, want) || !slices.Contains(ports, "backend/db 5432/TCP ()") {
		t.Errorf("no %q among %q", want, ports)
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

// reviewCluster is a review's cluster (two nodes, dual stack): pod c
// declares only 443, pod quiet declares no port.
const reviewCluster = `apiVersion: v1
kind: Node
metadata: {name: node-a}
status: {addresses: [{type: InternalIP, address: 192.0.2.11}, {type: InternalIP, address: "2001:db8::11"}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
status: {addresses: [{type: InternalIP, address: 192.0.2.12}, {type: InternalIP, address: "2001:db8::12"}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns1}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns2}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns1, labels: {app: a}}
spec:
  nodeName: node-a
  containers: [{name: c, image: x, ports: [{name: web, containerPort: 80}, {name: dns, containerPort: 53, protocol: UDP}]}]
status: {podIPs: [{ip: 10.244.1.10}, {ip: "fd00:1::10"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: ns2, labels: {app: c}}
spec:
  nodeName: node-b
  containers: [{name: c, image: x, ports: [{name: web, containerPort: 443}]}]
status: {podIPs: [{ip: 10.244.2.30}, {ip: "fd00:2::30"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: quiet, namespace: ns2, labels: {app: quiet}}
spec: {nodeName: node-b, containers: [{name: c, image: x}]}
status: {podIPs: [{ip: 10.244.2.44}]}
`

// TestDiffJudgesUndeclaredPortsAndAddresses: a
// change that opens ports no pod declares, or addresses no pod or --peer
// has, is a change (exit 3), shown with the range its probe stands for;
// before, the diff said "0 flows change" and exited 0.
func TestDiffJudgesUndeclaredPortsAndAddresses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := write("base.yaml", reviewCluster)
	c443 := write("c443.yaml", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: c-in, namespace: ns2}
spec:
  podSelector: {matchLabels: {app: c}}
  ingress: [{ports: [{port: 443}]}]
`)
	cAll := write("call.yaml", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: c-in, namespace: ns2}
spec:
  podSelector: {matchLabels: {app: c}}
  ingress: [{}]
`)
	cnp := write("cnp.yaml", `apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: no-internet}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  egress:
  - {action: Deny, to: [{networks: [198.51.100.0/24]}]}
`)
	quiet := write("quiet.yaml", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: quiet-deny, namespace: ns2}
spec:
  podSelector: {matchLabels: {app: quiet}}
  policyTypes: [Ingress, Egress]
`)
	for _, tc := range []struct {
		name string
		args []string
		want []string // lines (columns joined by two spaces) the table holds
	}{
		{"all ports opened", []string{"-f", base, "-f", c443, "--after", cAll}, []string{
			"ns1/a  ns2/c  1/TCP (any port or protocol but TCP 443) IPv4  denied  allowed",
			"ns1/a  ns2/c  1/TCP (any port or protocol but TCP 443) IPv6  denied  allowed",
		}},
		{"isolating policy deleted", []string{"-f", base, "-f", c443, "--delete", "networkpolicy/ns2/c-in"}, []string{
			"0.0.0.0/0  ns2/c  1/TCP (any port or protocol but TCP 443)  denied  allowed",
		}},
		{"network deny deleted", []string{"-f", base, "-f", cnp, "--delete", "cnp/no-internet"}, []string{
			"ns1/a  198.51.100.0/24  1/TCP (any port or protocol)  denied  allowed",
		}},
		{"pod declaring no port", []string{"-f", base, "-f", quiet, "--delete", "netpol/ns2/quiet-deny"}, []string{
			"ns1/a  ns2/quiet  1/TCP (any port or protocol)  denied  allowed",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, "", append([]string{"diff"}, tc.args...)...)
			squeezed := strings.Join(strings.Fields(out), " ")
			for _, w := range tc.want {
				if !strings.Contains(squeezed, strings.Join(strings.Fields(w), " ")) {
					t.Errorf("no line %q", w)
				}
			}
			if code != exitChanged || t.Failed() {
				t.Errorf("code %d, stderr %q, out:\n%s", code, errOut, out)
			}
		})
	}
}
