package policy

import "fmt"

// CompileStats compiles c and reports, for tests of what a compile
// touches: the pods that got a PodPolicy, the pods in NetworkPolicy
// classes, the namespaces with classes but no such pod, the peers
// resolved, and the NetworkPolicies and ClusterNetworkPolicies whose rules
// were compiled.
func CompileStats(c *Cluster, opts Options) (subjects, classified, strayNamespaces, resolvedPeers, compiledNPs, compiledCNPs int) {
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
	compiledCNPs = CompiledCNPs(&Compiler{s: s})
	return
}

// CompiledCNPs names the ClusterNetworkPolicies whose rules c compiled.
func CompiledCNPs(c *Compiler) int {
	n := 0
	for _, cnp := range c.s.cnps {
		if cnp != nil && cnp.rules != nil {
			n++
		}
	}
	return n
}

// MemoValidator validates policies as a compile's workers do, remembering
// the selectors it found valid; Remembered is how many it holds.
type MemoValidator struct{ v *validator }

func NewMemoValidator() MemoValidator { return MemoValidator{newValidator()} }

func (m MemoValidator) NetworkPolicy(np *NetworkPolicy) string { return fmt.Sprint(m.v.validateNP(np)) }

func (m MemoValidator) ClusterNetworkPolicy(c *ClusterNetworkPolicy) string {
	return fmt.Sprint(m.v.validateCNP(c))
}

func (m MemoValidator) Remembered() int { return len(m.v.validSels) }

// ValidatePolicies validates c's policies on one goroutine, with one
// validator that remembers valid selectors (as each of a compile's
// workers has) or with none; it returns how many errors it found.
func ValidatePolicies(c *Cluster, remember bool) int {
	var v *validator
	if remember {
		v = newValidator()
	}
	n := 0
	for _, np := range c.NetworkPolicies {
		n += len(v.validateNP(np))
	}
	for i := range c.ClusterNetworkPolicies {
		n += len(v.validateCNP(&c.ClusterNetworkPolicies[i]))
	}
	return n
}
