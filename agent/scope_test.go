package agent

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// TestScopeKeepsEveryNodesRules: on random clusters, every node's
// ruleset compiled from its scope (NetworkPolicies of namespaces with a
// local pod only) is byte for byte the ruleset compiled from the whole
// cluster.
func TestScopeKeepsEveryNodesRules(t *testing.T) {
	cfg := randcluster.Default()
	cfg.Nodes, cfg.Namespaces, cfg.MaxNetworkPolicies, cfg.MaxPods = 3, 5, 8, 14
	dropped := 0
	for seed := int64(1); seed <= 150; seed++ {
		y, err := randcluster.Generate(seed, cfg).Manifests()
		if err != nil {
			t.Fatal(err)
		}
		res, err := (&manifest.Loader{Stdin: strings.NewReader(string(y))}).Load("-")
		if err != nil {
			t.Fatal(err)
		}
		opts := policy.Options{IngressNetworksAndNodes: seed%2 == 0, DenyNodeLocal: seed%3 == 0}
		full := policy.Compile(&res.Cluster, opts)
		for _, n := range res.Cluster.Nodes {
			local := localNamespaces(res.Cluster.Pods, n.Name)
			scoped := res.Cluster
			scoped.NetworkPolicies = nil
			for _, np := range res.Cluster.NetworkPolicies {
				if local[np.Namespace] {
					scoped.NetworkPolicies = append(scoped.NetworkPolicies, np)
				} else {
					dropped++
				}
			}
			var want, got bytes.Buffer
			if _, err := nft.WriteReplace(&want, full, n.Name); err != nil {
				t.Fatal(err)
			}
			if _, err := nft.WriteReplace(&got, policy.Compile(&scoped, opts), n.Name); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Fatalf("seed %d node %s: the scoped ruleset differs (%d of %d NetworkPolicies in scope)\nscoped:\n%s\nfull:\n%s\nmanifests:\n%s",
					seed, n.Name, len(scoped.NetworkPolicies), len(res.Cluster.NetworkPolicies), got.String(), want.String(), y)
			}
		}
	}
	if dropped == 0 {
		t.Fatal("no NetworkPolicy was ever out of scope: the test proves nothing")
	}
	t.Logf("%d NetworkPolicies left out of some node's scope", dropped)
}

// TestAgentScope: a node compiles the NetworkPolicies of its pods'
// namespaces only; a pod arriving in another namespace brings that
// namespace's policies in; the leader still reports a problem of a
// policy no node of its own compiles.
func TestAgentScope(t *testing.T) {
	c := newFakeCluster(t,
		fixture.Namespace("a", nil), fixture.Namespace("b", nil), fixture.Namespace("c", nil),
		fixture.Node("n1", nil, "192.168.0.1"), fixture.Node("n2", nil, "192.168.0.2"),
		fixture.Pod("a", "x", "n1", map[string]string{"app": "x"}, nil, "10.0.0.1"),
		fixture.Pod("b", "z", "n2", map[string]string{"app": "z"}, nil, "10.0.0.3"),
		fixture.YAML(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-b, namespace: b}
spec: {podSelector: {}}
`),
		fixture.YAML(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: broken, namespace: c}
spec: {podSelector: {}, ingress: [{from: [{podSelector: {}, future: {}}]}]}
`),
	)
	dp := newTestDP("n1")
	a, _ := startAgent(t, c, Config{LeaderElection: LeaderElection{Enabled: true, LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond}}, dp)
	fixture.Eventually(t, 10*time.Second, "ready", func() (bool, string) { return a.Ready() == nil, "not ready" })
	if v := testutilValue(t, a, "moat_agent_network_policies_out_of_scope", ""); v != "2" {
		t.Errorf("out of scope = %s, want 2 (namespaces b and c have no pod on n1)", v)
	}
	// The leader reports the unknown field of a policy that no node
	// compiles (namespace c has no pod at all).
	fixture.Eventually(t, 15*time.Second, "PolicyProblem Event on c/broken", func() (bool, string) {
		evs, err := c.kube.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == EventPolicyProblem && e.InvolvedObject.Name == "broken" && strings.Contains(e.Message, "future") {
				return true, ""
			}
		}
		return false, fixture.Explain("%d Events, none about c/broken", len(evs.Items))
	})
	// A pod of namespace b lands on n1: b's policy now isolates it here.
	if _, err := c.kube.CoreV1().Pods("b").Create(context.Background(), fixture.Pod("b", "w", "n1", map[string]string{"app": "w"}, nil, "10.0.0.4"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fixture.Eventually(t, 10*time.Second, "b/w isolated by b's policy", func() (bool, string) {
		got, _ := dp.allows("10.0.0.1", "10.0.0.4", 80)
		return !got, "x reaches w"
	})
	if v := testutilValue(t, a, "moat_agent_network_policies_out_of_scope", ""); v != "1" {
		t.Errorf("out of scope = %s, want 1", v)
	}
}
