package decode

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Policies are decoded strictly: every field of the type, unknown fields
// and repeated fields recorded with their paths. A wrongly typed or
// repeated value is reported at its own path (what it must be, what it
// is) and left at its empty value; the compiler fails closed on the part
// that path belongs to (a peer, a port, a rule, the pod selector, the
// policy types: docs/semantics.md), exactly as for an unknown field there.
// Only a spec that is not an object replaces the whole spec.

var (
	npSpecSchema    = schema{fields: []string{"podSelector", "ingress", "egress", "policyTypes"}}
	npIngressSchema = schema{fields: []string{"ports", "from"}}
	npEgressSchema  = schema{fields: []string{"ports", "to"}}
	npPortSchema    = schema{fields: []string{"protocol", "port", "endPort"}}
	npPeerSchema    = schema{fields: []string{"podSelector", "namespaceSelector", "ipBlock"}}
	ipBlockSchema   = schema{fields: []string{"cidr", "except"}}
)

// rules reads a rule list. A rule list that is not a list is reported at
// its own path and read as one empty rule, so that a NetworkPolicy still
// isolates in that direction; the compiler lets no rule of a list that
// failed allow anything.
func rules[T any](d *dec, dst *[]T, rule func(*T) error) error {
	k, err := d.src.peek()
	if err != nil {
		return err
	}
	if k != kArray && k != kNull {
		*dst = make([]T, 1)
		return d.wrong("a list", k)
	}
	return list(d, dst, rule)
}

// unreadable marks a part that a broken spec leaves unknown.
func unreadable(path string) *field.Error {
	return &field.Error{Type: field.ErrorTypeTypeInvalid, Field: path, BadValue: field.OmitValueType{}, Detail: "the spec could not be read; enforced fail-closed"}
}

func (d *dec) npSpec(s *networkingv1.NetworkPolicySpec) error {
	m := d.mark()
	read, err := d.object(&npSpecSchema, func(i int) error {
		switch i {
		case 0:
			return d.selector(&s.PodSelector, "")
		case 1:
			return rules(d, &s.Ingress, func(r *networkingv1.NetworkPolicyIngressRule) error {
				_, err := d.object(&npIngressSchema, func(i int) error {
					if i == 0 {
						return d.npPorts(&r.Ports)
					}
					return d.npPeers(&r.From)
				})
				return err
			})
		case 2:
			return rules(d, &s.Egress, func(r *networkingv1.NetworkPolicyEgressRule) error {
				_, err := d.object(&npEgressSchema, func(i int) error {
					if i == 0 {
						return d.npPorts(&r.Ports)
					}
					return d.npPeers(&r.To)
				})
				return err
			})
		}
		return list(d, &s.PolicyTypes, func(t *networkingv1.PolicyType) error {
			var v string
			err := d.str(&v)
			*t = networkingv1.PolicyType(v)
			return err
		})
	})
	if err != nil {
		return err
	}
	if ps := d.since(m); !read && len(ps) > 0 {
		// The spec is not an object: which pods it selects and what its
		// rules allow are unknown. Its namespace is isolated both ways
		// with nothing allowed.
		path := d.pathString()
		*s = networkingv1.NetworkPolicySpec{Ingress: make([]networkingv1.NetworkPolicyIngressRule, 1), Egress: make([]networkingv1.NetworkPolicyEgressRule, 1)}
		d.invalid = append(d.invalid, ps[0].fieldError("the whole policy is enforced fail-closed"), unreadable(path+".podSelector"), unreadable(path+".ingress[0]"), unreadable(path+".egress[0]"))
		d.problems = d.problems[:m]
	}
	d.report(m)
	return nil
}

func (d *dec) npPorts(dst *[]networkingv1.NetworkPolicyPort) error {
	return list(d, dst, func(p *networkingv1.NetworkPolicyPort) error {
		_, err := d.object(&npPortSchema, func(i int) error {
			switch i {
			case 0:
				return d.protocolPtr(&p.Protocol)
			case 1:
				return d.intOrString(&p.Port)
			}
			k, err := d.src.peek()
			if err != nil || k == kNull {
				if err == nil {
					p.EndPort, err = nil, d.src.skip()
				}
				return err
			}
			var v int32
			m := d.mark()
			if err := d.int32(&v); err != nil || d.mark() != m {
				return err
			}
			p.EndPort = &v
			return nil
		})
		return err
	})
}

func (d *dec) protocolPtr(dst **corev1.Protocol) error {
	k, err := d.src.peek()
	if err != nil || k == kNull {
		if err == nil {
			*dst, err = nil, d.src.skip()
		}
		return err
	}
	var v string
	if err := d.str(&v); err != nil {
		return err
	}
	p := corev1.Protocol(v)
	*dst = &p
	return nil
}

// intOrString reads an intstr.IntOrString as its UnmarshalJSON does: a
// string or an int32.
func (d *dec) intOrString(dst **intstr.IntOrString) error {
	k, err := d.src.peek()
	if err != nil {
		return err
	}
	switch k {
	case kNull:
		*dst = nil
		return d.src.skip()
	case kString:
		s, err := d.src.str()
		v := intstr.FromString(s)
		*dst = &v
		return err
	case kNumber:
		var n int32
		m := d.mark()
		if err := d.int32(&n); err != nil || d.mark() != m {
			return err
		}
		v := intstr.FromInt32(n)
		*dst = &v
		return nil
	}
	return d.wrong("an integer or a string", k)
}

func (d *dec) npPeers(dst *[]networkingv1.NetworkPolicyPeer) error {
	return list(d, dst, func(p *networkingv1.NetworkPolicyPeer) error {
		_, err := d.object(&npPeerSchema, func(i int) error {
			switch i {
			case 0:
				return d.selectorPtr(&p.PodSelector, "")
			case 1:
				return d.selectorPtr(&p.NamespaceSelector, "")
			}
			k, err := d.src.peek()
			if err != nil || k == kNull {
				if err == nil {
					p.IPBlock, err = nil, d.src.skip()
				}
				return err
			}
			b := &networkingv1.IPBlock{}
			p.IPBlock = b
			_, err = d.object(&ipBlockSchema, func(i int) error {
				if i == 0 {
					return d.str(&b.CIDR)
				}
				return d.strList(&b.Except)
			})
			return err
		})
		return err
	})
}
