package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/internal/netns"
)

// namespaces holds open handles to a lab's namespaces.
type namespaces struct {
	handles map[string]*netns.NS
}

// Get returns a namespace of the lab.
func (n *namespaces) Get(name string) (*netns.NS, error) {
	h, ok := n.handles[name]
	if !ok {
		return nil, fmt.Errorf("lab has no network namespace %s", name)
	}
	return h, nil
}

// Close releases the handles (the namespaces stay while named).
func (n *namespaces) Close() {
	for name, h := range n.handles {
		h.Close()
		delete(n.handles, name)
	}
}

// Open opens the namespaces of a built lab.
func (t *topology) Open() (*namespaces, error) {
	ns := &namespaces{handles: map[string]*netns.NS{}}
	for _, name := range t.Namespaces() {
		h, err := netns.Open(name)
		if err != nil {
			ns.Close()
			return nil, err
		}
		ns.handles[name] = h
	}
	return ns, nil
}

// Build creates the lab's namespaces, links, addresses and routes. On
// error everything it made is removed again.
func (t *topology) Build() (_ *namespaces, err error) {
	ns := &namespaces{handles: map[string]*netns.NS{}}
	var created []string
	defer func() {
		if err != nil {
			ns.Close()
			// Only what this call created: a name clash must not
			// remove another lab's namespace.
			for _, name := range created {
				if derr := netns.Delete(name); derr != nil {
					err = errors.Join(err, derr)
				}
			}
		}
	}()
	for _, name := range t.Namespaces() {
		h, err := netns.Create(name)
		if err != nil {
			return nil, err
		}
		created = append(created, name)
		ns.handles[name] = h
		// Addresses are added with NODAD; links created later in this
		// namespace inherit "default".
		for _, kv := range [][2]string{
			{"net.ipv6.conf.all.accept_dad", "0"},
			{"net.ipv6.conf.default.accept_dad", "0"},
		} {
			if err := h.Sysctl(kv[0], kv[1]); err != nil {
				return nil, err
			}
		}
		nl, err := h.Netlink()
		if err != nil {
			return nil, err
		}
		lo, err := nl.LinkByName("lo")
		if err == nil {
			err = nl.LinkSetUp(lo)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: loopback up: %w", name, err)
		}
	}
	for _, n := range t.Nodes {
		h := ns.handles[n.NS]
		if err := h.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
			return nil, err
		}
		if err := h.Sysctl("net.ipv6.conf.all.forwarding", "1"); err != nil {
			return nil, err
		}
	}
	if err := t.buildUnderlay(ns); err != nil {
		return nil, err
	}
	for _, p := range t.Pods {
		if err := t.buildPod(ns, p); err != nil {
			return nil, fmt.Errorf("pod %s: %w", p.Key, err)
		}
	}
	return ns, nil
}

// Teardown deletes every namespace of the lab; links and routes go with
// them. Missing namespaces are not an error.
func (t *topology) Teardown() error {
	var errs []error
	for _, name := range t.Namespaces() {
		if err := netns.Delete(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// handleIn is the netlink handle of a namespace of the lab (closed with
// the namespace).
func handleIn(ns *namespaces, name string) (*netlink.Handle, error) {
	h, err := ns.Get(name)
	if err != nil {
		return nil, err
	}
	return h.Netlink()
}

func hostPrefix(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}

func addAddr(nl *netlink.Handle, link netlink.Link, a netip.Addr, scope int) error {
	addr := &netlink.Addr{IPNet: hostPrefix(a), Flags: unix.IFA_F_NODAD, Scope: scope}
	if a.Is6() && a.IsLinkLocalUnicast() {
		addr.IPNet.Mask = net.CIDRMask(64, 128)
	}
	if err := nl.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("add address %s to %s: %w", a, link.Attrs().Name, err)
	}
	return nil
}

// route adds dst (a host route) through link, via gw when valid (onlink,
// so the next hop needs no covering prefix), with a preferred source when
// src is valid.
func route(nl *netlink.Handle, link netlink.Link, dst, gw, src netip.Addr) error {
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: hostPrefix(dst)}
	if gw.IsValid() {
		r.Gw = gw.AsSlice()
		if gw.Is4() == dst.Is4() {
			r.Flags = int(netlink.FLAG_ONLINK)
		}
	} else {
		r.Scope = netlink.SCOPE_LINK
	}
	if src.IsValid() && src.Is4() == dst.Is4() {
		r.Src = src.AsSlice()
	}
	if err := nl.RouteAdd(r); err != nil {
		return fmt.Errorf("route %s via %s dev %s: %w", dst, gw, link.Attrs().Name, err)
	}
	return nil
}

func linkUp(nl *netlink.Handle, name string) (netlink.Link, error) {
	l, err := nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find link %s: %w", name, err)
	}
	if err := nl.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return l, nil
}

// buildUnderlay makes the bridge that joins nodes and the outside, and
// routes between them.
func (t *topology) buildUnderlay(ns *namespaces) error {
	ul, err := handleIn(ns, t.Underlay)
	if err != nil {
		return err
	}
	off := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}, MulticastSnooping: &off}
	if err := ul.LinkAdd(br); err != nil {
		return fmt.Errorf("underlay bridge: %w", err)
	}
	brl, err := linkUp(ul, "br0")
	if err != nil {
		return err
	}
	attach := func(port, peerNS string) error {
		h, err := ns.Get(peerNS)
		if err != nil {
			return err
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port}, PeerName: "ul0", PeerNamespace: netlink.NsFd(int(h.Handle()))}
		if err := ul.LinkAdd(veth); err != nil {
			return fmt.Errorf("underlay link for %s: %w", peerNS, err)
		}
		l, err := ul.LinkByName(port)
		if err != nil {
			return fmt.Errorf("find %s: %w", port, err)
		}
		if err := ul.LinkSetMaster(l, brl); err != nil {
			return fmt.Errorf("attach %s to the bridge: %w", port, err)
		}
		return ul.LinkSetUp(l)
	}
	for i, n := range t.Nodes {
		if err := attach(fmt.Sprintf("n%d", i), n.NS); err != nil {
			return err
		}
	}
	if err := attach("out", t.Outside.NS); err != nil {
		return err
	}

	// Each node: its addresses on ul0; routes to the other nodes, their
	// pods and the outside.
	for i, n := range t.Nodes {
		if err := t.nodeUnderlay(ns, i, n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return t.outsideUnderlay(ns)
}

func (t *topology) nodeUnderlay(ns *namespaces, i int, n *nodeNS) error {
	nl, err := handleIn(ns, n.NS)
	if err != nil {
		return err
	}
	l, err := linkUp(nl, "ul0")
	if err != nil {
		return err
	}
	for _, a := range n.Addrs {
		if err := addAddr(nl, l, a, int(netlink.SCOPE_UNIVERSE)); err != nil {
			return err
		}
	}
	if err := addAddr(nl, l, n.LinkLocal, int(netlink.SCOPE_LINK)); err != nil {
		return err
	}
	for j, o := range t.Nodes {
		if j == i {
			continue
		}
		for _, a := range o.Addrs {
			if err := route(nl, l, a, netip.Addr{}, n.src(a)); err != nil {
				return err
			}
		}
	}
	for _, p := range t.Pods {
		if p.Node == i {
			continue
		}
		o := t.Nodes[p.Node]
		for _, a := range p.IPs {
			gw := o.Src4
			if a.Is6() {
				gw = o.LinkLocal
			}
			if err := route(nl, l, a, gw, n.src(a)); err != nil {
				return err
			}
		}
	}
	for _, a := range t.Outside.Addrs {
		if err := route(nl, l, a, netip.Addr{}, n.src(a)); err != nil {
			return err
		}
	}
	return nil
}

// src is the node's preferred source towards a of the same family.
func (n *nodeNS) src(a netip.Addr) netip.Addr {
	if a.Is4() {
		return n.Src4
	}
	return n.Src6
}

func (t *topology) outsideUnderlay(ns *namespaces) error {
	nl, err := handleIn(ns, t.Outside.NS)
	if err != nil {
		return err
	}
	l, err := linkUp(nl, "ul0")
	if err != nil {
		return err
	}
	for _, a := range t.Outside.Addrs {
		if err := addAddr(nl, l, a, int(netlink.SCOPE_UNIVERSE)); err != nil {
			return err
		}
	}
	if err := addAddr(nl, l, t.Outside.LinkLocal, int(netlink.SCOPE_LINK)); err != nil {
		return err
	}
	for _, n := range t.Nodes {
		for _, a := range n.Addrs {
			if err := route(nl, l, a, netip.Addr{}, netip.Addr{}); err != nil {
				return err
			}
		}
	}
	for _, p := range t.Pods {
		o := t.Nodes[p.Node]
		for _, a := range p.IPs {
			gw := o.Src4
			if a.Is6() {
				gw = o.LinkLocal
			}
			if err := route(nl, l, a, gw, netip.Addr{}); err != nil {
				return err
			}
		}
	}
	return nil
}

// buildPod links a pod to its node: eth0 in the pod, p<N> in the node.
func (t *topology) buildPod(ns *namespaces, p *podNS) error {
	n := t.Nodes[p.Node]
	nodeNL, err := handleIn(ns, n.NS)
	if err != nil {
		return err
	}
	podNL, err := handleIn(ns, p.NS)
	if err != nil {
		return err
	}
	podH, _ := ns.Get(p.NS)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.Link}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(podH.Handle()))}
	if err := nodeNL.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", p.Link, err)
	}
	nl, err := linkUp(nodeNL, p.Link)
	if err != nil {
		return err
	}
	if err := addAddr(nodeNL, nl, podGateway4, int(netlink.SCOPE_LINK)); err != nil {
		return err
	}
	if err := addAddr(nodeNL, nl, podGateway6, int(netlink.SCOPE_LINK)); err != nil {
		return err
	}
	for _, a := range p.IPs {
		if err := route(nodeNL, nl, a, netip.Addr{}, n.src(a)); err != nil {
			return err
		}
	}

	eth, err := linkUp(podNL, "eth0")
	if err != nil {
		return err
	}
	has4, has6 := false, false
	for _, a := range p.IPs {
		if err := addAddr(podNL, eth, a, int(netlink.SCOPE_UNIVERSE)); err != nil {
			return err
		}
		has4, has6 = has4 || a.Is4(), has6 || a.Is6()
	}
	if has4 {
		if err := route(podNL, eth, podGateway4, netip.Addr{}, netip.Addr{}); err != nil {
			return err
		}
		def := &netlink.Route{LinkIndex: eth.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: podGateway4.AsSlice()}
		if err := podNL.RouteAdd(def); err != nil {
			return fmt.Errorf("default route: %w", err)
		}
	}
	if has6 {
		def := &netlink.Route{LinkIndex: eth.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Gw: podGateway6.AsSlice()}
		if err := podNL.RouteAdd(def); err != nil {
			return fmt.Errorf("default IPv6 route: %w", err)
		}
	}
	return nil
}
