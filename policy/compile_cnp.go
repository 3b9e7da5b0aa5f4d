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
	// rules by direction and index; a rule voided by fail-closed has no
	// set. They are compiled on first use (cnpRulesOf), nil until then, as a
	// NetworkPolicy's are: a node-scoped Compiler never compiles the rules
	// of the policies that select none of its pods, and their peers are
	// never interned. Status and diagnostics come from validation alone,
	// so an invalid policy is reported whether or not it selects a pod.
	rules *[2][]*rule
	// fail is what compiling the rules needs of the validation problems;
	// nil for the many policies with none.
	fail   *cnpFail
	status PolicyStatus
	diags  []Diagnostic
	named  []Diagnostic
	// namedPorts are the named ports of the rules not voided, known
	// without compiling them (named-port warnings, classes).
	namedPorts []ruleNamedPort
	nsKeys     []string
	podKeys    []string
	names      []string // port names the ingress rules use
	lists      map[*cnpList]struct{}
}

// cnpFail is what fail-closed compilation of a ClusterNetworkPolicy's
// rules reads: the problems' paths, the problem with the whole policy
// (every rule fails closed) and the one with its subject.
type cnpFail struct {
	bad            badPaths
	whole, subject string
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

// compileCNP compiles a ClusterNetworkPolicy, all but its rules (see
// cnpRulesOf); errs are its validation errors.
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
	// (Rare: these two rules are compiled at once.)
	if msg := objectProblem(unknown); msg != "" {
		out.rules = new([2][]*rule)
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
	if len(bad) > 0 {
		out.fail = &cnpFail{bad: bad, whole: whole, subject: subjectBad}
	}

	// The named ports of the rules that are not voided, as compiling them
	// would leave them.
	for i := range spec.Ingress {
		r := &spec.Ingress[i]
		out.addNamedPorts(Ingress, i, r.Action, len(r.From), r.Protocols)
	}
	for i := range spec.Egress {
		r := &spec.Egress[i]
		out.addNamedPorts(Egress, i, r.Action, len(r.To), r.Protocols)
	}
	for _, n := range out.namedPorts {
		if n.dir == Ingress && !slices.Contains(out.names, n.name) {
			out.names = append(out.names, n.name)
		}
	}
	return out
}

// addNamedPorts records the named ports a rule keeps after fail-closed
// (cnpRuleForm).
func (c *cnpState) addNamedPorts(dir Direction, index int, action v1alpha2.ClusterNetworkPolicyRuleAction, peers int, protos []v1alpha2.ClusterNetworkPolicyProtocol) {
	hasNamed := false
	for j := range protos {
		hasNamed = hasNamed || protos[j].DestinationNamedPort != ""
	}
	if !hasNamed {
		return
	}
	f := c.ruleForm(dir, index, action, peers, protos)
	if f.voided {
		return
	}
	for _, n := range f.ports.named {
		c.namedPorts = append(c.namedPorts, ruleNamedPort{dir, index, n})
	}
}

// cnpRulesOf compiles the policy's rules the first time they are needed.
func (s *state) cnpRulesOf(c *cnpState) *[2][]*rule {
	if c.rules != nil {
		return c.rules
	}
	c.rules = new([2][]*rule)
	spec := &c.src.Spec
	for i := range spec.Ingress {
		r := &spec.Ingress[i]
		pfs := make([]cnpPeerFields, len(r.From))
		for j, p := range r.From {
			pfs[j] = cnpPeerFields{namespaces: p.Namespaces, pods: p.Pods, nodes: p.Nodes, networks: p.Networks}
		}
		c.rules[Ingress] = append(c.rules[Ingress], s.compileCNPRule(c, Ingress, i, r.Name, r.Action, pfs, r.Protocols))
	}
	for i := range spec.Egress {
		r := &spec.Egress[i]
		pfs := make([]cnpPeerFields, len(r.To))
		for j, p := range r.To {
			pfs[j] = cnpPeerFields{namespaces: p.Namespaces, pods: p.Pods, nodes: p.Nodes, networks: p.Networks, domains: p.DomainNames}
		}
		c.rules[Egress] = append(c.rules[Egress], s.compileCNPRule(c, Egress, i, r.Name, r.Action, pfs, r.Protocols))
	}
	return c.rules
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

// cnpRuleForm is what fail-closed (docs/semantics.md, Fail closed) makes of
// one rule, before any peer is interned.
type cnpRuleForm struct {
	// failed are the problems that changed the rule; none for a rule Moat
	// understands.
	failed []string
	// voided: an Accept rule that failed matches nothing (no set, no ports).
	voided bool
	// widePeers: the rule's peers widen to every address; else good are
	// the indexes of the peers that are understood.
	widePeers bool
	good      []int
	ports     portSpec
}

// ruleForm applies fail-closed semantics to one rule: a part Moat cannot
// understand makes an Accept rule match nothing and turns a Deny or Pass
// rule into a Deny of everything that part could have matched. The
// problem with the whole policy (everything could be meant) widens peers
// and ports; the one with the subject only fails the rule (it keeps its
// peers and protocols, and already applies to every pod).
func (c *cnpState) ruleForm(dir Direction, index int, action v1alpha2.ClusterNetworkPolicyRuleAction, peers int, protos []v1alpha2.ClusterNetworkPolicyProtocol) cnpRuleForm {
	var f cnpRuleForm
	fail := c.fail
	if fail == nil {
		// Nearly every policy: nothing failed, no field path to make.
		f.good = make([]int, peers)
		for j := range f.good {
			f.good[j] = j
		}
		f.ports.all = len(protos) == 0
		for j := range protos {
			addCNPProtocol(&f.ports, &protos[j], j)
		}
		if f.ports.all {
			f.ports = portSpec{all: true}
		}
		return f
	}
	bad := fail.bad
	path := fmt.Sprintf("spec.%s[%d]", dir, index)
	peerField := "from"
	if dir == Egress {
		peerField = "to"
	}
	for _, p := range []string{fail.whole, fail.subject} {
		if p != "" {
			f.failed = append(f.failed, p)
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
		f.failed = append(f.failed, ruleWide)
	} else {
		ruleWide = fail.whole
	}

	// Peers.
	f.widePeers = ruleWide != ""
	for j := range peers {
		pp := fmt.Sprintf("%s.%s[%d]", path, peerField, j)
		if msg := bad.under(pp); msg != "" {
			f.failed = append(f.failed, msg)
			f.widePeers = true
			continue
		}
		f.good = append(f.good, j)
	}
	if msg := bad.exactly(path + "." + peerField); msg != "" {
		f.widePeers = true
		f.failed = append(f.failed, msg)
	}

	// Protocols.
	allPorts := ruleWide != "" || len(protos) == 0
	if msg := bad.exactly(path + ".protocols"); msg != "" {
		allPorts = true
		f.failed = append(f.failed, msg)
	}
	for j := range protos {
		pp := fmt.Sprintf("%s.protocols[%d]", path, j)
		if msg := bad.under(pp); msg != "" {
			f.failed = append(f.failed, msg)
			allPorts = true
			continue
		}
		addCNPProtocol(&f.ports, &protos[j], j)
	}
	if allPorts {
		f.ports = portSpec{all: true}
	}
	if len(f.failed) > 0 && Action(action) == ActionAccept {
		// Matches nothing, also after any change (no peers to redo).
		f.voided, f.ports = true, portSpec{}
	}
	return f
}

// compileCNPRule compiles one rule as ruleForm shapes it, interning its
// peers.
func (s *state) compileCNPRule(c *cnpState, dir Direction, index int, name string, action v1alpha2.ClusterNetworkPolicyRuleAction, pfs []cnpPeerFields, protos []v1alpha2.ClusterNetworkPolicyProtocol) *rule {
	f := c.ruleForm(dir, index, action, len(pfs), protos)
	cr := &Rule{Policy: c.ref, Tier: c.tier, Priority: c.priority, Direction: dir, Index: index, Name: name, Action: Action(action)}
	out := &rule{dir: dir, owner: c, cnp: cr, index: index, ports: f.ports}
	if len(f.failed) > 0 {
		cr.FailClosed = strings.Join(f.failed, "; ")
		if f.voided {
			return out
		}
		cr.Action = ActionDeny
	}
	var peers []*peer
	if !f.widePeers {
		for _, j := range f.good {
			peers = append(peers, s.cnpPeer(&pfs[j]))
		}
	}
	out.set = s.internSet(peers, f.widePeers)
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
	if c.rules == nil {
		return
	}
	for d := range c.rules {
		for _, r := range c.rules[d] {
			s.dropRule(r)
		}
	}
}
