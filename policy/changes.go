package policy

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
)

// This file applies one object's change to the state, recording what it
// made dirty: the selectors and peers whose members change, the pods whose
// class may change, the rules whose matches must be rebuilt. publish then
// redoes only that.

// setNSLabels changes a namespace's labels.
func (s *state) setNSLabels(ns *nsState, l map[string]string) {
	next := withNSName(l, ns.name)
	if maps.Equal(next, ns.labels) {
		return
	}
	s.nsIndex.remove(ns.id, ns.labels)
	ns.labels = next
	s.nsIndex.add(ns.id, next)
	ns.projVer = [2]int{-1, -1}
	for _, sel := range s.nsSels {
		if sel.ns == nil {
			continue
		}
		was, now := sel.ns.Contains(ns.id), sel.sel.Matches(labels.Set(next))
		if was == now {
			continue
		}
		if now {
			sel.ns.Add(ns.id)
			sel.pods.Or(ns.pods)
		} else {
			sel.ns.Remove(ns.id)
			sel.pods.AndNot(ns.pods)
		}
		for pe := range sel.peers {
			if pe.resolved {
				pe.pods = s.peerPods(pe)
				pe.addrs, pe.pending = s.podAddrs(pe.pods), nil
				s.dirty.peers[pe] = struct{}{}
			}
		}
	}
	it := ns.pods.Iterator()
	for it.HasNext() {
		s.dirty.reclass[s.slots[it.Next()]] = struct{}{}
	}
	// The policies selecting its pods may change: redo their warnings.
	for np := range ns.tier.nps {
		s.dirty.namedPolicies[np] = struct{}{}
	}
	for _, c := range s.cnps {
		if len(c.names) > 0 {
			s.dirty.namedPolicies[c] = struct{}{}
		}
	}
}

// nsSelsAdd puts a new namespace into the resolved selectors that select it.
func (s *state) nsSelsAdd(ns *nsState) {
	for _, sel := range s.nsSels {
		if sel.ns != nil && sel.sel.Matches(labels.Set(ns.labels)) {
			sel.ns.Add(ns.id)
		}
	}
}

// nsSelsRemove takes a namespace without pods out of the selectors.
func (s *state) nsSelsRemove(ns *nsState) {
	for _, sel := range s.nsSels {
		if sel.ns != nil {
			sel.ns.Remove(ns.id)
		}
	}
}

func (s *state) upsertNamespace(n Namespace) {
	ns := s.namespace(n.Name)
	if !ns.explicit {
		ns.explicit = true
		s.dirty.diags = true
	}
	s.setNSLabels(ns, n.Labels)
}

func (s *state) deleteNamespace(name string) {
	ns := s.namespaces[name]
	if ns == nil || !ns.explicit {
		return
	}
	ns.explicit = false
	s.dirty.diags = true
	s.setNSLabels(ns, nil)
	s.dropNamespace(ns)
}

func (s *state) upsertNode(n Node) {
	if old := s.nodes[n.Name]; old != nil {
		s.countNodeAddrs(old, -1)
	}
	s.nodes[n.Name] = &n
	s.countNodeAddrs(&n, 1)
	s.nodesChanged()
}

func (s *state) deleteNode(name string) {
	if n, ok := s.nodes[name]; ok {
		s.countNodeAddrs(n, -1)
		delete(s.nodes, name)
		s.nodesChanged()
	}
}

// countNodeAddrs adds d to the count of nodes that list each of n's
// addresses (state.nodeAddrRefs).
func (s *state) countNodeAddrs(n *Node, d int32) {
	for _, a := range n.Addrs {
		a = a.Unmap()
		if c := s.nodeAddrRefs[a] + d; c > 0 {
			s.nodeAddrRefs[a] = c
		} else {
			delete(s.nodeAddrRefs, a)
		}
	}
}

// nodeClaimsChanged re-resolves the nodes peers when a pod took or
// released (d.addrs) an address some Node lists: nodeAddrs leaves out the
// addresses pods claim. It costs one map lookup per changed address
// otherwise.
func (s *state) nodeClaimsChanged() {
	if len(s.nodeAddrRefs) == 0 {
		return
	}
	for a := range s.dirty.addrs {
		if s.nodeAddrRefs[a] > 0 {
			s.refreshNodePeers()
			return
		}
	}
}

// nodesChanged re-resolves the nodes peers.
func (s *state) nodesChanged() {
	s.dirty.nodes = true
	s.dirty.diags = true
	s.refreshNodePeers()
}

// refreshNodePeers re-resolves the resolved nodes peers, marking those
// whose addresses changed.
func (s *state) refreshNodePeers() {
	for _, pe := range s.peers {
		if pe.kind == peerNodes && pe.resolved {
			if addrs := s.nodeAddrs(pe.node); !slices.Equal(addrs.Ranges(), pe.addrs.Ranges()) {
				pe.addrs = addrs
				s.dirty.peers[pe] = struct{}{}
			}
		}
	}
}

// upsertNP adds a NetworkPolicy or replaces those of the same namespace
// and name, keeping the first one's place in the input order.
func (s *state) upsertNP(np *NetworkPolicy) {
	pos := -1
	for i, o := range s.nps {
		if o != nil && o.src.Namespace == np.Namespace && o.src.Name == np.Name {
			if pos < 0 {
				pos = i
			}
			s.removeNP(i)
		}
	}
	st := s.addNP(np, (*validator)(nil).validateNP(np))
	if pos >= 0 {
		s.nps[pos], s.nps[len(s.nps)-1] = st, nil
	}
	s.compactPolicies()
}

func (s *state) deleteNP(namespace, name string) {
	for i, o := range s.nps {
		if o != nil && o.ref().Namespace == namespace && o.ref().Name == name {
			s.removeNP(i)
		}
	}
	s.compactPolicies()
}

func (s *state) removeNP(i int) {
	np := s.nps[i]
	s.nps[i] = nil
	np.ns.tier.remove(np)
	s.dirty.relistNS[np.ns.tier] = struct{}{}
	np.dropTiers(s, bothDirections)
	s.dropNP(np)
	s.dirty.status, s.dirty.diags = true, true
}

func (s *state) upsertCNP(cnp *ClusterNetworkPolicy) {
	pos := -1
	for i, o := range s.cnps {
		if o != nil && o.ref.Name == cnp.Name {
			if pos < 0 {
				pos = i
			}
			s.removeCNP(i)
		}
	}
	st := s.addCNP(cnp, (*validator)(nil).validateCNP(cnp))
	if pos >= 0 {
		s.cnps[pos], s.cnps[len(s.cnps)-1] = st, nil
	}
	s.compactPolicies()
}

func (s *state) deleteCNP(name string) {
	for i, o := range s.cnps {
		if o != nil && o.ref.Name == name {
			s.removeCNP(i)
		}
	}
	s.compactPolicies()
}

func (s *state) removeCNP(i int) {
	c := s.cnps[i]
	s.cnps[i] = nil
	delete(s.cnpsByID, c.id)
	t := s.tierOf(c)
	t.remove(c)
	s.dirty.relistCNP[t.idx] = true
	c.dropTiers(s, bothDirections)
	s.dropCNP(c)
	s.dirty.status, s.dirty.diags = true, true
}

// compactPolicies drops deleted entries from the input order.
func (s *state) compactPolicies() {
	s.nps = slices.DeleteFunc(s.nps, func(n *npState) bool { return n == nil })
	s.cnps = slices.DeleteFunc(s.cnps, func(c *cnpState) bool { return c == nil })
}

// policyChanged records a new policy's status, diagnostics and named ports.
func (s *state) policyChanged(p any) {
	s.dirty.status, s.dirty.diags = true, true
	s.dirty.namedPolicies[p] = struct{}{}
}
