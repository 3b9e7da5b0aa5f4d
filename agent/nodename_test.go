package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/policy"
)

// TestNodeNameNotFound, against a real API server: an agent whose
// --node-name matches no Node (a short name where the Node has the FQDN)
// programs nothing, so the table the agent with the right name left keeps
// enforcing; it is not ready, says why and counts the problem. Once a
// Node of its name appears it programs that node and turns ready.
func TestNodeNameNotFound(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; runs without -short")
	}
	ctx := context.Background()
	env, clients := startAPIServer(ctx, t)
	const fqdn = "n1.example.com"
	fixture.CreateNamespace(ctx, t, env, fixture.Namespace("a", nil))
	fixture.CreateNode(ctx, t, env, fixture.Node(fqdn, nil, "192.168.1.1"))
	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "x", fqdn, map[string]string{"app": "x"}, nil), "10.1.0.1")
	fixture.MustPolicy(ctx, t, env, npIsolateX)

	// What the agent with the right name left: x isolated.
	right := newTestDP(fqdn)
	isolateX := &policy.NetworkPolicy{Namespace: "a", Name: "isolate-x", Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	old := policy.Compile(&policy.Cluster{
		Namespaces:      []policy.Namespace{{Name: "a"}},
		Nodes:           []policy.Node{{Name: fqdn, Addrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}},
		Pods:            []*policy.Pod{{Namespace: "a", Name: "x", NodeName: fqdn, Labels: map[string]string{"app": "x"}, IPs: []netip.Addr{netip.MustParseAddr("10.1.0.1")}}},
		NetworkPolicies: []*policy.NetworkPolicy{isolateX},
	}, policy.Options{})
	if _, err := right.Syncer.Sync(ctx, old); err != nil {
		t.Fatal(err)
	}
	if got, ok := right.allows("10.1.0.9", "10.1.0.1", 80); !ok || got {
		t.Fatalf("the old table does not isolate x: reachable=%v", got)
	}
	before := right.fake.Dump()

	// Restarted with the short name, on the same table.
	dp := newTestDPOn(right.fake, "n1")
	n1 := runAPIAgent(t, clients, Config{NodeName: "n1"}, dp)
	fixture.Eventually(t, 30*time.Second, "node_not_found reported", func() (bool, string) {
		v := testutilValue(t, n1.Agent, "moat_agent_input_problems", `problem="node_not_found"`)
		return v == "1", "node_not_found = " + v
	})
	if err := n1.Ready(); err == nil || !strings.Contains(err.Error(), "node n1 not found") {
		t.Errorf("Ready() = %v, want node n1 not found", err)
	}
	if v := testutilValue(t, n1.Agent, "moat_agent_ready", ""); v != "0" {
		t.Errorf("moat_agent_ready = %s", v)
	}
	// A change in the cluster queues a sync: still nothing programmed.
	fixture.MustPolicy(ctx, t, env, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-y, namespace: a}
spec:
  podSelector: {matchLabels: {app: "y"}}
  policyTypes: [Ingress]
`)
	time.Sleep(time.Second)
	if dp.fake.Dump() != before || dp.calls.Load() != 0 {
		t.Errorf("the table changed (%d syncs) although no Node is named n1", dp.calls.Load())
	}

	fixture.CreateNode(ctx, t, env, fixture.Node("n1", nil, "192.168.1.2"))
	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "w", "n1", map[string]string{"app": "x"}, nil), "10.1.0.2")
	fixture.Eventually(t, 30*time.Second, "n1 programmed and ready once the Node exists", func() (bool, string) {
		got, ok := dp.allows("10.1.0.9", "10.1.0.2", 80)
		return n1.Ready() == nil && ok && !got, fixture.Explain("Ready() = %v, programmed %v, w reachable %v", n1.Ready(), ok, got)
	})
	fixture.Eventually(t, 10*time.Second, "node_not_found cleared", func() (bool, string) {
		v := testutilValue(t, n1.Agent, "moat_agent_input_problems", `problem="node_not_found"`)
		return v == "0", "node_not_found = " + v
	})
}
