package policy

import (
	"github.com/RoaringBitmap/roaring/v2"
)

// publish brings the compiled tiers up to date with what changed since the
// last publication and makes the next Program. Its cost follows what
// changed: the classes whose policies or rules changed, the pods that
// changed class, and one copy of the Program's per-pod slices.
func (s *state) publish() *Program {
	d := &s.dirty
	s.nodeClaimsChanged()
	s.settlePeers()
	s.refreshTiers()
	s.refreshPeers()
	for r := range d.rules {
		r.forget()
		if r.set != nil {
			// Shared by the rules with the same peers and ports.
			r.set.matches = nil
		}
		r.owner.dropTiers(s, r.dir)
	}
	if d.full {
		for _, ps := range s.order {
			s.classify(ps)
		}
	} else {
		for ps := range d.reclass {
			s.classify(ps)
		}
	}
	s.refreshNamed()
	for c := range d.combos {
		if c.members.IsEmpty() {
			continue
		}
		pp := s.podPolicy(c)
		if pp == c.pp {
			continue
		}
		c.pp = pp
		if d.full {
			continue // every pod's entry is new
		}
		it := c.members.Iterator()
		for it.HasNext() {
			d.pods = append(d.pods, s.slots[it.Next()])
		}
	}
	s.prog = s.program()
	if len(s.selCache) > 4*(len(s.nps)+len(s.cnps))+1024 {
		// Selectors of policies long gone: start afresh.
		s.selCache = selectorCache{}
	}
	s.slotFree = append(s.slotFree, s.pendingFree...)
	s.pendingFree = s.pendingFree[:0]
	d.reset()
	return s.prog
}

// refreshTiers applies changed policies to the tiers: new keys (every
// pod's class is recomputed) and new policy lists per class.
func (s *state) refreshTiers() {
	d := &s.dirty
	for _, t := range []*cnpTier{s.admin, s.baseline} {
		if t.stale {
			t.refresh(s)
			t.stale = false
			if !d.full {
				for _, ps := range s.slots {
					if ps != nil && ps.subject {
						d.reclass[ps] = struct{}{}
					}
				}
			}
		}
		if d.relistCNP[t.idx] || t.relist {
			s.relistCNP(t)
		}
	}
	for t := range d.relistNS {
		if t.stale {
			t.keyList = t.keys.keys()
			t.keysID = s.internKeys(t.keyList)
			t.namesID = s.internNames(t.names)
			t.stale = false
			if !d.full {
				it := t.ns.pods.Iterator()
				for it.HasNext() {
					d.reclass[s.slots[it.Next()]] = struct{}{}
				}
			}
		}
		if t.relist {
			s.relistNP(t)
		}
	}
}

// refreshPeers recomputes the peer sets of changed peers and forgets the
// matches of the rules using them.
func (s *state) refreshPeers() {
	d := &s.dirty
	sets := map[*peerSet]struct{}{}
	for p := range d.peers {
		for ps := range p.sets {
			if ps.resolved {
				sets[ps] = struct{}{}
			}
		}
	}
	for ps := range sets {
		ps.resolved = false
		s.resolveSet(ps)
		for r := range ps.rules {
			d.rules[r] = struct{}{}
		}
	}
}

// classify puts a pod into its classes, and so its combo.
func (s *state) classify(ps *podState) {
	var a, b *cnpClass
	var n *npClass
	if ps.subject && !ps.gone {
		a, b = s.cnpClassOf(s.admin, ps), s.cnpClassOf(s.baseline, ps)
		n = s.npClassOf(ps.ns.tier, ps)
	}
	if a == ps.admin && b == ps.baseline && n == ps.np {
		return
	}
	var c *combo
	if a != nil {
		a.members++
		b.members++
		n.members++
		c = s.comboFor(a, n, b)
		c.members.Add(ps.slot)
	}
	if old := ps.combo; old != nil {
		old.members.Remove(ps.slot)
		if old.members.IsEmpty() {
			s.dropCombo(old)
		}
		s.leaveCNP(ps.admin)
		s.leaveCNP(ps.baseline)
		s.leaveNP(ps.np)
	}
	ps.admin, ps.baseline, ps.np, ps.combo = a, b, n, c
	if !s.dirty.full {
		s.dirty.pods = append(s.dirty.pods, ps)
	}
}

func (s *state) comboFor(a *cnpClass, n *npClass, b *cnpClass) *combo {
	k := comboKey{a: a, b: b, n: n}
	if c := s.combos[k]; c != nil {
		return c
	}
	c := &combo{key: k, members: roaring.New()}
	s.combos[k] = c
	addTo(&a.combos, c)
	addTo(&b.combos, c)
	addTo(&n.combos, c)
	s.dirty.combos[c] = struct{}{}
	return c
}

func (s *state) dropCombo(c *combo) {
	delete(s.combos, c.key)
	delete(c.key.a.combos, c)
	delete(c.key.b.combos, c)
	delete(c.key.n.combos, c)
	delete(s.dirty.combos, c)
}

func (s *state) leaveCNP(c *cnpClass) {
	if c.members--; c.members > 0 {
		return
	}
	delete(c.tier.classes, c.key)
	delete(c.list.classes, c)
	c.list.release()
}

func (s *state) leaveNP(c *npClass) {
	if c.members--; c.members > 0 {
		return
	}
	delete(c.tier.classes, c.key)
	delete(c.list.classes, c)
	c.list.release()
}
