package policy

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/moat-net/moat/api/v1alpha2"
)

// cnpState is a compiled ClusterNetworkPolicy: its place in its tier, its
// subject as a namespace and a pod selector, and its rules.
type cnpState struct {
	id       uint32
	src      *ClusterNetworkPolicy
	ref      PolicyRef
	seq      int
	tier     Tier
	priority int32
	// The subject: pods that podSel selects in namespaces nsSel selects.
	// subjNone: it selects nothing.
	nsSel, podSel labels.Selector
	nsKey, podKey string
	subjNone      bool
	rules         [2][]*rule
	status        PolicyStatus
	diags         []Diagnostic
	named         []Diagnostic
	nsKeys        []string
	podKeys       []string
	names         []string // port names the ingress rules use
	lists         map[*cnpList]struct{}
}

func (c *cnpState) dropTiers(s *state, dir Direction) {
	for l := range c.lists {
		l.drop(s, dir)
	}
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

// compileCNP compiles a ClusterNetworkPolicy; errs are its validation
// errors.
func (s *state) compileCNP(cnp *ClusterNetworkPolicy, errs field.ErrorList) *cnpState {
	ref := PolicyRef{Kind: "ClusterNetworkPolicy", Name: cnp.Name}
	// A field a disabled feature gate hides counts as unknown.
	unknown := s.unknownCNPFields(cnp)
	bad, status, diags := s.check(ref, cnp.Source, errs, unknown)
	s.cnpNext++
	out := &cnpState{id: s.cnpNext, src: cnp, ref: ref, status: status, diags: diags}
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
	out.nsSel, out.podSel = everything, everything
	if subjectBad == "" {
		s.cnpSubject(out, &spec.Subject)
	}
	out.nsKeys, out.podKeys = selectorKeys(out.nsSel), selectorKeys(out.podSel)

	// An unknown field outside spec may have been meant to change anything:
	// the policy denies all its subject's traffic both ways, at its place.
	if msg := objectProblem(unknown); msg != "" {
		for _, dir := range []Direction{Ingress, Egress} {
			failed := []string{msg}
			if subjectBad != "" {
				failed = append(failed, subjectBad)
			}
			r := &Rule{Policy: ref, Tier: out.tier, Priority: out.priority, Direction: dir, Action: ActionDeny, FailClosed: strings.Join(failed, "; ")}
			out.rules[dir] = []*rule{s.newRule(&rule{dir: dir, owner: out, cnp: r, set: s.internSet(nil, true), ports: portSpec{all: true}})}
		}
		return out
	}

	for i := range spec.Ingress {
		r := &spec.Ingress[i]
		pfs := make([]cnpPeerFields, len(r.From))
		for j, p := range r.From {
			pfs[j] = cnpPeerFields{namespaces: p.Namespaces, pods: p.Pods, nodes: p.Nodes, networks: p.Networks}
		}
		out.rules[Ingress] = append(out.rules[Ingress], s.compileCNPRule(out, Ingress, i, r.Name, r.Action, "from", pfs, r.Protocols, bad, whole, subjectBad))
	}
	for i := range spec.Egress {
		r := &spec.Egress[i]
		pfs := make([]cnpPeerFields, len(r.To))
		for j, p := range r.To {
			pfs[j] = cnpPeerFields{namespaces: p.Namespaces, pods: p.Pods, nodes: p.Nodes, networks: p.Networks, domains: p.DomainNames}
		}
		out.rules[Egress] = append(out.rules[Egress], s.compileCNPRule(out, Egress, i, r.Name, r.Action, "to", pfs, r.Protocols, bad, whole, subjectBad))
	}
	for _, r := range out.rules[Ingress] {
		for _, n := range r.ports.named {
			if !slices.Contains(out.names, n.name) {
				out.names = append(out.names, n.name)
			}
		}
	}
	return out
}

// cnpSubject reads a valid subject into selectors.
func (s *state) cnpSubject(out *cnpState, subj *v1alpha2.ClusterNetworkPolicySubject) {
	var ok1, ok2 = true, true
	switch {
	case subj.Namespaces != nil:
		out.nsSel, out.nsKey, ok1 = s.selCache.getKeyed(subj.Namespaces)
	case subj.Pods != nil:
		out.nsSel, out.nsKey, ok1 = s.selCache.getKeyed(&subj.Pods.NamespaceSelector)
		out.podSel, out.podKey, ok2 = s.selCache.getKeyed(&subj.Pods.PodSelector)
	default:
		out.subjNone = true
	}
	if !ok1 || !ok2 || out.subjNone {
		out.subjNone = true
		out.nsSel, out.podSel = labels.Nothing(), labels.Nothing()
		out.nsKey, out.podKey = "<nothing>", "<nothing>"
	}
}

// compileCNPRule resolves one rule and applies fail-closed semantics
// (docs/semantics.md, Fail closed): a part Moat cannot understand makes an
// Accept rule match nothing and turns a Deny or Pass rule into a Deny of
// everything that part could have matched. wide is a problem with the whole
// policy (everything could be meant); subject is a problem with the subject
// only (the rule keeps its peers and protocols, and already applies to
// every pod).
func (s *state) compileCNPRule(c *cnpState, dir Direction, index int, name string, action v1alpha2.ClusterNetworkPolicyRuleAction, peerField string, pfs []cnpPeerFields, protos []v1alpha2.ClusterNetworkPolicyProtocol, bad badPaths, wide, subject string) *rule {
	path := fmt.Sprintf("spec.%s[%d]", dir, index)
	cr := &Rule{Policy: c.ref, Tier: c.tier, Priority: c.priority, Direction: dir, Index: index, Name: name, Action: Action(action)}
	out := &rule{dir: dir, owner: c, cnp: cr, index: index}

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
	var good []int
	for j := range pfs {
		pp := fmt.Sprintf("%s.%s[%d]", path, peerField, j)
		if msg := bad.under(pp); msg != "" {
			failed = append(failed, msg)
			widePeers = true
			continue
		}
		good = append(good, j)
	}
	if msg := bad.exactly(path + "." + peerField); msg != "" {
		widePeers = true
		failed = append(failed, msg)
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
		addCNPProtocol(&out.ports, &protos[j], j)
	}
	if allPorts {
		out.ports = portSpec{all: true}
	}

	if len(failed) > 0 {
		cr.FailClosed = strings.Join(failed, "; ")
		if cr.Action == ActionAccept {
			// Matches nothing, also after any change (no peers to redo).
			out.ports = portSpec{}
			return out
		}
		cr.Action = ActionDeny
	}
	var peers []*peer
	if !widePeers {
		for _, j := range good {
			peers = append(peers, s.cnpPeer(&pfs[j]))
		}
	}
	out.set = s.internSet(peers, widePeers)
	return s.newRule(out)
}

func addCNPProtocol(s *portSpec, p *v1alpha2.ClusterNetworkPolicyProtocol, index int) {
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
		s.named = append(s.named, namedPort{0, p.DestinationNamedPort, index})
	}
}

// cnpPeer interns one valid peer. domainNames are understood but not
// enforced (Moat has no DNS snooping): they match no address, which for the
// Accept-only domainNames peer is the closed direction.
func (s *state) cnpPeer(p *cnpPeerFields) *peer {
	switch {
	case p.namespaces != nil:
		sel, key, ok := s.selCache.getKeyed(p.namespaces)
		if !ok {
			return s.addrPeer("none", noAddrs)
		}
		return s.selectorPeer(nil, s.internNSSel(key, sel), nil)
	case p.pods != nil:
		nsSel, nsKey, ok1 := s.selCache.getKeyed(&p.pods.NamespaceSelector)
		podSel, podKey, ok2 := s.selCache.getKeyed(&p.pods.PodSelector)
		if !ok1 || !ok2 {
			return s.addrPeer("none", noAddrs)
		}
		return s.selectorPeer(nil, s.internNSSel(nsKey, nsSel), s.podSelOf(podSel, podKey))
	case p.nodes != nil:
		sel, key, ok := s.selCache.getKeyed(p.nodes)
		if !ok {
			return s.addrPeer("none", noAddrs)
		}
		return s.nodePeer(key, sel)
	case p.networks != nil:
		var key strings.Builder
		key.WriteString("networks=")
		for _, c := range p.networks {
			key.WriteString(string(c))
			key.WriteByte(',')
		}
		if pe := s.peers["addrs="+key.String()]; pe != nil {
			return pe
		}
		var rs []AddrRange
		for _, c := range p.networks {
			if pre, err := ParseCIDR(string(c)); err == nil {
				rs = append(rs, PrefixRange(pre))
			}
		}
		return s.addrPeer(key.String(), NewAddrSet(rs...))
	}
	return s.addrPeer("none", noAddrs)
}

// dropCNP forgets a compiled ClusterNetworkPolicy's rules and peers.
func (s *state) dropCNP(c *cnpState) {
	for d := range c.rules {
		for _, r := range c.rules[d] {
			s.dropRule(r)
		}
	}
}
