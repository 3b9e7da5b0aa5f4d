package nft

import (
	"slices"

	"github.com/moat-net/moat/policy"
)

// chainMemo is what building a DirPolicy's chains produced, kept with its
// cached plan so that the next Build can take it instead of building the
// same rules again (most of a Build's time at 30,000 pods went there; a
// relabel changes the chains of a few DirPolicies at most).
//
// A DirPolicy's chains are a function of its plan (fixed for the
// DirPolicy), the shapes of its runs (which depend on the runs, on
// immutable address sets and, through shareCrowded, on the node's other
// runs: setNames tells a union run's set name, and the lookups of the
// peers it leaves out, from a shared run's lookups) and the names this
// Build gives the shared sets its rules look up: peer sets, named after
// the smallest use over every run of the node, and union sets. The memo
// is taken only while those names are the ones it was built with, each
// peer set's together with the ports it is looked up with: a run's
// lookups are in name order, so names alone do not tell which ports go
// with which set once two peer sets swap names
// (TestChainMemoAfterPeerNamesSwap).
type chainMemo struct {
	names    []string
	entry    entry
	chains   []*policyChain
	counters []*DropCounter
	portSets []*namedSet
}

// setNames appends the names of the shared sets the rules of p's runs
// look up, in rule order, each peer set's with the ports it is looked up
// with.
func (b *builder) setNames(dst []string, p *dirPlan) []string {
	add := func(rs []*run) {
		for _, r := range rs {
			if r.shape.union {
				dst = append(dst, b.setName[r.memo])
			}
			// A lookup's rule is its peer set's name and its ports:
			// both, since names alone (in rule order) do not say which
			// ports go with which set once two peers swap names.
			for _, l := range r.shape.lookups {
				dst = append(dst, l.peer.name, l.key)
			}
			dst = append(dst, "|")
		}
	}
	add(p.admin)
	if p.np != nil {
		add([]*run{p.np})
	}
	add(p.baseline)
	return dst
}

// memoChains returns the entry of dp from its memo and adds the chains,
// counters and services sets they use to the ruleset; false when there is
// no memo or the set names changed.
func (b *builder) memoChains(dp *policy.DirPolicy) (entry, bool) {
	cp := b.cachedPlan(dp)
	if cp == nil || cp.chains == nil {
		return entry{}, false
	}
	m := cp.chains
	b.names = b.setNames(b.names[:0], b.plans[dp])
	if !slices.Equal(b.names, m.names) {
		return entry{}, false
	}
	for _, c := range m.chains {
		b.rs.chains[c.Name] = c
	}
	for _, c := range m.counters {
		b.rs.counters[c.Name] = c
	}
	for _, s := range m.portSets {
		if _, ok := b.rs.sets[s.Name]; !ok {
			b.rs.sets[s.Name] = s
		}
	}
	return m.entry, true
}

// keepChains records the chains just built for dp, and what they use:
// the counters chain registered (a run can register one without a rule,
// when its peers are empty) and the services sets of their rules.
func (b *builder) keepChains(dp *policy.DirPolicy, e entry) {
	cp := b.cachedPlan(dp)
	if cp == nil {
		return
	}
	m := &chainMemo{names: b.setNames(nil, b.plans[dp]), entry: e, counters: slices.Clone(b.counted)}
	for _, name := range []string{e.chain, e.next} {
		c := b.rs.chains[name]
		if name == "" || c == nil {
			continue
		}
		m.chains = append(m.chains, c)
		for _, r := range c.Rules {
			if r.PortSet != "" {
				m.portSets = append(m.portSets, b.rs.sets[r.PortSet])
			}
		}
	}
	cp.chains = m
}

// cachedPlan is the cache's entry for dp, nil without a cache.
func (b *builder) cachedPlan(dp *policy.DirPolicy) *cachedPlan {
	if b.cache == nil {
		return nil
	}
	return b.cache.plans[dp]
}
