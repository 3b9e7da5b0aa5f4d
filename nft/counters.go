package nft

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// Reasons a packet is dropped, the Reason of a DropCounter.
const (
	// ReasonDeny: a ClusterNetworkPolicy Deny rule matched.
	ReasonDeny = "deny"
	// ReasonFailClosed: a ClusterNetworkPolicy rule that failed closed
	// (invalid or unknown fields; docs/semantics.md, "Fail closed") matched and dropped.
	ReasonFailClosed = "fail_closed"
	// ReasonIsolation: NetworkPolicies select the pod and none allowed
	// the connection.
	ReasonIsolation = "isolation"
	// ReasonInvalid: conntrack classed the packet invalid.
	ReasonInvalid = "invalid"
	// ReasonNotSYN: a TCP packet new to conntrack that is no SYN, to or
	// from a policed pod.
	ReasonNotSYN = "not_syn"
	// ReasonConflict: two local pods share the address (fail closed).
	ReasonConflict = "conflict"
	// ReasonSpoofed: a new connection from an address in the node's pod
	// CIDRs that no pod the agent knows owns (forged, or a pod not
	// learnt yet); any packet on a pod interface from a source not routed
	// through it, or a local pod's address on another interface
	// (podLinkRules); a pod's ICMP error about a connection it is no end
	// of (relatedRules); a pod's overlay encapsulation to a node
	// (encapRules).
	ReasonSpoofed = "spoofed"
	// ReasonUnknownDestination: a new connection the node forwards to an
	// address in its pod CIDRs that no pod the agent knows owns (a pod
	// whose address has not reached the agent yet, or no pod at all).
	ReasonUnknownDestination = "unknown_destination"
	// ReasonLinkScope: a new connection the node forwards from or to an
	// IPv6 link-local address, to a broadcast or multicast address, or
	// an IPv6 router message (pods on one bridge; see linkRules), or one
	// a pod opens to the node from its IPv6 link-local or unspecified
	// address (podLinkScopeRules); an IPv6 neighbour discovery message
	// whose hop limit is not 255 (ndDrop).
	ReasonLinkScope = "link_scope"
)

// DropCounter is one nftables counter object that drop rules count into,
// with what it stands for. Per policy rule rather than per chain: chains
// are shared and replaced as pods come and go, policy rules are what an
// operator asks about.
type DropCounter struct {
	// Name is the counter object in table inet moat.
	Name string
	// Policies are the policies whose rule drops: one ClusterNetworkPolicy
	// for a Deny rule, the NetworkPolicies that select the pod (all in
	// its namespace) for isolation, none for the fixed drops.
	Policies []policy.PolicyRef
	// Tier is Admin or Baseline for ClusterNetworkPolicy rules, empty
	// otherwise.
	Tier policy.Tier
	// Direction is "ingress" or "egress"; empty for the fixed drops,
	// which judge no direction of a pod.
	Direction string
	// Rule is the index in spec.ingress or spec.egress of a
	// ClusterNetworkPolicy rule, -1 when the drop is no single rule's.
	Rule int
	// Reason is one of the Reason constants.
	Reason string
	// Packets and Bytes are what the kernel counted since the counter
	// was created. A full replace of the table carries them over, so
	// they only start again from zero when the rule they count for has
	// been gone from the node.
	Packets, Bytes uint64
}

// Names of the fixed counters; policy rule counters are "c-" and a hash.
const (
	counterInvalid  = "drop-invalid"
	counterNotSYN   = "drop-not-syn"
	counterConflict = "drop-conflict"
	// counterNoTier counts packets of a pod missing from a next-tier map
	// (nextChain): fail-closed, and never expected to count.
	counterNoTier  = "drop-no-tier"
	counterSpoofed = "drop-spoofed"
	counterLink    = "drop-link-scope"
	// counterUnknownDst counts unknownDstRules' drops.
	counterUnknownDst = "drop-unknown-dst"
)

var staticCounters = []DropCounter{
	{Name: counterInvalid, Rule: -1, Reason: ReasonInvalid},
	{Name: counterNotSYN, Rule: -1, Reason: ReasonNotSYN},
	{Name: counterConflict, Rule: -1, Reason: ReasonConflict},
	{Name: counterNoTier, Rule: -1, Reason: ReasonFailClosed},
	{Name: counterSpoofed, Rule: -1, Reason: ReasonSpoofed},
	{Name: counterLink, Rule: -1, Reason: ReasonLinkScope},
	{Name: counterUnknownDst, Rule: -1, Reason: ReasonUnknownDestination},
}

// counterComment is the human-readable note on a counter object.
func (c *DropCounter) counterComment() string {
	var refs []string
	for _, p := range c.Policies {
		refs = append(refs, p.String())
	}
	parts := []string{"drop", c.Reason}
	if c.Direction != "" {
		parts = append(parts, c.Direction)
	}
	if c.Rule >= 0 {
		parts = append(parts, fmt.Sprintf("rule %d", c.Rule))
	}
	return comment(strings.Join(append(parts, refs...), " "))
}

// cnpCounter describes the counter of one ClusterNetworkPolicy rule.
func cnpCounter(r *policy.Rule, dir policy.Direction) *DropCounter {
	reason := ReasonDeny
	if r.FailClosed != "" || r.Action != policy.ActionDeny {
		reason = ReasonFailClosed
	}
	id := fmt.Sprintf("cnp|%s|%s|%s|%d|%s", r.Tier, r.Policy, dir, r.Index, reason)
	return &DropCounter{
		Name:      hashName("c-", id),
		Policies:  []policy.PolicyRef{r.Policy},
		Tier:      r.Tier,
		Direction: dir.String(),
		Rule:      r.Index,
		Reason:    reason,
	}
}

// isolationCounter describes the counter of NetworkPolicy isolation for
// the pods that exactly these policies select in this direction.
func isolationCounter(refs []policy.PolicyRef, dir policy.Direction) *DropCounter {
	refs = append([]policy.PolicyRef(nil), refs...)
	sort.Slice(refs, func(i, j int) bool { return refs[i].String() < refs[j].String() })
	parts := []string{"np", dir.String()}
	for _, r := range refs {
		parts = append(parts, r.String())
	}
	return &DropCounter{
		Name:      hashName("c-", parts...),
		Policies:  refs,
		Direction: dir.String(),
		Rule:      -1,
		Reason:    ReasonIsolation,
	}
}

// counterObject is the knftables object of a counter, starting from the
// given values when carried over from a replaced table.
func counterObject(c *DropCounter, prev map[string]CounterValue) *knftables.Counter {
	obj := &knftables.Counter{Name: c.Name, Comment: knftables.PtrTo(c.counterComment())}
	if p, ok := prev[c.Name]; ok && (p.Packets != 0 || p.Bytes != 0) {
		obj.Packets = knftables.PtrTo(p.Packets)
		obj.Bytes = knftables.PtrTo(p.Bytes)
	}
	return obj
}

// CounterValue is what the kernel counted in one counter object.
type CounterValue struct {
	Packets, Bytes uint64
}

// CounterReader reads the counter objects of table inet moat: what the
// kernel counted, by counter name. A missing table is no counters and no
// error. Options.Counters chooses one: NetlinkCounters asks the kernel,
// NFTCounters asks a knftables.Interface (knftables' fake in tests).
type CounterReader interface {
	ReadCounters(ctx context.Context) (map[string]CounterValue, error)
}

// NFTCounters reads the counters through a knftables.Interface: for a
// real one, `nft --json list counters table inet moat`, after a `list`
// of their names. nft (1.0.6)
// loads the whole table into its cache first, every chain, rule, set and
// element, so on a large table one reading costs what listing the table
// does (~0.3-0.5 s of CPU at 7,000 rules and 63,000 elements). It is the
// reader for knftables.NewFake, which has no kernel behind it, and for
// Interfaces whose namespace the Syncer cannot know.
type NFTCounters struct {
	NFT knftables.Interface
}

// ReadCounters implements CounterReader.
func (r NFTCounters) ReadCounters(ctx context.Context) (map[string]CounterValue, error) {
	// The fake's ListCounters dereferences a missing table; its List
	// reports it as not found. The fake may hide behind a wrapper, so
	// every Interface is asked.
	names, err := r.NFT.List(ctx, "counters")
	if err != nil && !knftables.IsNotFound(err) {
		return nil, fmt.Errorf("list counters of table inet %s: %w", Table, err)
	}
	if len(names) == 0 {
		return nil, nil
	}
	list, err := r.NFT.ListCounters(ctx)
	if err != nil {
		if knftables.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list counters of table inet %s: %w", Table, err)
	}
	out := make(map[string]CounterValue, len(list))
	for _, c := range list {
		if c == nil {
			continue
		}
		var v CounterValue
		if c.Packets != nil {
			v.Packets = *c.Packets
		}
		if c.Bytes != nil {
			v.Bytes = *c.Bytes
		}
		out[c.Name] = v
	}
	return out, nil
}

// Counters reads the drop counters of the table last programmed: one entry
// per counter of that ruleset, sorted by name, with what the kernel has
// counted. Counters the kernel does not hold (someone deleted them) are left
// out; with nothing programmed yet the result is empty.
func (s *Syncer) Counters(ctx context.Context) ([]DropCounter, error) {
	s.mu.Lock()
	meta, reader := s.counters, s.counterReader()
	s.mu.Unlock()
	if len(meta) == 0 {
		return nil, nil
	}
	got, err := reader.ReadCounters(ctx)
	if err != nil {
		return nil, fmt.Errorf("read drop counters on node %s: %w", s.opts.Node, err)
	}
	out := make([]DropCounter, 0, len(meta))
	for _, name := range sortedKeys(meta) {
		v, ok := got[name]
		if !ok {
			continue
		}
		c := *meta[name]
		c.Packets, c.Bytes = v.Packets, v.Bytes
		out = append(out, c)
	}
	return out, nil
}
