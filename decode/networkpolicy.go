package decode

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Policies are decoded strictly: every field of the type, unknown fields
// and repeated fields recorded with their paths. A wrongly typed or
// repeated value makes the part it belongs to (a rule, the pod selector,
// the policy types, the whole spec) unreadable: that part is replaced by
// its empty value and reported as invalid at its own path, where the
// compiler fails closed on exactly it (docs/semantics.md).

var (
	npSpecSchema    = schema{fields: []string{"podSelector", "ingress", "egress", "policyTypes"}}
	npIngressSchema = schema{fields: []string{"ports", "from"}}
	npEgressSchema  = schema{fields: []string{"ports", "to"}}
	npPortSchema    = schema{fields: []string{"protocol", "port", "endPort"}}
	npPeerSchema    = schema{fields: []string{"podSelector", "namespaceSelector", "ipBlock"}}
	ipBlockSchema   = schema{fields: []string{"cidr", "except"}}
)

// unit decodes one part; problems inside it replace it by zero() and
// become one invalid-field error at the part's path.
func (d *dec) unit(what string, read func() error, zero func()) error {
	m := d.mark()
	if err := read(); err != nil {
		return err
	}
	if ps := d.since(m); len(ps) > 0 {
		zero()
		d.failUnit(d.pathString(), ps, what) // reading left the path as it was
		d.problems = d.problems[:m]
	}
	return nil
}

// rules reads a rule list, each rule a unit. A rule list that is not a
// list becomes one empty rule that fails closed, so that a NetworkPolicy
// still isolates in that direction and the rule's index is reported.
func rules[T any](d *dec, dst *[]T, rule func(*T) error) error {
	k, err := d.src.peek()
	if err != nil {
		return err
	}
	if k != kArray && k != kNull {
		path := d.pathString()
		m := d.mark()
		if err := d.wrong("a list", k); err != nil {
			return err
		}
		*dst = make([]T, 1)
		d.failUnit(path+"[0]", d.since(m), "the rule list")
		d.problems = d.problems[:m]
		return nil
	}
	return list(d, dst, func(r *T) error {
		return d.unit("the rule", func() error { return rule(r) }, func() { *r = *new(T) })
	})
}

// unreadable marks a part that a broken spec leaves unknown.
func unreadable(path string) *field.Error {
	return &field.Error{Type: field.ErrorTypeTypeInvalid, Field: path, BadValue: field.OmitValueType{}, Detail: "the spec could not be read; enforced fail-closed"}
}

func (d *dec) npSpec(s *networkingv1.NetworkPolicySpec) error {
	m := d.mark()
	_, err := d.object(&npSpecSchema, func(i int) error {
		switch i {
		case 0:
			return d.unit("the pod selector", func() error { return d.selector(&s.PodSelector, "") }, func() { s.PodSelector = metav1.LabelSelector{} })
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
		return d.unit("the policy types", func() error {
			return list(d, &s.PolicyTypes, func(t *networkingv1.PolicyType) error {
				var v string
				err := d.str(&v)
				*t = networkingv1.PolicyType(v)
				return err
			})
		}, func() { s.PolicyTypes = nil })
	})
	if err != nil {
		return err
	}
	if ps := d.since(m); len(ps) > 0 {
		path := d.pathString()
		// The spec itself cannot be read: which pods it selects and what
		// its rules allow are unknown. Its namespace is isolated both ways
		// with nothing allowed.
		*s = networkingv1.NetworkPolicySpec{Ingress: make([]networkingv1.NetworkPolicyIngressRule, 1), Egress: make([]networkingv1.NetworkPolicyEgressRule, 1)}
		d.failUnit(path, ps, "the whole policy")
		d.problems = d.problems[:m]
		d.invalid = append(d.invalid, unreadable(path+".podSelector"), unreadable(path+".ingress[0]"), unreadable(path+".egress[0]"))
	}
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
			if err := d.int32(&v); err != nil {
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
