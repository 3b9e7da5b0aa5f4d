package policy

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// PodFromAPI reduces an API Pod to what policy needs. Every source (files,
// informers) converts through here so they agree. Problems (unparsable IPs,
// bad ports) are returned as diagnostics and the offending value is left
// out; the pod itself is always returned.
func PodFromAPI(o *corev1.Pod) (Pod, []Diagnostic) {
	ns := o.Namespace
	if ns == "" {
		ns = "default"
	}
	object := "Pod " + ns + "/" + o.Name
	var diags []Diagnostic
	bad := func(field, msg string) {
		diags = append(diags, Diagnostic{Severity: SeverityError, Object: object, Field: field, Message: msg})
	}
	p := Pod{Namespace: ns, Name: o.Name, Labels: o.Labels, NodeName: o.Spec.NodeName, HostNetwork: o.Spec.HostNetwork}
	// status.podIPs is authoritative; status.podIP is read only when it
	// is alone (older writers). The API server requires podIP to be
	// podIPs[0]; a file that disagrees is reported, and podIPs is used.
	field := func(i int) string { return fmt.Sprintf("status.podIPs[%d].ip", i) }
	var ips []string
	for _, ip := range o.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	switch {
	case len(ips) == 0 && o.Status.PodIP != "":
		ips = []string{o.Status.PodIP}
		field = func(int) string { return "status.podIP" }
	case len(ips) > 0 && o.Status.PodIP != "" && o.Status.PodIP != ips[0]:
		bad("status.podIP", fmt.Sprintf("%q must equal status.podIPs[0].ip %q: status.podIPs is used", o.Status.PodIP, ips[0]))
	}
	for i, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil {
			bad(field(i), fmt.Sprintf("invalid IP %q: left out", s))
			continue
		}
		if a.Zone() != "" {
			// The API server refuses it; nftables cannot match it.
			bad(field(i), fmt.Sprintf("invalid IP %q: an IPv6 zone is not allowed", s))
			continue
		}
		p.IPs = append(p.IPs, a.Unmap())
	}
	addPorts := func(field string, cs []corev1.Container) {
		for ci, c := range cs {
			prefix := fmt.Sprintf("spec.%s[%d]", field, ci)
			if len(cs) == 1 && field != "containers" {
				prefix = "spec." + field
			}
			for pi, cp := range c.Ports {
				proto := ProtoTCP
				if cp.Protocol != "" {
					var err error
					if proto, err = ParseProtocol(string(cp.Protocol)); err != nil || !proto.HasPorts() {
						bad(fmt.Sprintf("%s.ports[%d].protocol", prefix, pi), fmt.Sprintf("unsupported protocol %q", cp.Protocol))
						continue
					}
				}
				if cp.ContainerPort < 1 || cp.ContainerPort > 65535 {
					bad(fmt.Sprintf("%s.ports[%d].containerPort", prefix, pi), "must be between 1 and 65535")
					continue
				}
				p.Ports = append(p.Ports, ContainerPort{Name: cp.Name, Protocol: proto, Port: uint16(cp.ContainerPort)})
			}
		}
	}
	// Only containers that keep running serve ports: app containers and
	// sidecars (init containers with restartPolicy Always).
	for i, c := range o.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			addPorts(fmt.Sprintf("initContainers[%d]", i), []corev1.Container{c})
		}
	}
	addPorts("containers", o.Spec.Containers)
	return p, diags
}

// NodeFromAPI keeps a node's labels and IP addresses: of any address
// type, since a `nodes` peer selects "the IPs present in
// node.Status.Addresses". A Hostname or DNS address is one when its value
// is an IP literal: kubelet writes Hostname from --hostname-override,
// which some installs set to the node's IP, and before a cloud controller
// initialises the node it may be the only address. Names are skipped.
func NodeFromAPI(o *corev1.Node) (Node, []Diagnostic) {
	n := Node{Name: o.Name, Labels: o.Labels}
	var diags []Diagnostic
	for i, a := range o.Status.Addresses {
		ip, err := netip.ParseAddr(a.Address)
		if a.Type == corev1.NodeHostName || a.Type == corev1.NodeInternalDNS || a.Type == corev1.NodeExternalDNS {
			if err != nil || ip.Zone() != "" || slices.Contains(n.Addrs, ip.Unmap()) {
				continue // a name, or an address listed already
			}
		}
		if err != nil {
			diags = append(diags, Diagnostic{Severity: SeverityError, Object: "Node " + o.Name, Field: fmt.Sprintf("status.addresses[%d].address", i), Message: fmt.Sprintf("invalid IP %q: left out", a.Address)})
			continue
		}
		if ip.Zone() != "" {
			// A kubelet may report one; the API server does not refuse
			// it. Kept, it would reach nftables, which cannot parse it,
			// and stop every node's table from being programmed. A
			// link-local address is no address other nodes' pods reach.
			diags = append(diags, Diagnostic{Severity: SeverityWarning, Object: "Node " + o.Name, Field: fmt.Sprintf("status.addresses[%d].address", i), Message: fmt.Sprintf("%q has an IPv6 zone: skipped, as neither a node-local address nor a nodes peer", a.Address)})
			continue
		}
		if !slices.Contains(n.Addrs, ip.Unmap()) {
			n.Addrs = append(n.Addrs, ip.Unmap())
		}
	}
	cidrs := o.Spec.PodCIDRs
	if len(cidrs) == 0 && o.Spec.PodCIDR != "" {
		cidrs = []string{o.Spec.PodCIDR}
	}
	for i, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			diags = append(diags, Diagnostic{Severity: SeverityWarning, Object: "Node " + o.Name, Field: fmt.Sprintf("spec.podCIDRs[%d]", i), Message: fmt.Sprintf("invalid CIDR %q: not used to recognise forged pod addresses", c)})
			continue
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		n.PodCIDRs = append(n.PodCIDRs, p.Masked())
	}
	return n, diags
}

// NamespaceFromAPI keeps a namespace's name and labels.
func NamespaceFromAPI(o *corev1.Namespace) Namespace {
	return Namespace{Name: o.Name, Labels: o.Labels}
}
