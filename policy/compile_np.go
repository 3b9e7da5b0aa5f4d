package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// npState is a compiled NetworkPolicy: its subject selector, its policy
// types and its rules with their peers interned.
type npState struct {
	src *NetworkPolicy
	ns  *nsState
	// seq is the position in input order, for diagnostics.
	seq int
	// subject selects pods of ns (everything when the selector could not
	// be understood: the namespace is isolated).
	subject labels.Selector
	subjKey string
	// types are the directions the policy isolates.
	types [2]bool
	// What compiling the rules needs besides the validation problems:
	// whether the whole spec is voided, and in which directions rules
	// count. (The flags sit together: a cluster has tens of thousands of
	// NetworkPolicies.)
	specBad bool
	ruleOK  [2]bool
	// rules by direction and index; a rule that failed closed has no set.
	// They are compiled on first use (rulesOf), nil until then: a
	// node-scoped Compiler never compiles the rules of the many policies
	// that select none of its pods, and peers of theirs stay unresolved.
	rules *[2][]*rule
	// namedPorts are the named ports of the rules that are not voided,
	// known without compiling the rules (named-port warnings, classes).
	// The port names the ingress rules use (ingressNames) and the label
	// keys the subject reads (selectorKeys) are derived when needed
	// rather than kept: nearly every policy has none of the first and one
	// or two of the second.
	namedPorts []ruleNamedPort
	lists      map[*npList]struct{}
	// problems is nil for the many policies with nothing to report.
	problems *npProblems
}

// npProblems is what is wrong with a NetworkPolicy.
type npProblems struct {
	bad      badPaths      // validation problems, for compiling the rules
	rejected *PolicyStatus // its status when not accepted; nil if accepted
	diags    []Diagnostic
	// named are the warnings about named ports that resolve nowhere.
	named []Diagnostic
}

// ref names the policy.
func (np *npState) ref() PolicyRef {
	return PolicyRef{Kind: "NetworkPolicy", Namespace: np.src.Namespace, Name: np.src.Name}
}

// status is what the compiler concluded about the policy.
func (np *npState) status() PolicyStatus {
	if p := np.problems; p != nil && p.rejected != nil {
		return *p.rejected
	}
	return PolicyStatus{Policy: np.ref(), Accepted: true}
}

func (np *npState) bad() badPaths {
	if np.problems == nil {
		return nil
	}
	return np.problems.bad
}

// diagnostics are the policy's problems and named-port warnings.
func (np *npState) diagnostics() (diags, named []Diagnostic) {
	if np.problems == nil {
		return nil, nil
	}
	return np.problems.diags, np.problems.named
}

// setNamed replaces the named-port warnings; it returns the previous ones.
func (np *npState) setNamed(named []Diagnostic) []Diagnostic {
	if np.problems == nil {
		if named == nil {
			return nil
		}
		np.problems = &npProblems{}
	}
	before := np.problems.named
	np.problems.named = named
	return before
}

func (np *npState) dropTiers(s *state, dir Direction) {
	for l := range np.lists {
		l.drop(s, dir)
	}
}

// compileNP compiles a NetworkPolicy; errs are its validation errors.
func (s *state) compileNP(np *NetworkPolicy, errs field.ErrorList) *npState {
	ref := PolicyRef{Kind: "NetworkPolicy", Namespace: np.Namespace, Name: np.Name}
	bad, status, diags := s.check(ref, np.Source, errs, np.UnknownFields())
	ns := s.namespace(np.Namespace)
	ns.refs++
	out := &npState{src: np, ns: ns}
	if len(bad) > 0 || len(diags) > 0 || !status.Accepted {
		out.problems = &npProblems{bad: bad, diags: diags}
		if !status.Accepted {
			out.problems.rejected = &status
		}
	}
	spec := &np.Spec

	// Pod selection. An invalid selector isolates the whole namespace and
	// none of the policy's rules allow anything: they were meant for pods
	// we cannot tell, and opening others with them would widen access.
	sel, key, ok := s.selCache.getKeyed(&spec.PodSelector)
	subjectBad := !ok || bad.under("spec.podSelector") != ""
	if subjectBad {
		sel, key = everything, ""
	}
	out.subject, out.subjKey = sel, key

	// Policy types, defaulted as the API server does. Invalid types isolate
	// both directions, but rules count only in a direction validly listed.
	var ruleOK [2]bool
	if bad.under("spec.policyTypes") != "" {
		out.types = [2]bool{true, true}
		for _, t := range spec.PolicyTypes {
			ruleOK[Ingress] = ruleOK[Ingress] || t == networkingv1.PolicyTypeIngress
			ruleOK[Egress] = ruleOK[Egress] || t == networkingv1.PolicyTypeEgress
		}
	} else {
		out.types = policyTypes(spec)
		ruleOK = out.types
	}
	// A rule list that could not be read as a whole (not a list, or given
	// twice: decoding reports it at the list's own path) allows nothing;
	// its direction stays isolated as the policy types say.
	if bad.exactly("spec.ingress") != "" {
		ruleOK[Ingress] = false
	}
	if bad.exactly("spec.egress") != "" {
		ruleOK[Egress] = false
	}
	// An unknown field outside spec may have been meant to change anything:
	// both directions are isolated and no rule allows.
	if objectProblem(np.UnknownFields()) != "" {
		out.types, ruleOK = [2]bool{true, true}, [2]bool{}
	}
	// Unknown fields directly under spec may change what every rule means.
	specBad := subjectBad
	for _, p := range np.UnknownFields() {
		if isDirectChild("spec", p) {
			specBad = true
		}
	}

	out.specBad, out.ruleOK = specBad, ruleOK

	for i, r := range spec.Ingress {
		path := rulePath("spec.ingress", i, bad)
		if !npRuleVoid(path, "from", bad, specBad || !ruleOK[Ingress]) {
			out.addNamedPorts(Ingress, i, path, r.Ports)
		}
	}
	for i, r := range spec.Egress {
		path := rulePath("spec.egress", i, bad)
		if !npRuleVoid(path, "to", bad, specBad || !ruleOK[Egress]) {
			out.addNamedPorts(Egress, i, path, r.Ports)
		}
	}
	return out
}

// ingressNames are the port names the policy's ingress rules use, each
// once, in the order of the rules.
func (np *npState) ingressNames() []string {
	var out []string
	for _, n := range np.namedPorts {
		if n.dir == Ingress && !slices.Contains(out, n.name) {
			out = append(out, n.name)
		}
	}
	return out
}

// hasIngressNames: some ingress rule of the policy uses a named port.
func (np *npState) hasIngressNames() bool {
	for _, n := range np.namedPorts {
		if n.dir == Ingress {
			return true
		}
	}
	return false
}

// ruleNamedPort is a named port of a policy rule, known without compiling
// the rule.
type ruleNamedPort struct {
	dir  Direction
	rule int
	namedPort
}

// addNamedPorts records the named ports of a rule that is not voided,
// skipping entries that failed validation, as compileNPRule does.
func (np *npState) addNamedPorts(dir Direction, rule int, path string, ports []networkingv1.NetworkPolicyPort) {
	for j, p := range ports {
		if p.Port == nil || p.Port.Type != intstr.String {
			continue
		}
		if bad := np.bad(); len(bad) > 0 && bad.under(fmt.Sprintf("%s.ports[%d]", path, j)) != "" {
			continue
		}
		np.namedPorts = append(np.namedPorts, ruleNamedPort{dir, rule, namedPort{protocolOf(p.Protocol), p.Port.StrVal, j}})
	}
}

// rulesOf compiles the policy's rules the first time they are needed.
func (s *state) rulesOf(np *npState) *[2][]*rule {
	if np.rules != nil {
		return np.rules
	}
	np.rules = new([2][]*rule)
	spec, bad := &np.src.Spec, np.bad()
	for i, r := range spec.Ingress {
		path := rulePath("spec.ingress", i, bad)
		np.rules[Ingress] = append(np.rules[Ingress], s.compileNPRule(np, Ingress, i, path, "from", r.From, r.Ports, bad, np.specBad || !np.ruleOK[Ingress]))
	}
	for i, r := range spec.Egress {
		path := rulePath("spec.egress", i, bad)
		np.rules[Egress] = append(np.rules[Egress], s.compileNPRule(np, Egress, i, path, "to", r.To, r.Ports, bad, np.specBad || !np.ruleOK[Egress]))
	}
	return np.rules
}

// rulePath is a rule's field path, which only the policy's problems are
// matched against: "" when it has none, as nearly every policy, so that
// compiling its rules makes no string for them.
func rulePath(list string, i int, bad badPaths) string {
	if len(bad) == 0 {
		return ""
	}
	return list + "[" + strconv.Itoa(i) + "]"
}

// npRuleVoid reports whether a rule matches nothing: a problem on the rule
// itself (not inside a peer or port) voids it, and so does one at exactly
// its peer or port list, which would otherwise read as every peer or every
// port.
func npRuleVoid(path, peerField string, bad badPaths, none bool) bool {
	for _, b := range bad {
		if isDirectChild(path, b.path) && !isListField(path, b.path, peerField, "ports") ||
			b.path == path+"."+peerField || b.path == path+".ports" {
			none = true
		}
	}
	return none || bad.exactly(path) != ""
}

// policyTypes defaults and reads spec.policyTypes.
func policyTypes(spec *networkingv1.NetworkPolicySpec) [2]bool {
	var types [2]bool
	if len(spec.PolicyTypes) == 0 {
		types[Ingress] = true
		types[Egress] = len(spec.Egress) > 0
		return types
	}
	for _, t := range spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			types[Ingress] = true
		case networkingv1.PolicyTypeEgress:
			types[Egress] = true
		}
	}
	return types
}

func (s *state) compileNPRule(np *npState, dir Direction, index int, path, peerField string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, bad badPaths, none bool) *rule {
	r := &rule{dir: dir, owner: np, index: index}
	if npRuleVoid(path, peerField, bad, none) {
		return r
	}
	// Peers: an empty list is every address; a list whose entries all
	// failed is nothing.
	if len(peers) == 0 {
		r.set = s.internSet(nil, true)
	} else {
		var ps []*peer
		for j := range peers {
			if len(bad) > 0 && bad.under(fmt.Sprintf("%s.%s[%d]", path, peerField, j)) != "" {
				continue
			}
			ps = append(ps, s.npPeer(np.ns, &peers[j]))
		}
		r.set = s.internSet(ps, false)
	}
	// Ports: an empty list is all traffic; failed entries match nothing.
	if len(ports) == 0 {
		r.ports.all = true
	}
	for j, p := range ports {
		if len(bad) > 0 && bad.under(fmt.Sprintf("%s.ports[%d]", path, j)) != "" {
			continue
		}
		proto := protocolOf(p.Protocol)
		switch {
		case p.Port == nil:
			r.ports.numeric = append(r.ports.numeric, protoRange{proto, AllPorts})
		case p.Port.Type == intstr.String:
			// Recorded at validation (addNamedPorts).
		default:
			to := p.Port.IntVal
			if p.EndPort != nil {
				to = *p.EndPort
			}
			r.ports.numeric = append(r.ports.numeric, protoRange{proto, PortRange{uint16(p.Port.IntVal), uint16(to)}})
		}
	}
	for _, n := range np.namedPorts {
		if n.dir == dir && n.rule == index {
			r.ports.named = append(r.ports.named, n.namedPort)
		}
	}
	return s.newRule(r)
}

// npPeer interns one NetworkPolicy peer.
func (s *state) npPeer(ns *nsState, p *networkingv1.NetworkPolicyPeer) *peer {
	if p.IPBlock != nil {
		cidr, err := ParseCIDR(p.IPBlock.CIDR)
		if err != nil {
			return s.addrPeer("none", noAddrs)
		}
		var holes []AddrRange
		for _, e := range p.IPBlock.Except {
			if ex, err := ParseCIDR(e); err == nil {
				holes = append(holes, PrefixRange(ex))
			}
		}
		key := "ipblock=" + p.IPBlock.CIDR
		if len(p.IPBlock.Except) > 0 {
			key += " except " + strings.Join(p.IPBlock.Except, ",")
		}
		if pe := s.peers["addrs="+key]; pe != nil {
			return pe
		}
		return s.addrPeer(key, NewAddrSet(PrefixRange(cidr)).Subtract(NewAddrSet(holes...)))
	}
	var podSel *podSel
	if p.PodSelector != nil {
		sel, key, ok := s.selCache.getKeyed(p.PodSelector)
		if !ok {
			return s.addrPeer("none", noAddrs)
		}
		podSel = s.podSelOf(sel, key)
	}
	if p.NamespaceSelector == nil {
		return s.selectorPeer(ns, nil, podSel)
	}
	sel, key, ok := s.selCache.getKeyed(p.NamespaceSelector)
	if !ok {
		return s.addrPeer("none", noAddrs)
	}
	return s.selectorPeer(nil, s.internNSSel(key, sel), podSel)
}

// podSelOf interns a pod selector with its canonical string; nil stands
// for every pod.
func (s *state) podSelOf(sel labels.Selector, key string) *podSel {
	if isEverything(sel) {
		return nil
	}
	return s.internPodSel(key, sel)
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

// dropNP forgets a compiled NetworkPolicy's rules and peers.
func (s *state) dropNP(np *npState) {
	if np.rules != nil {
		for _, rs := range np.rules {
			for _, r := range rs {
				s.dropRule(r)
			}
		}
	}
	np.ns.refs--
	s.dropNamespace(np.ns)
}
