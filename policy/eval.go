package policy

import (
	"fmt"
	"net/netip"
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
	Reason string   `json:"reason"`
}

// Verdict is the answer for one flow: allowed iff both directions allow.
type Verdict struct {
	Allowed bool     `json:"allowed"`
	Egress  Decision `json:"egress"`
	Ingress Decision `json:"ingress"`
}

// Evaluate judges a flow against the Program. Its cost depends on the
// rules that select the two pods, not on the size of the cluster.
func (p *Program) Evaluate(f Flow) Verdict {
	var v Verdict
	if f.Src.Pod >= 0 && f.Src.Pod == f.Dst.Pod {
		d := Decision{Allowed: true, Tier: TierNotPoliced, Reason: "a pod's traffic to itself is not policed"}
		return Verdict{Allowed: true, Egress: d, Ingress: d}
	}
	v.Egress = p.judge(f.Src, f.Dst.Addr, f, Egress)
	v.Ingress = p.judge(f.Dst, f.Src.Addr, f, Ingress)
	v.Allowed = v.Egress.Allowed && v.Ingress.Allowed
	return v
}

func (p *Program) judge(local Endpoint, remote netip.Addr, f Flow, dir Direction) Decision {
	if local.Pod < 0 || p.Policies[local.Pod] == nil {
		return Decision{Allowed: true, Tier: TierNotPoliced, Reason: p.notPolicedReason(local, dir)}
	}
	pod := &p.Pods[local.Pod]
	if dir == Ingress && !p.Options.DenyNodeLocal {
		for _, a := range p.NodeAddrs(pod.NodeName) {
			if a == remote.Unmap() {
				return Decision{Allowed: true, Tier: TierNodeLocal, Reason: fmt.Sprintf("node-local traffic from node %s to its own pod is allowed", pod.NodeName)}
			}
		}
	}
	dp := p.Policies[local.Pod].Dir(dir)
	var passed []string
	if d, done := judgeTier(dp.Admin, remote, f, &passed); done {
		return d
	}
	if dp.NP != nil {
		for _, r := range dp.NP.Rules {
			if r.Match.Matches(remote, f.Proto, f.Port) {
				ref, idx := r.Policy, r.Index
				return Decision{Allowed: true, Tier: TierNetworkPolicy, Policy: &ref, Rule: &idx, Action: ActionAllow, Passed: passed,
					Reason: fmt.Sprintf("%s %s rule %d allows it", ref, dir, idx)}
			}
		}
		names := make([]string, len(dp.NP.Policies))
		for i, r := range dp.NP.Policies {
			names[i] = r.Namespace + "/" + r.Name
		}
		return Decision{Allowed: false, Tier: TierNetworkPolicy, Action: ActionIsolate, Passed: passed,
			Reason: fmt.Sprintf("NetworkPolicies select the pod for %s (%s) and no rule allows it", dir, strings.Join(names, ", "))}
	}
	if d, done := judgeTier(dp.Baseline, remote, f, &passed); done {
		return d
	}
	reason := "no policy selects this pod for " + dir.String() + ": default allow"
	if len(passed) > 0 || len(dp.Admin) > 0 || len(dp.Baseline) > 0 {
		reason = "no rule decided: default allow"
	}
	return Decision{Allowed: true, Tier: TierDefault, Passed: passed, Reason: reason}
}

// judgeTier walks one ClusterNetworkPolicy tier; done is false when the
// tier made no decision (no match, or a Pass).
func judgeTier(rules []RuleMatch, remote netip.Addr, f Flow, passed *[]string) (Decision, bool) {
	for _, rm := range rules {
		if !rm.Match.Matches(remote, f.Proto, f.Port) {
			continue
		}
		r := rm.Rule
		ref, idx := r.Policy, r.Index
		desc := fmt.Sprintf("%s %s rule %d", ref, r.Direction, r.Index)
		if r.Name != "" {
			desc += fmt.Sprintf(" (%s)", r.Name)
		}
		if r.Action == ActionPass {
			*passed = append(*passed, desc)
			return Decision{}, false
		}
		d := Decision{Allowed: r.Action == ActionAccept, Tier: r.Tier, Policy: &ref, Rule: &idx, RuleName: r.Name, Action: r.Action, Passed: *passed}
		verb := "accepts"
		if r.Action == ActionDeny {
			verb = "denies"
		}
		d.Reason = fmt.Sprintf("%s %s it", desc, verb)
		if r.FailClosed != "" {
			d.Reason += " (fail-closed: " + r.FailClosed + ")"
		}
		return d, true
	}
	return Decision{}, false
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
	return fmt.Sprintf("the %s is outside the pod network: not policed", end)
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
	srcAddrs := p.endpointAddrs(src)
	dstAddrs := p.endpointAddrs(dst)
	for _, s := range srcAddrs {
		for _, d := range dstAddrs {
			if s.Is4() == d.Is4() {
				src.Addr, dst.Addr = s, d
				return src, dst, true
			}
		}
	}
	return src, dst, false
}

func (p *Program) endpointAddrs(e Endpoint) []netip.Addr {
	if e.Pod >= 0 && !e.Fixed {
		return p.Pods[e.Pod].IPs
	}
	return []netip.Addr{e.Addr}
}
