package policy_test

import (
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/policy"
)

// TestRelabelMatchesFullCompile relabels random pods one after another and
// checks after each step that the incremental Program answers every sampled
// flow exactly as a full compilation of the same snapshot does, and that the
// Program from before the step still answers as before.
func TestRelabelMatchesFullCompile(t *testing.T) {
	gen := clustergen.Generate(clustergen.Config{Nodes: 4, Namespaces: 12, Pods: 150, NetworkPolicies: 30, ClusterPolicies: 12, Seed: 7})
	cluster := gen.ToCluster()
	comp := policy.NewCompiler(cluster, policy.Options{})
	r := rand.New(rand.NewPCG(3, 4))
	tiers := []string{"web", "api", "db", "cache", "worker"}
	for step := 0; step < 40; step++ {
		before := comp.Program()
		flows := sampleFlows(before, 400)
		was := make([]bool, len(flows))
		for i, f := range flows {
			was[i] = before.Allowed(f)
		}

		pi := r.IntN(len(cluster.Pods))
		labels := maps.Clone(cluster.Pods[pi].Labels)
		labels["tier"] = tiers[r.IntN(len(tiers))]
		if r.IntN(3) == 0 {
			delete(labels, "app")
		}
		cluster.Pods[pi].Labels = labels
		inc, ok := comp.RelabelPod(cluster.Pods[pi].Key(), labels)
		if !ok {
			t.Fatalf("pod %s unknown", cluster.Pods[pi].Key())
		}
		full := policy.Compile(cluster, policy.Options{})
		for i, f := range flows {
			// Flows are by pod index; both Programs sort pods identically.
			if got, want := inc.Allowed(f), full.Allowed(f); got != want {
				t.Fatalf("step %d (relabel %s): flow %+v: incremental %v, full %v", step, cluster.Pods[pi].Key(), f, got, want)
			}
			if before.Allowed(f) != was[i] {
				t.Fatalf("step %d: the previous Program changed its answer for %+v", step, f)
			}
		}
	}
}

// BenchmarkRelabelScale measures the incremental recompile after one pod
// relabel in the scale cluster.
func BenchmarkRelabelScale(b *testing.B) {
	cluster := clustergen.Generate(clustergen.Scale).ToCluster()
	comp := policy.NewCompiler(cluster, policy.Options{})
	tiers := []string{"web", "api", "db", "cache", "worker"}
	i := 0
	for b.Loop() {
		p := &cluster.Pods[(i*7919)%len(cluster.Pods)]
		labels := maps.Clone(p.Labels)
		labels["tier"] = tiers[i%len(tiers)]
		if _, ok := comp.RelabelPod(p.Key(), labels); !ok {
			b.Fatal("unknown pod")
		}
		i++
	}
}
