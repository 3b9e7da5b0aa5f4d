package nft

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// PodLink says that the node routes a local pod's address through an
// interface: new connections that arrive on that interface must come from
// one of the addresses routed through it (podLinkRules). Unlike everything else in a Ruleset it is a fact of the node's network
// namespace, not of the cluster: the Syncer asks a LinkResolver for the
// links on each sync, and Build (moat nft) leaves them empty.
type PodLink struct {
	// Index is the interface index in the node's network namespace.
	Index int
	Addr  netip.Addr
	// Unknown: the node routes Addr to a pod interface of its own (a
	// veth with a host route), but no pod the agent knows holds Addr: a
	// pod created since the agent last heard of the node's pods. Only
	// resolved on a node without pod CIDRs (NetlinkLinks), where nothing
	// else would stop it: the interface is checked (podifs) and accepts
	// no source (no podsrc element), and Addr is an unknown address in
	// the pod network (a /32 or /128 of podnet4/6, not in pods4/6), so
	// that new connections from and to it fail closed until the agent
	// learns the pod.
	Unknown bool
}

func (l PodLink) compare(o PodLink) int {
	if l.Index != o.Index {
		return l.Index - o.Index
	}
	if c := l.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	switch {
	case l.Unknown == o.Unknown:
		return 0
	case o.Unknown:
		return -1
	}
	return 1
}

// LinkQuery is what a LinkResolver is asked about one node.
type LinkQuery struct {
	// Addrs are the addresses of the pod-network pods on the node,
	// sorted, each once.
	Addrs []netip.Addr
	// PodCIDRs are the node's pod CIDRs (Node spec.podCIDRs).
	PodCIDRs []netip.Prefix
	// NodeAddrs are the node's own addresses (Node status.addresses).
	NodeAddrs []netip.Addr
}

// LinkResolver finds the interfaces through which a node routes its
// pods' addresses.
type LinkResolver interface {
	// ResolveLinks returns the links of the addresses it could resolve;
	// an address it could not is left out (see NetlinkLinks). An error
	// means it could resolve nothing.
	ResolveLinks(ctx context.Context, q LinkQuery) ([]PodLink, error)
}

// NetlinkLinks resolves pod links with the kernel's own route lookup, as
// `ip route get ADDR fibmatch` does.
//
// It keeps only a route it is sure leads to pods and to nothing else,
// because every new connection arriving on the interface it names is then
// checked: an uplink taken for a pod's interface would drop all traffic
// from outside the node. A pod's address counts when the route the node
// uses for it is a unicast route without a gateway, through an interface
// other than loopback that holds none of the node's own addresses, and is
// either a host route (/32, /128: routed CNIs, one veth per pod) or inside
// the node's pod CIDRs (a bridge CNI's subnet route). Any other address
// (no route yet, a pod whose host route is not installed and that the
// default route or the node's own subnet would carry, an overlay CNI
// routing pods through a gateway) is left out, and its interface is then
// checked only if another pod's address makes it a pod interface: the
// check fails open for interfaces it cannot identify.
//
// On a node without pod CIDRs (q.PodCIDRs empty), where no pod network
// range tells a pod the agent has not learnt yet from any other address,
// it also lists the kernel's host routes (main table; unicast, no
// gateway, /32 or /128) through veth interfaces other than the excluded
// ones, and returns those to an address no known pod holds as Unknown
// links: routed CNIs (a veth and a host route per pod: Calico, kindnet's
// ptp, the AWS VPC CNI) install them before the pod's containers start,
// so such a pod fails closed instead of meeting no chain. Host routes
// through anything but a veth (a VPN's tunnel, a WireGuard peer, a
// dummy) are left alone: they lead to no pod.
type NetlinkLinks struct {
	// Handle selects the network namespace; nil uses the namespace of
	// the calling thread.
	Handle *netlink.Handle
}

// ResolveLinks implements LinkResolver: one route lookup per node
// address and one per pod address.
func (r NetlinkLinks) ResolveLinks(ctx context.Context, q LinkQuery) ([]PodLink, error) {
	h := r.Handle
	if h == nil {
		var err error
		if h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
		defer h.Close()
	}
	// The interfaces holding the node's addresses: each address's local
	// route names it. Loopback is always interface 1 (LOOPBACK_IFINDEX).
	excluded := map[int]bool{1: true}
	for _, a := range q.NodeAddrs {
		routes, err := h.RouteGetWithOptions(a.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
		if err == nil && len(routes) > 0 && routes[0].Type == unix.RTN_LOCAL {
			excluded[routes[0].LinkIndex] = true
		}
	}
	var out []PodLink
	for _, a := range q.Addrs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		routes, err := h.RouteGetWithOptions(a.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
		if unroutable(err) || (err == nil && len(routes) == 0) {
			continue // not resolved
		}
		if err != nil {
			return nil, fmt.Errorf("route to %s: %w", a, err)
		}
		if idx, ok := podRoute(routes[0], a, q.PodCIDRs); ok && !excluded[idx] {
			out = append(out, PodLink{Index: idx, Addr: a})
		}
	}
	if len(q.PodCIDRs) == 0 {
		unknown, err := unknownPodRoutes(h, q, excluded)
		if err != nil {
			return nil, err
		}
		out = append(out, unknown...)
	}
	return out, nil
}

// RouteWatcher is a LinkResolver that can say when the node's host routes
// change: a routed CNI adds a pod's host route before its containers
// start, so resolving then fails the new pod closed (Unknown links) long
// before its address reaches the agent through the API server.
type RouteWatcher interface {
	// WatchRoutes subscribes, before it returns, to the routes of the
	// namespace it resolves in, and then calls changed from another
	// goroutine after each host route (/32, /128) of the main table is
	// added or deleted, until ctx ends or the subscription fails (then
	// failed is called with why, once).
	WatchRoutes(ctx context.Context, changed func(), failed func(error)) error
}

// WatchRoutes implements RouteWatcher for the calling thread's network
// namespace; with a Handle (another namespace) it cannot, and says so.
func (r NetlinkLinks) WatchRoutes(ctx context.Context, changed func(), failed func(error)) error {
	if r.Handle != nil {
		return errors.New("watching routes is only supported in the calling thread's network namespace")
	}
	ch := make(chan netlink.RouteUpdate, 256)
	done := make(chan struct{})
	errc := make(chan error, 1)
	err := netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{ErrorCallback: func(err error) {
		select {
		case errc <- err:
		default:
		}
	}})
	if err != nil {
		return fmt.Errorf("subscribe to route changes: %w", err)
	}
	go func() {
		defer func() {
			close(done) // closes the socket; the reader then closes ch
			for range ch {
			}
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-ch:
				if !ok {
					err := errors.New("subscription ended")
					select {
					case err = <-errc:
					default:
					}
					failed(fmt.Errorf("route changes: %w", err))
					return
				}
				if u.Table != unix.RT_TABLE_MAIN || u.Dst == nil {
					continue
				}
				if p, ok := prefixOf(u.Dst); ok && p.IsSingleIP() {
					changed()
				}
			}
		}
	}()
	return nil
}

// unknownPodRoutes lists the host routes through veths (not excluded) to
// addresses that are neither a pod address of q nor an address of the
// node (its Node's, or any its interfaces hold): the Unknown links of
// NetlinkLinks. One dump of the main routing table, one of the
// addresses, and one link lookup per interface such a route names.
func unknownPodRoutes(h *netlink.Handle, q LinkQuery, excluded map[int]bool) ([]PodLink, error) {
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	// The node's own addresses on any interface: an IPv6 address added
	// as a /128 (a CNI's gateway on a pod's veth) comes with a host route
	// in the main table, and is no pod.
	local, err := interfaceAddrs(h)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	veth := map[int]bool{}
	var out []PodLink
	for _, rt := range routes {
		if rt.Dst == nil || rt.LinkIndex <= 0 || excluded[rt.LinkIndex] {
			continue
		}
		dst, ok := prefixOf(rt.Dst)
		if !ok || !dst.IsSingleIP() {
			continue
		}
		a := dst.Addr()
		if _, own := local[a]; !a.IsGlobalUnicast() || own || slices.Contains(q.NodeAddrs, a) {
			continue
		}
		if _, known := slices.BinarySearchFunc(q.Addrs, a, netip.Addr.Compare); known {
			continue
		}
		if idx, ok := podRoute(rt, a, nil); !ok || idx != rt.LinkIndex {
			continue
		}
		isVeth, seen := veth[rt.LinkIndex]
		if !seen {
			l, err := h.LinkByIndex(rt.LinkIndex)
			isVeth = err == nil && l.Type() == "veth"
			veth[rt.LinkIndex] = isVeth
		}
		if isVeth {
			out = append(out, PodLink{Index: rt.LinkIndex, Addr: a, Unknown: true})
		}
	}
	return out, nil
}

// unroutable reports whether a route lookup failed because the node has
// no route for the address (unreachable, prohibit, blackhole), not
// because netlink failed.
func unroutable(err error) bool {
	return errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EINVAL)
}

// podRoute reports whether rt, the route the node uses for pod address
// a, leads to pods only (see NetlinkLinks), and through which interface.
func podRoute(rt netlink.Route, a netip.Addr, podCIDRs []netip.Prefix) (int, bool) {
	if rt.Type != unix.RTN_UNICAST || rt.Gw != nil || rt.Via != nil || len(rt.MultiPath) > 0 || rt.LinkIndex <= 0 || rt.Dst == nil {
		return 0, false
	}
	dst, ok := prefixOf(rt.Dst)
	if !ok {
		return 0, false
	}
	if dst.IsSingleIP() && dst.Addr() == a {
		return rt.LinkIndex, true
	}
	for _, c := range podCIDRs {
		if c.Bits() <= dst.Bits() && c.Contains(dst.Addr()) {
			return rt.LinkIndex, true
		}
	}
	return 0, false
}

// prefixOf is a route's destination as a prefix.
func prefixOf(dst *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(dst.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := dst.Mask.Size()
	if bits == 0 {
		return netip.Prefix{}, false
	}
	if a.Is4In6() {
		a = a.Unmap()
		if bits == 128 {
			ones -= 96
		}
	}
	p, err := a.Prefix(ones)
	return p, err == nil
}

// linkQuery reads what a LinkResolver needs from prog for node, and the
// key that says whether the answer may have changed: besides the query,
// which pod holds each address (another pod given the address of one
// deleted since the last sync has a veth of its own; the same pod
// re-created with its address, a StatefulSet's with a fixed one, waits
// for linkRefresh).
func linkQuery(prog *policy.Program, node string) (LinkQuery, linkKey) {
	q := LinkQuery{PodCIDRs: prog.PodCIDRs(node)}
	for _, a := range prog.NodeAddrs(node) {
		q.NodeAddrs = append(q.NodeAddrs, a.Unmap())
	}
	var owners []podAddr
	for i := range prog.Pods {
		p := &prog.Pods[i]
		if p.NodeName != node || p.HostNetwork {
			continue
		}
		for _, a := range p.IPs {
			if a = a.Unmap(); a.IsValid() {
				q.Addrs = append(q.Addrs, a)
				owners = append(owners, podAddr{pod: p.Key(), addr: a})
			}
		}
	}
	slices.SortFunc(q.Addrs, netip.Addr.Compare)
	q.Addrs = slices.Compact(q.Addrs)
	return q, linkKey{owners: owners, cidrs: q.PodCIDRs, nodeAddrs: q.NodeAddrs}
}

// linkKey is what a node's pod links depend on (linkQuery).
type linkKey struct {
	owners    []podAddr
	cidrs     []netip.Prefix
	nodeAddrs []netip.Addr
}

type podAddr struct {
	pod  string
	addr netip.Addr
}

func (k linkKey) equal(o linkKey) bool {
	return slices.Equal(k.owners, o.owners) && slices.Equal(k.cidrs, o.cidrs) && slices.Equal(k.nodeAddrs, o.nodeAddrs)
}

// normaliseLinks sorts links and drops duplicates and invalid ones, so
// that equal sets of links compare equal.
func normaliseLinks(links []PodLink) []PodLink {
	out := make([]PodLink, 0, len(links))
	for _, l := range links {
		if l.Index > 0 && l.Addr.IsValid() {
			out = append(out, PodLink{Index: l.Index, Addr: l.Addr.Unmap(), Unknown: l.Unknown})
		}
	}
	slices.SortFunc(out, PodLink.compare)
	return slices.Compact(out)
}

// linkIndexes are the distinct interfaces of sorted links.
func linkIndexes(links []PodLink) []int {
	var out []int
	for _, l := range links {
		if n := len(out); n == 0 || out[n-1] != l.Index {
			out = append(out, l.Index)
		}
	}
	return out
}

// forgedOn reports whether the forward and input hooks drop a packet
// from src arriving on interface iif as forged (podLinkRules): iif is a
// pod interface and src no address routed through it, or src is a pod
// address whose link is resolved and iif is another interface.
func (rs *Ruleset) forgedOn(iif int, src netip.Addr) bool {
	if iif == 0 {
		return false
	}
	// Only a known pod's link accepts its source (podsrc).
	if _, found := slices.BinarySearchFunc(rs.links, PodLink{Index: iif, Addr: src}, PodLink.compare); found {
		return false
	}
	if _, podIf := slices.BinarySearchFunc(rs.links, iif, func(l PodLink, i int) int { return l.Index - i }); podIf {
		return true
	}
	// A known pod's address arriving on another interface (podaddrs),
	// found without building linkAddrs' sorted copy: Allows runs per
	// conntrack entry when a sync cuts.
	return slices.ContainsFunc(rs.links, func(l PodLink) bool { return !l.Unknown && l.Addr == src })
}

// knownLinks are the links of known pods' addresses: the elements of
// podsrc4/6.
func knownLinks(links []PodLink) []PodLink {
	out := make([]PodLink, 0, len(links))
	for _, l := range links {
		if !l.Unknown {
			out = append(out, l)
		}
	}
	return out
}

// unknownAddr reports whether a is the address of an Unknown link: a pod
// the node routes but the agent does not know yet.
func (rs *Ruleset) unknownAddr(a netip.Addr) bool {
	for _, l := range rs.links {
		if l.Unknown && l.Addr == a {
			return true
		}
	}
	return false
}

// podNetElements are the elements of podnet4/6: the node's pod CIDRs and
// the address of each Unknown link as a host prefix (none inside a pod
// CIDR: links kept from an earlier resolution may be, and the interval
// set would refuse the overlap).
func (rs *Ruleset) podNetElements() []netip.Prefix {
	out := slices.Clone(rs.podNets)
	for _, l := range rs.links {
		if !l.Unknown {
			continue
		}
		inside := false
		for _, p := range rs.podNets {
			inside = inside || p.Contains(l.Addr)
		}
		if p := netip.PrefixFrom(l.Addr, l.Addr.BitLen()); !inside && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// withLinks is rs with other links: the same sets, chains and maps
// (shared, never changed once built), so a sync where only the node's
// routes changed patches only the link sets.
func (rs *Ruleset) withLinks(links []PodLink) *Ruleset {
	c := *rs
	c.links = links
	return &c
}

func podIfElement(i int) *knftables.Element {
	return &knftables.Element{Set: "podifs", Key: []string{strconv.Itoa(i)}}
}

func podSrcElement(l PodLink) *knftables.Element {
	return &knftables.Element{Set: "podsrc" + family(l.Addr), Key: []string{strconv.Itoa(l.Index), l.Addr.String()}}
}

// linkAddrs are the distinct addresses of known pods' links, sorted:
// those whose link is resolved, which may arrive on that link only (set
// podaddrs4/6; podLinkRules).
func linkAddrs(links []PodLink) []netip.Addr {
	out := make([]netip.Addr, 0, len(links))
	for _, l := range links {
		if !l.Unknown {
			out = append(out, l.Addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func podAddrElement(a netip.Addr) *knftables.Element {
	return &knftables.Element{Set: "podaddrs" + family(a), Key: []string{a.String()}}
}
