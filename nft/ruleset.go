package nft

import (
	"net/netip"
	"slices"
	"sort"

	"github.com/moat-net/moat/policy"
)

// setKind says what a set holds and so which nftables type it has.
type setKind int

// Set kinds. Peer address sets (addr4, addr6) are shared: one pair per
// distinct peer, looked up by every rule that uses it, with the rule's
// ports matched beside it (inline, or in a services set). A run of rules
// too long to walk one lookup at a time gets union sets instead: one set
// of each of the first four kinds, named after the rules, so that pod
// churn only changes elements, never which sets a chain looks up.
const (
	// addr4 is "ipv4_addr . nf_proto" with flags interval: remote
	// addresses (a shared peer, or a union run's terms without ports),
	// each beside the constant family "ipv4", looked up as "ip daddr .
	// meta nfproto". The family field is there for the nft CLI's sake:
	// before it changes any element, nft (1.0.x) reads back every element
	// of every interval set whose key is a single field, in every table,
	// which on a node with a few hundred thousand elements costs more
	// than 100 ms per transaction. A concatenated key is exempt, so a
	// label change costs a few milliseconds instead.
	addr4 setKind = iota
	// addr6 is addr4 for IPv6.
	addr6
	// ports4 is "ipv4_addr . inet_proto . inet_service" with flags
	// interval: remote address, protocol and destination port of a union
	// run's terms with ports.
	ports4
	// ports6 is ports4 for IPv6.
	ports6
	// services is "inet_proto . inet_service" with flags interval: the
	// ports of shared lookups that need more than one range.
	services
)

// setKinds lists the kinds of a union run's sets in the order rules look
// them up.
var setKinds = [...]setKind{addr4, addr6, ports4, ports6}

// suffix is appended to a union run's base name to name its set of this
// kind.
func (k setKind) suffix() string {
	return [...]string{"-a4", "-a6", "-p4", "-p6", ""}[k]
}

func (k setKind) ipv4() bool { return k == addr4 || k == ports4 }

// box is one element of a ports set: a range of remote addresses, one
// protocol and a range of destination ports.
type box struct {
	Addrs policy.AddrRange
	Proto policy.Protocol
	Ports policy.PortRange
}

// service is one element of a services set: a protocol and a range of
// destination ports.
type service struct {
	Proto policy.Protocol
	Ports policy.PortRange
}

// namedSet is one named set with its elements.
type namedSet struct {
	Name string
	Kind setKind
	// Addrs holds the elements of addr4/addr6 sets: sorted, disjoint.
	Addrs []policy.AddrRange
	// Boxes holds the elements of ports4/ports6 sets, pairwise disjoint:
	// sorted by address range, then protocol, then port (cut along
	// addresses: boxes with different address ranges do not overlap), or
	// when PortMajor by protocol, then port range, then address range
	// (cut along ports: boxes with different port ranges do not overlap).
	Boxes     []box
	PortMajor bool
	// Services holds the elements of a services set: sorted by protocol,
	// then port; disjoint.
	Services []service
	// hash identifies the elements (empty when unknown).
	hash string
}

// verdictKind is what a rule does when it matches.
type verdictKind int

// Verdicts. verdictReturn hands the packet back to the dispatch chain, which
// then judges the other direction; verdictDrop ends it; verdictGoto continues in the
// next tier's chain.
const (
	verdictReturn verdictKind = iota
	verdictDrop
	verdictGoto
)

// verdict is a rule's verdict.
type verdict struct {
	Kind verdictKind
	// Target is the chain of a verdictGoto.
	Target string
}

// chainRule is one rule of a policy chain. It matches in one of four
// ways: with Peers, when the remote address is in that shared peer set
// and the packet's protocol and port are in Ports; with Set, when the
// remote address (and protocol and port) is in one of a union run's four
// sets; with Self, when source and destination are one local pod's
// address (set self4/self6); with none of them, always.
type chainRule struct {
	// Self matches a pod's traffic to its own address, which in the
	// node's hooks is the Service hairpin: the pod reached a Service
	// whose proxy sent it back to the pod (its traffic to its own address
	// never leaves its network namespace).
	Self bool
	// Peers is the base name of a shared peer set pair: Peers+"-4" and
	// Peers+"-6".
	Peers string
	// Ports restricts a Peers rule to some protocols and ports; nil or
	// All matches all traffic.
	Ports *policy.PortSet
	// PortSet names the services set holding Ports when they are more
	// than one protocol and range ("" when they render inline).
	PortSet string
	// Set is the base name of a union run's four sets.
	Set     string
	Verdict verdict
	Comment string
	// Counter names the counter object a drop rule counts into ("" for
	// none). Its name derives from the policy rule it stands for, not
	// from the chain, so every chain enforcing that rule shares it and it
	// outlives chain and element churn.
	Counter string
}

// policyChain is one policy chain. Its name is derived from its content, so two
// pods judged alike share it and a chain, once created, never changes.
type policyChain struct {
	Name  string
	Dir   policy.Direction
	Rules []chainRule
}

// Ruleset is everything that varies in one node's table.
type Ruleset struct {
	node string
	// sets and Chains are the policy sets and chains, by name.
	sets   map[string]*namedSet
	chains map[string]*policyChain
	// egress and ingress map a local pod address to the chain that
	// judges that direction; a pod no policy selects has no entry.
	egress, ingress map[netip.Addr]string
	// egressNext and ingressNext map the address of a local pod whose
	// entry chain is its Admin tier to the chain of its tiers after it
	// ("": none, the direction is allowed); see nextChain.
	egressNext, ingressNext map[netip.Addr]string
	// self lists local policed pod addresses: set self4/6 holds each as
	// (address . address), which NetworkPolicy chains accept (a pod's
	// Service hairpin: a pod cannot block access to itself), and a TCP
	// packet that is new to conntrack but no SYN is dropped from or to
	// them (set local4/6).
	self []netip.Addr
	// own lists the node's addresses (its Node's status.addresses), for
	// Allows alone: a connection from one of them is taken to be the
	// node's own, which the output hook does not check for forged
	// sources, even when the address is inside the node's pod CIDRs.
	own []netip.Addr
	// nodeLocal lists the node's addresses whose traffic to local pods is
	// allowed; empty when node-local traffic is policed.
	nodeLocal []netip.Addr
	// hostLocal is whether any local address of the node is node-local
	// too (the output hook asks the kernel: outputRules), nodeClaimed the
	// node's addresses a pod-network pod claims, which are not.
	hostLocal   bool
	nodeClaimed []netip.Addr
	// clusterNodes are the addresses of every Node of the cluster, this
	// one's included (set nodeaddrs4/6): a pod's overlay encapsulation to
	// them is dropped (encapRules).
	clusterNodes []netip.Addr
	// podNets are the node's pod CIDRs (policy.Node.PodCIDRs), and pods
	// every pod-network pod address in them, policed or not (Program.PodAddrsIn): a
	// new connection from an address in podNets that is not in pods is
	// forged, or from a pod the agent has not learnt yet, and is dropped.
	podNets []netip.Prefix
	pods    []netip.Addr
	// links are the node's pod interfaces and the pod addresses routed
	// through each (sorted, see PodLink; on a node without pod CIDRs
	// also the Unknown ones, of pods the agent does not know yet): not
	// built from the Program but resolved on the node, nil when not
	// (Build, moat nft).
	links []PodLink
	// counters describes the table's drop counters by counter name: the
	// fixed ones and one per policy rule (or NetworkPolicy isolation)
	// that some chain of this ruleset drops with. Packets and Bytes are
	// zero here; Syncer.counters reads them from the kernel.
	counters map[string]*DropCounter
	// warnings describe input the ruleset could not honour exactly, and
	// how it failed closed.
	warnings []string
}

// Stats counts what a ruleset programs.
type Stats struct {
	Chains, Rules, Sets, Elements int
}

// Stats counts chains, rules, sets and elements, static ones included.
func (rs *Ruleset) Stats() Stats {
	st := Stats{Chains: len(rs.chains) + len(staticChains), Sets: len(rs.sets) + len(staticSets) + len(staticMaps)}
	for _, c := range staticChains {
		st.Rules += len(c.rules)
	}
	for _, c := range rs.chains {
		st.Rules += renderedRules(c)
	}
	for _, s := range rs.sets {
		st.Elements += s.len()
	}
	st.Elements += len(rs.egress) + len(rs.ingress) + len(rs.egressNext) + len(rs.ingressNext) + 2*len(rs.self) + len(rs.nodeLocal) + len(rs.podNetElements()) + len(rs.pods)
	st.Elements += len(rs.nodeClaimed) + len(rs.clusterNodes) + len(rs.hostLocalTypes()) + len(rs.conflicts()) + len(linkIndexes(rs.links)) + len(knownLinks(rs.links)) + len(linkAddrs(rs.links))
	return st
}

// hostLocalTypes are the elements of the hostlocal set.
func (rs *Ruleset) hostLocalTypes() []string {
	if rs.hostLocal {
		return []string{"local"}
	}
	return nil
}

// conflicts lists, sorted, the addresses several pods claim (the verdict
// maps send them to the conflict chain).
func (rs *Ruleset) conflicts() []netip.Addr {
	var out []netip.Addr
	for a, c := range rs.ingress {
		if c == conflictChain {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

func sortedAddrs(m map[netip.Addr]string) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// len is the number of elements.
func (s *namedSet) len() int { return len(s.Addrs) + len(s.Boxes) + len(s.Services) }
