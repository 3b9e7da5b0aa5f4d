package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/moat-net/moat/policy"
)

// Conntrack finds and removes connection-tracking entries. Rules judge
// only the first packet of a connection; an established connection keeps
// flowing until its entry is gone, so a Program that newly denies it must
// also remove the entry.
type Conntrack interface {
	// Delete removes every entry whose first packet deny rejects and
	// returns how many it removed.
	Delete(ctx context.Context, deny func(Packet) bool) (int, error)
	// DeleteAddrs removes every entry that has one of addrs as the
	// source or destination of either direction (the pod's side of a
	// Service's or a masquerade's translation too) and returns how many
	// it removed.
	DeleteAddrs(ctx context.Context, addrs []netip.Addr) (int, error)
}

// noConntrack is the Conntrack of a Syncer on an Interface that programs
// no kernel it knows of (Options.Conntrack): it removes nothing.
type noConntrack struct{}

func (noConntrack) Delete(context.Context, func(Packet) bool) (int, error) { return 0, nil }

func (noConntrack) DeleteAddrs(context.Context, []netip.Addr) (int, error) { return 0, nil }

// NetlinkConntrack is the kernel's conntrack table, reached over netlink.
type NetlinkConntrack struct {
	// Handle selects the network namespace; nil uses the namespace of the
	// calling thread.
	Handle *netlink.Handle
}

// Delete implements Conntrack for both address families. A dump costs a
// walk of the kernel's whole conntrack hash table (shared by all network
// namespaces: ~10 ms at 262,144 buckets, however few entries the
// namespace holds), so one dump of both families comes first, and only a
// family where some flow is denied is dumped again to delete.
//
// Each packet carries Local for a source the namespace holds as its own
// address, read once per call: a connection the node started from an
// address its Node does not list (a gateway on the pod network) is judged
// as the output hook judged it, not as forged; likewise DstLocal for a
// destination, which the input hook judged (not as an unknown pod). When the addresses cannot
// be read nothing is deleted: cutting the node's own connections is worse
// than keeping a denied one until the next try.
func (c NetlinkConntrack) Delete(ctx context.Context, deny func(Packet) bool) (int, error) {
	local, err := interfaceAddrs(c.Handle)
	if err != nil {
		return 0, fmt.Errorf("conntrack: the node's addresses: %w", err)
	}
	judge := deny
	deny = func(p Packet) bool {
		_, p.Local = local[p.Src]
		_, p.DstLocal = local[p.Dst]
		return judge(p)
	}
	families := []netlink.InetFamily{netlink.InetFamily(netlink.FAMILY_V4), netlink.InetFamily(netlink.FAMILY_V6)}
	if flows, err := c.list(0); err == nil {
		families = deniedFamilies(flows, deny)
	}
	return c.deleteMatching(ctx, families, flowFilter{deny: deny})
}

// DeleteAddrs implements Conntrack, dumping only the families of addrs.
// Addresses the namespace holds as its own are left out: their entries
// are the node's connections, which no pod's departure ends. When those
// cannot be read nothing is deleted.
func (c NetlinkConntrack) DeleteAddrs(ctx context.Context, addrs []netip.Addr) (int, error) {
	local, err := interfaceAddrs(c.Handle)
	if err != nil {
		return 0, fmt.Errorf("conntrack: the node's addresses: %w", err)
	}
	f := addrFilter{}
	var families []netlink.InetFamily
	for _, a := range addrs {
		a = a.Unmap()
		if _, own := local[a]; own || !a.IsValid() {
			continue
		}
		f[a] = struct{}{}
		fam := netlink.InetFamily(netlink.FAMILY_V6)
		if a.Is4() {
			fam = netlink.InetFamily(netlink.FAMILY_V4)
		}
		if !slices.Contains(families, fam) {
			families = append(families, fam)
		}
	}
	return c.deleteMatching(ctx, families, f)
}

// deleteMatching deletes the entries of each family that f matches, in
// the namespace of c.Handle (the caller's when nil), and counts them. A
// family that fails does not stop the others; ctx is checked between
// families.
func (c NetlinkConntrack) deleteMatching(ctx context.Context, families []netlink.InetFamily, f netlink.CustomConntrackFilter) (int, error) {
	total := 0
	var errs []error
	for _, fam := range families {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		var n uint
		var err error
		if c.Handle != nil {
			n, err = c.Handle.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f)
		} else {
			n, err = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f)
		}
		total += int(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack family %d: %w", fam, err))
		}
	}
	return total, errors.Join(errs...)
}

// addrFilter matches the entries with one of its addresses on either
// side of either direction.
type addrFilter map[netip.Addr]struct{}

func (f addrFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	for _, ip := range [][]byte{flow.Forward.SrcIP, flow.Forward.DstIP, flow.Reverse.SrcIP, flow.Reverse.DstIP} {
		if a, ok := netip.AddrFromSlice(ip); ok {
			if _, hit := f[a.Unmap()]; hit {
				return true
			}
		}
	}
	return false
}

// interfaceAddrs are the addresses of every interface of h's namespace
// (the calling thread's when h is nil), unmapped.
func interfaceAddrs(h *netlink.Handle) (map[netip.Addr]struct{}, error) {
	var addrs []netlink.Addr
	var err error
	if h != nil {
		addrs, err = h.AddrList(nil, netlink.FAMILY_ALL)
	} else {
		addrs, err = netlink.AddrList(nil, netlink.FAMILY_ALL)
	}
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Addr]struct{}, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out[ip.Unmap()] = struct{}{}
		}
	}
	return out, nil
}

// list dumps the conntrack table of one family, 0 for all.
func (c NetlinkConntrack) list(fam netlink.InetFamily) ([]*netlink.ConntrackFlow, error) {
	if c.Handle != nil {
		return c.Handle.ConntrackTableList(netlink.ConntrackTable, fam)
	}
	return netlink.ConntrackTableList(netlink.ConntrackTable, fam)
}

// deniedFamilies lists the address families of the flows deny rejects.
func deniedFamilies(flows []*netlink.ConntrackFlow, deny func(Packet) bool) []netlink.InetFamily {
	var out []netlink.InetFamily
	for _, fl := range flows {
		fam := netlink.InetFamily(fl.FamilyType)
		if slices.Contains(out, fam) {
			continue
		}
		if p, ok := packetOf(fl); ok && deny(p) {
			out = append(out, fam)
		}
	}
	return out
}

type flowFilter struct{ deny func(Packet) bool }

// MatchConntrackFlow rebuilds the packet the rules judged: the original
// source, and the destination the reply comes from (after any DNAT, which
// happens before the filter hooks).
func (f flowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	p, ok := packetOf(flow)
	return ok && f.deny(p)
}

func packetOf(flow *netlink.ConntrackFlow) (Packet, bool) {
	src, ok1 := netip.AddrFromSlice(flow.Forward.SrcIP)
	dst, ok2 := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return Packet{}, false
	}
	p := Packet{Src: src.Unmap(), Dst: dst.Unmap(), Proto: policy.Protocol(flow.Forward.Protocol)}
	if p.Proto.HasPorts() {
		p.Port = flow.Reverse.SrcPort
	}
	return p, true
}
