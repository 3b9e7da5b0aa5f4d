package policy

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// npCompiled is a NetworkPolicy with selectors and peers resolved.
type npCompiled struct {
	ref      PolicyRef
	selected []int
	// subjectKey names the memoised selection; empty when the selection
	// cannot change (an invalid selector selects the whole namespace).
	subjectKey string
	types      [2]bool
	rules      [2][]npRule
	status     PolicyStatus
}

// npRule is one NetworkPolicy rule before per-pod named-port resolution.
type npRule struct {
	index int
	peers peerSet
	// parts are the rule's peers, kept so the union can be redone when a
	// selector peer changes; nil when peers is fixed (all, or nothing).
	parts []peer
	ports portSpec
	// none: the rule failed closed and matches nothing. (A rule whose
	// peers or ports resolve to nothing today simply compiles to an empty
	// Match.)
	none bool
}

func (k *compiler) compileNP(np *NetworkPolicy) *npCompiled {
	ref := PolicyRef{Kind: "NetworkPolicy", Namespace: np.Namespace, Name: np.Name}
	bad, status := k.check(ref, np.Source, validateNP(np), np.UnknownFields)
	out := &npCompiled{ref: ref, status: status}
	spec := &np.Spec

	// Pod selection. An invalid selector isolates the whole namespace and
	// none of the policy's rules allow anything: they were meant for pods
	// we cannot tell, and opening others with them would widen access.
	sel, ok := k.sel.get(&spec.PodSelector)
	subjectBad := !ok || bad.under("spec.podSelector") != ""
	if subjectBad {
		out.selected = k.podsByNS[np.Namespace]
	} else {
		out.subjectKey = "ns=" + np.Namespace + "|pod=" + selectorKey(&spec.PodSelector)
		out.selected = k.podPeer(out.subjectKey, peerDef{ns: np.Namespace, podSel: sel}).pods
	}

	// Policy types, defaulted as the API server does. Invalid types isolate
	// both directions, but rules count only in a direction validly listed.
	var ruleOK [2]bool
	if bad.under("spec.policyTypes") != "" {
		out.types = [2]bool{true, true}
		for _, t := range spec.PolicyTypes {
			ruleOK[Ingress] = ruleOK[Ingress] || t == networkingv1.PolicyTypeIngress
			ruleOK[Egress] = ruleOK[Egress] || t == networkingv1.PolicyTypeEgress
		}
	} else if len(spec.PolicyTypes) == 0 {
		out.types[Ingress] = true
		out.types[Egress] = len(spec.Egress) > 0
	} else {
		for _, t := range spec.PolicyTypes {
			switch t {
			case networkingv1.PolicyTypeIngress:
				out.types[Ingress] = true
			case networkingv1.PolicyTypeEgress:
				out.types[Egress] = true
			}
		}
	}
	if bad.under("spec.policyTypes") == "" {
		ruleOK = out.types
	}
	// Unknown fields directly under spec may change what every rule means.
	specBad := subjectBad
	for _, p := range np.UnknownFields {
		if isDirectChild("spec", p) {
			specBad = true
		}
	}

	for i, r := range spec.Ingress {
		path := fmt.Sprintf("spec.ingress[%d]", i)
		out.rules[Ingress] = append(out.rules[Ingress], k.compileNPRule(np.Namespace, i, path, "from", r.From, r.Ports, bad, specBad || !ruleOK[Ingress]))
	}
	for i, r := range spec.Egress {
		path := fmt.Sprintf("spec.egress[%d]", i)
		out.rules[Egress] = append(out.rules[Egress], k.compileNPRule(np.Namespace, i, path, "to", r.To, r.Ports, bad, specBad || !ruleOK[Egress]))
	}
	return out
}

func isDirectChild(parent, path string) bool {
	if len(path) <= len(parent)+1 || path[:len(parent)+1] != parent+"." {
		return false
	}
	rest := path[len(parent)+1:]
	for _, c := range rest {
		if c == '.' || c == '[' {
			return false
		}
	}
	return true
}

func (k *compiler) compileNPRule(ns string, index int, path, peerField string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, bad badPaths, specBad bool) npRule {
	r := npRule{index: index}
	// A problem on the rule itself (not inside a peer or port) voids it.
	for _, b := range bad {
		if isDirectChild(path, b.path) && !isListField(path, b.path, peerField, "ports") {
			r.none = true
		}
	}
	if specBad || bad.exactly(path) != "" {
		r.none = true
	}
	if r.none {
		return r
	}
	// Peers: an empty list is every address; a list whose entries all
	// failed is nothing.
	if len(peers) == 0 {
		r.peers = allPeers()
	} else {
		var ps []peer
		for j := range peers {
			if bad.under(fmt.Sprintf("%s.%s[%d]", path, peerField, j)) != "" {
				continue
			}
			ps = append(ps, k.npPeer(ns, &peers[j]))
		}
		r.peers = unionPeers(ps)
		r.parts = ps
	}
	// Ports: an empty list is all traffic; failed entries match nothing.
	if len(ports) == 0 {
		r.ports.all = true
	}
	for j, p := range ports {
		if bad.under(fmt.Sprintf("%s.ports[%d]", path, j)) != "" {
			continue
		}
		proto := protocolOf(p.Protocol)
		switch {
		case p.Port == nil:
			r.ports.numeric = append(r.ports.numeric, protoRange{proto, AllPorts})
		case p.Port.Type == intstr.String:
			r.ports.named = append(r.ports.named, namedPort{proto, p.Port.StrVal})
		default:
			to := p.Port.IntVal
			if p.EndPort != nil {
				to = *p.EndPort
			}
			r.ports.numeric = append(r.ports.numeric, protoRange{proto, PortRange{uint16(p.Port.IntVal), uint16(to)}})
		}
	}
	return r
}

// isListField reports whether a bad path lies inside one of the rule's
// list fields, where problems are contained to one entry.
func isListField(rulePath, badPath string, fields ...string) bool {
	for _, f := range fields {
		p := rulePath + "." + f
		if badPath == p || len(badPath) > len(p) && badPath[:len(p)] == p && badPath[len(p)] == '[' {
			return true
		}
	}
	return false
}

// npPeer resolves one NetworkPolicy peer.
func (k *compiler) npPeer(ns string, p *networkingv1.NetworkPolicyPeer) peer {
	if p.IPBlock != nil {
		cidr, err := ParseCIDR(p.IPBlock.CIDR)
		if err != nil {
			return peer{addrs: NewAddrSet()}
		}
		var holes []AddrRange
		for _, e := range p.IPBlock.Except {
			if ex, err := ParseCIDR(e); err == nil {
				holes = append(holes, PrefixRange(ex))
			}
		}
		return peer{addrs: NewAddrSet(PrefixRange(cidr)).Subtract(NewAddrSet(holes...))}
	}
	podSel := labels.Everything()
	if p.PodSelector != nil {
		s, ok := k.sel.get(p.PodSelector)
		if !ok {
			return peer{addrs: NewAddrSet()}
		}
		podSel = s
	}
	def := peerDef{ns: ns, podSel: podSel}
	nsKey := "ns=" + ns
	if p.NamespaceSelector != nil {
		s, ok := k.sel.get(p.NamespaceSelector)
		if !ok {
			return peer{addrs: NewAddrSet()}
		}
		def.nsSel = s
		nsKey = "nssel=" + selectorKey(p.NamespaceSelector)
	}
	return k.podPeer(nsKey+"|pod="+selectorKey(p.PodSelector), def)
}

// protocolOf maps a core protocol, defaulting to TCP.
func protocolOf(p *corev1.Protocol) Protocol {
	if p == nil {
		return ProtoTCP
	}
	proto, err := ParseProtocol(string(*p))
	if err != nil {
		return 0
	}
	return proto
}
