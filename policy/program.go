package policy

import (
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// Direction says which end of a connection a rule judges: egress rules
// are judged for the source pod, ingress rules for the destination pod.
type Direction int

// The two directions, ingress first as in the API objects.
const (
	Ingress Direction = iota
	Egress
)

// bothDirections stands for ingress and egress where a direction is asked.
const bothDirections Direction = -1

// String is "ingress" or "egress".
func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// Tier names where a decision was made, in evaluation order.
type Tier string

// Tiers in evaluation order (docs/semantics.md), plus the pseudo-tiers that explain decisions made
// before or without policy.
const (
	TierAdmin         Tier = "Admin"
	TierNetworkPolicy Tier = "NetworkPolicy"
	TierBaseline      Tier = "Baseline"
	// TierDefault: no tier decided, Kubernetes' default allow.
	TierDefault Tier = "Default"
	// TierNotPoliced: this end is not a pod-network pod (external IP,
	// node, host-network pod) or the flow is a pod talking to itself.
	TierNotPoliced Tier = "NotPoliced"
	// TierNodeLocal: the node's own addresses reaching its pods (kubelet
	// probes), allowed unless Options.DenyNodeLocal.
	TierNodeLocal Tier = "NodeLocal"
)

// Action is what a ClusterNetworkPolicy rule does with matching traffic.
type Action string

// Rule actions. Allow and Isolate describe NetworkPolicy-tier outcomes so
// every decision carries an action.
const (
	ActionAccept Action = "Accept"
	ActionDeny   Action = "Deny"
	ActionPass   Action = "Pass"
	// ActionAllow: a NetworkPolicy rule allowed the traffic.
	ActionAllow Action = "Allow"
	// ActionIsolate: NetworkPolicies select the pod and none allowed it.
	ActionIsolate Action = "Isolate"
)

// PolicyRef names a policy object.
type PolicyRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// String is "Kind namespace/name" or "Kind name".
func (r PolicyRef) String() string {
	if r.Namespace == "" {
		return r.Kind + " " + r.Name
	}
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

// Term is one product of addresses and ports; a Match is a union of terms.
// Most rules compile to one term; egress named ports add one term per
// group of destination pods, because the name resolves differently on each.
//
// Terms whose addresses come from the same peers (the same selectors,
// CIDRs or nodes, in whichever rules and policies) share one *AddrSet, and
// a Compiler keeps that pointer across Programs while the peers' addresses
// do not change: a backend can key shared sets by it.
type Term struct {
	Addrs *AddrSet
	Ports *PortSet

	// split, when set, describes Addrs for the evaluator's index as the
	// addresses of some pods (by slot) plus other ranges, so that pods
	// picked by selectors cost one segment per run of slots instead of one
	// per address. Addrs is always their union.
	split *termSplit
}

// Match is the set of (peer address, protocol, port) a rule matches: the
// peer is the remote end (destination for egress, source for ingress).
type Match []Term

// Matches reports whether the remote address, protocol and port match.
func (m Match) Matches(remote netip.Addr, proto Protocol, port uint16) bool {
	for _, t := range m {
		if t.Ports.Matches(proto, port) && t.Addrs.Contains(remote) {
			return true
		}
	}
	return false
}

// Rule is one compiled ClusterNetworkPolicy rule.
type Rule struct {
	Policy    PolicyRef
	Tier      Tier
	Priority  int32
	Direction Direction
	// Index is the rule's position in spec.ingress or spec.egress.
	Index int
	Name  string
	// Action is the effective action: a Pass or Deny rule that failed
	// closed becomes Deny.
	Action Action
	// FailClosed explains why the rule was changed, empty if it was not.
	FailClosed string
}

// Field is the rule's field path, e.g. "spec.egress[2]".
func (r *Rule) Field() string { return fmt.Sprintf("spec.%s[%d]", r.Direction, r.Index) }

// RuleMatch is a rule as it applies to one pod: the match may depend on
// the pod when the rule uses named ports.
type RuleMatch struct {
	Rule  *Rule
	Match Match
}

// NPRule is one NetworkPolicy rule as it applies to one pod.
type NPRule struct {
	Policy PolicyRef
	Index  int
	Match  Match
}

// NPTier is the NetworkPolicy tier of one pod in one direction: the
// policies that select it (so it is isolated) and their rules.
type NPTier struct {
	Policies []PolicyRef
	Rules    []NPRule
}

// DirPolicy is everything that judges one direction of one pod: Admin,
// NP, Baseline in evaluation order. Pods with the same selecting policies
// share one.
type DirPolicy struct {
	// index is built on first evaluation, so that compiling for a
	// dataplane (which never evaluates) does not pay for it. The fields
	// a verdict reads (the once's flag, the indexes, NP and Admin) come
	// first, within the first cache line of the 128-byte allocation:
	// after Admin, NP and Baseline they took a second line, a likely
	// cache miss per direction at scale.
	indexOnce sync.Once
	// NP is nil when no NetworkPolicy selects the pod for this direction.
	NP       *NPTier
	index    dirIndex // by value: one pointer fewer to chase per verdict
	Admin    []RuleMatch
	Baseline []RuleMatch

	// The compiled tiers this DirPolicy was made of; nil when built by
	// hand.
	admin, baseline *cnpDir
	np              *npDir
}

// dirIndex holds one matchIndex per tier.
type dirIndex struct {
	admin, np, baseline *matchIndex
}

func (dp *DirPolicy) indexes() *dirIndex {
	dp.indexOnce.Do(func() {
		if dp.admin != nil {
			// Compiled: tiers share their index with every DirPolicy
			// that has the same tier.
			dp.index = dirIndex{admin: dp.admin.idx(), np: dp.np.idx(), baseline: dp.baseline.idx()}
			return
		}
		ms := func(rs []RuleMatch) []Match {
			out := make([]Match, len(rs))
			for i, r := range rs {
				out[i] = r.Match
			}
			return out
		}
		ix := dirIndex{admin: buildIndex(ms(dp.Admin)), baseline: buildIndex(ms(dp.Baseline))}
		if dp.NP != nil {
			nps := make([]Match, len(dp.NP.Rules))
			for i, r := range dp.NP.Rules {
				nps[i] = r.Match
			}
			ix.np = buildIndex(nps)
		}
		dp.index = ix
	})
	return &dp.index
}

// PodPolicy is the compiled policy of one pod-network pod.
type PodPolicy struct {
	Ingress, Egress *DirPolicy
}

// Dir returns the direction's policy.
func (p *PodPolicy) Dir(d Direction) *DirPolicy {
	if d == Egress {
		return p.Egress
	}
	return p.Ingress
}

// PolicyStatus is what the compiler concluded about one policy object:
// the data behind a ClusterNetworkPolicy's Accepted condition.
type PolicyStatus struct {
	Policy   PolicyRef `json:"policy"`
	Accepted bool      `json:"accepted"`
	// Reason is InvalidSpec or UnknownField when not accepted.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// PolicyCounts counts a Program's policy objects of each kind by
// outcome.
type PolicyCounts struct {
	NetworkPolicy, ClusterNetworkPolicy PolicyCount
}

// PolicyCount is how many policies of one kind are enforced as written
// (Accepted) and how many fail-closed (PolicyStatus.Accepted false).
type PolicyCount struct {
	Accepted, FailedClosed int
}

func (c *PolicyCount) count(accepted bool) {
	if accepted {
		c.Accepted++
	} else {
		c.FailedClosed++
	}
}

// Options change compilation.
type Options struct {
	// DenyNodeLocal turns off the default allowance of traffic from a
	// node's own addresses to the pods on that node.
	DenyNodeLocal bool
	// IngressNetworksAndNodes is the feature gate of the same name: off,
	// ingress `networks` and `nodes` peers of ClusterNetworkPolicies are
	// treated as unknown fields and enforced fail-closed.
	IngressNetworksAndNodes bool
	// Node, when set, scopes the Program to one node, as moat-agent needs
	// it: only the pod-network pods on that node get a PodPolicy (every
	// other pod's is nil, as if not policed), and nothing is compiled for
	// pods elsewhere. Peers are still resolved cluster-wide, so the
	// Program judges that node's pods exactly as a full Program does, and
	// only them: the evaluator answers "not policed" for the other pods.
	Node string
	// Pods, when set, scopes the Program to these pods ("namespace/name"),
	// as `moat explain` needs it for the two ends of one flow: only they
	// (and, with Node, only those on the node) get a PodPolicy, exactly the
	// one a full Program gives them. Nothing is compiled for other pods.
	Pods []string
}

// Program is the single compiled form of all policies of a snapshot. The
// evaluator and the nftables backend both read it; it is immutable.
type Program struct {
	Options Options
	// Pods are all pods with their index as ID, sorted by namespace/name;
	// with Options.Node, only that node's pods (pods elsewhere are
	// addresses to it: PodByKey and PodByIP do not find them).
	Pods []Pod
	// Policies holds one PodPolicy per pod, nil for host-network pods and
	// pods without IPs (they are not policed), and with Options.Node for
	// pods on other nodes. Pods judged alike share one PodPolicy.
	Policies []*PodPolicy
	Nodes    []Node
	// Status has one entry per policy object, sorted by kind and name;
	// with Options.Node, only the ClusterNetworkPolicies' (moat-agent
	// writes their Accepted conditions) and those of the NetworkPolicies
	// not accepted. An entry for every NetworkPolicy of the cluster cost
	// a node-scoped Program ~1.8 MB at 19,000 of them, kept for nothing
	// but counting: Counts counts every policy whatever Status lists.
	Status      []PolicyStatus
	Counts      PolicyCounts
	Diagnostics []Diagnostic

	// podByKey and podByIP find a pod's slot (its stable number in the
	// Compiler, which the evaluator's index uses); slotIndex maps a slot
	// to the pod's index in Pods, -1 for a pod not listed, and may be
	// shorter than the slots podByIP knows (pods added elsewhere since).
	// podByIP covers every pod, listed or not: the evaluator finds a
	// remote peer's slot through it.
	podByKey  *cowMap[string, uint32]
	podByIP   *addrCOW[uint32]
	slotIndex []int32
	podSlot   []uint32 // index in Pods -> slot
	// dupAddrs are addresses more than one pod claims, with the keys of
	// the pods that claim them; traffic on them is denied.
	dupAddrs  map[netip.Addr][]string
	nodeByIP  map[netip.Addr]int
	nodeIndex map[string]int
	// evalTable is what the evaluator reads per pod (an *evalPodTable,
	// see evalPods), made on the first verdict. An atomic.Value rather
	// than an atomic.Pointer: a Program may be copied (vet's copylocks).
	evalTable atomic.Value
	// podNetTable is the nodes' pod CIDRs by prefix (a *podNetTable, see
	// podNetOf), made on the first verdict that needs it.
	podNetTable atomic.Value
}

// PodByKey finds a pod by "namespace/name".
func (p *Program) PodByKey(key string) (int, bool) {
	s, ok := p.podByKey.get(key)
	if !ok {
		return 0, false
	}
	return int(p.slotIndex[s]), true
}

// PodByIP finds the pod-network pod that owns an address.
func (p *Program) PodByIP(a netip.Addr) (int, bool) {
	s, ok := p.podByIP.get(a.Unmap())
	if !ok || int(s) >= len(p.slotIndex) || p.slotIndex[s] < 0 {
		return 0, false // no pod, or one a node-scoped Program does not list
	}
	return int(p.slotIndex[s]), true
}

// PodAddrsIn lists, sorted, the addresses within nets that pod-network
// pods claim, alone or with others, on any node: with Options.Node too,
// where Pods lists only that node's pods. It reads every pod address of
// the cluster once.
func (p *Program) PodAddrsIn(nets []netip.Prefix) []netip.Addr {
	if len(nets) == 0 {
		return nil
	}
	var out []netip.Addr
	in := func(a netip.Addr) {
		for _, n := range nets {
			if n.Contains(a) {
				out = append(out, a)
				return
			}
		}
	}
	p.podByIP.v4.keys(func(k uint32) bool {
		in(netip.AddrFrom4([4]byte{byte(k >> 24), byte(k >> 16), byte(k >> 8), byte(k)}))
		return true
	})
	p.podByIP.other.keys(func(a netip.Addr) bool {
		in(a)
		return true
	})
	for a := range p.dupAddrs {
		in(a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// RuleAddrSets yields the address set of every term of every rule the
// Program's pods are judged by, visiting each DirPolicy once (pods of a
// class share theirs). Terms with the same peers share one set, which
// then comes once per term: callers that need the distinct sets keep
// those they have seen. The CLI partitions addresses by these sets
// (matrix classes, moat diff's address classes).
func (p *Program) RuleAddrSets() iter.Seq[*AddrSet] {
	return func(yield func(*AddrSet) bool) {
		dirs := map[*DirPolicy]bool{}
		for _, pp := range p.Policies {
			if pp == nil {
				continue
			}
			for _, dp := range []*DirPolicy{pp.Ingress, pp.Egress} {
				if dp == nil || dirs[dp] {
					continue
				}
				dirs[dp] = true
				if !yieldMatches(yield, dp) {
					return
				}
			}
		}
	}
}

// yieldMatches yields the address sets of a DirPolicy's terms, tier by
// tier; false when yield asked to stop.
func yieldMatches(yield func(*AddrSet) bool, dp *DirPolicy) bool {
	terms := func(m Match) bool {
		for _, t := range m {
			if !yield(t.Addrs) {
				return false
			}
		}
		return true
	}
	for _, r := range dp.Admin {
		if !terms(r.Match) {
			return false
		}
	}
	if dp.NP != nil {
		for _, r := range dp.NP.Rules {
			if !terms(r.Match) {
				return false
			}
		}
	}
	for _, r := range dp.Baseline {
		if !terms(r.Match) {
			return false
		}
	}
	return true
}

// DuplicateAddr reports whether more than one pod claims the address.
func (p *Program) DuplicateAddr(a netip.Addr) bool { return p.dupAddrs[a.Unmap()] != nil }

// Claimants lists, sorted, the keys ("namespace/name") of the pods that
// claim a duplicate address, wherever they run; nil if it is not one.
func (p *Program) Claimants(a netip.Addr) []string { return p.dupAddrs[a.Unmap()] }

// DuplicateAddrs lists, sorted, the addresses more than one pod claims:
// traffic from or to them is denied, and a dataplane must drop it on every
// node, not only where both claimants run.
func (p *Program) DuplicateAddrs() []netip.Addr {
	out := make([]netip.Addr, 0, len(p.dupAddrs))
	for a := range p.dupAddrs {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// podClaims reports whether a pod-network pod claims the address, on any
// node, alone or with others.
func (p *Program) podClaims(a netip.Addr) bool {
	_, ok := p.podByIP.get(a)
	return ok || p.dupAddrs[a] != nil
}

// NodeLocalAddrs lists, sorted, the addresses from which connections to
// the pods of the node are node-local (allowed before any tier): the
// node's own, less any that a pod-network pod claims too. Such a claim is
// an input problem (a pod given its node's address, or a forged status),
// and a packet's source address cannot tell the two apart, so its
// connections are judged as the pod's rather than let through. Nil when
// Options.DenyNodeLocal.
func (p *Program) NodeLocalAddrs(node string) []netip.Addr {
	if p.Options.DenyNodeLocal {
		return nil
	}
	var out []netip.Addr
	for i := range p.Nodes {
		if p.Nodes[i].Name != node {
			continue
		}
		for _, a := range p.Nodes[i].Addrs {
			if a = a.Unmap(); a.IsValid() && !p.podClaims(a) && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// PodCIDRs returns the pod CIDRs of a node by name (Node.PodCIDRs), nil
// if unknown or without any.
func (p *Program) PodCIDRs(node string) []netip.Prefix {
	for i := range p.Nodes {
		if p.Nodes[i].Name == node {
			return p.Nodes[i].PodCIDRs
		}
	}
	return nil
}

// NodeByIP finds the node that owns an address.
func (p *Program) NodeByIP(a netip.Addr) (int, bool) {
	i, ok := p.nodeByIP[a.Unmap()]
	return i, ok
}

// NodeAddrs returns the addresses of a node by name, nil if unknown.
func (p *Program) NodeAddrs(name string) []netip.Addr {
	if i, ok := p.nodeIndex[name]; ok {
		return p.Nodes[i].Addrs
	}
	return nil
}
