// Package nft turns a compiled policy.Program into the nftables ruleset of
// one node (table "inet moat", DESIGN §4) and keeps the kernel in step with
// it: a full replace or a diff, each in one transaction, and removal of
// established flows the new rules deny. Every drop counts into a named
// counter object per policy rule (Syncer.Counters reads them back), which
// patches never touch and a full replace carries over.
//
// The package first builds a Ruleset, a small intermediate form that can be
// diffed against what is programmed, rendered into knftables operations and
// interpreted in Go (to pick the conntrack entries to remove, and to test
// the translation without a kernel).
package nft

import (
	"net/netip"
	"sort"

	"github.com/moat-net/moat/policy"
)

// SetKind says what a set holds and so which nftables type it has.
type SetKind int

// Set kinds. Peer address sets (Addr4, Addr6) are shared: one pair per
// distinct peer, looked up by every rule that uses it, with the rule's
// ports matched beside it (inline, or in a Services set). A run of rules
// too long to walk one lookup at a time gets union sets instead: one set
// of each of the first four kinds, named after the rules, so that pod
// churn only changes elements, never which sets a chain looks up.
const (
	// Addr4 is "ipv4_addr" with flags interval: remote addresses (a
	// shared peer, or a union run's terms without ports).
	Addr4 SetKind = iota
	// Addr6 is Addr4 for IPv6.
	Addr6
	// Ports4 is "ipv4_addr . inet_proto . inet_service" with flags
	// interval: remote address, protocol and destination port of a union
	// run's terms with ports.
	Ports4
	// Ports6 is Ports4 for IPv6.
	Ports6
	// Services is "inet_proto . inet_service" with flags interval: the
	// ports of shared lookups that need more than one range.
	Services
)

// setKinds lists the kinds of a union run's sets in the order rules look
// them up.
var setKinds = [...]SetKind{Addr4, Addr6, Ports4, Ports6}

// suffix is appended to a union run's base name to name its set of this
// kind.
func (k SetKind) suffix() string {
	return [...]string{"-a4", "-a6", "-p4", "-p6", ""}[k]
}

func (k SetKind) ipv4() bool { return k == Addr4 || k == Ports4 }

// Box is one element of a ports set: a range of remote addresses, one
// protocol and a range of destination ports.
type Box struct {
	Addrs policy.AddrRange
	Proto policy.Protocol
	Ports policy.PortRange
}

// Service is one element of a Services set: a protocol and a range of
// destination ports.
type Service struct {
	Proto policy.Protocol
	Ports policy.PortRange
}

// Set is one named set with its elements.
type Set struct {
	Name string
	Kind SetKind
	// Addrs holds the elements of Addr4/Addr6 sets: sorted, disjoint.
	Addrs []policy.AddrRange
	// Boxes holds the elements of Ports4/Ports6 sets: sorted by address
	// range, then protocol, then port; pairwise disjoint.
	Boxes []Box
	// Services holds the elements of a Services set: sorted by protocol,
	// then port; disjoint.
	Services []Service
	// hash identifies the elements (empty when unknown).
	hash string
}

// VerdictKind is what a rule does when it matches.
type VerdictKind int

// Verdicts. Return hands the packet back to the dispatch chain, which
// then judges the other direction; Drop ends it; Goto continues in the
// next tier's chain.
const (
	Return VerdictKind = iota
	Drop
	Goto
)

// Verdict is a rule's verdict.
type Verdict struct {
	Kind VerdictKind
	// Target is the chain of a Goto.
	Target string
}

// Rule is one rule of a policy chain. It matches in one of three ways:
// with Peers, when the remote address is in that shared peer set and the
// packet's protocol and port are in Ports; with Set, when the remote
// address (and protocol and port) is in one of a union run's four sets;
// with neither, always.
type Rule struct {
	// Peers is the base name of a shared peer set pair: Peers+"-4" and
	// Peers+"-6".
	Peers string
	// Ports restricts a Peers rule to some protocols and ports; nil or
	// All matches all traffic.
	Ports *policy.PortSet
	// PortSet names the Services set holding Ports when they are more
	// than one protocol and range ("" when they render inline).
	PortSet string
	// Set is the base name of a union run's four sets.
	Set     string
	Verdict Verdict
	Comment string
	// Counter names the counter object a drop rule counts into ("" for
	// none). Its name derives from the policy rule it stands for, not
	// from the chain, so every chain enforcing that rule shares it and it
	// outlives chain and element churn.
	Counter string
}

// Chain is one policy chain. Its name is derived from its content, so two
// pods judged alike share it and a chain, once created, never changes.
type Chain struct {
	Name  string
	Dir   policy.Direction
	Rules []Rule
}

// Ruleset is everything that varies in one node's table.
type Ruleset struct {
	Node string
	// Sets and Chains are the policy sets and chains, by name.
	Sets   map[string]*Set
	Chains map[string]*Chain
	// Egress and Ingress map a local pod address to the chain that
	// judges that direction; a pod no policy selects has no entry.
	Egress, Ingress map[netip.Addr]string
	// Self lists local policed pod addresses: a pod reaching its own
	// address is not policed, and a TCP packet that is new to conntrack
	// but no SYN is dropped from or to them.
	Self []netip.Addr
	// NodeLocal lists the node's addresses whose traffic to local pods is
	// allowed; empty when node-local traffic is policed.
	NodeLocal []netip.Addr
	// Counters describes the table's drop counters by counter name: the
	// fixed ones and one per policy rule (or NetworkPolicy isolation)
	// that some chain of this ruleset drops with. Packets and Bytes are
	// zero here; Syncer.Counters reads them from the kernel.
	Counters map[string]*DropCounter
	// Warnings describe input the ruleset could not honour exactly, and
	// how it failed closed.
	Warnings []string
}

// Stats counts what a ruleset programs.
type Stats struct {
	Chains, Rules, Sets, Elements int
}

// Stats counts chains, rules, sets and elements, static ones included.
func (rs *Ruleset) Stats() Stats {
	st := Stats{Chains: len(rs.Chains) + len(staticChains), Sets: len(rs.Sets) + len(staticSets) + len(staticMaps)}
	for _, c := range staticChains {
		st.Rules += len(c.rules)
	}
	for _, c := range rs.Chains {
		st.Rules += len(renderChainRules(c))
	}
	for _, s := range rs.Sets {
		st.Elements += s.len()
	}
	st.Elements += len(rs.Egress) + len(rs.Ingress) + 2*len(rs.Self) + len(rs.NodeLocal)
	return st
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
func (s *Set) len() int { return len(s.Addrs) + len(s.Boxes) + len(s.Services) }
