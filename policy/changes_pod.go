package policy

import (
	"maps"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
)

// A pod's change (new, relabelled, readdressed, new ports, deleted) is
// applied to the indexes, the resolved selectors and the peers it enters or
// leaves; the pod is marked for reclassification (see changes.go).

// upsertPod adds a pod or replaces one of the same namespace and name.
func (s *state) upsertPod(p *Pod) {
	p = cleanAddrs(p)
	i, ps := s.findPod(p.Key())
	if ps == nil {
		ns := s.namespace(p.Namespace)
		ns.refs++
		ps = &podState{pod: p, ns: ns}
		s.allocSlot(ps)
		s.order = slices.Insert(s.order, i, ps)
		s.updatePod(ps, nil)
		return
	}
	old := ps.pod
	ps.pod = p
	s.updatePod(ps, old)
}

// deletePod removes a pod; false if unknown.
func (s *state) deletePod(key string) bool {
	i, ps := s.findPod(key)
	if ps == nil {
		return false
	}
	old := ps.pod
	ps.pod = &Pod{Namespace: old.Namespace, Name: old.Name, HostNetwork: true}
	ps.gone = true
	s.updatePod(ps, old)
	s.order = slices.Delete(s.order, i, i+1)
	delete(s.dirty.podData, ps)
	if _, had := s.podsWithDiags[ps]; had {
		delete(s.podsWithDiags, ps)
		s.dirty.diags = true
	}
	if s.nodeMissing(old.NodeName) {
		s.dirty.diags = true // it counted towards a missing node
	}
	s.pendingFree = append(s.pendingFree, ps.slot)
	s.slots[ps.slot] = nil
	ps.ns.refs--
	s.dropNamespace(ps.ns)
	s.dirty.removed = append(s.dirty.removed, ps)
	return true
}

// findPod finds a pod by "namespace/name" in s.order, which is sorted by
// that key: i is its position, or where it would be inserted. A binary
// search rather than a map from keys: at 100,000 pods the map and its key
// strings would cost ~15 MB for lookups made once per pod change.
func (s *state) findPod(key string) (i int, ps *podState) {
	i, found := slices.BinarySearchFunc(s.order, key, func(ps *podState, k string) int { return cmpKey(ps.pod, k) })
	if !found {
		return i, nil
	}
	return i, s.order[i]
}

// updatePod brings indexes, selectors and peers up to date after a pod's
// fields changed from old (nil: the pod is new).
func (s *state) updatePod(ps *podState, old *Pod) {
	d := &s.dirty
	wasNet := ps.podnet
	var oldLabels map[string]string
	var oldIPs []netip.Addr
	oldSig := ps.fullSig
	if old != nil {
		oldLabels, oldIPs = old.Labels, old.IPs
	}
	s.setPodFacts(ps)
	ps.projs = [2]podProj{}
	p := ps.pod
	nowNet := ps.podnet
	labelsChanged := old == nil || !maps.Equal(oldLabels, p.Labels)
	addrsChanged := old == nil || wasNet != nowNet || !slices.Equal(oldIPs, p.IPs)
	portsChanged := old == nil || oldSig != ps.fullSig || wasNet != nowNet
	d.podData[ps] = struct{}{}
	d.reclass[ps] = struct{}{}
	if oldHost := old == nil || old.HostNetwork; oldHost != p.HostNetwork {
		if oldHost {
			ps.ns.nonHost++
		} else {
			ps.ns.nonHost--
		}
		d.diags = true
	}
	if s.nodeMissing(p.NodeName) || old != nil && old.NodeName != p.NodeName && s.nodeMissing(old.NodeName) {
		d.diags = true // missing nodes are counted by the pods on them
	}
	if old != nil && !labelsChanged && !addrsChanged && !portsChanged && old.NodeName == p.NodeName {
		return
	}
	c := podChange{oldLabels: oldLabels, oldIPs: oldIPs, oldSig: oldSig, wasNet: wasNet, nowNet: nowNet,
		labels: labelsChanged, addrs: addrsChanged, ports: portsChanged}
	// 1. Indexes of pod-network pods.
	s.reindexPod(ps, c)
	// 2. Pod selectors whose members change, and the peers that may follow.
	s.repeerPod(ps, c)
	// 3. Rules whose named ports resolve on pods matched by address.
	s.renamedPod(ps, c)
}

// podChange is what changed in a pod, for updatePod's steps.
type podChange struct {
	oldLabels            map[string]string
	oldIPs               []netip.Addr
	oldSig               int32
	wasNet, nowNet       bool
	labels, addrs, ports bool // which of the pod's facts changed
}

// reindexPod updates the label index, namespace membership, addresses and declared ports of a changed pod.
func (s *state) reindexPod(ps *podState, c podChange) {
	p := ps.pod
	if c.wasNet && (c.labels || !c.nowNet) {
		s.podIndex.remove(ps.slot, c.oldLabels)
	}
	if c.nowNet && (c.labels || !c.wasNet) {
		s.podIndex.add(ps.slot, p.Labels)
	}
	if c.wasNet != c.nowNet {
		if c.nowNet {
			ps.ns.pods.Add(ps.slot)
		} else {
			ps.ns.pods.Remove(ps.slot)
		}
		for _, sel := range s.nsSels {
			if sel.ns != nil && sel.ns.Contains(ps.ns.id) {
				if c.nowNet {
					sel.pods.Add(ps.slot)
				} else {
					sel.pods.Remove(ps.slot)
				}
			}
		}
	}
	if c.addrs {
		s.moveAddrs(ps, c.wasNet, c.oldIPs)
		s.setSlotAddrs(ps)
	}
	if c.ports {
		if c.wasNet {
			s.declare(ps.slot, c.oldSig, false)
		}
		if c.nowNet {
			s.declare(ps.slot, ps.fullSig, true)
		}
	}
}

// repeerPod updates the pod selectors whose members change and the peers that may follow.
func (s *state) repeerPod(ps *podState, c podChange) {
	p := ps.pod
	cands := map[*peer]struct{}{}
	for _, sel := range s.podSels {
		if sel.pods == nil {
			continue
		}
		was := sel.pods.Contains(ps.slot)
		now := c.nowNet && sel.sel.Matches(labels.Set(p.Labels))
		if was == now {
			continue
		}
		if now {
			sel.pods.Add(ps.slot)
		} else {
			sel.pods.Remove(ps.slot)
		}
		for pe := range sel.peers {
			cands[pe] = struct{}{}
		}
	}
	if c.addrs || c.ports {
		for pe := range ps.ns.peers {
			cands[pe] = struct{}{}
		}
		for _, sel := range s.nsSels {
			if sel.ns != nil && sel.ns.Contains(ps.ns.id) {
				for pe := range sel.peers {
					cands[pe] = struct{}{}
				}
			}
		}
	}
	for pe := range cands {
		if !pe.resolved {
			continue
		}
		was := pe.pods.Contains(ps.slot)
		now := c.nowNet && s.inScope(pe, ps.ns) && (pe.podSel == nil || s.podSelPods(pe.podSel).Contains(ps.slot))
		if was == now && !(now && (c.addrs || c.ports)) {
			continue
		}
		s.peerMember(pe, ps, was, now, c.oldIPs)
	}
}

// renamedPod marks the rules whose named ports resolve on pods matched by address, and records the pod for named-port diagnostics.
func (s *state) renamedPod(ps *podState, c podChange) {
	d := &s.dirty
	p := ps.pod
	if c.addrs || c.ports {
		for r := range s.wideNamed {
			if !r.matched {
				continue
			}
			if r.set.all || anyIn(r.set.cidrs, c.oldIPs) || anyIn(r.set.cidrs, p.IPs) {
				d.rules[r] = struct{}{}
			}
		}
	}
	if c.labels || c.ports || c.wasNet != c.nowNet {
		d.namedPods = append(d.namedPods, namedChange{ps, c.oldLabels, c.wasNet})
	}
}

func anyIn(set *AddrSet, addrs []netip.Addr) bool {
	if set == nil {
		return false
	}
	for _, a := range addrs {
		if set.Contains(a) {
			return true
		}
	}
	return false
}

// moveAddrs updates who owns which address after a pod's addresses (or
// whether it is a pod-network pod) changed.
func (s *state) moveAddrs(ps *podState, wasNet bool, oldIPs []netip.Addr) {
	d := &s.dirty
	s.addrIndex = nil
	d.diags = true
	if wasNet {
		for _, a := range oldIPs {
			owners := slices.DeleteFunc(slices.Clone(s.ipOwners.of(a)), func(o *podState) bool { return o == ps })
			s.setOwners(a, owners)
		}
	}
	if ps.podnet {
		for _, a := range ps.pod.IPs {
			s.setOwners(a, append(slices.Clone(s.ipOwners.of(a)), ps))
		}
	}
	delete(s.podsWithDiags, ps)
	if len(ps.pod.IPs) == 0 {
		s.podsWithDiags[ps] = struct{}{}
	}
	for _, a := range ps.pod.IPs {
		if s.ipOwners.count(a) > 1 {
			s.podsWithDiags[ps] = struct{}{}
		}
	}
}

func (s *state) setOwners(a netip.Addr, owners []*podState) {
	s.dirty.addrs[a] = struct{}{}
	s.ipOwners.set(a, owners)
	// Co-owners gain or lose their duplicate-address warning.
	for _, o := range owners {
		delete(s.podsWithDiags, o)
		if len(o.pod.IPs) == 0 || len(owners) > 1 {
			s.podsWithDiags[o] = struct{}{}
		}
		for _, b := range o.pod.IPs {
			if s.ipOwners.count(b) > 1 {
				s.podsWithDiags[o] = struct{}{}
			}
		}
	}
}

// peerMember applies a pod joining, leaving or changing within a resolved
// peer. The peer's pods are replaced, never changed in place: published
// Programs hold them. Its addresses follow once per batch (settlePeers):
// a burst of changes to one large peer then copies its address set once,
// not once per change.
func (s *state) peerMember(pe *peer, ps *podState, was, now bool, oldIPs []netip.Addr) {
	if was {
		pe.pending = append(pe.pending, oldIPs...)
	}
	if now {
		pe.pending = append(pe.pending, ps.pod.IPs...)
	}
	if was != now {
		// A pod that stays (only its addresses or ports changed) leaves
		// the peer's pods as they are.
		pods := pe.pods.Clone()
		if was {
			pods.Remove(ps.slot)
		} else {
			pods.Add(ps.slot)
		}
		pe.pods = pods
	}
	s.dirty.peers[pe] = struct{}{}
}

// settlePeers brings the addresses of the peers whose pods changed up to
// date: an address belongs to a pod peer while a pod among its pods
// claims it. It runs before anything of the batch is published.
func (s *state) settlePeers() {
	for pe := range s.dirty.peers {
		if len(pe.pending) == 0 {
			continue
		}
		cands := slices.SortedFunc(slices.Values(pe.pending), netip.Addr.Compare)
		cands = slices.Compact(cands)
		var adds, dels []netip.Addr
		for _, a := range cands {
			switch want := s.ownedWithin(a, pe.pods); {
			case want == pe.addrs.Contains(a):
			case want:
				adds = append(adds, a)
			default:
				dels = append(dels, a)
			}
		}
		pe.addrs, pe.pending = pe.addrs.with(adds, dels), nil
	}
}

// ownedWithin reports whether a pod among pods claims a.
func (s *state) ownedWithin(a netip.Addr, pods interface{ Contains(uint32) bool }) bool {
	return s.ipOwners.any(a, func(o *podState) bool { return pods.Contains(o.slot) })
}

// nodeMissing reports whether pods on the named node count towards a
// missing-node warning.
func (s *state) nodeMissing(name string) bool {
	return name != "" && s.nodes[name] == nil
}
