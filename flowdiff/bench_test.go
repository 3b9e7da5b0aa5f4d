package flowdiff

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/policy"
)

// change edits a cluster as a pull request would: the NetworkPolicy in
// use (one that isolates some pod) is deleted, nps-1
// random NetworkPolicies are rewritten (a peer changed or rules dropped),
// cnps ClusterNetworkPolicies' actions changed, pods pods relabelled.
func change(c *clustergen.Cluster, inUse policy.PolicyRef, seed uint64, nps, cnps, pods int) *clustergen.Cluster {
	r := rand.New(rand.NewPCG(seed, 7))
	next := copyCluster(c)
	next.NetworkPolicies = slices.DeleteFunc(next.NetworkPolicies, func(np networkingv1.NetworkPolicy) bool {
		return np.Namespace == inUse.Namespace && np.Name == inUse.Name
	})
	for range nps - 1 {
		mutations[4+r.IntN(2)](r, next) // a peer changed, or rules dropped
	}
	for range cnps {
		mutations[7](r, next)
	}
	for range pods {
		mutations[0](r, next)
	}
	return next
}

// BenchmarkDiff measures `moat diff`'s comparison (compilation excluded):
// Compute for a one-policy change and for a large one (1% of the
// NetworkPolicies, 1% of the ClusterNetworkPolicies, 0.1% of the pods), and
// at 1,000 pods Full (every flow judged) in the same run, for the ratio.
// Metrics: flows covered, flows judged, verdicts changed.
func BenchmarkDiff(b *testing.B) {
	for _, size := range []struct {
		name string
		cfg  clustergen.Config
		full bool
	}{
		{"pods=1000", clustergen.Config{Nodes: 20, Namespaces: 100, Pods: 1000, NetworkPolicies: 200, ClusterPolicies: 20, Seed: 1}, true},
		{"pods=10000", clustergen.Scale, false},
	} {
		b.Run(size.name, func(b *testing.B) {
			gen := clustergen.Generate(size.cfg)
			opts := policy.Options{IngressNetworksAndNodes: true}
			before := policy.Compile(gen.ToCluster(), opts)
			dopts := Options{Peers: []netip.Addr{netip.MustParseAddr("203.0.113.9")}}
			c := size.cfg
			var inUse policy.PolicyRef
			for _, pp := range before.Policies {
				if pp != nil && pp.Ingress.NP != nil && len(pp.Ingress.NP.Policies) == 1 {
					inUse = pp.Ingress.NP.Policies[0]
					break
				}
			}
			for _, ch := range []struct {
				name            string
				nps, cnps, pods int
				full            bool
			}{
				{"one-policy", 1, 0, 0, false},
				{"large", max(1, c.NetworkPolicies/100), max(1, c.ClusterPolicies/100), max(1, c.Pods/1000), size.full},
			} {
				after := policy.Compile(change(gen, inUse, 1, ch.nps, ch.cnps, ch.pods).ToCluster(), opts)
				fns := map[string]func(before, after *policy.Program, opts Options) *Result{"compute": Compute}
				if ch.full {
					fns["full"] = Full
				}
				for _, name := range []string{"compute", "full"} {
					f, ok := fns[name]
					if !ok {
						continue
					}
					b.Run(ch.name+"/"+name, func(b *testing.B) {
						var res *Result
						for b.Loop() {
							res = f(before, after, dopts)
						}
						b.ReportMetric(float64(res.Flows), "flows")
						b.ReportMetric(float64(res.Judged), "judged")
						b.ReportMetric(float64(len(res.Changes)), "changes")
					})
				}
			}
		})
	}
}
