package policy

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/moat-net/moat/api/v1alpha2"
)

// cnpCompiled is a ClusterNetworkPolicy with subject and peers resolved.
type cnpCompiled struct {
	ref      PolicyRef
	tier     Tier
	priority int32
	selected []int
	// subjectKey names the memoised subject; empty when it cannot change.
	subjectKey string
	rules      [2][]cnpRule
	status     PolicyStatus
}

// cnpRule is one rule before per-pod named-port resolution.
type cnpRule struct {
	rule  *Rule
	peers peerSet
	// parts: see npRule.parts.
	parts []peer
	ports portSpec
}

// cnpPeerFields are the peer fields Moat understands, with ingress and
// egress alike (NPEP-127).
type cnpPeerFields struct {
	namespaces *metav1.LabelSelector
	pods       *v1alpha2.NamespacedPod
	nodes      *metav1.LabelSelector
	networks   []v1alpha2.CIDR
	domains    []v1alpha2.DomainName
}

func (k *compiler) compileCNP(cnp *ClusterNetworkPolicy) *cnpCompiled {
	ref := PolicyRef{Kind: "ClusterNetworkPolicy", Name: cnp.Name}
	bad, status := k.check(ref, cnp.Source, validateCNP(cnp), k.unknownCNPFields(cnp))
	out := &cnpCompiled{ref: ref, status: status}
	spec := &cnp.Spec

	// Problems with the policy as a whole (tier, priority, rule counts,
	// unknown spec fields) void every Accept and turn Pass into Deny.
	whole := ""
	for _, b := range bad {
		if b.path == "spec" || isDirectChild("spec", b.path) && b.path != "spec.subject" && !isListField("spec", b.path, "ingress", "egress") ||
			b.path == "spec.ingress" || b.path == "spec.egress" {
			whole = b.path + ": " + b.msg
			break
		}
	}
	out.tier = TierAdmin
	if spec.Tier == v1alpha2.BaselineTier {
		out.tier = TierBaseline
	}
	out.priority = min(max(spec.Priority, 0), maxPriority)

	// Subject. One that cannot be understood could select any pod: Deny and
	// Pass rules then apply to every pod, Accept rules to none.
	subjectBad := bad.under("spec.subject")
	if subjectBad == "" {
		out.subjectKey, out.selected = k.cnpSubject(&spec.Subject)
	} else {
		out.selected = k.policed
	}

	for i := range spec.Ingress {
		r := &spec.Ingress[i]
		pfs := make([]cnpPeerFields, len(r.From))
		for j, p := range r.From {
			pfs[j] = cnpPeerFields{namespaces: p.Namespaces, pods: p.Pods, nodes: p.Nodes, networks: p.Networks}
		}
		out.rules[Ingress] = append(out.rules[Ingress], k.compileCNPRule(out, Ingress, i, r.Name, r.Action, "from", pfs, r.Protocols, bad, whole, subjectBad))
	}
	for i := range spec.Egress {
		r := &spec.Egress[i]
		pfs := make([]cnpPeerFields, len(r.To))
		for j, p := range r.To {
			pfs[j] = cnpPeerFields{namespaces: p.Namespaces, pods: p.Pods, nodes: p.Nodes, networks: p.Networks, domains: p.DomainNames}
		}
		out.rules[Egress] = append(out.rules[Egress], k.compileCNPRule(out, Egress, i, r.Name, r.Action, "to", pfs, r.Protocols, bad, whole, subjectBad))
	}
	return out
}

func (k *compiler) cnpSubject(s *v1alpha2.ClusterNetworkPolicySubject) (string, []int) {
	var p *cnpPeerFields
	switch {
	case s.Namespaces != nil:
		p = &cnpPeerFields{namespaces: s.Namespaces}
	case s.Pods != nil:
		p = &cnpPeerFields{pods: s.Pods}
	default:
		return "", nil
	}
	pe := k.cnpPeer(p)
	return pe.key, pe.pods
}

// compileCNPRule resolves one rule and applies fail-closed semantics
// (DESIGN §3): a part Moat cannot understand makes an Accept rule match
// nothing and turns a Deny or Pass rule into a Deny of everything that part
// could have matched. wide is a problem with the whole policy (everything
// could be meant); subject is a problem with the subject only (the rule
// keeps its peers and protocols, and already applies to every pod).
func (k *compiler) compileCNPRule(c *cnpCompiled, dir Direction, index int, name string, action v1alpha2.ClusterNetworkPolicyRuleAction, peerField string, pfs []cnpPeerFields, protos []v1alpha2.ClusterNetworkPolicyProtocol, bad badPaths, wide, subject string) cnpRule {
	path := fmt.Sprintf("spec.%s[%d]", dir, index)
	rule := &Rule{Policy: c.ref, Tier: c.tier, Priority: c.priority, Direction: dir, Index: index, Name: name, Action: Action(action)}
	out := cnpRule{rule: rule}

	var failed []string
	for _, f := range []string{wide, subject} {
		if f != "" {
			failed = append(failed, f)
		}
	}
	// Problems on the rule itself (its action, an unknown field beside
	// from/to) affect everything it matches. The name is cosmetic.
	ruleWide := ""
	for _, b := range bad {
		if (b.path == path || isDirectChild(path, b.path)) && !isListField(path, b.path, peerField, "protocols") && b.path != path+".name" {
			ruleWide = b.path + ": " + b.msg
			break
		}
	}
	if ruleWide != "" {
		failed = append(failed, ruleWide)
	} else {
		ruleWide = wide
	}

	// Peers.
	widePeers := ruleWide != ""
	var peers []peer
	for j := range pfs {
		pp := fmt.Sprintf("%s.%s[%d]", path, peerField, j)
		if msg := bad.under(pp); msg != "" {
			failed = append(failed, msg)
			widePeers = true
			continue
		}
		peers = append(peers, k.cnpPeer(&pfs[j]))
	}
	if bad.exactly(path+"."+peerField) != "" {
		widePeers = true
		failed = append(failed, bad.exactly(path+"."+peerField))
	}
	if widePeers {
		out.peers = allPeers()
	} else {
		out.peers = unionPeers(peers)
		out.parts = peers
	}

	// Protocols.
	allPorts := ruleWide != "" || len(protos) == 0
	if msg := bad.exactly(path + ".protocols"); msg != "" {
		allPorts = true
		failed = append(failed, msg)
	}
	for j := range protos {
		pp := fmt.Sprintf("%s.protocols[%d]", path, j)
		if msg := bad.under(pp); msg != "" {
			failed = append(failed, msg)
			allPorts = true
			continue
		}
		addCNPProtocol(&out.ports, &protos[j])
	}
	if allPorts {
		out.ports = portSpec{all: true}
	}

	if len(failed) > 0 {
		rule.FailClosed = strings.Join(failed, "; ")
		switch rule.Action {
		case ActionAccept:
			// Matches nothing, also after a relabel (no parts to redo).
			out.peers = peerSet{addrs: NewAddrSet(), cidrs: NewAddrSet()}
			out.parts = nil
			out.ports = portSpec{}
		default:
			rule.Action = ActionDeny
		}
	}
	return out
}

func addCNPProtocol(s *portSpec, p *v1alpha2.ClusterNetworkPolicyProtocol) {
	add := func(proto Protocol, dp *v1alpha2.Port) {
		switch {
		case dp == nil:
		case dp.Range != nil:
			s.numeric = append(s.numeric, protoRange{proto, PortRange{uint16(dp.Range.Start), uint16(dp.Range.End)}})
		case dp.Number != 0:
			s.numeric = append(s.numeric, protoRange{proto, PortRange{uint16(dp.Number), uint16(dp.Number)}})
		}
	}
	switch {
	case p.TCP != nil:
		add(ProtoTCP, p.TCP.DestinationPort)
	case p.UDP != nil:
		add(ProtoUDP, p.UDP.DestinationPort)
	case p.SCTP != nil:
		add(ProtoSCTP, p.SCTP.DestinationPort)
	case p.DestinationNamedPort != "":
		s.named = append(s.named, namedPort{0, p.DestinationNamedPort})
	}
}

// cnpPeer resolves one valid peer. domainNames are understood but not
// enforced (Moat has no DNS snooping): they match no address, which for the
// Accept-only domainNames peer is the closed direction.
func (k *compiler) cnpPeer(p *cnpPeerFields) peer {
	switch {
	case p.namespaces != nil:
		sel, _ := k.sel.get(p.namespaces)
		return k.podPeer("nssel="+selectorKey(p.namespaces)+"|pod=all", peerDef{nsSel: sel, podSel: labels.Everything()})
	case p.pods != nil:
		nsSel, _ := k.sel.get(&p.pods.NamespaceSelector)
		podSel, _ := k.sel.get(&p.pods.PodSelector)
		return k.podPeer("nssel="+selectorKey(&p.pods.NamespaceSelector)+"|pod="+selectorKey(&p.pods.PodSelector), peerDef{nsSel: nsSel, podSel: podSel})
	case p.nodes != nil:
		sel, _ := k.sel.get(p.nodes)
		return peer{addrs: k.nodeAddrs(sel)}
	case p.networks != nil:
		var rs []AddrRange
		for _, c := range p.networks {
			if pre, err := ParseCIDR(string(c)); err == nil {
				rs = append(rs, PrefixRange(pre))
			}
		}
		return peer{addrs: NewAddrSet(rs...)}
	}
	return peer{addrs: NewAddrSet()}
}
