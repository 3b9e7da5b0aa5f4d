package policy

import (
	"net/netip"
	"slices"
)

// podNetTable finds the node whose pod CIDRs hold an address without a
// walk of every node: a map from each CIDR to the first node (by name)
// that lists it, probed once per distinct prefix length (usually two,
// /24 and /64). A verdict on a flow to a bare address reads it, and a
// matrix has one per pod and peer.
type podNetTable struct {
	nodes []Node // the Nodes it was made from
	byNet map[netip.Prefix]int
	// bits are the distinct prefix lengths of each family (0: IPv4).
	bits [2][]int
}

// podNetOf finds the node whose pod CIDRs contain a (the first by name,
// as Program.Nodes are sorted) and that CIDR.
func (p *Program) podNetOf(a netip.Addr) (int, netip.Prefix, bool) {
	t, _ := p.podNetTable.Load().(*podNetTable)
	if t == nil || !sameSlice(t.nodes, p.Nodes) {
		t = &podNetTable{nodes: p.Nodes, byNet: map[netip.Prefix]int{}}
		for i := range p.Nodes {
			for _, c := range p.Nodes[i].PodCIDRs {
				if _, ok := t.byNet[c]; !ok {
					t.byNet[c] = i
				}
				f := famIndex(c.Addr())
				if !slices.Contains(t.bits[f], c.Bits()) {
					t.bits[f] = append(t.bits[f], c.Bits())
				}
			}
		}
		p.podNetTable.Store(t)
	}
	a = a.Unmap()
	best, found := -1, netip.Prefix{}
	for _, b := range t.bits[famIndex(a)] {
		c, err := a.Prefix(b) // of a's family: no error, no allocation
		if err != nil {
			continue
		}
		if i, ok := t.byNet[c]; ok && (best < 0 || i < best) {
			best, found = i, c
		}
	}
	return best, found, best >= 0
}

// unownedAt finds the node behind which an address lies that no pod
// and no node owns: it is in that node's pod CIDRs, so the pod network
// routes it there, and it is no pod-network pod's address (on any node)
// and no node's. Such an address is a pod the agents do not know yet (its
// status.podIPs has not reached them) or no pod at all, and that node
// drops new connections from it (spoofRules) and to it
// (unknownDstRules in package nft).
func (p *Program) unownedAt(a netip.Addr) (int, netip.Prefix, bool) {
	a = a.Unmap()
	if p.podClaims(a) {
		return 0, netip.Prefix{}, false
	}
	if _, ok := p.nodeByIP[a]; ok {
		return 0, netip.Prefix{}, false
	}
	return p.podNetOf(a)
}

// unknownDstAt finds the node whose forward hook drops a new connection
// from src to dst because dst is an address behind it that no pod owns
// (unownedAt): the destinations' side of forged sources, which keeps a
// pod unreachable until its node's agent knows its address ("filtering is
// effective ... from the very first instant that any container in that
// Pod is started", Kubernetes docs, "Pod lifecycle"). The node's own
// connections (from its addresses or its host-network pods) leave
// through its output hook, which does not check, and an address reaching
// itself crosses no node.
func (p *Program) unknownDstAt(src, dst Endpoint) (int, netip.Prefix, bool) {
	if dst.Pod >= 0 {
		return 0, netip.Prefix{}, false
	}
	d, s := dst.Addr.Unmap(), src.Addr.Unmap()
	i, c, ok := p.unownedAt(d)
	if !ok || s == d && src.Pod < 0 {
		return 0, netip.Prefix{}, false
	}
	n := &p.Nodes[i]
	if src.Pod >= 0 && p.Pods[src.Pod].HostNetwork && p.Pods[src.Pod].NodeName == n.Name {
		return 0, netip.Prefix{}, false
	}
	if src.Pod < 0 && (slices.Contains(n.Addrs, s) || p.nodeByIPIs(s, i)) {
		return 0, netip.Prefix{}, false
	}
	return i, c, true
}

// nodeByIPIs reports whether a is an address of node i by nodeByIP.
func (p *Program) nodeByIPIs(a netip.Addr, i int) bool {
	j, ok := p.nodeByIP[a]
	return ok && j == i
}

// famIndex is 0 for IPv4, 1 for IPv6.
func famIndex(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}
