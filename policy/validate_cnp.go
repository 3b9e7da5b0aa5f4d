package policy

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/moat-net/moat/api/v1alpha2"
)

// Limits of the ClusterNetworkPolicy CRD (network-policy-api v0.2.0).
const (
	maxCNPRules     = 25
	maxCNPPeers     = 25
	maxCNPProtocols = 25
	maxCNPNetworks  = 25
	maxRuleNameLen  = 100
	maxCIDRLen      = 43
	maxPriority     = 1000
)

var domainNamePattern = regexp.MustCompile(`^(\*\.)?([a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$`)

// ValidateClusterNetworkPolicy applies every OpenAPI and CEL rule of the
// experimental-channel CRD, including the NPEP-127 ingress peers, so that
// `moat check` rejects what the API server would and the compiler knows
// which parts to fail closed.
func ValidateClusterNetworkPolicy(cnp *v1alpha2.ClusterNetworkPolicy) field.ErrorList {
	return (*validator)(nil).clusterNetworkPolicy(cnp)
}

func (v *validator) clusterNetworkPolicy(cnp *v1alpha2.ClusterNetworkPolicy) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateObjectName(cnp.Name, "", false)...)
	spec := field.NewPath("spec")
	switch cnp.Spec.Tier {
	case v1alpha2.AdminTier, v1alpha2.BaselineTier:
	case "":
		errs = append(errs, field.Required(spec.Child("tier"), `must be "Admin" or "Baseline"`))
	default:
		errs = append(errs, field.NotSupported(spec.Child("tier"), cnp.Spec.Tier, []string{"Admin", "Baseline"}))
	}
	if cnp.Spec.Priority < 0 || cnp.Spec.Priority > maxPriority {
		errs = append(errs, field.Invalid(spec.Child("priority"), cnp.Spec.Priority, "must be between 0 and 1000"))
	}
	errs = append(errs, v.subject(&cnp.Spec.Subject, spec.Child("subject"))...)
	if n := len(cnp.Spec.Ingress); n > maxCNPRules {
		errs = append(errs, field.TooMany(spec.Child("ingress"), n, maxCNPRules))
	}
	if n := len(cnp.Spec.Egress); n > maxCNPRules {
		errs = append(errs, field.TooMany(spec.Child("egress"), n, maxCNPRules))
	}
	for i := range cnp.Spec.Ingress {
		r := &cnp.Spec.Ingress[i]
		p := spec.Child("ingress").Index(i)
		errs = append(errs, validateRuleHead(r.Name, r.Action, p)...)
		errs = append(errs, validatePeerCount(len(r.From), r.From == nil, p.Child("from"))...)
		addrPeer := false
		for j := range r.From {
			peer := &r.From[j]
			addrPeer = addrPeer || peer.Networks != nil || peer.Nodes != nil
			errs = append(errs, v.peer(peer.Namespaces, peer.Pods, peer.Nodes, peer.Networks, nil, p.Child("from").Index(j))...)
		}
		errs = append(errs, validateProtocols(r.Protocols, addrPeer, p)...)
	}
	for i := range cnp.Spec.Egress {
		r := &cnp.Spec.Egress[i]
		p := spec.Child("egress").Index(i)
		errs = append(errs, validateRuleHead(r.Name, r.Action, p)...)
		errs = append(errs, validatePeerCount(len(r.To), r.To == nil, p.Child("to"))...)
		addrPeer := false
		for j := range r.To {
			peer := &r.To[j]
			addrPeer = addrPeer || peer.Networks != nil || peer.Nodes != nil || peer.DomainNames != nil
			errs = append(errs, v.peer(peer.Namespaces, peer.Pods, peer.Nodes, peer.Networks, peer.DomainNames, p.Child("to").Index(j))...)
			if peer.DomainNames != nil && r.Action != v1alpha2.ClusterNetworkPolicyRuleActionAccept {
				// The API's contract (domainNames are an allowlist); the
				// v0.2.0 CRD does not enforce it, Moat does and fails closed.
				errs = append(errs, field.Forbidden(p.Child("to").Index(j).Child("domainNames"), "domainNames may only be used in Accept rules"))
			}
		}
		errs = append(errs, validateProtocols(r.Protocols, addrPeer, p)...)
	}
	return errs
}

func (v *validator) subject(s *v1alpha2.ClusterNetworkPolicySubject, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	n := 0
	if s.Namespaces != nil {
		n++
		errs = append(errs, v.selector(s.Namespaces, p, "namespaces")...)
	}
	if s.Pods != nil {
		n++
		errs = append(errs, v.namespacedPod(s.Pods, p.Child("pods"))...)
	}
	return append(errs, exactlyOne(n, p, "namespaces, pods")...)
}

func exactlyOne(n int, p *field.Path, fields string) field.ErrorList {
	switch {
	case n == 0:
		return field.ErrorList{field.Required(p, "exactly one of "+fields+" must be set (an empty object may hold a field this version of Moat does not know)")}
	case n > 1:
		// Forbidden, not Invalid: the count is not the field's value.
		return field.ErrorList{field.Forbidden(p, fmt.Sprintf("exactly one of %s must be set, found %d", fields, n))}
	}
	return nil
}

func (v *validator) namespacedPod(np *v1alpha2.NamespacedPod, p *field.Path) field.ErrorList {
	errs := v.selector(&np.NamespaceSelector, p, "namespaceSelector")
	return append(errs, v.selector(&np.PodSelector, p, "podSelector")...)
}

func validateRuleHead(name string, action v1alpha2.ClusterNetworkPolicyRuleAction, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(name) > maxRuleNameLen {
		errs = append(errs, field.TooLong(p.Child("name"), name, maxRuleNameLen))
	}
	switch action {
	case v1alpha2.ClusterNetworkPolicyRuleActionAccept, v1alpha2.ClusterNetworkPolicyRuleActionDeny, v1alpha2.ClusterNetworkPolicyRuleActionPass:
	case "":
		errs = append(errs, field.Required(p.Child("action"), `must be "Accept", "Deny" or "Pass"`))
	default:
		errs = append(errs, field.NotSupported(p.Child("action"), action, []string{"Accept", "Deny", "Pass"}))
	}
	return errs
}

func validatePeerCount(n int, missing bool, p *field.Path) field.ErrorList {
	switch {
	case missing || n == 0:
		return field.ErrorList{field.Required(p, "must have at least 1 peer")}
	case n > maxCNPPeers:
		return field.ErrorList{field.TooMany(p, n, maxCNPPeers)}
	}
	return nil
}

func (v *validator) peer(ns *metav1.LabelSelector, pods *v1alpha2.NamespacedPod, nodes *metav1.LabelSelector, networks []v1alpha2.CIDR, domains []v1alpha2.DomainName, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	n := 0
	if ns != nil {
		n++
		errs = append(errs, v.selector(ns, p, "namespaces")...)
	}
	if pods != nil {
		n++
		errs = append(errs, v.namespacedPod(pods, p.Child("pods"))...)
	}
	if nodes != nil {
		n++
		errs = append(errs, v.selector(nodes, p, "nodes")...)
	}
	if networks != nil {
		n++
		errs = append(errs, validateNetworks(networks, p.Child("networks"))...)
	}
	if domains != nil {
		n++
		dp := p.Child("domainNames")
		if len(domains) == 0 || len(domains) > maxCNPNetworks {
			errs = append(errs, field.Invalid(dp, len(domains), "must have between 1 and 25 items"))
		}
		for i, d := range domains {
			if !domainNamePattern.MatchString(string(d)) {
				errs = append(errs, field.Invalid(dp.Index(i), d, "must be a domain name, optionally with a leading '*.'"))
			}
		}
	}
	return append(errs, exactlyOne(n, p, "namespaces, pods, nodes, networks, domainNames")...)
}

func validateNetworks(nets []v1alpha2.CIDR, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(nets) == 0 || len(nets) > maxCNPNetworks {
		errs = append(errs, field.Invalid(p, len(nets), "must have between 1 and 25 items"))
	}
	seen := map[v1alpha2.CIDR]bool{}
	for i, c := range nets {
		if len(c) > maxCIDRLen {
			errs = append(errs, field.TooLong(p.Index(i), string(c), maxCIDRLen))
		}
		// The CRD's message, then why (as the CRD's isCIDR, strictly:
		// leading zeros are refused, never read as decimal or octal, and
		// IPv4-mapped IPv6 is not a CIDR either).
		if pre, err := netip.ParsePrefix(string(c)); err != nil {
			errs = append(errs, field.Invalid(p.Index(i), string(c), "Invalid CIDR format provided: "+prefixProblem(string(c), err)))
		} else if pre.Addr().Is4In6() {
			errs = append(errs, field.Invalid(p.Index(i), string(c), "Invalid CIDR format provided: an IPv4-mapped IPv6 address"))
		}
		if seen[c] {
			errs = append(errs, field.Duplicate(p.Index(i), string(c)))
		}
		seen[c] = true
	}
	return errs
}

func validateProtocols(protos []v1alpha2.ClusterNetworkPolicyProtocol, addrPeer bool, rule *field.Path) field.ErrorList {
	var errs field.ErrorList
	p := rule.Child("protocols")
	if protos != nil && len(protos) == 0 || len(protos) > maxCNPProtocols {
		errs = append(errs, field.Invalid(p, len(protos), "must have between 1 and 25 items when set"))
	}
	for i := range protos {
		pr := &protos[i]
		pp := p.Index(i)
		n := 0
		if pr.TCP != nil {
			n++
			errs = append(errs, validateDestPort(pr.TCP.DestinationPort, pp.Child("tcp"))...)
		}
		if pr.UDP != nil {
			n++
			errs = append(errs, validateDestPort(pr.UDP.DestinationPort, pp.Child("udp"))...)
		}
		if pr.SCTP != nil {
			n++
			errs = append(errs, validateDestPort(pr.SCTP.DestinationPort, pp.Child("sctp"))...)
		}
		if pr.DestinationNamedPort != "" {
			n++
			if addrPeer {
				errs = append(errs, field.Invalid(pp.Child("destinationNamedPort"), pr.DestinationNamedPort,
					"networks/nodes/domainNames peer cannot be set with namedPorts since there are no namedPorts for networks/nodes/domainNames"))
			}
		}
		errs = append(errs, exactlyOne(n, pp, "tcp, udp, sctp, destinationNamedPort")...)
	}
	return errs
}

func validateDestPort(port *v1alpha2.Port, p *field.Path) field.ErrorList {
	if port == nil {
		return field.ErrorList{field.Required(p.Child("destinationPort"), "must be set (an empty object may hold a field this version of Moat does not know)")}
	}
	p = p.Child("destinationPort")
	var errs field.ErrorList
	n := 0
	if port.Number != 0 {
		n++
		errs = append(errs, portNumber(port.Number, p.Child("number"))...)
	}
	if port.Range != nil {
		n++
		errs = append(errs, portNumber(port.Range.Start, p.Child("range", "start"))...)
		errs = append(errs, portNumber(port.Range.End, p.Child("range", "end"))...)
		if port.Range.Start >= port.Range.End {
			errs = append(errs, field.Invalid(p.Child("range"), fmt.Sprintf("%d-%d", port.Range.Start, port.Range.End), "Start port must be less than End port"))
		}
	}
	return append(errs, exactlyOne(n, p, "number, range")...)
}

func portNumber(n int32, p *field.Path) field.ErrorList {
	if n < 1 || n > 65535 {
		return field.ErrorList{field.Invalid(p, n, "must be between 1 and 65535")}
	}
	return nil
}

// validateCNP is what the compiler checks of a ClusterNetworkPolicy: what
// decoding found (Invalid: wrongly typed parts, missing required fields)
// first, then the CRD's rules.
func (v *validator) validateCNP(cnp *ClusterNetworkPolicy) field.ErrorList {
	return withDecodeErrors(cnp.Invalid, v.clusterNetworkPolicy(cnp.ClusterNetworkPolicy))
}

// withDecodeErrors puts what decoding found before validation's errors,
// leaving out what would say the same twice: validation of the empty
// value that replaced a part decoding could not read, and a missing
// required field (decoding reports it; the typed object cannot tell
// missing from empty).
func withDecodeErrors(decoded, validated field.ErrorList) field.ErrorList {
	errs := append(field.ErrorList(nil), decoded...)
	for _, e := range validated {
		if !slices.ContainsFunc(decoded, func(d *field.Error) bool { return coveredBy(e, d) }) {
			errs = append(errs, e)
		}
	}
	return errs
}

func coveredBy(e, d *field.Error) bool {
	switch d.Type {
	case field.ErrorTypeRequired:
		return e.Type == field.ErrorTypeRequired && e.Field == d.Field
	case field.ErrorTypeTypeInvalid:
		// A required one-of (a peer, a subject) that is empty only
		// because decoding could not read the member it had.
		if e.Type == field.ErrorTypeRequired && e.Field == parentPath(d.Field) {
			return true
		}
		fallthrough
	case field.ErrorTypeDuplicate:
		return e.Field == d.Field || strings.HasPrefix(e.Field, d.Field+".") || strings.HasPrefix(e.Field, d.Field+"[")
	}
	return false
}

// parentPath is the path of the object or list holding the field at p:
// "spec.ingress[0]" for "spec.ingress[0].from", "spec.ingress" for
// "spec.ingress[0]".
func parentPath(p string) string {
	if i := strings.LastIndexAny(p, ".["); i > 0 {
		return p[:i]
	}
	return ""
}
