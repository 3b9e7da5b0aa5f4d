package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// Building the next Program from the state, sharing with the last one
// what did not change.

// listable reports whether a pod belongs in the Program's Pods: every
// pod, or with Options.Node only that node's. A node-scoped Program has
// no use for the other pods' entries (their PodPolicy is nil, and peers
// reach its rules as addresses), and at 100,000 pods they cost ~18 MB
// and a copy of the list whenever any pod changes.
func (s *state) listable(ps *podState) bool {
	return !ps.gone && (s.opts.Node == "" || ps.pod.NodeName == s.opts.Node)
}

// program makes the next Program, sharing with the last one what did not
// change.
func (s *state) program() *Program {
	d := &s.dirty
	old := s.prog
	p := &Program{Options: s.opts}
	if old == nil {
		n := 0
		for _, ps := range s.order {
			if ps.listed = s.listable(ps); ps.listed {
				n++
			}
		}
		p.Pods = make([]Pod, 0, n)
		p.Policies = make([]*PodPolicy, 0, n)
		p.podSlot = make([]uint32, 0, n)
		byKey := make(map[string]uint32, n)
		for _, ps := range s.order {
			if !ps.listed {
				continue
			}
			var pp *PodPolicy
			if ps.combo != nil {
				pp = ps.combo.pp
			}
			p.Pods = append(p.Pods, *ps.pod)
			p.Policies = append(p.Policies, pp)
			p.podSlot = append(p.podSlot, ps.slot)
			if s.loadKeys != nil {
				byKey[s.loadKeys[ps.index]] = ps.slot // made once, by uniquePods
			} else {
				byKey[ps.pod.Key()] = ps.slot
			}
		}
		p.podByKey = newCOWMap(byKey)
		p.slotIndex = slotIndex(p.podSlot, len(s.slots))
		return s.finishProgram(p, old)
	}
	added, removed := s.listChanges()
	if len(added)+len(removed) > 0 {
		s.reorder(p, old, added, removed)
	} else {
		p.Pods, p.Policies, p.podSlot, p.slotIndex, p.podByKey = old.Pods, old.Policies, old.podSlot, old.slotIndex, old.podByKey
		for ps := range d.podData {
			if ps.listed {
				p.Pods = slices.Clone(old.Pods)
				break
			}
		}
		for _, ps := range d.pods {
			if ps.listed {
				p.Policies = slices.Clone(old.Policies)
				break
			}
		}
	}
	for ps := range d.podData {
		if ps.listed {
			p.Pods[p.slotIndex[ps.slot]] = *ps.pod
		}
	}
	for _, ps := range d.pods {
		if !ps.listed {
			continue
		}
		i := p.slotIndex[ps.slot]
		p.Policies[i] = nil
		if ps.combo != nil {
			p.Policies[i] = ps.combo.pp
		}
	}
	return s.finishProgram(p, old)
}

// listChanges finds the pods that join the Program's Pods (new pods, and
// pods that became listable: scheduled to the node) and those that leave
// it, and updates their listed marks.
func (s *state) listChanges() (added, removed []*podState) {
	d := &s.dirty
	for _, ps := range d.removed {
		if ps.listed {
			removed = append(removed, ps)
		}
	}
	for ps := range d.podData {
		switch now := s.listable(ps); {
		case now && !ps.listed:
			added = append(added, ps)
		case !now && ps.listed:
			removed = append(removed, ps)
		}
	}
	for _, ps := range added {
		ps.listed = true
	}
	for _, ps := range removed {
		ps.listed = false
	}
	return added, removed
}

// slotIndex inverts podSlot.
func slotIndex(podSlot []uint32, slots int) []int32 {
	out := make([]int32, slots)
	for i := range out {
		out[i] = -1
	}
	for i, sl := range podSlot {
		out[sl] = int32(i)
	}
	return out
}

// reorder makes the per-pod slices after pods were added or removed, by
// copying the unchanged runs of the last Program's: the cost is a copy of
// the slices, not a walk over the pods.
func (s *state) reorder(p, old *Program, addedPods, removedPods []*podState) {
	var removed []int
	changes := map[string]*uint32{}
	for _, ps := range removedPods {
		if int(ps.slot) < len(old.slotIndex) && old.slotIndex[ps.slot] >= 0 && old.podSlot[old.slotIndex[ps.slot]] == ps.slot {
			removed = append(removed, int(old.slotIndex[ps.slot]))
			changes[ps.pod.Key()] = nil
		}
	}
	slices.Sort(removed)
	type insert struct {
		at int // position in the old slice
		ps *podState
	}
	var added []insert
	for _, ps := range addedPods {
		key := ps.pod.Key()
		at, _ := slices.BinarySearchFunc(old.Pods, key, func(o Pod, k string) int { return cmpKey(&o, k) })
		added = append(added, insert{at, ps})
		slot := ps.slot
		changes[key] = &slot
	}
	slices.SortFunc(added, func(a, b insert) int {
		if a.at != b.at {
			return a.at - b.at
		}
		return strings.Compare(a.ps.pod.Key(), b.ps.pod.Key())
	})
	n := len(old.Pods) - len(removed) + len(added)
	p.Pods = make([]Pod, 0, n)
	p.Policies = make([]*PodPolicy, 0, n)
	p.podSlot = make([]uint32, 0, n)
	next := 0 // next old index to copy
	copyTo := func(end int) {
		for len(removed) > 0 && removed[0] < end {
			r := removed[0]
			removed = removed[1:]
			p.Pods = append(p.Pods, old.Pods[next:r]...)
			p.Policies = append(p.Policies, old.Policies[next:r]...)
			p.podSlot = append(p.podSlot, old.podSlot[next:r]...)
			next = r + 1
		}
		if end > next {
			p.Pods = append(p.Pods, old.Pods[next:end]...)
			p.Policies = append(p.Policies, old.Policies[next:end]...)
			p.podSlot = append(p.podSlot, old.podSlot[next:end]...)
			next = end
		}
	}
	for _, a := range added {
		copyTo(a.at)
		p.Pods = append(p.Pods, *a.ps.pod)
		var pp *PodPolicy
		if a.ps.combo != nil {
			pp = a.ps.combo.pp
		}
		p.Policies = append(p.Policies, pp)
		p.podSlot = append(p.podSlot, a.ps.slot)
	}
	copyTo(len(old.Pods))
	p.slotIndex = slotIndex(p.podSlot, len(s.slots))
	p.podByKey = old.podByKey.with(changes)
}

// cmpKey compares a pod's "namespace/name" with key, without making the
// pod's key.
func cmpKey(p *Pod, key string) int {
	ns, name := p.Namespace, p.Name
	n := min(len(ns), len(key))
	if c := strings.Compare(ns, key[:n]); c != 0 || len(key) == n {
		if c != 0 {
			return c
		}
		return 1 // key is a prefix of the namespace
	}
	if len(ns) < len(key) {
		if c := strings.Compare("/", key[n:n+1]); c != 0 {
			return c
		}
		return strings.Compare(name, key[n+1:])
	}
	return 0
}

// finishProgram fills what does not depend on the pod order.
func (s *state) finishProgram(p, old *Program) *Program {
	d := &s.dirty
	s.addressTables(p, old)
	s.nodeTables(p, old)
	if old == nil || d.status {
		p.Status, p.Counts = s.statuses()
	} else {
		p.Status, p.Counts = old.Status, old.Counts
	}
	if old == nil || d.diags {
		p.Diagnostics = s.diagnostics()
	} else {
		p.Diagnostics = old.Diagnostics
	}
	return p
}

// statuses lists the policies' statuses, sorted by kind and name, and
// counts every policy by outcome. Scoped to a node, it lists the
// ClusterNetworkPolicies and only the NetworkPolicies not accepted
// (Program.Status says why).
func (s *state) statuses() ([]PolicyStatus, PolicyCounts) {
	type keyed struct {
		key string
		i   int
	}
	var counts PolicyCounts
	keys := make([]keyed, 0, len(s.cnps))
	for i, np := range s.nps {
		st := np.status()
		counts.NetworkPolicy.count(st.Accepted)
		if st.Accepted && s.opts.Node != "" {
			continue
		}
		keys = append(keys, keyed{st.Policy.String(), i})
	}
	for i, c := range s.cnps {
		counts.ClusterNetworkPolicy.count(c.status.Accepted)
		keys = append(keys, keyed{c.ref.String(), len(s.nps) + i})
	}
	slices.SortFunc(keys, func(a, b keyed) int {
		if c := strings.Compare(a.key, b.key); c != 0 {
			return c
		}
		return a.i - b.i
	})
	out := make([]PolicyStatus, len(keys))
	for j, k := range keys {
		if k.i < len(s.nps) {
			out[j] = s.nps[k.i].status()
		} else {
			out[j] = s.cnps[k.i-len(s.nps)].status
		}
	}
	return out, counts
}

// addressTables finds pods by address: the slot of the pod that alone
// claims each address, and the addresses several pods claim. Both cover
// every pod, listed or not: the evaluator finds remote peers by slot.
func (s *state) addressTables(p, old *Program) {
	d := &s.dirty
	if old == nil {
		byIP := newAddrMap[uint32](len(s.ipOwners.one.v4))
		p.dupAddrs = map[netip.Addr][]string{}
		for a, owner := range s.ipOwners.one.all() {
			if s.ipOwners.many[a] == nil {
				byIP.set(a, owner.slot)
			}
		}
		for a, owners := range s.ipOwners.shared() {
			p.dupAddrs[a] = claimants(owners)
		}
		p.podByIP = newAddrCOW(byIP)
		return
	}
	p.podByIP, p.dupAddrs = old.podByIP, old.dupAddrs
	if len(d.addrs) == 0 {
		return
	}
	changes := make(map[netip.Addr]*uint32, len(d.addrs))
	dupChanged := false
	for a := range d.addrs {
		owners := s.ipOwners.of(a)
		if len(owners) == 1 {
			slot := owners[0].slot
			changes[a] = &slot
		} else {
			changes[a] = nil
		}
		if len(owners) > 1 || old.dupAddrs[a] != nil {
			dupChanged = true
		}
	}
	p.podByIP = old.podByIP.with(changes)
	if dupChanged {
		p.dupAddrs = maps.Clone(old.dupAddrs)
		for a := range d.addrs {
			if owners := s.ipOwners.of(a); len(owners) > 1 {
				p.dupAddrs[a] = claimants(owners)
			} else {
				delete(p.dupAddrs, a)
			}
		}
	}
}

// claimants are the keys of the pods that claim one address, sorted.
func claimants(owners []*podState) []string {
	out := make([]string, len(owners))
	for i, ps := range owners {
		out[i] = ps.pod.Key()
	}
	slices.Sort(out)
	return out
}

// nodeTables indexes nodes by name and address.
func (s *state) nodeTables(p, old *Program) {
	if old != nil && !s.dirty.nodes {
		p.Nodes, p.nodeIndex, p.nodeByIP = old.Nodes, old.nodeIndex, old.nodeByIP
		return
	}
	p.nodeIndex = map[string]int{}
	p.nodeByIP = map[netip.Addr]int{}
	names := make([]string, 0, len(s.nodes))
	for name := range s.nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		n := s.nodes[name]
		p.nodeIndex[name] = len(p.Nodes)
		for _, a := range n.Addrs {
			if _, dup := p.nodeByIP[a.Unmap()]; !dup {
				p.nodeByIP[a.Unmap()] = len(p.Nodes)
			}
		}
		p.Nodes = append(p.Nodes, *n)
	}
}

// diagnostics lists every finding: duplicate input objects, namespaces
// known only by name, nodes and pods without usable addresses, then each
// policy's problems in input order.
func (s *state) diagnostics() []Diagnostic {
	out := slices.Clone(s.globalDiags)
	var implied []string
	for name, ns := range s.namespaces {
		if !ns.explicit && s.hasPodNetPod(ns) {
			implied = append(implied, name)
		}
	}
	sort.Strings(implied)
	for _, name := range implied {
		out = append(out, Diagnostic{Severity: SeverityWarning, Object: "Namespace " + name, Message: "no Namespace object in the input: only its kubernetes.io/metadata.name label is known to selectors"})
	}
	out = append(out, s.nodeDiags()...)
	out = append(out, s.missingNodeDiags()...)
	pods := make([]*podState, 0, len(s.podsWithDiags))
	for ps := range s.podsWithDiags {
		pods = append(pods, ps)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].pod.Key() < pods[j].pod.Key() })
	for _, ps := range pods {
		out = append(out, s.podDiags(ps)...)
	}
	for _, np := range s.nps {
		diags, named := np.diagnostics()
		out = append(out, diags...)
		out = append(out, named...)
	}
	for _, c := range s.cnps {
		out = append(out, c.diags...)
		out = append(out, c.named...)
	}
	return out
}

// hasPodNetPod reports whether a namespace has a pod that is not on the
// host network (those do not need their namespace's labels).
func (s *state) hasPodNetPod(ns *nsState) bool { return ns.nonHost > 0 }

// missingNodeDiags warns of nodes that pods run on but the input has no
// Node object for (`kubectl get pods,ns,netpol` leaves them out): their
// addresses are unknown, so the node-local exemption and `nodes` peers
// cannot see them, and verdicts about them differ from the cluster's.
func (s *state) missingNodeDiags() []Diagnostic {
	missing := map[string]int{}
	for _, ps := range s.order {
		if n := ps.pod.NodeName; s.nodeMissing(n) {
			missing[n]++
		}
	}
	if len(missing) == 0 {
		return nil
	}
	const why = "the node-local exemption and `nodes` peers do not know its addresses"
	if len(s.nodes) == 0 {
		pods := 0
		for _, n := range missing {
			pods += n
		}
		return []Diagnostic{{Severity: SeverityWarning, Object: "Node", Message: fmt.Sprintf("no Node objects in the input, but %d pods run on %d nodes: %s (add them, e.g. kubectl get nodes -o yaml)", pods, len(missing), strings.Replace(why, "its", "their", 1))}}
	}
	names := make([]string, 0, len(missing))
	for n := range missing {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]Diagnostic, 0, len(names))
	for _, n := range names {
		out = append(out, Diagnostic{Severity: SeverityWarning, Object: "Node " + n, Message: fmt.Sprintf("no Node object in the input, but %d pods run on it: %s", missing[n], why)})
	}
	return out
}

func (s *state) nodeDiags() []Diagnostic {
	names := make([]string, 0, len(s.nodes))
	for name := range s.nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []Diagnostic
	owner := map[netip.Addr]string{}
	for _, name := range names {
		n := s.nodes[name]
		if len(n.Addrs) == 0 {
			out = append(out, Diagnostic{Severity: SeverityWarning, Object: "Node " + name, Field: "status.addresses", Message: "node has no IP address: `nodes` peers select nothing on it"})
		}
		for _, a := range n.Addrs {
			if pods := s.ipOwners.of(a.Unmap()); len(pods) > 0 {
				out = append(out, Diagnostic{Severity: SeverityWarning, Object: "Node " + name, Field: "status.addresses",
					Message: fmt.Sprintf("address %s is also pod %s's: left out of `nodes` peers and not node-local, its traffic is judged as the pod's", a, strings.Join(claimants(pods), ", pod "))})
			}
			if other, dup := owner[a.Unmap()]; dup {
				out = append(out, Diagnostic{Severity: SeverityWarning, Object: "Node " + name, Field: "status.addresses", Message: fmt.Sprintf("address %s also belongs to node %s", a, other)})
				continue
			}
			owner[a.Unmap()] = name
		}
	}
	return out
}
