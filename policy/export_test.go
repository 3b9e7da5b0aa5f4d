package policy

// CompileStats compiles c and reports, for tests of what a compile
// touches: the pods that got a PodPolicy, the pods in NetworkPolicy
// classes, the namespaces with classes but no such pod, the peers
// resolved, and the NetworkPolicies whose rules were compiled.
func CompileStats(c *Cluster, opts Options) (subjects, classified, strayNamespaces, resolvedPeers, compiledNPs int) {
	s := build(c, opts)
	withSubject := map[*nsState]bool{}
	for _, ps := range s.order {
		if ps.subject {
			subjects++
			withSubject[ps.ns] = true
		}
	}
	for _, ns := range s.namespaces {
		for _, c := range ns.tier.classes {
			classified += c.members
			if !withSubject[ns] {
				strayNamespaces++
			}
		}
	}
	for _, np := range s.nps {
		if np.rules != nil {
			compiledNPs++
		}
	}
	for _, p := range s.peers {
		if p.resolved {
			resolvedPeers++
		}
	}
	return
}
