package policy

import "github.com/RoaringBitmap/roaring/v2"

// combo is the pods in one class of each tier: they share a PodPolicy.
type combo struct {
	key     comboKey
	members *roaring.Bitmap
	pp      *PodPolicy
}

// comboKey is the classes of a combo, one per tier.
type comboKey struct {
	a, b *cnpClass
	n    *npClass
}

// combosDirty marks combos whose PodPolicy must be recompiled.
func (s *state) combosDirty(cs map[*combo]struct{}) {
	for c := range cs {
		s.dirty.combos[c] = struct{}{}
	}
}

// podPolicy compiles a combo's PodPolicy from its classes' lists. A
// direction whose compiled tiers did not change keeps its DirPolicy (and
// the evaluator's index with it); a PodPolicy with both unchanged is kept.
func (s *state) podPolicy(c *combo) *PodPolicy {
	a, n, b := c.key.a, c.key.n, c.key.b
	var old [2]*DirPolicy
	if c.pp != nil {
		old = [2]*DirPolicy{c.pp.Ingress, c.pp.Egress}
	}
	ing := dirPolicy(old[Ingress], s.cnpDirOf(a.list, Ingress, a.key.sig), s.npDirOf(n.list, Ingress, n.key.sig), s.cnpDirOf(b.list, Ingress, b.key.sig))
	eg := dirPolicy(old[Egress], s.cnpDirOf(a.list, Egress, 0), s.npDirOf(n.list, Egress, 0), s.cnpDirOf(b.list, Egress, 0))
	if c.pp != nil && ing == old[Ingress] && eg == old[Egress] {
		return c.pp
	}
	return &PodPolicy{Ingress: ing, Egress: eg}
}

// dirPolicy is old if it was made of the same compiled tiers, else a new
// DirPolicy of them.
func dirPolicy(old *DirPolicy, a *cnpDir, n *npDir, b *cnpDir) *DirPolicy {
	if old != nil && old.admin == a && old.np == n && old.baseline == b {
		return old
	}
	return &DirPolicy{Admin: a.rules, NP: n.tier, Baseline: b.rules, admin: a, np: n, baseline: b}
}
