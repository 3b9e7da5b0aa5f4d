// Package bindaddr gives the agent its KEP-2025 bind address: the KEP puts it
// on a dummy interface with host scope; where dummy interfaces are missing it
// goes, host-scoped, on an existing interface (lo by default). An address the
// kernel already treats as local is used as it is and never removed.
package bindaddr

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Lease is an ensured bind address; Release undoes what Ensure did.
type Lease struct {
	link  netlink.Link
	addr  *netlink.Addr
	Added bool
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

// Ensure makes ip bindable: if it is already local nothing changes;
// otherwise it is added to ifname as a /32 with host scope, or as a /128
// without duplicate address detection (Linux derives an IPv6 address's scope
// from the address itself; on lo it is reachable from this host only either way).
func Ensure(ip net.IP, ifname string) (*Lease, error) {
	local, err := IsLocal(ip)
	if err != nil {
		return nil, fmt.Errorf("--bind-address %s: %w", ip, err)
	}
	if local {
		return &Lease{}, nil
	}
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("--bind-interface %q: %w", ifname, err)
	}
	bits := 32
	if ip.To4() == nil {
		bits = 128
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}, Scope: unix.RT_SCOPE_HOST}
	if bits == 128 {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrAdd(link, a); err != nil {
		return nil, fmt.Errorf("--bind-address %s on %s: %w", ip, ifname, err)
	}
	return &Lease{link: link, addr: a, Added: true}, nil
}

// Release removes the address if Ensure added it.
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
