package policy_test

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/policy"
)

// Regression tests for inputs that once widened access.
func TestNoWideningOnBrokenPolicies(t *testing.T) {
	prog := compile(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: a}
spec: {podSelector: {}}
---
# An invalid podSelector: the namespace is isolated and the rule opens nothing.
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad-selector, namespace: a}
spec:
  podSelector: {matchExpressions: [{key: app, operator: In, values: []}]}
  ingress: [{ports: [{port: 80}]}]
---
# Invalid policyTypes: Ingress is not validly listed, so its rules do not count.
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad-types, namespace: a}
spec:
  podSelector: {matchLabels: {app: "y"}}
  policyTypes: [Egress, Egres]
  ingress: [{}]
  egress: [{}]
---
# A Deny with domainNames (Accept-only) fails closed: it denies everything.
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-domain}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {env: dev}}}
  egress: [{action: Deny, to: [{domainNames: [evil.example.com]}]}]
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "invalid podSelector opens nothing", from: "192.168.1.1", to: "a/x", port: 80, allowed: false, ingress: npTier},
		{name: "invalid policyTypes: unlisted ingress rules do not count", from: "192.168.1.1", to: "a/y", port: 80, allowed: false, ingress: npTier},
		{name: "invalid policyTypes: validly listed egress rules count", from: "a/y", to: "192.168.1.1", port: 80, allowed: true, egress: npTier},
		{name: "Deny with domainNames denies everything", from: "b/z", to: "203.0.113.7", port: 443, allowed: false, egress: admin, reasonHas: "fail-closed"},
	})
	if errs := diagnosticsFor(t, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: ns1}\nspec: {podSelector: {}, policyTypes: [Ingress, Ingress]}"); len(errs) > 0 {
		t.Errorf("repeated policyTypes are legal for the API server, got %v", errs)
	}
}

// Addresses claimed by two pods: traffic on them is denied, and the pods
// stay policed on their other addresses.
func TestDuplicateAddresses(t *testing.T) {
	c := &policy.Cluster{Pods: []*policy.Pod{
		ipPod("a", "10.0.0.1"),
		ipPod("b", "10.0.0.1", "fd00::b"),
		ipPod("self", "10.0.0.9", "::ffff:10.0.0.9"),
	}}
	c.NetworkPolicies = []*policy.NetworkPolicy{policy.NetworkPolicyFromAPI(denyAll("n"))}
	prog := policy.Compile(c, policy.Options{})
	b, _ := prog.PodByKey("n/b")
	self, _ := prog.PodByKey("n/self")
	ext := policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr("fd00::99")}
	for _, f := range []policy.Flow{
		{Src: ext, Dst: policy.Endpoint{Pod: b, Addr: netip.MustParseAddr("fd00::b")}, Proto: policy.ProtoTCP, Port: 80},
		{Src: policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr("10.0.0.5")}, Dst: policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr("10.0.0.1")}, Proto: policy.ProtoTCP, Port: 80},
		{Src: policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr("10.0.0.5")}, Dst: policy.Endpoint{Pod: self, Addr: netip.MustParseAddr("10.0.0.9")}, Proto: policy.ProtoTCP, Port: 80},
	} {
		if v := prog.Evaluate(f); v.Allowed {
			t.Errorf("%v -> %v allowed (%s | %s)", f.Src.Addr, f.Dst.Addr, v.Egress.Reason, v.Ingress.Reason)
		}
	}
	if prog.Policies[b] == nil || prog.Policies[self] == nil || !prog.DuplicateAddr(netip.MustParseAddr("10.0.0.1")) || prog.DuplicateAddr(netip.MustParseAddr("10.0.0.9")) {
		t.Errorf("policed b=%v self=%v; duplicates wrong", prog.Policies[b] != nil, prog.Policies[self] != nil)
	}
}

// PodByIP names each address's one owner, IPv4 (kept under 4-byte keys)
// and IPv6 alike, in a full compile and after changes: no owner for an
// address two pods claim, nor for one no pod has.
func TestPodByIPOwners(t *testing.T) {
	c := &policy.Cluster{Pods: []*policy.Pod{
		ipPod("a", "10.0.0.1"),
		ipPod("b", "10.0.0.1", "fd00::b"),
		ipPod("c", "0.0.0.7", "fd00::c"),
		ipPod("d", "::ffff:10.0.0.4"),
	}}
	comp := policy.NewCompiler(c, policy.Options{})
	check := func(what string, want map[string]string) {
		t.Helper()
		prog := comp.Program()
		for addr, owner := range want {
			i, ok := prog.PodByIP(netip.MustParseAddr(addr))
			got := ""
			if ok {
				got = prog.Pods[i].Name
			}
			if got != owner {
				t.Errorf("%s: PodByIP(%s) = %q, want %q", what, addr, got, owner)
			}
		}
	}
	check("full compile", map[string]string{
		"10.0.0.1": "", "fd00::b": "b", "0.0.0.7": "c", "::ffff:0.0.0.7": "c", "fd00::c": "c",
		"10.0.0.4": "d", "::ffff:10.0.0.4": "d", "10.0.0.2": "", "fd00::a": "",
	})
	comp.DeletePod("n/a")
	comp.UpsertPod(ipPod("e", "10.0.0.2", "fd00::e"))
	comp.UpsertPod(ipPod("c", "10.0.0.3", "fd00::c"))
	check("after changes", map[string]string{
		"10.0.0.1": "b", "fd00::b": "b", "10.0.0.2": "e", "fd00::e": "e",
		"0.0.0.7": "", "10.0.0.3": "c", "fd00::c": "c", "10.0.0.4": "d",
	})
}

// ipPod is pod n/name on node n1, labelled app=name, with the given
// addresses.
func ipPod(name string, ips ...string) *policy.Pod {
	p := &policy.Pod{Namespace: "n", Name: name, NodeName: "n1", Labels: map[string]string{"app": name}}
	for _, ip := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(ip))
	}
	return p
}

func denyAll(ns string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-all", Namespace: ns}}
}

// Only containers that keep running declare ports: an init container's
// named port does not count, a sidecar's does.
func TestInitContainerPorts(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	p, _ := policy.PodFromAPI(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "n"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{
				{Name: "setup", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 9999}}},
				{Name: "sidecar", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: 15001}}},
			},
			Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}},
		},
	})
	if len(p.Ports) != 2 || p.Ports[0].Name != "proxy" || p.Ports[1].Port != 8080 {
		t.Errorf("ports = %+v", p.Ports)
	}
}
