package policy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// An unknown field outside spec (here a mis-indented `ingress:` holding a
// Deny, and `egress` beside spec) may have been meant to change anything:
// the whole policy fails closed. A NetworkPolicy isolates the pods it
// selects in both directions with nothing allowed; a ClusterNetworkPolicy
// denies all its subject's traffic both ways at its tier and priority.
// Unknown fields under metadata stay harmless. (Issue 9.6: before, such a
// policy was enforced as if the field were not there.)
func TestUnknownFieldOutsideSpecFailsWholePolicy(t *testing.T) {
	prog := compile(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: misindented}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {matchLabels: {env: dev}}}
ingress:
- action: Deny
  from: [{namespaces: {}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: later-accept}
spec:
  tier: Admin
  priority: 6
  subject: {namespaces: {matchLabels: {env: dev}}}
  ingress: [{action: Accept, from: [{namespaces: {}}]}]
  egress: [{action: Accept, to: [{networks: ["0.0.0.0/0"]}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-misindented, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress: [{}]
egress:
- to: [{ipBlock: {cidr: 192.168.0.0/16}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-harmless, namespace: a, annotationz: {a: b}}
spec:
  podSelector: {matchLabels: {app: "y"}}
  ingress: [{}]
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "CNP: subject's ingress denied at its place (before a later Accept)", from: "a/x", to: "b/z", port: 80, allowed: false, ingress: admin, reasonHas: "misindented ingress rule 0 denies it (fail-closed: ingress: unknown field outside spec"},
		{name: "CNP: subject's egress denied too", from: "b/z", to: "192.168.1.1", port: 443, allowed: false, egress: admin, reasonHas: "misindented egress rule 0 denies it"},
		{name: "CNP: other pods untouched", from: "a/y", to: "192.168.1.1", port: 443, allowed: true, egress: deflt},
		{name: "NP: selected pod isolated for ingress, its rules allow nothing", from: "a/y", to: "a/x", port: 80, allowed: false, ingress: npTier},
		{name: "NP: selected pod isolated for egress too", from: "a/x", to: "192.168.1.1", port: 443, allowed: false, egress: npTier},
		{name: "NP: unknown metadata field is harmless", from: "192.168.1.1", to: "a/y", port: 8080, allowed: true, ingress: npTier},
	})
	want := map[string]bool{"ClusterNetworkPolicy misindented": false, "NetworkPolicy a/np-misindented": false, "NetworkPolicy a/np-harmless": true}
	for _, s := range prog.Status {
		if w, ok := want[s.Policy.String()]; ok && s.Accepted != w {
			t.Errorf("%s: accepted = %v, want %v (%s)", s.Policy, s.Accepted, w, s.Message)
		}
	}
	found := false
	for _, d := range prog.Diagnostics {
		if d.Object == "ClusterNetworkPolicy misindented" && d.Field == "ingress" && strings.Contains(d.Message, "whole policy") {
			found = true
		}
	}
	if !found {
		t.Errorf("no diagnostic for the top-level ingress field: %v", prog.Diagnostics)
	}
}

// A named port resolves on the destination pod whatever peer matched its
// address, an ipBlock included (issue 9.8: before, `port: dns-tcp` towards
// a pod in the block allowed nothing while `port: 53` allowed it).
func TestNamedPortTowardsPodInIPBlock(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: z-egress, namespace: b}
spec:
  podSelector: {matchLabels: {app: z}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.1.0.0/16, except: [10.1.2.0/24]}}]
    ports: [{port: http}, {port: dns, protocol: UDP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-egress, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.1.0.0/16}}]
    ports: [{port: http}]
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "http resolves on x (80) through the ipBlock", from: "b/z", to: "a/x", port: 80, allowed: true, egress: npTier, reasonHas: "z-egress egress rule 0 allows it"},
		{name: "dns/UDP resolves on x (53)", from: "b/z", to: "a/x", port: 53, proto: "UDP", allowed: true, egress: npTier},
		{name: "not another number", from: "b/z", to: "a/x", port: 8080, allowed: false, egress: npTier},
		{name: "a pod in the except range is not matched", from: "b/z", to: "a/y", port: 8080, allowed: false, egress: npTier},
		{name: "an address of no pod in the block: names match nothing", from: "b/z", to: "10.1.9.9", port: 80, allowed: false, egress: npTier},
		{name: "http resolves on y (8080) through the ipBlock", from: "a/x", to: "a/y", port: 8080, allowed: true, egress: npTier},
		{name: "only the address the block matches: x's IPv6 address is outside it", from: "b/z", to: "fd00::1:1", port: 80, allowed: false, egress: npTier},
	})
}

// Program.Allowed does not allocate, also for flows passed on by a Pass
// rule (issue 9.15: the Pass list escaped to the heap).
func TestAllowedDoesNotAllocate(t *testing.T) {
	prog := compile(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: pass-all}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  ingress: [{action: Pass, from: [{namespaces: {}}]}]
  egress: [{action: Pass, to: [{namespaces: {}}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline-pass}
spec:
  tier: Baseline
  priority: 1
  subject: {namespaces: {}}
  ingress: [{action: Pass, from: [{namespaces: {}}]}]
`, policy.Options{})
	x, _ := prog.ParseEndpoint("a/x")
	z, _ := prog.ParseEndpoint("b/z")
	f := policy.Flow{Src: z, Dst: x, Proto: policy.ProtoTCP, Port: 80}
	v := prog.Evaluate(f)
	if !v.Allowed || len(v.Ingress.Passed) != 2 || len(v.Egress.Passed) != 1 {
		t.Fatalf("the flow should pass through both tiers: %+v", v)
	}
	if n := testing.AllocsPerRun(100, func() { prog.Allowed(f) }); n != 0 {
		t.Errorf("Allowed allocates %v times per flow through Pass rules", n)
	}
}

// Named ports that resolve nowhere are reported by the compiler (issue
// 9.10): for ingress when none of the selected pods declares the name, for
// egress when no pod of the cluster does; at the port's field path.
func TestNamedPortWarnings(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-named, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  policyTypes: [Ingress, Egress]
  ingress: [{ports: [{port: http}, {port: metrics}, {port: dns, protocol: TCP}]}]
  egress: [{ports: [{port: web}, {port: nowhere}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: selects-none, namespace: a}
spec:
  podSelector: {matchLabels: {app: nobody}}
  ingress: [{ports: [{port: metrics}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: cnp-named}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {env: dev}}}
  ingress: [{action: Accept, from: [{namespaces: {}}], protocols: [{destinationNamedPort: web}, {destinationNamedPort: http}]}]
`, policy.Options{})
	var got []string
	for _, d := range prog.Diagnostics {
		if d.Severity == policy.SeverityWarning && strings.Contains(d.Message, "named port") {
			got = append(got, d.Object+" "+d.Field+": "+d.Message)
		}
	}
	want := []string{
		`NetworkPolicy a/x-named spec.ingress[0].ports[1].port: named port "metrics" (TCP) is declared by none of the 1 pods the policy selects: the rule allows no traffic on it`,
		`NetworkPolicy a/x-named spec.ingress[0].ports[2].port: named port "dns" (TCP) is declared by none of the 1 pods the policy selects: the rule allows no traffic on it`,
		`NetworkPolicy a/x-named spec.egress[0].ports[1].port: named port "nowhere" (TCP) is declared by no pod in the cluster: the rule allows no traffic on it`,
		`ClusterNetworkPolicy cnp-named spec.ingress[0].protocols[1].destinationNamedPort: named port "http" is declared by none of the 1 pods the policy selects: the rule allows no traffic on it`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("named-port warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestCopiedProgramJudgesItsOwnPolicies: a copy of a Program given other
// Policies (tests build such variants) judges by them, not by the per-pod
// table the original made on its first verdict; the original is
// unchanged.
func TestCopiedProgramJudgesItsOwnPolicies(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`, policy.Options{})
	x, _ := prog.ParseEndpoint("a/x")
	z, _ := prog.ParseEndpoint("b/z")
	f := policy.Flow{Src: z, Dst: x, Proto: policy.ProtoTCP, Port: 80}
	if prog.Allowed(f) {
		t.Fatal("b/z -> a/x allowed under deny-all")
	}
	cp := *prog
	cp.Policies = slices.Clone(prog.Policies)
	cp.Policies[x.Pod] = nil
	if !cp.Allowed(f) {
		t.Error("the copy without a/x's policy denies b/z -> a/x")
	}
	if prog.Allowed(f) {
		t.Error("the original allows b/z -> a/x after the copy judged it")
	}
}
