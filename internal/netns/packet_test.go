package netns

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// Packets the kernel's sockets would not send. sendAs sends a datagram
// from an address its namespace does not hold.

// sendAs sends one UDP datagram from src, an address ns need not hold,
// to dst: a transparent socket (IP_TRANSPARENT) may send from any source,
// as a raw socket may, and the kernel still routes the datagram.
func sendAs(t *testing.T, ns *NS, src, dst netip.AddrPort, msg string) {
	t.Helper()
	if err := ns.Do(func() error {
		var domain, level, opt int
		var from, to unix.Sockaddr
		if src.Addr().Is4() {
			domain, level, opt = unix.AF_INET, unix.SOL_IP, unix.IP_TRANSPARENT
			from, to = &unix.SockaddrInet4{Addr: src.Addr().As4(), Port: int(src.Port())}, &unix.SockaddrInet4{Addr: dst.Addr().As4(), Port: int(dst.Port())}
		} else {
			domain, level, opt = unix.AF_INET6, unix.SOL_IPV6, unix.IPV6_TRANSPARENT
			from, to = &unix.SockaddrInet6{Addr: src.Addr().As16(), Port: int(src.Port())}, &unix.SockaddrInet6{Addr: dst.Addr().As16(), Port: int(dst.Port())}
		}
		fd, err := unix.Socket(domain, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
			return err
		}
		if err := unix.Bind(fd, from); err != nil {
			return err
		}
		return unix.Sendto(fd, []byte(msg), 0, to)
	}); err != nil {
		t.Fatalf("send %s from %s to %s: %v", msg, src, dst, err)
	}
}
