package clustergen

import (
	"testing"

	"github.com/moat-net/moat/policy"
)

// The generator aims for objects a real API server accepts: the
// benchmarks must measure valid policies, not fail-closed ones.
func TestGeneratedClusterIsValid(t *testing.T) {
	c := Generate(Config{Nodes: 5, Namespaces: 20, Pods: 200, NetworkPolicies: 40, ClusterPolicies: 10, Seed: 3})
	prog := policy.Compile(c.ToCluster(), policy.Options{IngressNetworksAndNodes: true})
	for _, d := range prog.Diagnostics {
		t.Errorf("%s", d)
	}
	policed := 0
	for _, p := range prog.Policies {
		if p != nil {
			policed++
		}
	}
	if policed != 200 {
		t.Errorf("%d pods policed, want 200", policed)
	}
	again := Generate(Config{Nodes: 5, Namespaces: 20, Pods: 200, NetworkPolicies: 40, ClusterPolicies: 10, Seed: 3})
	if again.Pods[17].Status.PodIP != c.Pods[17].Status.PodIP || again.ClusterNetworkPolicies[3].Spec.Priority != c.ClusterNetworkPolicies[3].Spec.Priority {
		t.Error("generation is not deterministic")
	}
}
