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

// TestNodeScopedProgramKeepsEveryNodesRules: on random clusters, every
// node's ruleset from the program the agent compiles (Options.Node: only
// that node's pods and the policies selecting them) is byte for byte the
// ruleset of the whole cluster's program.
func TestNodeScopedProgramKeepsEveryNodesRules(t *testing.T) {
	cfg := randcluster.Default()
	cfg.Nodes, cfg.Namespaces, cfg.MaxNetworkPolicies, cfg.MaxPods = 3, 5, 8, 14
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
			var want, got bytes.Buffer
			if _, err := nft.WriteReplace(&want, full, n.Name); err != nil {
				t.Fatal(err)
			}
			scoped := opts
			scoped.Node = n.Name
			if _, err := nft.WriteReplace(&got, policy.Compile(&res.Cluster, scoped), n.Name); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Fatalf("seed %d node %s: the node-scoped ruleset differs\nscoped:\n%s\nfull:\n%s\nmanifests:\n%s",
					seed, n.Name, got.String(), want.String(), y)
			}
		}
	}
}

// TestAgentScope: the leader reports a problem of a policy that selects no
// pod of its node (no pod at all); a pod arriving on the node in another
// namespace is isolated by that namespace's policy.
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
	startReady(t, c, Config{LeaderElection: testLeaderElection()}, dp)
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
}
