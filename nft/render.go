package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// Table is the one table Moat owns: family inet, so IPv4 and IPv6 share
// every chain.
const Table = "moat"

const (
	dispatchChain  = "dispatch"
	nodeLocalChain = "node-local"
	conflictChain  = "conflict"
	tableComment   = "moat: network policy; managed by moat, do not edit"
)

// nextChain is where a pod's Admin tier chain goes for the tiers after it
// (a Pass, or no Admin rule matched): a lookup of the pod's address in a
// verdict map of its own, so that the Admin tier's chain does not name
// the pod's NetworkPolicy or Baseline chain. Pods with equal Admin tiers
// share one chain whatever their other tiers, and a label change that
// moves a pod to other NetworkPolicies changes a map element, not the
// Admin chain's rules. A pod missing from the map (never, by
// construction) is dropped.
func nextChain(dir policy.Direction) string {
	if dir == policy.Ingress {
		return "ingress-next"
	}
	return "egress-next"
}

// staticChain is a chain whose rules never change.
type staticChain struct {
	name  string
	hook  knftables.BaseChainHook
	rules []string
}

// Every packet that enters, leaves or crosses the node meets the same
// judgement: replies of allowed connections pass, invalid packets drop,
// new connections go to dispatch. dispatch judges the source pod's egress
// (a verdict map from address to chain; the chain returns when egress
// allows) and then the destination pod's ingress the same way. A pod's
// traffic to its own address is judged too: in the node's hooks it can
// only be the Service hairpin (a pod's connection to its own address
// stays in its network namespace), which ClusterNetworkPolicy judges
// ("A Pod connecting to a Service IP that the service proxy load-balances
// back to the same Pod is subject to ClusterNetworkPolicy", network-policy-api
// api-overview); the NetworkPolicy tier's chains accept it first (Self
// rules: a pod cannot block access to itself), so NetworkPolicies do not
// isolate it, and the Baseline tier judges it when no NetworkPolicy
// selects the pod. The output hook alone first lets the node's own addresses
// reach its pods (node-local).
var staticChains = []staticChain{
	{name: conflictChain, rules: []string{"counter name " + counterConflict + " drop"}},
	{name: dispatchChain, rules: []string{
		// A TCP packet that is new to conntrack but not a SYN is the
		// middle of a connection whose entry is gone, typically because
		// a Program denied it and Sync removed the entry. Picked up
		// loosely it would start a connection from the wrong end (and
		// let the other end's packets through as replies): drop it.
		// Untracked packets (a notrack rule, as NodeLocal DNSCache
		// installs) never have an entry: each is judged on its own.
		"ct state new ip saddr @local4 tcp flags & (fin|syn|rst|ack) != syn counter name " + counterNotSYN + " drop",
		"ct state new ip daddr @local4 tcp flags & (fin|syn|rst|ack) != syn counter name " + counterNotSYN + " drop",
		"ct state new ip6 saddr @local6 tcp flags & (fin|syn|rst|ack) != syn counter name " + counterNotSYN + " drop",
		"ct state new ip6 daddr @local6 tcp flags & (fin|syn|rst|ack) != syn counter name " + counterNotSYN + " drop",
		"ip saddr vmap @egress4",
		"ip6 saddr vmap @egress6",
		"ip daddr vmap @ingress4",
		"ip6 daddr vmap @ingress6",
	}},
	// nodeLocalChain: a new connection the node itself starts from one
	// of its node-local addresses (only the output hook goes here). It
	// skips the tiers but not the check for TCP connections picked up in
	// the middle, nor the drop of addresses two pods claim (no pod owns
	// them, whoever connects).
	{name: nodeLocalChain, rules: []string{
		"ip daddr @conflict4 goto " + conflictChain,
		"ip6 daddr @conflict6 goto " + conflictChain,
		"ct state new ip daddr @local4 tcp flags & (fin|syn|rst|ack) != syn counter name " + counterNotSYN + " drop",
		"ct state new ip6 daddr @local6 tcp flags & (fin|syn|rst|ack) != syn counter name " + counterNotSYN + " drop",
		"accept",
	}},
	{name: "egress-next", rules: []string{
		"ip saddr vmap @egress-next4",
		"ip6 saddr vmap @egress-next6",
		"counter name " + counterNoTier + " drop",
	}},
	{name: "ingress-next", rules: []string{
		"ip daddr vmap @ingress-next4",
		"ip6 daddr vmap @ingress-next6",
		"counter name " + counterNoTier + " drop",
	}},
	{name: "forward", hook: knftables.ForwardHook, rules: forwardRules},
	{name: "input", hook: knftables.InputHook, rules: inputRules},
	{name: "output", hook: knftables.OutputHook, rules: outputRules},
}

// spoofRules drop a new connection whose source is in the node's pod
// CIDRs but is no address of a pod on the node: a pod forging its source
// would otherwise miss its egress chain (dispatch finds it by source
// address) and leave through the base chain's accept policy. A pod the
// agent has not learnt yet is caught too (fail closed until it is). When
// the Node has no spec.podCIDRs, podnet4/6 hold only the addresses the
// node routes to pods the agent does not know (PodLink.Unknown). Packets the node sends never meet them: output does not
// have them, and input skips what arrives on loopback (the node's own
// packets to itself, which may carry the node's gateway address in a pod
// CIDR).
var spoofRules = []string{
	"ip saddr @podnet4 ip saddr != @pods4 counter name " + counterSpoofed + " drop",
	"ip6 saddr @podnet6 ip6 saddr != @pods6 counter name " + counterSpoofed + " drop",
}

// unknownDstRules drop a new connection the node forwards to an address
// in its pod CIDRs that is no pod-network pod's address the agent knows:
// the destinations' side of spoofRules. A pod's ingress chain is found by
// its address, so a pod whose address has not reached the agent yet
// (kubelet writes status.podIPs after the sandbox is up, often after its
// containers started) would otherwise meet no ingress chain and be
// reachable through the base chain's accept policy, against "filtering is
// effective ... from the very first instant that any container in that
// Pod is started" (Kubernetes docs, Network Policies, "Pod lifecycle").
// Forward alone has them: in input the destination is the node itself,
// whose gateway address may be in a pod CIDR, and in output the node's
// own connections (kubelet probes) are node-local. Without
// spec.podCIDRs podnet4/6 hold only the Unknown links' addresses.
var unknownDstRules = []string{
	"ip daddr @podnet4 ip daddr != @pods4 counter name " + counterUnknownDst + " drop",
	"ip6 daddr @podnet6 ip6 daddr != @pods6 counter name " + counterUnknownDst + " drop",
}

// linkRules replace baseRules' neighbour discovery rules in forward. The
// kernel never routes link-scope traffic, so in forward it can only be
// frames a bridge CNI (with br_netfilter) carries between pods of one
// node, which dispatch cannot judge: a link-local, broadcast or multicast
// destination is in no ingress map, and would pass an isolated pod's
// ingress. Neighbour solicitations and advertisements stay accepted (pods
// resolve each other and their gateway); router solicitations,
// advertisements and redirects do not come from pods, and are dropped
// with every other new connection from or to a link-local address and
// every broadcast or multicast one. A neighbour solicitation or
// advertisement the node routes is no link infrastructure either (RFC
// 4861: a receiver discards one whose hop limit is not 255, and the
// kernel has decremented a routed packet's before forward): with data in
// it, it would carry anything past any policy to a raw socket (ndDrop).
var linkRules = []string{
	"icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept",
	ndDrop,
	"ip6 saddr fe80::/10 counter name " + counterLink + " drop",
	"ip6 daddr fe80::/10 counter name " + counterLink + " drop",
	"meta pkttype { broadcast, multicast } counter name " + counterLink + " drop",
}

// podLinkRules drop a packet that arrives on a pod interface (one through
// which the node routes a local pod: set podifs) with a source that is not
// routed through that interface (sets podsrc4/6 of interface and address;
// see PodLink), and a packet whose source is a local pod's address with a
// resolved link (podaddrs4/6) that arrives on any other interface (a host
// on the node's uplink, or a tunnel, forging the pod). spoofRules alone
// let a pod forge a source outside the pod CIDRs, or a pod of another
// node, and meet no egress chain or the wrong one. The agent fills the
// sets from the node's routes on each sync (NetlinkLinks); an interface
// it does not know as a pod's is not checked, nor an address whose link
// it could not resolve. On a bridge CNI all the node's pods share the
// bridge as the incoming interface, so a pod may still use another local
// pod's address on the same bridge.
//
// They come first in forward and input, before the conntrack accepts: a
// forged packet that matches another flow's entry (a pod sending as its
// neighbour into the neighbour's UDP flow with an outside host, or as
// that host to the neighbour) is accepted as established otherwise. On a
// routed CNI they are exact for every packet, new or not: an honest
// packet from a pod interface carries a source routed through it. The
// price is a set lookup or two for every packet these hooks see
// (BENCHMARKS.md, "Pod sources before conntrack"); the family match
// comes first so that each packet meets one family's lookups.
//
// IPv6 sources that are unspecified or link-local are exempt: a pod's
// link-local address is no pod address, but the pod's kernel sends link
// infrastructure from it (or from ::) to the node and, on a bridge, to
// its neighbours. Of them forward drops every new connection (linkRules)
// and input all but link infrastructure (podLinkScopeRules).
var podLinkRules = []string{
	"meta nfproto ipv4 meta iif @podifs meta iif . ip saddr != @podsrc4 counter name " + counterSpoofed + " drop",
	"meta nfproto ipv6 meta iif @podifs ip6 saddr != { ::, fe80::/10 } meta iif . ip6 saddr != @podsrc6 counter name " + counterSpoofed + " drop",
	"ip saddr @podaddrs4 meta iif . ip saddr != @podsrc4 counter name " + counterSpoofed + " drop",
	"ip6 saddr @podaddrs6 meta iif . ip6 saddr != @podsrc6 counter name " + counterSpoofed + " drop",
}

// podLinkScopeRules judge, in input, what arrives on a pod interface from
// an unspecified or link-local IPv6 source. Such a source reaches only the
// node itself, but that is exactly what egress policies to nodes or
// networks are written to stop: dispatch finds no egress chain for an
// fe80:: address, so a pod whose egress is denied would reach every
// service of its node listening on :: through the node's link-local
// address on its link. Of it only link
// infrastructure passes: neighbour discovery and router solicitations
// (baseRules, before these) and multicast listener queries and reports
// (MLD, which conntrack leaves untracked); every other new connection,
// echo requests included, is dropped as link scope. Nothing a pod needs
// uses its link-local address towards the node: its gateway, DNS and
// probes' answers go over its pod addresses. An interface the agent does
// not know as a pod's is not checked.
var podLinkScopeRules = []string{
	"meta iif @podifs ip6 saddr { ::, fe80::/10 } icmpv6 type { mld-listener-query, mld-listener-report, mld-listener-done, mld2-listener-report } accept",
	"meta iif @podifs ip6 saddr { ::, fe80::/10 } counter name " + counterLink + " drop",
}

// relatedRules drop, before the accept of related ICMP errors, an error
// that arrives on a pod interface about a connection none of whose ends
// is routed through that interface. Conntrack relates an ICMP error to
// the connection its quoted header names and checks only the error's
// destination against it, not its source: a pod whose egress is denied
// would otherwise reach any host with a connection through the node,
// with an error carrying data of its choice after the quoted header, and
// inject errors (port unreachable, "fragmentation needed") into other
// pods' connections and the node's own. A pod's own errors about its own
// connections pass: its address is then the original source or the reply
// source of the entry (the latter also as a Service's backend, behind
// destination NAT). Errors from routers and from outside the node are not
// affected (conntrack cannot tell who may send those).
var relatedRules = []string{
	"ct state related meta iif @podifs meta iif . ct original ip saddr != @podsrc4 meta iif . ct reply ip saddr != @podsrc4 counter name " + counterSpoofed + " drop",
	"ct state related meta iif @podifs meta iif . ct original ip6 saddr != @podsrc6 meta iif . ct reply ip6 saddr != @podsrc6 counter name " + counterSpoofed + " drop",
}

// tunnelPorts are the UDP ports of the overlay encapsulations encapRules
// drop: VXLAN (IANA's 4789: Calico, Antrea; Linux's first 8472: flannel,
// Cilium) and Geneve (6081). A CNI configured for another port is not
// covered.
const tunnelPorts = "4789, 6081, 8472"

// encapRules drop overlay encapsulation a pod sends to its node (input)
// or to another node's address (forward, encapForwardRules: flannel
// masquerades it to this node's address on the way, so only this node
// can tell it is a pod's): VXLAN and Geneve (tunnelPorts) and IP-in-IP,
// IPv6-in-IP (SIT) and GRE (protocols 4, 41, 47). The kernel's tunnel
// devices (flannel.1, vxlan.calico, tunl0) take encapsulated packets from
// any source, and a decapsulated packet enters forward on the tunnel
// device, which is no pod interface, with whatever source its inner
// header claims: another node's pod, judged by the destination's ingress
// as that pod. A pod has no business tunnelling to a node (the CNI does
// that for it), so this holds whatever the policies allow; a pod's
// tunnels to hosts outside the cluster's nodes are policed as any other
// traffic. An interface the agent does not know as a pod's is not
// checked.
var encapRules = []string{
	"meta iif @podifs udp dport { " + tunnelPorts + " } counter name " + counterSpoofed + " drop",
	"meta iif @podifs meta l4proto { 4, 41, 47 } counter name " + counterSpoofed + " drop",
}

// encapForwardRules are encapRules for forward: to the addresses of the
// cluster's nodes (set nodeaddrs4/6).
var encapForwardRules = []string{
	"meta iif @podifs ip daddr @nodeaddrs4 udp dport { " + tunnelPorts + " } counter name " + counterSpoofed + " drop",
	"meta iif @podifs ip6 daddr @nodeaddrs6 udp dport { " + tunnelPorts + " } counter name " + counterSpoofed + " drop",
	"meta iif @podifs ip daddr @nodeaddrs4 meta l4proto { 4, 41, 47 } counter name " + counterSpoofed + " drop",
	"meta iif @podifs ip6 daddr @nodeaddrs6 meta l4proto { 4, 41, 47 } counter name " + counterSpoofed + " drop",
}

// conntrackRules are the start of forward and input: the pod-interface
// checks, replies of allowed connections, the ICMP errors related to them
// from their ends, and the drop of what conntrack calls invalid.
var conntrackRules = slices.Concat(podLinkRules, baseRules[:1], relatedRules, baseRules[1:3])

var forwardRules = slices.Concat(conntrackRules, linkRules, spoofRules, unknownDstRules, encapForwardRules, baseRules[len(baseRules)-1:])

var inputRules = slices.Concat(conntrackRules, baseRules[3:len(baseRules)-1], encapRules, []string{
	"meta iiftype != loopback " + spoofRules[0],
	"meta iiftype != loopback " + spoofRules[1],
	podLinkScopeRules[0],
	podLinkScopeRules[1],
	baseRules[len(baseRules)-1],
})

// outputRules are baseRules with the node-local exemption before
// dispatch. Only the output hook sees the packets the node itself sends,
// and only those may use the exemption (docs/semantics.md, "Node-local
// traffic"): in forward or input a packet with a node address as source
// came from elsewhere, forged (the kernel drops such IPv4 martians, but
// not IPv6 ones), and is judged like any other.
// Besides the Node's status addresses, any address the kernel holds as
// local is the node's: with many CNIs (ptp, bridge, kindnet, flannel)
// the node reaches its pods from its gateway address on the pod network,
// so kubelet probes carry that source; NodeLocal DNSCache answers from a
// link-local address of its own. The hostlocal set holds the address
// type "local" unless node-local traffic is policed. A node address that
// a pod-network pod claims (nodeclaimed) is judged as the pod's, as the
// evaluator judges it.
var outputRules = append(slices.Clone(baseRules[:len(baseRules)-1]),
	"ip saddr @nodelocal4 goto "+nodeLocalChain,
	"ip6 saddr @nodelocal6 goto "+nodeLocalChain,
	"ip saddr @nodeclaimed4 goto "+dispatchChain,
	"ip6 saddr @nodeclaimed6 goto "+dispatchChain,
	"fib saddr type @hostlocal goto "+nodeLocalChain,
	baseRules[len(baseRules)-1],
)

// IPv6 neighbour discovery is link infrastructure, not a connection: a
// node's neighbour advertisement to an isolated pod's address must not be
// judged as ingress, or the pod loses its gateway. Only on-link messages
// are (hop limit 255, as RFC 4861 requires of all five); any other is
// dropped as link scope.
// Of related connections only ICMP errors are accepted as they come: a
// conntrack helper's expected connection (an FTP or SIP data channel the
// helper predicted) is a new connection like any other, and is judged.
// (icmpv6 is nft's own name for protocol 58; "ipv6-icmp" would need
// /etc/protocols, which the agent's image does not have.)
var baseRules = []string{
	"ct state established accept",
	"ct state related meta l4proto { icmp, icmpv6 } accept",
	"ct state invalid counter name " + counterInvalid + " drop",
	"icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect } ip6 hoplimit 255 accept",
	ndDrop,
	"jump " + dispatchChain,
}

// ndDrop drops the neighbour discovery messages the rules before it did
// not accept: neighbour discovery is never a connection (conntrack leaves
// it untracked), so dispatch could not judge it as one.
const ndDrop = "icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect } counter name " + counterLink + " drop"

var staticSets = []knftables.Set{
	{Name: "self4", Type: "ipv4_addr . ipv4_addr", Comment: knftables.PtrTo("local pod addresses, to themselves: the Service hairpin, which NetworkPolicy chains accept")},
	{Name: "self6", Type: "ipv6_addr . ipv6_addr", Comment: knftables.PtrTo("local pod addresses, to themselves: the Service hairpin, which NetworkPolicy chains accept")},
	{Name: "local4", Type: "ipv4_addr", Comment: knftables.PtrTo("policed pods on this node")},
	{Name: "local6", Type: "ipv6_addr", Comment: knftables.PtrTo("policed pods on this node")},
	{Name: "nodelocal4", Type: "ipv4_addr", Comment: knftables.PtrTo("this node's addresses when node-local traffic is allowed")},
	{Name: "nodelocal6", Type: "ipv6_addr", Comment: knftables.PtrTo("this node's addresses when node-local traffic is allowed")},
	{Name: "nodeclaimed4", Type: "ipv4_addr", Comment: knftables.PtrTo("this node's addresses a pod-network pod claims")},
	{Name: "nodeclaimed6", Type: "ipv6_addr", Comment: knftables.PtrTo("this node's addresses a pod-network pod claims")},
	{Name: "nodeaddrs4", Type: "ipv4_addr", Comment: knftables.PtrTo("every node's addresses: tunnel endpoints pods may not encapsulate to")},
	{Name: "nodeaddrs6", Type: "ipv6_addr", Comment: knftables.PtrTo("every node's addresses: tunnel endpoints pods may not encapsulate to")},
	{Name: "hostlocal", Type: "fib_addrtype", Comment: knftables.PtrTo("local: any address of the node is node-local; empty when node-local traffic is policed")},
	{Name: "conflict4", Type: "ipv4_addr", Comment: knftables.PtrTo("addresses several pods claim")},
	{Name: "conflict6", Type: "ipv6_addr", Comment: knftables.PtrTo("addresses several pods claim")},
	{Name: "podnet4", Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}, Comment: knftables.PtrTo("this node's pod CIDRs")},
	{Name: "podnet6", Type: "ipv6_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}, Comment: knftables.PtrTo("this node's pod CIDRs")},
	{Name: "pods4", Type: "ipv4_addr", Comment: knftables.PtrTo("pod addresses in this node's pod CIDRs")},
	{Name: "pods6", Type: "ipv6_addr", Comment: knftables.PtrTo("pod addresses in this node's pod CIDRs")},
	{Name: "podifs", Type: "iface_index", Comment: knftables.PtrTo("interfaces local pods are routed through; filled by moat-agent from the node's routes")},
	{Name: "podsrc4", Type: "iface_index . ipv4_addr", Comment: knftables.PtrTo("pod interface and the pod addresses routed through it; filled by moat-agent")},
	{Name: "podsrc6", Type: "iface_index . ipv6_addr", Comment: knftables.PtrTo("pod interface and the pod addresses routed through it; filled by moat-agent")},
	{Name: "podaddrs4", Type: "ipv4_addr", Comment: knftables.PtrTo("the addresses in podsrc4: they may arrive on their pod interface only")},
	{Name: "podaddrs6", Type: "ipv6_addr", Comment: knftables.PtrTo("the addresses in podsrc6: they may arrive on their pod interface only")},
}

var staticMaps = []knftables.Map{
	{Name: "egress4", Type: "ipv4_addr : verdict", Comment: knftables.PtrTo("local pod address to its egress chain")},
	{Name: "egress6", Type: "ipv6_addr : verdict", Comment: knftables.PtrTo("local pod address to its egress chain")},
	{Name: "ingress4", Type: "ipv4_addr : verdict", Comment: knftables.PtrTo("local pod address to its ingress chain")},
	{Name: "ingress6", Type: "ipv6_addr : verdict", Comment: knftables.PtrTo("local pod address to its ingress chain")},
	{Name: "egress-next4", Type: "ipv4_addr : verdict", Comment: knftables.PtrTo("local pod address to its egress tiers after Admin")},
	{Name: "egress-next6", Type: "ipv6_addr : verdict", Comment: knftables.PtrTo("local pod address to its egress tiers after Admin")},
	{Name: "ingress-next4", Type: "ipv4_addr : verdict", Comment: knftables.PtrTo("local pod address to its ingress tiers after Admin")},
	{Name: "ingress-next6", Type: "ipv6_addr : verdict", Comment: knftables.PtrTo("local pod address to its ingress tiers after Admin")},
}

// nftType is the set's key type. Address sets carry the family beside the
// address (see addrKey).
func (k setKind) nftType() string {
	return [...]string{"ipv4_addr . nf_proto", "ipv6_addr . nf_proto", "ipv4_addr . inet_proto . inet_service", "ipv6_addr . inet_proto . inet_service", "inet_proto . inet_service"}[k]
}

func (v verdict) String() string {
	switch v.Kind {
	case verdictDrop:
		return "drop"
	case verdictGoto:
		return "goto " + v.Target
	}
	return "return"
}

// renderChainRules expands a policy chain into nft rules: a rule with
// shared peers looks the remote end up in the peer's set of each family,
// with its ports beside it; a union rule looks it up in the run's four
// sets (the family decides which two can match).
func renderChainRules(c *policyChain) []*knftables.Rule {
	field := "daddr"
	if c.Dir == policy.Ingress {
		field = "saddr"
	}
	var out []*knftables.Rule
	for _, r := range c.Rules {
		var cm *string
		if r.Comment != "" {
			cm = knftables.PtrTo(comment(r.Comment))
		}
		v := r.Verdict.String()
		if r.Counter != "" {
			v = "counter name " + r.Counter + " " + v
		}
		switch {
		case r.Self:
			out = append(out,
				&knftables.Rule{Chain: c.Name, Rule: "ip saddr . ip daddr @self4 " + v, Comment: cm},
				&knftables.Rule{Chain: c.Name, Rule: "ip6 saddr . ip6 daddr @self6 " + v, Comment: cm},
			)
		case r.Peers != "":
			ports := portsExpr(r)
			out = append(out,
				&knftables.Rule{Chain: c.Name, Rule: fmt.Sprintf("ip %s . meta nfproto @%s-4 %s%s", field, r.Peers, ports, v), Comment: cm},
				&knftables.Rule{Chain: c.Name, Rule: fmt.Sprintf("ip6 %s . meta nfproto @%s-6 %s%s", field, r.Peers, ports, v), Comment: cm},
			)
		case r.Set != "":
			out = append(out,
				&knftables.Rule{Chain: c.Name, Rule: fmt.Sprintf("ip %s . meta nfproto @%s-a4 %s", field, r.Set, v), Comment: cm},
				&knftables.Rule{Chain: c.Name, Rule: fmt.Sprintf("ip6 %s . meta nfproto @%s-a6 %s", field, r.Set, v), Comment: cm},
				&knftables.Rule{Chain: c.Name, Rule: fmt.Sprintf("ip %s . meta l4proto . th dport @%s-p4 %s", field, r.Set, v), Comment: cm},
				&knftables.Rule{Chain: c.Name, Rule: fmt.Sprintf("ip6 %s . meta l4proto . th dport @%s-p6 %s", field, r.Set, v), Comment: cm},
			)
		default:
			out = append(out, &knftables.Rule{Chain: c.Name, Rule: v, Comment: cm})
		}
	}
	return out
}

// renderedRules is len(renderChainRules(c)) without rendering: Stats
// counts the rules of every chain on each sync, and rendering them all
// cost the agent ~10 ms per sync at 30,000 pods. The cases are
// renderChainRules' own.
func renderedRules(c *policyChain) int {
	n := 0
	for _, r := range c.Rules {
		switch {
		case r.Self, r.Peers != "":
			n += 2
		case r.Set != "":
			n += 4
		default:
			n++
		}
	}
	return n
}

// portsExpr is the port match of a shared rule, with a trailing space:
// empty for all traffic, "tcp dport 80" for one protocol and range, a
// lookup of protocol and port in a services set otherwise.
func portsExpr(r chainRule) string {
	if r.PortSet != "" {
		return "meta l4proto . th dport @" + r.PortSet + " "
	}
	if r.Ports == nil {
		return ""
	}
	sv, _ := singleService(r.Ports)
	if sv.Proto.HasPorts() {
		return fmt.Sprintf("%s dport %s ", protoName(sv.Proto), sv.Ports)
	}
	return fmt.Sprintf("meta l4proto %d th dport %s ", sv.Proto, sv.Ports)
}

func setObject(s *namedSet) *knftables.Set {
	return &knftables.Set{Name: s.Name, Type: s.Kind.nftType(), Flags: []knftables.SetFlag{knftables.IntervalFlag}}
}

func mapName(dir policy.Direction, a netip.Addr) string {
	n := "egress"
	if dir == policy.Ingress {
		n = "ingress"
	}
	if a.Is4() {
		return n + "4"
	}
	return n + "6"
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "4"
	}
	return "6"
}

func mapElement(dir policy.Direction, a netip.Addr, chain string) *knftables.Element {
	return &knftables.Element{Map: mapName(dir, a), Key: []string{a.String()}, Value: []string{"jump " + chain}}
}

// nextMapName is the map nextChain looks a pod's address up in.
func nextMapName(dir policy.Direction, a netip.Addr) string {
	return nextChain(dir) + family(a)
}

// nextElement sends a pod to the chain of its tiers after Admin; "" (none
// can deny) returns.
func nextElement(dir policy.Direction, a netip.Addr, chain string) *knftables.Element {
	v := "return"
	if chain != "" {
		v = "goto " + chain
	}
	return &knftables.Element{Map: nextMapName(dir, a), Key: []string{a.String()}, Value: []string{v}}
}

func selfElement(a netip.Addr) *knftables.Element {
	return &knftables.Element{Set: "self" + family(a), Key: []string{a.String(), a.String()}}
}

func localElement(a netip.Addr) *knftables.Element {
	return &knftables.Element{Set: "local" + family(a), Key: []string{a.String()}}
}

func nodeLocalElement(a netip.Addr) *knftables.Element {
	return &knftables.Element{Set: "nodelocal" + family(a), Key: []string{a.String()}}
}

func nodeClaimedElement(a netip.Addr) *knftables.Element {
	return &knftables.Element{Set: "nodeclaimed" + family(a), Key: []string{a.String()}}
}

func clusterNodeElement(a netip.Addr) *knftables.Element {
	return &knftables.Element{Set: "nodeaddrs" + family(a), Key: []string{a.String()}}
}

func conflictElement(a netip.Addr) *knftables.Element {
	return &knftables.Element{Set: "conflict" + family(a), Key: []string{a.String()}}
}

func hostLocalElement(t string) *knftables.Element {
	return &knftables.Element{Set: "hostlocal", Key: []string{t}}
}

func podElement(a netip.Addr) *knftables.Element {
	return &knftables.Element{Set: "pods" + family(a), Key: []string{a.String()}}
}

func podNetElement(p netip.Prefix) *knftables.Element {
	return &knftables.Element{Set: "podnet" + family(p.Addr()), Key: []string{p.String()}}
}

// addStatic adds the table's fixed skeleton: sets, maps and chains that
// every ruleset has.
func addStatic(tx *knftables.Transaction) {
	for i := range staticSets {
		s := staticSets[i]
		tx.Add(&s)
	}
	for i := range staticMaps {
		m := staticMaps[i]
		tx.Add(&m)
	}
	for _, c := range staticChains {
		ch := &knftables.Chain{Name: c.name}
		if c.hook != "" {
			ch.Type = knftables.PtrTo(knftables.FilterType)
			ch.Hook = knftables.PtrTo(c.hook)
			ch.Priority = knftables.PtrTo(knftables.FilterPriority)
			ch.Policy = knftables.PtrTo(knftables.AcceptPolicy)
		}
		tx.Add(ch)
	}
}

func addStaticRules(tx *knftables.Transaction) {
	for _, c := range staticChains {
		for _, r := range c.rules {
			tx.Add(&knftables.Rule{Chain: c.name, Rule: r})
		}
	}
}

// fullTransaction replaces the whole table in one transaction: the add
// makes the delete legal on a fresh node, and nft applies all or nothing,
// so packets see either the old table or the complete new one. Counters
// named in prev (read from the table being replaced) start from its
// values, so that a replace does not reset what they counted.
func fullTransaction(tx *knftables.Transaction, rs *Ruleset, prev map[string]CounterValue) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(tableComment)})
	tx.Delete(&knftables.Table{})
	tx.Add(&knftables.Table{Comment: knftables.PtrTo(tableComment)})
	addStatic(tx)
	for _, name := range sortedKeys(rs.counters) {
		tx.Add(counterObject(rs.counters[name], prev))
	}
	for _, name := range sortedKeys(rs.sets) {
		tx.Add(setObject(rs.sets[name]))
	}
	for _, name := range sortedKeys(rs.chains) {
		tx.Add(&knftables.Chain{Name: name})
	}
	addStaticRules(tx)
	for _, name := range sortedKeys(rs.chains) {
		for _, r := range renderChainRules(rs.chains[name]) {
			tx.Add(r)
		}
	}
	for _, name := range sortedKeys(rs.sets) {
		s := rs.sets[name]
		for _, k := range s.elementKeys() {
			tx.Add(&knftables.Element{Set: s.Name, Key: k})
		}
	}
	for _, a := range rs.self {
		tx.Add(selfElement(a))
		tx.Add(localElement(a))
	}
	for _, a := range rs.nodeLocal {
		tx.Add(nodeLocalElement(a))
	}
	for _, a := range rs.nodeClaimed {
		tx.Add(nodeClaimedElement(a))
	}
	for _, a := range rs.clusterNodes {
		tx.Add(clusterNodeElement(a))
	}
	for _, t := range rs.hostLocalTypes() {
		tx.Add(hostLocalElement(t))
	}
	for _, a := range rs.conflicts() {
		tx.Add(conflictElement(a))
	}
	for _, p := range rs.podNetElements() {
		tx.Add(podNetElement(p))
	}
	for _, a := range rs.pods {
		tx.Add(podElement(a))
	}
	for _, i := range linkIndexes(rs.links) {
		tx.Add(podIfElement(i))
	}
	for _, l := range knownLinks(rs.links) {
		tx.Add(podSrcElement(l))
	}
	for _, a := range linkAddrs(rs.links) {
		tx.Add(podAddrElement(a))
	}
	for _, a := range sortedAddrs(rs.egress) {
		tx.Add(mapElement(policy.Egress, a, rs.egress[a]))
	}
	for _, a := range sortedAddrs(rs.ingress) {
		tx.Add(mapElement(policy.Ingress, a, rs.ingress[a]))
	}
	for _, a := range sortedAddrs(rs.egressNext) {
		tx.Add(nextElement(policy.Egress, a, rs.egressNext[a]))
	}
	for _, a := range sortedAddrs(rs.ingressNext) {
		tx.Add(nextElement(policy.Ingress, a, rs.ingressNext[a]))
	}
}

// diffTransaction turns old into new with the fewest operations: 1. new
// sets with their elements; 2. the elements of surviving sets; 3. new
// counters and chains; 4. the fixed sets and verdict maps; 5. chains, sets
// and counters nothing uses any more, last. Chains never change in place
// (their names hash their content), so when only pods or labels change
// the transaction holds element operations only.
func diffTransaction(tx *knftables.Transaction, old, rs *Ruleset) {
	addNewSets(tx, old, rs)
	patchSets(tx, old, rs)
	addNewChains(tx, old, rs)
	patchDispatch(tx, old, rs)
	deleteGone(tx, old, rs)
}

func addNewSets(tx *knftables.Transaction, old, rs *Ruleset) {
	for _, name := range sortedKeys(rs.sets) {
		s := rs.sets[name]
		if _, ok := old.sets[name]; !ok {
			tx.Add(setObject(s))
			for _, k := range s.elementKeys() {
				tx.Add(&knftables.Element{Set: name, Key: k})
			}
		}
	}
}

// patchSets updates the elements of sets both rulesets have. Deletions
// come before additions within a set: an interval set refuses a new
// element that overlaps one still present.
func patchSets(tx *knftables.Transaction, old, rs *Ruleset) {
	for _, name := range sortedKeys(rs.sets) {
		o, ok := old.sets[name]
		if !ok || (o.hash != "" && o.hash == rs.sets[name].hash) {
			continue
		}
		del, add := setDiff(o, rs.sets[name])
		for _, k := range del {
			tx.Delete(&knftables.Element{Set: name, Key: k})
		}
		for _, k := range add {
			tx.Add(&knftables.Element{Set: name, Key: k})
		}
	}
}

// addNewChains adds new counters and chains. Counters belong to policy
// rules, not chains: they stay while any chain counts into them and are
// never reset by a patch.
func addNewChains(tx *knftables.Transaction, old, rs *Ruleset) {
	for _, name := range sortedKeys(rs.counters) {
		if _, ok := old.counters[name]; !ok {
			tx.Add(counterObject(rs.counters[name], nil))
		}
	}
	var newChains []string
	for _, name := range sortedKeys(rs.chains) {
		if _, ok := old.chains[name]; !ok {
			newChains = append(newChains, name)
			tx.Add(&knftables.Chain{Name: name})
		}
	}
	for _, name := range newChains {
		for _, r := range renderChainRules(rs.chains[name]) {
			tx.Add(r)
		}
	}
}

// patchDispatch updates the fixed sets and the verdict maps (a changed
// element is deleted, then added again).
func patchDispatch(tx *knftables.Transaction, old, rs *Ruleset) {
	diffAddrList(tx, old.self, rs.self, selfElement)
	diffAddrList(tx, old.self, rs.self, localElement)
	diffAddrList(tx, old.nodeLocal, rs.nodeLocal, nodeLocalElement)
	diffAddrList(tx, old.nodeClaimed, rs.nodeClaimed, nodeClaimedElement)
	diffAddrList(tx, old.clusterNodes, rs.clusterNodes, clusterNodeElement)
	diffAddrList(tx, old.hostLocalTypes(), rs.hostLocalTypes(), hostLocalElement)
	diffAddrList(tx, old.conflicts(), rs.conflicts(), conflictElement)
	diffAddrList(tx, old.podNetElements(), rs.podNetElements(), podNetElement)
	diffAddrList(tx, old.pods, rs.pods, podElement)
	diffAddrList(tx, linkIndexes(old.links), linkIndexes(rs.links), podIfElement)
	diffAddrList(tx, knownLinks(old.links), knownLinks(rs.links), podSrcElement)
	diffAddrList(tx, linkAddrs(old.links), linkAddrs(rs.links), podAddrElement)
	diffVerdictMap(tx, policy.Egress, old.egress, rs.egress, mapName, mapElement)
	diffVerdictMap(tx, policy.Ingress, old.ingress, rs.ingress, mapName, mapElement)
	diffVerdictMap(tx, policy.Egress, old.egressNext, rs.egressNext, nextMapName, nextElement)
	diffVerdictMap(tx, policy.Ingress, old.ingressNext, rs.ingressNext, nextMapName, nextElement)
}

// diffVerdictMap turns the elements of one direction's verdict maps (by
// address; name and elem give each address's map and element) from om
// into nm.
func diffVerdictMap(tx *knftables.Transaction, dir policy.Direction, om, nm map[netip.Addr]string,
	name func(policy.Direction, netip.Addr) string, elem func(policy.Direction, netip.Addr, string) *knftables.Element) {
	for _, a := range sortedAddrs(om) {
		if c, ok := nm[a]; !ok || c != om[a] {
			tx.Delete(&knftables.Element{Map: name(dir, a), Key: []string{a.String()}})
		}
	}
	for _, a := range sortedAddrs(nm) {
		if c, ok := om[a]; !ok || c != nm[a] {
			tx.Add(elem(dir, a, nm[a]))
		}
	}
}

// deleteGone deletes what only old has. A chain may only go once nothing
// jumps to it: chains that others refer to go after those others.
func deleteGone(tx *knftables.Transaction, old, rs *Ruleset) {
	var gone []string
	for _, name := range sortedKeys(old.chains) {
		if _, ok := rs.chains[name]; !ok {
			gone = append(gone, name)
		}
	}
	for _, name := range orderReferrersFirst(old, gone) {
		tx.Delete(&knftables.Chain{Name: name})
	}
	for _, name := range sortedKeys(old.sets) {
		if _, ok := rs.sets[name]; !ok {
			tx.Delete(&knftables.Set{Name: name})
		}
	}
	for _, name := range sortedKeys(old.counters) {
		if _, ok := rs.counters[name]; !ok {
			tx.Delete(&knftables.Counter{Name: name})
		}
	}
}

func orderReferrersFirst(rs *Ruleset, names []string) []string {
	referenced := map[string]bool{}
	for _, n := range names {
		for _, r := range rs.chains[n].Rules {
			if r.Verdict.Kind == verdictGoto {
				referenced[r.Verdict.Target] = true
			}
		}
	}
	var first, last []string
	for _, n := range names {
		if referenced[n] {
			last = append(last, n)
		} else {
			first = append(first, n)
		}
	}
	return append(first, last...)
}

func diffKeys(old, cur [][]string) (del, add [][]string) {
	in := func(ks [][]string) map[string][]string {
		m := make(map[string][]string, len(ks))
		for _, k := range ks {
			m[strings.Join(k, " . ")] = k
		}
		return m
	}
	om, nm := in(old), in(cur)
	for _, k := range old {
		if _, ok := nm[strings.Join(k, " . ")]; !ok {
			del = append(del, k)
		}
	}
	for _, k := range cur {
		if _, ok := om[strings.Join(k, " . ")]; !ok {
			add = append(add, k)
		}
	}
	return del, add
}

func diffAddrList[A comparable](tx *knftables.Transaction, old, cur []A, elem func(A) *knftables.Element) {
	om := map[A]bool{}
	for _, a := range old {
		om[a] = true
	}
	nm := map[A]bool{}
	for _, a := range cur {
		nm[a] = true
	}
	for _, a := range old {
		if !nm[a] {
			tx.Delete(elem(a))
		}
	}
	for _, a := range cur {
		if !om[a] {
			tx.Add(elem(a))
		}
	}
}
