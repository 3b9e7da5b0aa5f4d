package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Endpoint is one end of a flow: a pod of the snapshot or a bare address.
type Endpoint struct {
	// Pod is the pod's index in Program.Pods, or -1.
	Pod int
	// Addr is the address the packet carries.
	Addr netip.Addr
	// Fixed pins Addr: the user named this address, so PairAddrs must not
	// pick another of the pod's addresses.
	Fixed bool
}

// Flow is one connection attempt: a new connection from Src to Dst.
type Flow struct {
	Src, Dst Endpoint
	Proto    Protocol
	// Port is the destination port; 0 for protocols without ports.
	Port uint16
}

// Decision explains one direction of a verdict.
type Decision struct {
	Allowed bool `json:"allowed"`
	// Tier is where the decision was made.
	Tier Tier `json:"tier"`
	// Policy and Rule name the deciding rule, when one decided.
	Policy   *PolicyRef `json:"policy,omitempty"`
	Rule     *int       `json:"rule,omitempty"`
	RuleName string     `json:"ruleName,omitempty"`
	Action   Action     `json:"action,omitempty"`
	// Passed lists the Pass rules that handed the decision on.
	Passed []string `json:"passed,omitempty"`
	// Isolating lists the NetworkPolicies that select the pod when none
	// of them allowed the flow (Action ActionIsolate); Reason names only
	// the first few. It is shared with the Program: do not modify it. It
	// is left out of JSON, where a matrix would repeat it in every cell;
	// moat explain -o json prints it.
	Isolating []PolicyRef `json:"-"`
	Reason    string      `json:"reason"`
}

// Verdict is the answer for one flow: allowed iff both directions allow.
type Verdict struct {
	Allowed bool     `json:"allowed"`
	Egress  Decision `json:"egress"`
	Ingress Decision `json:"ingress"`
}

// Evaluate judges a flow against the Program and explains both
// directions. Its cost depends on the rules that select the two pods, not
// on the size of the cluster.
func (p *Program) Evaluate(f Flow) Verdict {
	e, i := p.judgeBoth(f)
	return p.verdict(e, i, f)
}

// verdict puts both directions' outcomes into words.
func (p *Program) verdict(e, i outcome, f Flow) Verdict {
	v := Verdict{Egress: p.explain(e, f, Egress), Ingress: p.explain(i, f, Ingress)}
	v.Allowed = v.Egress.Allowed && v.Ingress.Allowed
	return v
}

// duplicateEnd reports whether an end's address is claimed by several
// pods: its traffic cannot be attributed, and is denied. Callers test
// len(p.dupAddrs) first, so that a Program without such addresses (nearly
// every one) pays no call per verdict.
func (p *Program) duplicateEnd(f Flow) bool {
	return p.dupAddrs[f.Src.Addr.Unmap()] != nil || p.dupAddrs[f.Dst.Addr.Unmap()] != nil
}

// Allowed is Evaluate without the explanation: the verdict alone, without
// allocating. The lab and differential tests use it in their hot loops.
func (p *Program) Allowed(f Flow) bool {
	e, i := p.judgeBoth(f)
	return e.allowed && i.allowed
}

// EvaluateHairpin judges a pod's connection to itself through a Service
// that the service proxy load-balances back to the same pod (the hairpin),
// as the pod's node sees it after the proxy's translation: f from one of
// the pod's addresses to the same address, on the pod's port. Evaluate
// calls a pod's connection to its own address not policed (it never
// leaves the pod's network namespace); the hairpin does leave it, and
// upstream says it "is subject to ClusterNetworkPolicy" (network-policy-api
// api-overview, "hairpin"): the Admin tier judges it, the NetworkPolicy
// tier allows it when NetworkPolicies select the pod for that direction
// (a pod cannot block access to itself), and otherwise the Baseline tier
// judges it. A flow between two ends that are not one pod is judged as
// Evaluate judges it.
func (p *Program) EvaluateHairpin(f Flow) Verdict {
	if !isHairpin(f) {
		return p.Evaluate(f)
	}
	e, i := p.judgeHairpin(f)
	return p.verdict(e, i, f)
}

// HairpinAllowed is EvaluateHairpin without the explanation.
func (p *Program) HairpinAllowed(f Flow) bool {
	if !isHairpin(f) {
		return p.Allowed(f)
	}
	e, i := p.judgeHairpin(f)
	return e.allowed && i.allowed
}

func isHairpin(f Flow) bool {
	return f.Src.Pod >= 0 && f.Src.Pod == f.Dst.Pod
}

// judgeHairpin is judgeBoth for a pod's Service hairpin: no shortcut for
// traffic to itself, and the NetworkPolicy tier allows it.
func (p *Program) judgeHairpin(f Flow) (outcome, outcome) {
	if len(p.dupAddrs) > 0 && p.duplicateEnd(f) {
		o := outcome{tier: TierNotPoliced, duplicate: true}
		return o, o
	}
	pods := p.evalPods()
	return p.judgeTiers(pods, f.Src, f.Dst, f, Egress, true), p.judgeTiers(pods, f.Dst, f.Src, f, Ingress, true)
}

// outcome is a decision before it is put into words. It holds no slice,
// so that Allowed never allocates.
type outcome struct {
	allowed bool
	tier    Tier
	rule    *Rule   // the deciding ClusterNetworkPolicy rule
	npRule  *NPRule // the allowing NetworkPolicy rule
	np      *NPTier // the isolating NetworkPolicy tier
	// passed are the Pass rules that handed the decision on: at most one
	// per ClusterNetworkPolicy tier, since a tier's first match decides.
	passed  [2]*Rule
	npassed int
	self    bool
	// hairpinNP: NetworkPolicies (np) select the pod, and allow its
	// Service hairpin.
	hairpinNP bool
	// duplicate: an end's address is claimed by several pods.
	duplicate bool
	// forged: the destination's node drops the source as forged
	// (forgedAt); node names that node.
	forged bool
	// unknownDst: the destination is an address behind node that no pod
	// owns, and node drops the connection (unknownDstAt).
	unknownDst bool
	node       string // node-local, forged or unknownDst: the node's name
	quiet      bool   // default allow with no rule at all for this pod
}

func (p *Program) judgeBoth(f Flow) (outcome, outcome) {
	if len(p.dupAddrs) > 0 && p.duplicateEnd(f) {
		o := outcome{tier: TierNotPoliced, duplicate: true}
		return o, o
	}
	if f.Src.Pod >= 0 && f.Src.Pod == f.Dst.Pod {
		o := outcome{allowed: true, tier: TierNotPoliced, self: true}
		return o, o
	}
	pods := p.evalPods()
	if f.Src.Pod < 0 || pods[f.Src.Pod].dirs[Egress] == nil {
		// The source is no policed pod (judge's first two cases): it
		// may be one the agent takes for forged. A policed pod's
		// address is a pod's, never forged, so pod-to-pod verdicts do
		// not look.
		if n, _, ok := p.forgedAt(f.Src, f.Dst); ok {
			o := outcome{tier: TierNotPoliced, forged: true, node: p.Nodes[n].Name}
			return o, o
		}
	}
	e := p.judge(pods, f.Src, f.Dst, f, Egress)
	if f.Dst.Pod < 0 {
		if n, _, ok := p.unknownDstAt(f.Src, f.Dst); ok {
			// The source's egress is judged as usual; the destination's
			// node drops what it lets through.
			return e, outcome{tier: TierNotPoliced, unknownDst: true, node: p.Nodes[n].Name}
		}
	}
	return e, p.judge(pods, f.Dst, f.Src, f, Ingress)
}

// forgedAt finds the node whose anti-spoofing rules drop a new connection
// from src to dst before any policy (docs/agent.md, "Forged sources"):
// a node drops, in its forward and input hooks, a source inside its own
// spec.podCIDRs that no pod-network pod claims, on any node. A bare
// address there that is no node's either lies behind that node
// (unownedAt: the pod network routes it there, so its packets come
// through it, and replies to it go there, where unknownDstRules drop
// them), whatever the destination, unless it reaches itself. Otherwise
// (a node's address, a host-network pod) the node that holds the
// destination (a pod of it, host-network or not, or one of its
// addresses) checks it against its own CIDRs. The node's own packets
// (from its addresses or its host-network pods) leave through the output
// hook, which does not check, so they are never forged at it. It returns
// the node's index and the pod CIDR that contains the source.
func (p *Program) forgedAt(src, dst Endpoint) (int, netip.Prefix, bool) {
	s := src.Addr.Unmap()
	if src.Pod >= 0 && !p.Pods[src.Pod].HostNetwork || p.podClaims(s) {
		return 0, netip.Prefix{}, false // a pod-network pod's address
	}
	if src.Pod < 0 && s != dst.Addr.Unmap() {
		if i, c, ok := p.unownedAt(s); ok {
			return i, c, true
		}
	}
	var dn string
	if dst.Pod >= 0 {
		dn = p.Pods[dst.Pod].NodeName
	} else if i, ok := p.nodeByIP[dst.Addr.Unmap()]; ok {
		dn = p.Nodes[i].Name
	}
	i, ok := p.nodeIndex[dn]
	if !ok {
		return 0, netip.Prefix{}, false // outside the cluster, or an unknown node
	}
	n := &p.Nodes[i]
	for _, c := range n.PodCIDRs {
		if !c.Contains(s) {
			continue
		}
		if src.Pod >= 0 && p.Pods[src.Pod].NodeName == dn || slices.Contains(n.Addrs, s) {
			return 0, netip.Prefix{}, false // the node's own packet
		}
		return i, c, true
	}
	return 0, netip.Prefix{}, false
}

// nodeLocal reports whether remote is an address of the node the pod runs
// on.
func (p *Program) nodeLocal(pod *Pod, remote netip.Addr) bool {
	n, ok := p.nodeByIP[remote]
	if !ok || p.podClaims(remote) {
		return false // not a node's, or a pod's too (NodeLocalAddrs)
	}
	if p.Nodes[n].Name == pod.NodeName {
		return true
	}
	// Another node claims the address first; the pod's node may too.
	return slices.Contains(p.NodeAddrs(pod.NodeName), remote)
}

func (p *Program) judge(pods []evalPod, local, remoteEnd Endpoint, f Flow, dir Direction) outcome {
	return p.judgeTiers(pods, local, remoteEnd, f, dir, false)
}

// judgeTiers judges one direction of f at its local end; hairpin: f is
// the pod's Service hairpin, which the NetworkPolicy tier allows.
func (p *Program) judgeTiers(pods []evalPod, local, remoteEnd Endpoint, f Flow, dir Direction, hairpin bool) outcome {
	if local.Pod < 0 {
		return outcome{allowed: true, tier: TierNotPoliced}
	}
	dp := pods[local.Pod].dirs[dir]
	if dp == nil {
		return outcome{allowed: true, tier: TierNotPoliced}
	}
	remote := remoteEnd.Addr.Unmap()
	ord := p.slotOf(pods, remoteEnd)
	// A remote end that is a pod's address (ord >= 0) is never
	// node-local (nodeLocal), so the node map is read only for others.
	if dir == Ingress && ord < 0 && !p.Options.DenyNodeLocal {
		if pod := &p.Pods[local.Pod]; p.nodeLocal(pod, remote) {
			return outcome{allowed: true, tier: TierNodeLocal, node: pod.NodeName}
		}
	}
	ix := dp.indexes()
	var o outcome
	if judgeTier(&o, &dp.Admin, ix.admin, remote, ord, f) {
		return o
	}
	if dp.NP != nil {
		o.tier = TierNetworkPolicy
		if hairpin {
			o.allowed, o.np, o.hairpinNP = true, dp.NP, true
			return o
		}
		if i := ix.np.lookup(remote, ord, f.Proto, f.Port); i >= 0 {
			o.allowed, o.npRule = true, &dp.NP.Rules[i]
			return o
		}
		o.np = dp.NP
		return o
	}
	if judgeTier(&o, &dp.Baseline, ix.baseline, remote, ord, f) {
		return o
	}
	o.allowed, o.tier = true, TierDefault
	o.quiet = o.npassed == 0 && len(dp.Admin) == 0 && len(dp.Baseline) == 0
	return o
}

// judgeTier finds the first matching rule of one ClusterNetworkPolicy
// tier and reports whether it decided (false: no match, or a Pass, which
// it records in o). The rules come by pointer: a slice argument reads
// its capacity too, which for Admin is in the DirPolicy's second cache
// line.
func judgeTier(o *outcome, rules *[]RuleMatch, ix *matchIndex, remote netip.Addr, ord int32, f Flow) bool {
	if len(*rules) == 0 {
		return false // without touching the (empty) index
	}
	i := ix.lookup(remote, ord, f.Proto, f.Port)
	if i < 0 {
		return false
	}
	r := (*rules)[i].Rule
	if r.Action == ActionPass {
		if o.npassed < len(o.passed) {
			o.passed[o.npassed] = r
			o.npassed++
		}
		return false
	}
	o.allowed, o.tier, o.rule = r.Action == ActionAccept, r.Tier, r
	return true
}

// reasonNames is how many policies a Reason names; Decision.Isolating
// has them all. A namespace may hold thousands of NetworkPolicies that
// select one pod, and a reason is a line for people.
const reasonNames = 10

// policyNames lists refs as namespace/name, the first reasonNames of them.
func policyNames(refs []PolicyRef) string {
	var b strings.Builder
	for i, r := range refs {
		if i == reasonNames {
			fmt.Fprintf(&b, " and %d more", len(refs)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(r.Namespace + "/" + r.Name)
	}
	return b.String()
}

func ruleDesc(r *Rule) string {
	desc := fmt.Sprintf("%s %s rule %d", r.Policy, r.Direction, r.Index)
	if r.Name != "" {
		desc += fmt.Sprintf(" (%s)", r.Name)
	}
	return desc
}

// explain puts the outcome of one direction of f into words.
func (p *Program) explain(o outcome, f Flow, dir Direction) Decision {
	local := f.Src
	if dir == Ingress {
		local = f.Dst
	}
	d := Decision{Allowed: o.allowed, Tier: o.tier}
	for _, r := range o.passed[:o.npassed] {
		d.Passed = append(d.Passed, ruleDesc(r))
	}
	switch {
	case o.duplicate:
		d.Reason = "an address of this flow is claimed by more than one pod: denied, since its traffic cannot be attributed"
	case o.forged:
		_, cidr, _ := p.forgedAt(f.Src, f.Dst)
		where := "which holds the destination"
		if p.endpointNode(f.Dst) != o.node {
			where = "where the pod network routes it (and its replies)"
		}
		d.Reason = fmt.Sprintf("the source %s is in node %s's pod CIDR %s but no pod owns it: node %s, %s, drops it as a forged source (or a pod whose address its agent does not know yet) before any policy",
			f.Src.Addr.Unmap(), o.node, cidr, o.node, where)
	case o.unknownDst:
		_, cidr, _ := p.unknownDstAt(f.Src, f.Dst)
		d.Reason = fmt.Sprintf("the destination %s is in node %s's pod CIDR %s but no pod owns it: node %s drops new connections to it before any policy (a pod is unreachable until its node's agent knows its address)",
			f.Dst.Addr.Unmap(), o.node, cidr, o.node)
	case o.self:
		d.Reason = "a pod's traffic to its own address is not policed (through a Service back to itself it is)"
	case o.tier == TierNotPoliced:
		d.Reason = p.notPolicedReason(local, dir)
	case o.tier == TierNodeLocal:
		d.Reason = fmt.Sprintf("node-local traffic from node %s to its own pod is allowed", o.node)
	case o.rule != nil:
		r := o.rule
		d.Policy, d.Rule, d.RuleName, d.Action = &r.Policy, &r.Index, r.Name, r.Action
		verb := "accepts"
		if r.Action == ActionDeny {
			verb = "denies"
		}
		d.Reason = fmt.Sprintf("%s %s it", ruleDesc(r), verb)
		if r.FailClosed != "" {
			d.Reason += " (fail-closed: " + r.FailClosed + ")"
		}
	case o.hairpinNP:
		d.Reason = fmt.Sprintf("NetworkPolicies select the pod for %s (%s), and a pod cannot block access to itself: they allow its Service hairpin", dir, policyNames(o.np.Policies))
	case o.npRule != nil:
		r := o.npRule
		d.Policy, d.Rule, d.Action = &r.Policy, &r.Index, ActionAllow
		d.Reason = fmt.Sprintf("%s %s rule %d allows it", r.Policy, dir, r.Index)
	case o.np != nil:
		d.Action = ActionIsolate
		d.Isolating = o.np.Policies
		d.Reason = fmt.Sprintf("NetworkPolicies select the pod for %s (%s) and no rule allows it", dir, policyNames(o.np.Policies))
	case o.quiet:
		d.Reason = "no policy selects this pod for " + dir.String() + ": default allow"
	default:
		d.Reason = "no rule decided: default allow"
	}
	return d
}

func (p *Program) notPolicedReason(e Endpoint, dir Direction) string {
	end := "source"
	if dir == Ingress {
		end = "destination"
	}
	if e.Pod >= 0 {
		pod := &p.Pods[e.Pod]
		if pod.HostNetwork {
			return fmt.Sprintf("the %s is a host-network pod: not policed", end)
		}
		return fmt.Sprintf("the %s pod is not policed (no usable IP)", end)
	}
	if n, ok := p.NodeByIP(e.Addr); ok {
		return fmt.Sprintf("the %s is node %s: not policed", end, p.Nodes[n].Name)
	}
	if n, c, ok := p.unownedAt(e.Addr); ok {
		// forgedAt or unknownDstAt found no drop: the address reaches
		// itself, or the node it lies behind connects to it.
		return fmt.Sprintf("the %s %s is in node %s's pod CIDR %s but no pod owns it: not policed (node %s's own connections, and an address's to itself, are not checked)", end, e.Addr.Unmap(), p.Nodes[n].Name, c, p.Nodes[n].Name)
	}
	return fmt.Sprintf("the %s is outside the pod network: not policed", end)
}

// endpointNode is the name of the node that holds an endpoint: a pod's
// node, or the node whose address it is; "" for none.
func (p *Program) endpointNode(e Endpoint) string {
	if e.Pod >= 0 {
		return p.Pods[e.Pod].NodeName
	}
	if i, ok := p.nodeByIP[e.Addr.Unmap()]; ok {
		return p.Nodes[i].Name
	}
	return ""
}

// ParseEndpoint resolves "namespace/pod" or an IP address. An address that
// belongs to a pod-network pod is that pod.
func (p *Program) ParseEndpoint(s string) (Endpoint, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap()
		if i, ok := p.PodByIP(a); ok {
			return Endpoint{Pod: i, Addr: a, Fixed: true}, nil
		}
		return Endpoint{Pod: -1, Addr: a, Fixed: true}, nil
	}
	i, ok := p.PodByKey(s)
	if !ok {
		if !strings.Contains(s, "/") {
			return Endpoint{}, fmt.Errorf("%q is neither an IP address nor namespace/pod", s)
		}
		return Endpoint{}, fmt.Errorf("pod %q not found in the input", s)
	}
	if len(p.Pods[i].IPs) == 0 {
		return Endpoint{}, fmt.Errorf("pod %q has no IP address (status.podIP)", s)
	}
	return Endpoint{Pod: i, Addr: p.Pods[i].IPs[0]}, nil
}

// PairAddrs picks addresses of one family for a flow between two
// endpoints: the source's first address that has a same-family address at
// the destination. ok is false when they share no family.
func (p *Program) PairAddrs(src, dst Endpoint) (Endpoint, Endpoint, bool) {
	for _, s := range p.endpointAddrs(src) {
		if d, ok := p.PairAddrsIn(src, dst, s.Is4()); ok {
			return d[0], d[1], true
		}
	}
	return src, dst, false
}

// PairAddrsIn is PairAddrs within one family (IPv4 if v4): each end's first
// address of that family. A dual-stack pair is two flows that policies may
// judge differently (an ipBlock is of one family), so tools that compare
// or list verdicts judge both.
func (p *Program) PairAddrsIn(src, dst Endpoint, v4 bool) ([2]Endpoint, bool) {
	i := slices.IndexFunc(p.endpointAddrs(src), func(a netip.Addr) bool { return a.Is4() == v4 })
	j := slices.IndexFunc(p.endpointAddrs(dst), func(a netip.Addr) bool { return a.Is4() == v4 })
	if i < 0 || j < 0 {
		return [2]Endpoint{}, false
	}
	src.Addr, dst.Addr = p.endpointAddrs(src)[i], p.endpointAddrs(dst)[j]
	return [2]Endpoint{src, dst}, true
}

func (p *Program) endpointAddrs(e Endpoint) []netip.Addr {
	if e.Pod >= 0 && !e.Fixed {
		return p.Pods[e.Pod].IPs
	}
	return []netip.Addr{e.Addr}
}
