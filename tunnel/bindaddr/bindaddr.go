// Package bindaddr gives the agent its KEP-2025 bind address: the KEP puts it
// on a dummy interface with host scope; where dummy interfaces are missing it
// goes, host-scoped, on an existing interface (lo by default). An address the
// kernel already treats as local is used as it is and never removed, unless
// Moat added it: addresses Moat adds carry an address-protocol mark
// (IFA_PROTO), so an agent restarted after a crash (SIGKILL, OOM) takes its
// address back as its own and removes it on a clean exit.
package bindaddr

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Proto is the address protocol (IFA_PROTO, Linux 5.18 and later) Moat
// writes on the addresses it adds ('m'); `ip address` prints it as
// "proto 0x6d". Older kernels ignore the attribute: there a restarted
// agent leaves an address a crashed one added, as it leaves any address it
// did not add.
const Proto = 0x6d

// ifaProto is IFA_PROTO from linux/if_addr.h (not in x/sys/unix).
const ifaProto = 11

// Lease is an ensured bind address; Release undoes what Ensure did.
type Lease struct {
	link netlink.Link
	addr *netlink.Addr
	// Added is true when Release removes the address: Ensure added it, or
	// found it carrying Moat's mark (Adopted).
	Added bool
	// Adopted is true when the address was already there with Moat's mark:
	// a previous agent added it and died without removing it.
	Adopted bool
}

// IsLocal reports whether the kernel routes ip to this host (a local route),
// which is exactly when a socket can bind it.
func IsLocal(ip net.IP) (bool, error) {
	rs, err := netlink.RouteGet(ip)
	if err != nil {
		if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
			return false, nil
		}
		return false, fmt.Errorf("route get %s: %w", ip, err)
	}
	return len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL, nil
}

// Ensure makes ip bindable. If ifname already has ip, it is used as it is,
// and owned (Release removes it) only when it carries Moat's mark; if the
// kernel routes ip locally through another address (127.0.0.0/8, an
// operator's address elsewhere) nothing changes; otherwise ip is added to
// ifname as a /32 with host scope, or as a /128 without duplicate address
// detection (Linux derives an IPv6 address's scope from the address itself;
// on lo it is reachable from this host only either way).
func Ensure(ip net.IP, ifname string) (*Lease, error) {
	link, linkErr := netlink.LinkByName(ifname)
	if linkErr == nil {
		a, proto, err := find(link, ip)
		if err != nil {
			return nil, fmt.Errorf("--bind-interface %q: %w", ifname, err)
		}
		if a != nil {
			if proto == Proto {
				return &Lease{link: link, addr: a, Added: true, Adopted: true}, nil
			}
			return &Lease{}, nil
		}
	}
	local, err := IsLocal(ip)
	if err != nil {
		return nil, fmt.Errorf("--bind-address %s: %w", ip, err)
	}
	if local {
		return &Lease{}, nil
	}
	if linkErr != nil {
		return nil, fmt.Errorf("--bind-interface %q: %w", ifname, linkErr)
	}
	bits := 32
	if ip.To4() == nil {
		bits = 128
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}, Scope: unix.RT_SCOPE_HOST}
	if bits == 128 {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := add(link, a); err != nil {
		return nil, fmt.Errorf("--bind-address %s on %s: %w", ip, ifname, err)
	}
	return &Lease{link: link, addr: a, Added: true}, nil
}

// Release removes the address if Ensure added or adopted it.
func (l *Lease) Release() error {
	if l == nil || !l.Added {
		return nil
	}
	if err := netlink.AddrDel(l.link, l.addr); err != nil {
		return fmt.Errorf("remove %s from %s: %w", l.addr.IPNet, l.link.Attrs().Name, err)
	}
	l.Added = false
	return nil
}

func family(ip net.IP) (int, []byte) {
	if v4 := ip.To4(); v4 != nil {
		return unix.AF_INET, v4
	}
	return unix.AF_INET6, ip.To16()
}

// add is netlink.AddrAdd for a host address, plus Moat's IFA_PROTO mark
// (the netlink package does not write that attribute).
func add(link netlink.Link, a *netlink.Addr) error {
	fam, ip := family(a.IP)
	req := nl.NewNetlinkRequest(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	msg := nl.NewIfAddrmsg(fam)
	msg.Index = uint32(link.Attrs().Index)
	msg.Prefixlen = uint8(8 * len(ip))
	msg.Scope = uint8(a.Scope)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, ip))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, ip))
	if a.Flags != 0 {
		req.AddData(nl.NewRtAttr(unix.IFA_FLAGS, nl.Uint32Attr(uint32(a.Flags))))
	}
	req.AddData(nl.NewRtAttr(ifaProto, nl.Uint8Attr(Proto)))
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// find returns ip's address on link, if any, and its IFA_PROTO (0 when
// unset).
func find(link netlink.Link, ip net.IP) (*netlink.Addr, uint8, error) {
	fam, want := family(ip)
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfAddrmsg(fam))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
	if err != nil {
		return nil, 0, fmt.Errorf("list addresses: %w", err)
	}
	for _, m := range msgs {
		msg := nl.DeserializeIfAddrmsg(m)
		if int(msg.Index) != link.Attrs().Index || int(msg.Family) != fam {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[msg.Len():])
		if err != nil {
			return nil, 0, fmt.Errorf("list addresses: %w", err)
		}
		var local, address net.IP
		var proto uint8
		for _, at := range attrs {
			switch at.Attr.Type {
			case unix.IFA_LOCAL:
				local = at.Value
			case unix.IFA_ADDRESS:
				address = at.Value
			case ifaProto:
				if len(at.Value) == 1 {
					proto = at.Value[0]
				}
			}
		}
		if local == nil { // IPv6 reports its address as IFA_ADDRESS only
			local = address
		}
		if local.Equal(want) {
			bits := 8 * len(want)
			return &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(int(msg.Prefixlen), bits)}, Scope: int(msg.Scope)}, proto, nil
		}
	}
	return nil, 0, nil
}
