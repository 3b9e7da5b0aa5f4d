package decode

import (
	corev1 "k8s.io/api/core/v1"
)

// Pods, Nodes and Namespaces are read leniently: only the fields policy
// needs are decoded (labels, node, host networking, container ports, pod
// IPs, node addresses), everything else is skipped after a syntax check.
// A wrongly typed value among the fields read makes the object unusable
// (it is dropped with the path of the value).

var (
	podSchema       = schema{fields: []string{"metadata", "spec", "status"}}
	podSpecSchema   = schema{fields: []string{"nodeName", "hostNetwork", "containers", "initContainers"}}
	containerSchema = schema{fields: []string{"name", "ports", "restartPolicy"}}
	portSchema      = schema{fields: []string{"name", "containerPort", "protocol"}}
	podStatusSchema = schema{fields: []string{"phase", "podIP", "podIPs"}}
	podIPSchema     = schema{fields: []string{"ip"}}
)

// podMember reads one top-level member of a Pod into o.
func (d *dec) podMember(o *corev1.Pod, i int) error {
	switch i {
	case 0:
		return d.meta(&o.ObjectMeta, true)
	case 1:
		_, err := d.object(&podSpecSchema, func(i int) error {
			switch i {
			case 0:
				return d.str(&o.Spec.NodeName)
			case 1:
				return d.bool(&o.Spec.HostNetwork)
			case 2:
				return d.containers(&o.Spec.Containers)
			}
			return d.containers(&o.Spec.InitContainers)
		})
		return err
	}
	_, err := d.object(&podStatusSchema, func(i int) error {
		switch i {
		case 0:
			var phase string
			err := d.str(&phase)
			o.Status.Phase = corev1.PodPhase(phase)
			return err
		case 1:
			return d.str(&o.Status.PodIP)
		}
		return list(d, &o.Status.PodIPs, func(ip *corev1.PodIP) error {
			_, err := d.object(&podIPSchema, func(int) error { return d.str(&ip.IP) })
			return err
		})
	})
	return err
}

func (d *dec) containers(dst *[]corev1.Container) error {
	return list(d, dst, func(c *corev1.Container) error {
		_, err := d.object(&containerSchema, func(i int) error {
			switch i {
			case 0:
				return d.str(&c.Name)
			case 1:
				return list(d, &c.Ports, func(p *corev1.ContainerPort) error {
					_, err := d.object(&portSchema, func(i int) error {
						switch i {
						case 0:
							return d.str(&p.Name)
						case 1:
							return d.int32(&p.ContainerPort)
						}
						var proto string
						err := d.str(&proto)
						p.Protocol = corev1.Protocol(proto)
						return err
					})
					return err
				})
			}
			var rp string
			if err := d.str(&rp); err != nil || rp == "" {
				return err
			}
			policy := corev1.ContainerRestartPolicy(rp)
			c.RestartPolicy = &policy
			return nil
		})
		return err
	})
}

var (
	nodeSchema        = schema{fields: []string{"metadata", "status", "spec"}}
	nodeSpecSchema    = schema{fields: []string{"podCIDR", "podCIDRs"}}
	nodeStatusSchema  = schema{fields: []string{"addresses"}}
	nodeAddressSchema = schema{fields: []string{"type", "address"}}
)

func (d *dec) nodeMember(o *corev1.Node, i int) error {
	if i == 0 {
		return d.meta(&o.ObjectMeta, true)
	}
	if i == 2 {
		// The pod CIDRs: the agent drops forged sources in them.
		_, err := d.object(&nodeSpecSchema, func(i int) error {
			if i == 0 {
				return d.str(&o.Spec.PodCIDR)
			}
			return list(d, &o.Spec.PodCIDRs, d.str)
		})
		return err
	}
	_, err := d.object(&nodeStatusSchema, func(int) error {
		return list(d, &o.Status.Addresses, func(a *corev1.NodeAddress) error {
			_, err := d.object(&nodeAddressSchema, func(i int) error {
				if i == 0 {
					var t string
					err := d.str(&t)
					a.Type = corev1.NodeAddressType(t)
					return err
				}
				return d.str(&a.Address)
			})
			return err
		})
	})
	return err
}
