package policy

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ValidateNetworkPolicy mirrors the API server's validation of
// networking.k8s.io/v1 NetworkPolicy, including KEP-2079 endPort rules.
// It returns every violation, not just the first.
func ValidateNetworkPolicy(np *NetworkPolicy) field.ErrorList {
	return (*validator)(nil).networkPolicy(np)
}

func (v *validator) networkPolicy(np *NetworkPolicy) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateObjectName(np.Name, np.Namespace, true)...)
	spec := field.NewPath("spec")
	errs = append(errs, v.selector(&np.Spec.PodSelector, spec, "podSelector")...)
	for i, r := range np.Spec.Ingress {
		p := spec.Child("ingress").Index(i)
		errs = append(errs, validateNPPorts(r.Ports, p.Child("ports"))...)
		for j, peer := range r.From {
			errs = append(errs, v.npPeer(&peer, p.Child("from").Index(j))...)
		}
	}
	for i, r := range np.Spec.Egress {
		p := spec.Child("egress").Index(i)
		errs = append(errs, validateNPPorts(r.Ports, p.Child("ports"))...)
		for j, peer := range r.To {
			errs = append(errs, v.npPeer(&peer, p.Child("to").Index(j))...)
		}
	}
	// Like the API server: known values, at most two; repeats are legal.
	for i, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress:
		default:
			errs = append(errs, field.NotSupported(spec.Child("policyTypes").Index(i), t, []string{"Ingress", "Egress"}))
		}
	}
	if len(np.Spec.PolicyTypes) > 2 {
		errs = append(errs, field.TooMany(spec.Child("policyTypes"), len(np.Spec.PolicyTypes), 2))
	}
	return errs
}

func validateObjectName(name, namespace string, namespaced bool) field.ErrorList {
	var errs field.ErrorList
	md := field.NewPath("metadata")
	if name == "" {
		errs = append(errs, field.Required(md.Child("name"), "name is required"))
	} else {
		for _, msg := range utilvalidation.IsDNS1123Subdomain(name) {
			errs = append(errs, field.Invalid(md.Child("name"), name, msg))
		}
	}
	if namespaced {
		if namespace == "" {
			errs = append(errs, field.Required(md.Child("namespace"), "namespace is required"))
		} else {
			for _, msg := range utilvalidation.IsDNS1123Label(namespace) {
				errs = append(errs, field.Invalid(md.Child("namespace"), namespace, msg))
			}
		}
	}
	return errs
}

// validator validates policies. A compile's validators (one per worker)
// remember the selectors they found valid, by content: a cluster's
// policies repeat a few selectors thousands of times, and checking one
// runs regular expressions over every key and value. Only validity is
// remembered, never errors, which name the field they are found in. The
// nil validator remembers nothing.
type validator struct {
	validSels map[string]struct{}
}

func newValidator() *validator {
	return &validator{validSels: map[string]struct{}{}}
}

func (v *validator) selector(sel *metav1.LabelSelector, parent *field.Path, name string) field.ErrorList {
	if sel == nil {
		return nil
	}
	if v == nil {
		return metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, parent.Child(name))
	}
	var buf [256]byte
	key := appendSelectorKey(buf[:0], sel)
	if _, ok := v.validSels[string(key)]; ok {
		return nil // and no field path made for it
	}
	errs := metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, parent.Child(name))
	if len(errs) == 0 {
		v.validSels[string(key)] = struct{}{}
	}
	return errs
}

func validateNPPorts(ports []networkingv1.NetworkPolicyPort, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, port := range ports {
		pp := p.Index(i)
		if port.Protocol != nil {
			switch *port.Protocol {
			case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
			default:
				errs = append(errs, field.NotSupported(pp.Child("protocol"), *port.Protocol, []string{"TCP", "UDP", "SCTP"}))
			}
		}
		if port.Port == nil {
			if port.EndPort != nil {
				errs = append(errs, field.Required(pp.Child("port"), "must be specified when endPort is specified"))
			}
			continue
		}
		if port.Port.Type == intstr.Int {
			for _, msg := range utilvalidation.IsValidPortNum(int(port.Port.IntVal)) {
				errs = append(errs, field.Invalid(pp.Child("port"), port.Port.IntVal, msg))
			}
			if port.EndPort != nil {
				if *port.EndPort < port.Port.IntVal {
					errs = append(errs, field.Invalid(pp.Child("endPort"), *port.EndPort, "must be greater than or equal to `port`"))
				}
				for _, msg := range utilvalidation.IsValidPortNum(int(*port.EndPort)) {
					errs = append(errs, field.Invalid(pp.Child("endPort"), *port.EndPort, msg))
				}
			}
		} else {
			if port.EndPort != nil {
				errs = append(errs, field.Invalid(pp.Child("endPort"), *port.EndPort, "may not be specified when `port` is non-numeric"))
			}
			for _, msg := range utilvalidation.IsValidPortName(port.Port.StrVal) {
				errs = append(errs, field.Invalid(pp.Child("port"), port.Port.StrVal, msg))
			}
		}
	}
	return errs
}

func (v *validator) npPeer(peer *networkingv1.NetworkPolicyPeer, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	n := 0
	if peer.PodSelector != nil {
		n++
		errs = append(errs, v.selector(peer.PodSelector, p, "podSelector")...)
	}
	if peer.NamespaceSelector != nil {
		n++
		errs = append(errs, v.selector(peer.NamespaceSelector, p, "namespaceSelector")...)
	}
	if peer.IPBlock != nil {
		n++
		if peer.PodSelector != nil || peer.NamespaceSelector != nil {
			errs = append(errs, field.Forbidden(p, "may not specify more than 1 peer type when ipBlock is specified"))
		}
		errs = append(errs, validateIPBlock(peer.IPBlock, p.Child("ipBlock"))...)
	}
	if n == 0 {
		errs = append(errs, field.Required(p, "must specify a peer"))
	}
	return errs
}

func validateIPBlock(b *networkingv1.IPBlock, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if b.CIDR == "" {
		return append(errs, field.Required(p.Child("cidr"), ""))
	}
	cidr, err := ParseCIDR(b.CIDR)
	if err != nil {
		return append(errs, field.Invalid(p.Child("cidr"), b.CIDR, err.Error()))
	}
	for i, e := range b.Except {
		ep := p.Child("except").Index(i)
		ex, err := ParseCIDR(e)
		if err != nil {
			errs = append(errs, field.Invalid(ep, e, err.Error()))
			continue
		}
		if !strictSubset(ex, cidr) {
			errs = append(errs, field.Invalid(ep, e, fmt.Sprintf("must be a strict subset of `cidr` %s", b.CIDR)))
		}
	}
	return errs
}

func strictSubset(inner, outer netip.Prefix) bool {
	return inner.Addr().Is4() == outer.Addr().Is4() && inner.Bits() > outer.Bits() && outer.Contains(inner.Addr())
}

// validateNP is what the compiler checks of a NetworkPolicy: what decoding
// found (Invalid) first, then the API server's validation.
func (v *validator) validateNP(np *NetworkPolicy) field.ErrorList {
	return withDecodeErrors(np.Invalid(), v.networkPolicy(np))
}
