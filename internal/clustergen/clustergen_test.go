package clustergen

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/moat-net/moat/policy"
)

// The generator aims for objects a real API server accepts: the
// benchmarks must measure valid policies, not fail-closed ones.
func TestGeneratedClusterIsValid(t *testing.T) {
	c := Generate(Config{Nodes: 5, Namespaces: 20, Pods: 200, NetworkPolicies: 40, ClusterPolicies: 10, Seed: 3})
	prog := policy.Compile(c.ToCluster(), policy.Options{IngressNetworksAndNodes: true})
	for _, d := range prog.Diagnostics {
		// Random named ports may resolve on none of a policy's pods:
		// legal, and a warning.
		if d.Severity == policy.SeverityError {
			t.Errorf("%s", d)
		}
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

// The workload shape too: valid objects, the counts, labels
// distinct per ReplicaSet, three ports per pod.
func TestWorkloadClusterIsValid(t *testing.T) {
	cfg := Config{Nodes: 10, Namespaces: 30, Pods: 300, NetworkPolicies: 210, ClusterPolicies: 20, Seed: 5, Workloads: true}
	c := Generate(cfg)
	prog := policy.Compile(c.ToCluster(), policy.Options{IngressNetworksAndNodes: true})
	for _, d := range prog.Diagnostics {
		t.Errorf("%s", d)
	}
	if len(c.Pods) != 300 || len(c.NetworkPolicies) != 210 || len(c.ClusterNetworkPolicies) != 20 || len(c.Nodes) != 10 || len(c.Namespaces) != 30 {
		t.Errorf("counts: %d pods, %d NPs, %d CNPs, %d nodes, %d namespaces", len(c.Pods), len(c.NetworkPolicies), len(c.ClusterNetworkPolicies), len(c.Nodes), len(c.Namespaces))
	}
	sets := map[string]bool{}
	for _, p := range c.Pods {
		if n := len(p.Spec.Containers[0].Ports); n != 3 {
			t.Fatalf("pod %s has %d ports, want 3", p.Name, n)
		}
		sets[p.Namespace+fmt.Sprint(p.Labels)] = true
	}
	if len(sets) < 90 {
		t.Errorf("%d distinct label sets among 300 pods, want mostly distinct ReplicaSets", len(sets))
	}
	policed := 0
	for _, p := range prog.Policies {
		if p != nil {
			policed++
		}
	}
	if policed != 300 {
		t.Errorf("%d pods policed, want 300", policed)
	}
	if again := Generate(cfg); !reflect.DeepEqual(again.NetworkPolicies[100], c.NetworkPolicies[100]) || !reflect.DeepEqual(again.ClusterNetworkPolicies[7], c.ClusterNetworkPolicies[7]) || again.Pods[77].Status.PodIP != c.Pods[77].Status.PodIP {
		t.Error("generation is not deterministic")
	}
}
