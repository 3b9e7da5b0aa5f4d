package agent

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/policy"
)

func TestHealthzDetectsAHungSync(t *testing.T) {
	a := &Agent{}
	now := time.Now()
	if err := a.healthy(now); err != nil {
		t.Errorf("idle agent unhealthy: %v", err)
	}
	a.syncStarted.Store(now.Add(-time.Minute).UnixNano())
	if err := a.healthy(now); err != nil {
		t.Errorf("one-minute sync unhealthy: %v", err)
	}
	a.syncStarted.Store(now.Add(-stuckAfter - time.Second).UnixNano())
	if err := a.healthy(now); err == nil {
		t.Error("a sync running longer than stuckAfter is reported healthy")
	}
}

// The status writer finds a ClusterNetworkPolicy's compiled status among
// every policy's, and indexes only those: NetworkPolicies have no status
// to write, and 20,000 of them made its index 3.4 MB.
func TestStatusOfIndexesClusterNetworkPoliciesOnly(t *testing.T) {
	cnp := policy.PolicyStatus{Policy: policy.PolicyRef{Kind: "ClusterNetworkPolicy", Name: "a"}, Reason: "InvalidSpec"}
	p := &published{status: []policy.PolicyStatus{
		cnp,
		{Policy: policy.PolicyRef{Kind: "ClusterNetworkPolicy", Name: "b"}, Accepted: true},
		{Policy: policy.PolicyRef{Kind: "NetworkPolicy", Namespace: "n", Name: "a"}, Accepted: true},
		{Policy: policy.PolicyRef{Kind: "NetworkPolicy", Namespace: "n", Name: "b"}, Accepted: true},
	}}
	if st, ok := p.statusOf(cnp.Policy); !ok || st != cnp {
		t.Errorf("statusOf(%v) = %v, %v", cnp.Policy, st, ok)
	}
	if _, ok := p.statusOf(policy.PolicyRef{Kind: "ClusterNetworkPolicy", Name: "c"}); ok {
		t.Error("statusOf found a policy that was not compiled")
	}
	if len(p.byRef) != 2 {
		t.Errorf("index holds %d statuses, want the 2 ClusterNetworkPolicies'", len(p.byRef))
	}
}

// The status writer gets the NetworkPolicies the diagnostics name, as
// compiled, and only those; it looks them up again only when the
// diagnostics change (any change of a NetworkPolicy changes them).
func TestPublishFindsDiagnosedNetworkPolicies(t *testing.T) {
	w := newStatusWriter(&Agent{})
	x := &policy.NetworkPolicy{Namespace: "a", Name: "x", Generation: 3}
	lookups := 0
	np := func(keys []string) map[string]*policy.NetworkPolicy {
		lookups++
		if slices.Contains(keys, "a/x") {
			return map[string]*policy.NetworkPolicy{"a/x": x}
		}
		return nil
	}
	diags := []policy.Diagnostic{
		{Object: "NetworkPolicy a/x", Message: "one"},
		{Object: "NetworkPolicy a/x", Message: "two"},
		{Object: "NetworkPolicy a/gone", Message: "three"},
		{Object: "Pod a/p", Message: "four"},
	}
	w.publish(compiled{}, &policy.Program{Diagnostics: diags}, np)
	p := w.latest.Load()
	if len(p.nps) != 1 || p.nps["a/x"] != x || lookups != 1 {
		t.Fatalf("published %v after %d lookups; want a/x alone, in one lookup", p.nps, lookups)
	}
	w.publish(compiled{}, &policy.Program{Diagnostics: diags}, np)
	if p := w.latest.Load(); p.nps["a/x"] != x || lookups != 1 {
		t.Fatalf("same diagnostics: published %v after %d lookups, want the last ones reused", p.nps, lookups)
	}
	w.publish(compiled{}, &policy.Program{Diagnostics: slices.Clone(diags)}, np)
	if lookups != 2 {
		t.Fatalf("new diagnostics: %d lookups, want them looked up again", lookups)
	}
	w.publish(compiled{}, &policy.Program{}, np)
	if p := w.latest.Load(); p.nps != nil {
		t.Fatalf("no diagnostics: published %v", p.nps)
	}
}

func TestDesiredCondition(t *testing.T) {
	cnp := func(y string) *decodedCNP {
		return decodeCNP(fixture.YAML(t, cnpHead+y))
	}
	compile := func(d *decodedCNP, opts policy.Options) policy.PolicyStatus {
		return policy.Compile(&policy.Cluster{ClusterNetworkPolicies: []policy.ClusterNetworkPolicy{d.ClusterNetworkPolicy}}, opts).Status[0]
	}
	for _, tc := range []struct {
		name, spec     string
		gate           bool
		status, reason string
		msg            string
	}{
		{"accepted", `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}}`, false, "True", ReasonAccepted, "enforced as written"},
		{"invalid", `spec: {tier: Admin, priority: 5000, subject: {namespaces: {}}}`, false, "False", ReasonInvalidSpec, "spec.priority"},
		{"unknown", `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, egress: [{action: Deny, to: [{fqdn: x}]}]}`, false, "False", ReasonUnknownField, "spec.egress[0].to[0].fqdn"},
		{"gated", `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{nodes: {}}]}]}`, false, "False", ReasonUnknownField, "--feature-gates=IngressNetworksAndNodes=true"},
		{"undecodable", `spec: {tier: Admin, priority: [1], subject: {namespaces: {}}}`, false, "False", ReasonInvalidSpec, "spec.priority: Invalid value: must be an integer, found a list"},
		{"gate on", `spec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{nodes: {}}]}]}`, true, "True", ReasonAccepted, "enforced as written"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := cnp(tc.spec)
			opts := policy.Options{IngressNetworksAndNodes: tc.gate}
			c := desiredCondition(d, compile(d, opts), opts)
			if string(c.Status) != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.msg) || c.ObservedGeneration != 3 || c.Type != ConditionAccepted {
				t.Errorf("condition = %+v, want %s/%s with %q, generation 3", c, tc.status, tc.reason, tc.msg)
			}
		})
	}
}

func TestCachedPodIsThePolicyView(t *testing.T) {
	p := fixture.Pod("a", "x", "n1", map[string]string{"app": "x"}, []fixture.Port{{Name: "http", Port: 80}}, "10.0.0.1", "fd00::1")
	p.Annotations = map[string]string{"big": strings.Repeat("x", 1000)}
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "b"}}
	always := corev1.ContainerRestartPolicyAlways
	// A sidecar (an init container that keeps running) serves its ports; a
	// plain init container does not.
	p.Spec.InitContainers = []corev1.Container{
		{Name: "proxy", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: 15001, Protocol: corev1.ProtocolTCP}}},
		{Name: "setup", Ports: []corev1.ContainerPort{{Name: "setup", ContainerPort: 9999, Protocol: corev1.ProtocolTCP}}},
	}
	p.UID = "u1"
	out, _ := toCachedPod(p)
	c := out.(*cachedPod)
	want, _ := policy.PodFromAPI(p)
	if c.Key() != want.Key() || !slices.Equal(c.IPs, want.IPs) || !slices.Equal(c.Ports, want.Ports) || c.NodeName != want.NodeName || c.Labels["app"] != "x" || c.finished {
		t.Errorf("cached pod differs from the policy view: %+v vs %+v", c.Pod, want)
	}
	if !slices.ContainsFunc(c.Ports, func(cp policy.ContainerPort) bool { return cp.Name == "proxy" }) || slices.ContainsFunc(c.Ports, func(cp policy.ContainerPort) bool { return cp.Name == "setup" }) {
		t.Errorf("ports %v: want the sidecar's, not the init container's", c.Ports)
	}
	if again, _ := toCachedPod(c); again != any(c) {
		t.Error("the transform is not idempotent")
	}
	if m := c.GetObjectMeta(); m.GetNamespace() != "a" || m.GetName() != "x" {
		t.Errorf("cache key from %s/%s", m.GetNamespace(), m.GetName())
	}
	convert := func(p *corev1.Pod) *cachedPod {
		o, _ := toCachedPod(p)
		return o.(*cachedPod)
	}
	relabelled := p.DeepCopy()
	relabelled.Labels = map[string]string{"app": "y"}
	if key, ok := relabelOnly(c, convert(relabelled)); !ok || key != "a/x" {
		t.Errorf("relabelOnly = %q, %v; want a/x, true", key, ok)
	}
	moved := relabelled.DeepCopy()
	moved.Status.PodIPs = moved.Status.PodIPs[:1]
	if _, ok := relabelOnly(c, convert(moved)); ok {
		t.Error("an IP change passed as a relabel")
	}
	recreated := p.DeepCopy()
	recreated.UID = "u2"
	if _, ok := relabelOnly(c, convert(recreated)); ok || !podChanged(c, convert(recreated)) {
		t.Error("a re-created pod passed as unchanged or as a relabel")
	}
	heartbeat := p.DeepCopy()
	heartbeat.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	heartbeat.Annotations = nil
	if !podChanged(c, convert(relabelled)) || podChanged(c, convert(heartbeat)) {
		t.Error("podChanged misjudges labels or status noise")
	}
	done := p.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	if cd := convert(done); !cd.finished || !podChanged(c, cd) {
		t.Error("a finished pod is not marked")
	}
}

// FuzzDecodeCNP: whatever JSON arrives as a ClusterNetworkPolicy, decoding
// and compiling never panic, and an object that did not decode cleanly is
// never reported as accepted.
func FuzzDecodeCNP(f *testing.F) {
	for _, s := range []string{
		`{"metadata":{"name":"p"},"spec":{"tier":"Admin","priority":1,"subject":{"namespaces":{}},"ingress":[{"action":"Deny","from":[{"namespaces":{}}]}]}}`,
		`{"metadata":{"name":"p"},"spec":{"tier":7,"subject":"all","egress":{"x":1}}}`,
		`{"metadata":{"name":"p"},"spec":[]}`,
		`{"metadata":"p","spec":{"ingress":[{"action":"Pass","from":[{"pods":{"podSelector":{"matchLabels":{"a":1}}}}]}]}}`,
	} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, js string, gate bool) {
		var obj map[string]any
		if json.Unmarshal([]byte(js), &obj) != nil || obj == nil {
			return
		}
		d := decodeCNP(&unstructured.Unstructured{Object: obj})
		opts := policy.Options{IngressNetworksAndNodes: gate}
		prog := policy.Compile(&policy.Cluster{
			Pods:                   []*policy.Pod{{Namespace: "a", Name: "x", NodeName: "n", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}},
			ClusterNetworkPolicies: []policy.ClusterNetworkPolicy{d.ClusterNetworkPolicy},
		}, opts)
		if (len(d.UnknownFields) > 0 || len(d.Invalid) > 0) && prog.Status[0].Accepted {
			t.Fatalf("unknown fields %v or undecodable parts %v but accepted", d.UnknownFields, d.Invalid)
		}
		_ = desiredCondition(d, prog.Status[0], opts)
	})
}
