package policy

import (
	"slices"
	"strings"

	"github.com/RoaringBitmap/roaring/v2"
)

// rule is one compiled rule of either kind, before named ports resolve:
// its peers (shared with every rule naming the same ones) and its ports.
// Its Match is built when a class of pods first needs it, and kept until
// its peers change.
type rule struct {
	dir Direction
	// set is nil when the rule matches nothing (it failed closed).
	set   *peerSet
	ports portSpec
	// owner is the policy, whose compiled tiers a change must drop.
	owner policyOwner
	// cnp is the ClusterNetworkPolicy rule; nil for NetworkPolicy rules.
	cnp *Rule
	// index is a NetworkPolicy rule's position in its list.
	index int

	numeric *PortSet
	// key identifies the ports, to share matches between rules.
	key     string
	matched bool
	match   Match
	// byNamed holds ingress matches with named ports, by the subject's
	// signature.
	byNamed map[int32]Match
}

// policyOwner is a compiled policy, as its rules see it.
type policyOwner interface {
	// dropTiers forgets the compiled tiers holding the policy, in one
	// direction or both (bothDirections).
	dropTiers(s *state, dir Direction)
}

// newRule registers a rule with its peer set.
func (s *state) newRule(r *rule) *rule {
	if r.set != nil {
		addTo(&r.set.rules, r)
		if r.dir == Egress && r.ports.hasNamed() {
			s.wideNamed[r] = struct{}{}
		}
	}
	return r
}

// dropRule releases a rule's peers. An egress rule with named ports also
// takes its shared Match out of its peer set: that Match resolved the
// names on the pods matched by address, and is kept current only through
// the matched rules in wideNamed (renamedPod). Left in the set after the
// last such rule went, it would outlive the pod changes that void it, and
// the next rule with these peers and ports (the same policy updated or
// re-created) would take it stale.
func (s *state) dropRule(r *rule) {
	delete(s.wideNamed, r)
	delete(s.dirty.rules, r)
	if r.set != nil {
		if r.dir == Egress && r.ports.hasNamed() {
			if r.key == "" {
				r.key = r.ports.key()
			}
			delete(r.set.matches, matchKey{Egress, r.key, 0})
		}
		delete(r.set.rules, r)
		s.releaseSet(r.set)
	}
}

// forget drops the rule's matches after its peers changed.
func (r *rule) forget() {
	r.matched, r.match, r.byNamed = false, nil, nil
}

// ruleMatch is the rule's Match for a subject of signature sig (which only
// ingress rules with named ports read). Rules with the same peers and ports
// share one Match.
func (s *state) ruleMatch(r *rule, sig int32) Match {
	if r.set == nil {
		return nil
	}
	named := r.dir == Ingress && r.ports.hasNamed()
	if !named {
		sig = 0
		if r.matched {
			return r.match
		}
	} else if m, ok := r.byNamed[sig]; ok {
		return m
	}
	s.resolveSet(r.set)
	if r.key == "" {
		r.key = r.ports.key()
	}
	k := matchKey{r.dir, r.key, sig}
	m, ok := r.set.matches[k]
	if !ok {
		switch {
		case r.dir == Egress:
			m = s.egressMatch(r)
		case named:
			m = s.ingressMatch(r, s.sigs[sig].ports)
		default:
			m = s.ingressMatch(r, nil)
		}
		if r.set.matches == nil {
			r.set.matches = map[matchKey]Match{}
		}
		r.set.matches[k] = m
	}
	if named {
		if r.byNamed == nil {
			r.byNamed = map[int32]Match{}
		}
		r.byNamed[sig] = m
	} else {
		r.match, r.matched = m, true
	}
	return m
}

// matchKey identifies a Match among those of one peer set.
type matchKey struct {
	dir   Direction
	ports string
	sig   int32
}

func (r *rule) numericSet() *PortSet {
	if r.numeric == nil {
		r.numeric = r.ports.numericSet()
	}
	return r.numeric
}

// ingressMatch: the destination is the subject, whose named ports are
// given.
func (s *state) ingressMatch(r *rule, named []ContainerPort) Match {
	set := r.set
	if set.addrs.Empty() {
		return nil
	}
	ps := r.numericSet()
	if r.ports.hasNamed() {
		ps = r.ports.resolve(named)
	}
	if ps.Empty() {
		return nil
	}
	return Match{{Addrs: set.addrs, Ports: ps, split: set.split}}
}

// egressMatch: named ports resolve on each destination pod, whatever peer
// matched its address (a selector, or an ipBlock, networks or nodes peer
// containing it), grouped so that pods resolving alike share one term.
func (s *state) egressMatch(r *rule) Match {
	set := r.set
	if set.addrs.Empty() {
		return nil
	}
	var m Match
	if ps := r.numericSet(); !ps.Empty() {
		m = append(m, Term{Addrs: set.addrs, Ports: ps, split: set.split})
	}
	if !r.ports.hasNamed() {
		return m
	}
	dests := s.podsInRanges(set.cidrs)
	if set.pods != nil {
		dests.Or(set.pods)
	}
	type group struct {
		key     string
		ports   *PortSet
		addrs   []AddrRange
		pods    *roaring.Bitmap
		partial bool
	}
	groups := map[string]*group{}
	bySig := map[int32]*group{}
	var order []*group
	it := dests.Iterator()
	for it.HasNext() {
		pod := s.slots[it.Next()]
		g, seen := bySig[pod.fullSig]
		if !seen {
			var b PortSetBuilder
			addNamed(&b, r.ports.named, s.sigs[pod.fullSig].ports)
			ps := b.Build()
			if !ps.Empty() {
				key := ps.String()
				if g = groups[key]; g == nil {
					g = &group{key: key, ports: ps, pods: roaring.New()}
					groups[key] = g
					order = append(order, g)
				}
			}
			bySig[pod.fullSig] = g
		}
		if g == nil {
			continue
		}
		all := true
		for _, a := range pod.pod.IPs {
			if set.addrs.Contains(a) {
				g.addrs = append(g.addrs, AddrRange{a, a})
			} else {
				all = false
			}
		}
		if all {
			g.pods.Add(pod.slot)
		} else {
			// Only some of the pod's addresses are peers: index them by
			// address.
			g.partial = true
		}
	}
	// By port set, not by the first pod met: pods' slots depend on the
	// order of changes, and an incremental Program must list the terms
	// as a fresh compile does (rulesets rendered from both then agree).
	slices.SortFunc(order, func(a, b *group) int { return strings.Compare(a.key, b.key) })
	for _, g := range order {
		if len(g.addrs) == 0 {
			continue
		}
		t := Term{Addrs: NewAddrSet(g.addrs...), Ports: g.ports}
		if !g.partial {
			t.split = newSplit(noAddrs, g.pods)
		}
		m = append(m, t)
	}
	return m
}
