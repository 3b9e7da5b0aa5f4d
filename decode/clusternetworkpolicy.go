package decode

import (
	"github.com/moat-net/moat/api/v1alpha2"
)

// ClusterNetworkPolicy schemas, by their location in the CRD's OpenAPI
// schema (for its required fields, see required.go).
var (
	cnpRootSchema     = schema{fields: []string{"metadata", "spec"}}
	cnpSpecSchema     = schema{fields: []string{"tier", "priority", "subject", "ingress", "egress"}}
	cnpSubjectSchema  = schema{fields: []string{"namespaces", "pods"}}
	namespacedPod     = schema{fields: []string{"namespaceSelector", "podSelector"}}
	cnpIngressSchema  = schema{fields: []string{"name", "action", "from", "protocols"}}
	cnpEgressSchema   = schema{fields: []string{"name", "action", "to", "protocols"}}
	cnpInPeerSchema   = schema{fields: []string{"namespaces", "pods", "nodes", "networks"}}
	cnpOutPeerSchema  = schema{fields: []string{"namespaces", "pods", "nodes", "networks", "domainNames"}}
	cnpProtocolSchema = schema{fields: []string{"tcp", "udp", "sctp", "destinationNamedPort"}}
	cnpProtoPort      = schema{fields: []string{"destinationPort"}}
	cnpPortSchema     = schema{fields: []string{"number", "range"}}
	cnpRangeSchema    = schema{fields: []string{"start", "end"}}
	cnpStatusSchema   = schema{fields: []string{"conditions"}}
)

func (d *dec) cnpSpec(s *v1alpha2.ClusterNetworkPolicySpec) error {
	m := d.mark()
	read, err := d.object(requiredSchema(&cnpSpecSchema, "spec"), func(i int) error {
		switch i {
		case 0:
			var t string
			err := d.str(&t)
			s.Tier = v1alpha2.Tier(t)
			return err
		case 1:
			return d.int32(&s.Priority)
		case 2:
			return d.cnpSubject(&s.Subject)
		case 3:
			return rules(d, &s.Ingress, func(r *v1alpha2.ClusterNetworkPolicyIngressRule) error {
				_, err := d.object(requiredSchema(&cnpIngressSchema, "spec.ingress[]"), func(i int) error {
					switch i {
					case 0:
						return d.str(&r.Name)
					case 1:
						return d.action(&r.Action)
					case 2:
						return list(d, &r.From, func(p *v1alpha2.ClusterNetworkPolicyIngressPeer) error {
							_, err := d.object(&cnpInPeerSchema, func(i int) error {
								const at = "spec.ingress[].from[]"
								switch i {
								case 0:
									return d.selectorPtr(&p.Namespaces, at+".namespaces")
								case 1:
									return d.namespacedPod(&p.Pods, at+".pods")
								case 2:
									return d.selectorPtr(&p.Nodes, at+".nodes")
								}
								return d.cidrs(&p.Networks)
							})
							return err
						})
					}
					return d.protocols(&r.Protocols, "spec.ingress[].protocols[]")
				})
				return err
			})
		}
		return rules(d, &s.Egress, func(r *v1alpha2.ClusterNetworkPolicyEgressRule) error {
			_, err := d.object(requiredSchema(&cnpEgressSchema, "spec.egress[]"), func(i int) error {
				switch i {
				case 0:
					return d.str(&r.Name)
				case 1:
					return d.action(&r.Action)
				case 2:
					return list(d, &r.To, func(p *v1alpha2.ClusterNetworkPolicyEgressPeer) error {
						_, err := d.object(&cnpOutPeerSchema, func(i int) error {
							const at = "spec.egress[].to[]"
							switch i {
							case 0:
								return d.selectorPtr(&p.Namespaces, at+".namespaces")
							case 1:
								return d.namespacedPod(&p.Pods, at+".pods")
							case 2:
								return d.selectorPtr(&p.Nodes, at+".nodes")
							case 3:
								return d.cidrs(&p.Networks)
							}
							return list(d, &p.DomainNames, func(n *v1alpha2.DomainName) error {
								var v string
								err := d.str(&v)
								*n = v1alpha2.DomainName(v)
								return err
							})
						})
						return err
					})
				}
				return d.protocols(&r.Protocols, "spec.egress[].protocols[]")
			})
			return err
		})
	})
	if err != nil {
		return err
	}
	if ps := d.since(m); !read && len(ps) > 0 {
		// The spec is not an object.
		d.invalid = append(d.invalid, ps[0].fieldError("the whole policy is enforced fail-closed"))
		d.brokenCNPSpec(s, d.pathString())
		d.problems = d.problems[:m]
	}
	d.report(m)
	return nil
}

// brokenCNPSpec replaces a spec that cannot be read: its tier, subject and
// rules are unknown, so every pod is a subject and one rule per direction
// denies everything (an Accept could not be honoured anyway).
func (d *dec) brokenCNPSpec(s *v1alpha2.ClusterNetworkPolicySpec, path string) {
	*s = v1alpha2.ClusterNetworkPolicySpec{
		Ingress: make([]v1alpha2.ClusterNetworkPolicyIngressRule, 1),
		Egress:  make([]v1alpha2.ClusterNetworkPolicyEgressRule, 1),
	}
	d.invalid = append(d.invalid, unreadable(path+".subject"), unreadable(path+".ingress[0]"), unreadable(path+".egress[0]"))
}

func (d *dec) action(dst *v1alpha2.ClusterNetworkPolicyRuleAction) error {
	var v string
	err := d.str(&v)
	*dst = v1alpha2.ClusterNetworkPolicyRuleAction(v)
	return err
}

func (d *dec) cnpSubject(s *v1alpha2.ClusterNetworkPolicySubject) error {
	_, err := d.object(&cnpSubjectSchema, func(i int) error {
		if i == 0 {
			return d.selectorPtr(&s.Namespaces, "spec.subject.namespaces")
		}
		return d.namespacedPod(&s.Pods, "spec.subject.pods")
	})
	return err
}

func (d *dec) namespacedPod(dst **v1alpha2.NamespacedPod, at string) error {
	k, err := d.src.peek()
	if err != nil || k == kNull {
		if err == nil {
			*dst, err = nil, d.src.skip()
		}
		return err
	}
	p := &v1alpha2.NamespacedPod{}
	*dst = p
	_, err = d.object(requiredSchema(&namespacedPod, at), func(i int) error {
		if i == 0 {
			return d.selector(&p.NamespaceSelector, at+".namespaceSelector")
		}
		return d.selector(&p.PodSelector, at+".podSelector")
	})
	return err
}

func (d *dec) cidrs(dst *[]v1alpha2.CIDR) error {
	return list(d, dst, func(c *v1alpha2.CIDR) error {
		var v string
		err := d.str(&v)
		*c = v1alpha2.CIDR(v)
		return err
	})
}

func (d *dec) protocols(dst *[]v1alpha2.ClusterNetworkPolicyProtocol, at string) error {
	return list(d, dst, func(p *v1alpha2.ClusterNetworkPolicyProtocol) error {
		_, err := d.object(&cnpProtocolSchema, func(i int) error {
			switch i {
			case 0:
				return d.protoPort(func(port *v1alpha2.Port) { p.TCP = &v1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: port} }, at+".tcp")
			case 1:
				return d.protoPort(func(port *v1alpha2.Port) { p.UDP = &v1alpha2.ClusterNetworkPolicyProtocolUDP{DestinationPort: port} }, at+".udp")
			case 2:
				return d.protoPort(func(port *v1alpha2.Port) { p.SCTP = &v1alpha2.ClusterNetworkPolicyProtocolSCTP{DestinationPort: port} }, at+".sctp")
			}
			return d.str(&p.DestinationNamedPort)
		})
		return err
	})
}

// protoPort reads {destinationPort: {number | range}} of one protocol;
// set receives the port (nil when absent) once the object is read.
func (d *dec) protoPort(set func(*v1alpha2.Port), at string) error {
	var port *v1alpha2.Port
	read, err := d.object(&cnpProtoPort, func(int) error {
		k, err := d.src.peek()
		if err != nil || k == kNull {
			if err == nil {
				port, err = nil, d.src.skip()
			}
			return err
		}
		port = &v1alpha2.Port{}
		_, err = d.object(&cnpPortSchema, func(i int) error {
			if i == 0 {
				return d.int32(&port.Number)
			}
			k, err := d.src.peek()
			if err != nil || k == kNull {
				if err == nil {
					port.Range, err = nil, d.src.skip()
				}
				return err
			}
			r := &v1alpha2.PortRange{}
			port.Range = r
			_, err = d.object(requiredSchema(&cnpRangeSchema, at+".destinationPort.range"), func(i int) error {
				if i == 0 {
					return d.int32(&r.Start)
				}
				return d.int32(&r.End)
			})
			return err
		})
		return err
	})
	if read {
		set(port)
	}
	return err
}

// cnpStatus reads the conditions (the agent compares them with the one it
// writes). Status is not policy: problems in it are ignored.
func (d *dec) cnpStatus(s *v1alpha2.ClusterNetworkPolicyStatus) error {
	m, inv := d.mark(), len(d.invalid)
	strict := d.strict
	d.strict = false
	_, err := d.object(&cnpStatusSchema, func(int) error { return d.conditions(&s.Conditions) })
	d.strict = strict
	if len(d.problems) > m {
		*s = v1alpha2.ClusterNetworkPolicyStatus{}
	}
	d.problems, d.invalid = d.problems[:m], d.invalid[:inv]
	return err
}
