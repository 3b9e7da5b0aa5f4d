package nft

import (
	"net/netip"
	"slices"

	"github.com/moat-net/moat/policy"
)

// Packet is the first packet of a connection as the node's rules see it.
type Packet struct {
	Src, Dst netip.Addr
	Proto    policy.Protocol
	// Port is the destination port, 0 for protocols without ports.
	Port uint16
	// InIf is the index of the interface the packet arrived on, 0 when
	// not known (the conntrack cleanup: conntrack does not record it) or
	// when the node itself sent it. Only the check of sources on pod
	// interfaces reads it (podLinkRules).
	InIf int
	// Local: the source is an address the node's kernel holds as its own
	// (its gateway on the pod network, a secondary address), which the
	// Node need not list in its status. Such a connection started on the
	// node and met only the output hook, whose exemption asks the kernel
	// (fib saddr type local). The conntrack cleanup sets it from the
	// namespace's addresses; a Packet without it is judged by the Node's
	// status addresses alone.
	Local bool
	// DstLocal: the destination is an address the node's kernel holds as
	// its own, so the packet meets the input hook, not forward, and
	// unknownDstRules do not see it (the node's gateway address may be
	// in a pod CIDR without being in its Node's status). The conntrack
	// cleanup sets it as it sets Local.
	DstLocal bool
}

// Allows reports whether this node's rules let the first packet of a new
// connection through. It walks the same chains and sets, in the same
// order, as the kernel does with the rendered table; the conntrack cleanup
// uses it to find established flows the rules now deny, and tests compare
// it with the evaluator.
func (rs *Ruleset) Allows(p Packet) bool {
	src, dst := p.Src.Unmap(), p.Dst.Unmap()
	if p.Local && rs.hostLocal && !contains(rs.nodeLocal, src) && !contains(rs.nodeClaimed, src) {
		// outputRules' last exemption: the node's own address, not one a
		// pod claims. The forward and input hooks' checks do not meet
		// a packet the node sends.
		return rs.ingress[dst] != conflictChain
	}
	if rs.forgedOn(p.InIf, src) {
		// podLinkRules. A link-local or unspecified IPv6 source, which
		// no PodLink holds, is dropped too: by podLinkScopeRules in
		// input and by linkRules in forward (whose drop of other
		// link-scope packets is not modelled: Allows judges
		// connections between routable addresses).
		return false
	}
	if rs.spoofed(src) && !contains(rs.own, src) {
		// The forward and input hooks' spoofRules. A connection from
		// one of the node's addresses is taken to start on the node
		// (as the evaluator takes it), and the output hook does not
		// check: a Node may list its gateway address in the pod CIDR.
		return false
	}
	if rs.unknownDst(dst) && !p.Local && !p.DstLocal && !contains(rs.own, dst) && !contains(rs.own, src) {
		// The forward hook's unknownDstRules. A connection from one of
		// the node's addresses is the node's own (output hook), one to
		// them ends in input: neither meets the rules.
		return false
	}
	if contains(rs.nodeLocal, src) {
		if rs.ingress[dst] == conflictChain {
			return false // node-local's conflict check
		}
		// Node-local: the output hook's exemption. A connection from a
		// node-local address is taken to start on the node, as the
		// evaluator takes it; one forged from elsewhere meets forward,
		// which has no such exemption (no pod owns the address, so
		// dispatch lets it reach the destination's ingress chain).
		return true
	}
	if c, ok := rs.egress[src]; ok && !rs.runChain(c, rs.egressNext, src, dst, p) {
		return false
	}
	if c, ok := rs.ingress[dst]; ok && !rs.runChain(c, rs.ingressNext, dst, src, p) {
		return false
	}
	return true
}

// PathAllows reports whether a new connection gets through the rules of
// every node it crosses in a routed pod network: the node holding the
// source and the node holding the destination (pass each once; nil for an
// end outside the cluster, and nothing for a pod reaching its own address,
// which crosses no node; a pod's Service hairpin crosses its node once,
// and Allows judges it as Program.HairpinAllowed does).
func PathAllows(p Packet, crossed ...*Ruleset) bool {
	for _, rs := range crossed {
		if rs != nil && !rs.Allows(p) {
			return false
		}
	}
	return true
}

// runChain returns false when the chain drops the packet. next is the
// direction's next-tier map, local the pod's address, remote the other
// end's.
func (rs *Ruleset) runChain(name string, next map[netip.Addr]string, local, remote netip.Addr, p Packet) bool {
	if name == conflictChain {
		return false
	}
	// Goto verdicts form a chain of tiers; bound the walk all the same.
	for hops := 0; hops < 8; hops++ {
		if name == nextChain(policy.Egress) || name == nextChain(policy.Ingress) {
			n, ok := next[local]
			if !ok {
				return false // drop-no-tier
			}
			if n == "" {
				return true
			}
			name = n
		}
		c, ok := rs.chains[name]
		if !ok {
			return false
		}
		next := ""
	rules:
		for _, r := range c.Rules {
			if !rs.matches(r, remote, p) {
				continue
			}
			switch r.Verdict.Kind {
			case verdictReturn:
				return true
			case verdictDrop:
				return false
			default:
				next = r.Verdict.Target
				break rules
			}
		}
		if next == "" {
			return true
		}
		name = next
	}
	return false
}

// matches reports whether a rule of a policy chain matches the packet.
func (rs *Ruleset) matches(r chainRule, remote netip.Addr, p Packet) bool {
	switch {
	case r.Self:
		return p.Src.Unmap() == p.Dst.Unmap() && contains(rs.self, p.Src.Unmap())
	case r.Peers != "":
		return rs.matchPeers(r, remote, p)
	case r.Set != "":
		return rs.lookup(r.Set, remote, p)
	}
	return true
}

func (rs *Ruleset) lookup(base string, remote netip.Addr, p Packet) bool {
	for _, k := range setKinds {
		s, ok := rs.sets[base+k.suffix()]
		if ok && s.contains(remote, p.Proto, p.Port) {
			return true
		}
	}
	return false
}

// spoofed reports whether the base chains drop a new connection from src
// as forged: in the node's pod CIDRs and no local pod's address, or the
// address of an Unknown link (podnet holds it, pods does not).
func (rs *Ruleset) spoofed(src netip.Addr) bool {
	if rs.unknownAddr(src) {
		// An Unknown link's address: podnet holds it, pods does not.
		return true
	}
	for _, p := range rs.podNets {
		if p.Contains(src) {
			_, found := slices.BinarySearchFunc(rs.pods, src, netip.Addr.Compare)
			return !found
		}
	}
	return false
}

// unknownDst reports whether dst is in the node's pod CIDRs but is no pod
// address the node knows (unknownDstRules); a local pod's address is
// never unknown.
func (rs *Ruleset) unknownDst(dst netip.Addr) bool {
	return rs.spoofed(dst)
}

func contains(list []netip.Addr, a netip.Addr) bool {
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}
