package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

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
}

// NetlinkConntrack is the kernel's conntrack table, reached over netlink.
type NetlinkConntrack struct {
	// Handle selects the network namespace; nil uses the namespace of the
	// calling thread.
	Handle *netlink.Handle
}

// Delete implements Conntrack for both address families.
func (c NetlinkConntrack) Delete(ctx context.Context, deny func(Packet) bool) (int, error) {
	total := 0
	var errs []error
	for _, fam := range []netlink.InetFamily{netlink.InetFamily(netlink.FAMILY_V4), netlink.InetFamily(netlink.FAMILY_V6)} {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		f := flowFilter{deny: deny}
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
