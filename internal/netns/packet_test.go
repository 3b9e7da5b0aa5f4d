package netns

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// Packets the kernel's sockets would not send: ICMP errors about other
// flows, neighbour discovery with data, tunnel encapsulations, a datagram
// from an address its namespace does not hold (sendAs). A raw socket
// (rawSender) sends what these build, the kernel adding the outer IP
// header from the socket's bound address; rawReceiver sees what arrives,
// as any process with CAP_NET_RAW on the receiving host would.

// checksum is the Internet checksum (RFC 1071) of the data, started from
// sum (a pseudo-header's).
func checksum(sum uint32, data []byte) uint16 {
	for i := 0; i+1 < len(data); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(data[i:]))
	}
	if len(data)%2 == 1 {
		sum += uint32(data[len(data)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// pseudoHeader is the sum of the IPv4 or IPv6 pseudo-header of a
// transport segment of length n.
func pseudoHeader(src, dst netip.Addr, proto byte, n int) uint32 {
	var sum uint32
	for _, a := range []netip.Addr{src, dst} {
		b := a.AsSlice()
		for i := 0; i < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	return sum + uint32(proto) + uint32(n>>16) + uint32(n&0xffff)
}

// udpDatagram is a UDP header and payload from src to dst, with its
// checksum.
func udpDatagram(src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], src.Port())
	binary.BigEndian.PutUint16(b[2:], dst.Port())
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)))
	copy(b[8:], payload)
	c := checksum(pseudoHeader(src.Addr(), dst.Addr(), unix.IPPROTO_UDP, len(b)), b)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[6:], c)
	return b
}

// ipPacket is an IPv4 or IPv6 header (hop limit 64, no options or
// extension headers) around payload.
func ipPacket(src, dst netip.Addr, proto byte, payload []byte) []byte {
	if src.Is4() {
		b := make([]byte, 20+len(payload))
		b[0] = 0x45
		binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
		b[8], b[9] = 64, proto
		copy(b[12:], src.AsSlice())
		copy(b[16:], dst.AsSlice())
		binary.BigEndian.PutUint16(b[10:], checksum(0, b[:20]))
		copy(b[20:], payload)
		return b
	}
	b := make([]byte, 40+len(payload))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(payload)))
	b[6], b[7] = proto, 64
	copy(b[8:], src.AsSlice())
	copy(b[24:], dst.AsSlice())
	copy(b[40:], payload)
	return b
}

// udpPacket is a whole IP packet carrying one UDP datagram.
func udpPacket(src, dst netip.AddrPort, payload []byte) []byte {
	return ipPacket(src.Addr(), dst.Addr(), unix.IPPROTO_UDP, udpDatagram(src, dst, payload))
}

// icmpMessage is an ICMP (IPv4) or ICMPv6 message body as a raw socket
// sends it: type, code, checksum, body. The ICMPv4 checksum is computed
// here; for ICMPv6 the kernel computes it (it covers the pseudo-header).
func icmpMessage(v4 bool, typ, code byte, body []byte) []byte {
	b := append([]byte{typ, code, 0, 0}, body...)
	if v4 {
		binary.BigEndian.PutUint16(b[2:], checksum(0, b))
	}
	return b
}

// portUnreachable is an ICMP (type 3 code 3) or ICMPv6 (type 1 code 4)
// port unreachable error about the UDP datagram from quotedSrc to
// quotedDst, followed by extra: arbitrary data, which a receiver's
// conntrack does not read.
func portUnreachable(quotedSrc, quotedDst netip.AddrPort, extra []byte) []byte {
	quoted := udpPacket(quotedSrc, quotedDst, nil)
	body := append(make([]byte, 4), quoted...)
	body = append(body, extra...)
	if quotedSrc.Addr().Is4() {
		return icmpMessage(true, 3, 3, body)
	}
	return icmpMessage(false, 1, 4, body)
}

// rawSender is a raw IP socket of one protocol in a namespace, bound to
// one of the namespace's addresses: the kernel adds the IP header.
type rawSender struct {
	fd int
	v4 bool
}

func newRawSender(t *testing.T, ns *NS, src netip.Addr, proto int) *rawSender {
	t.Helper()
	s := &rawSender{v4: src.Is4()}
	if err := ns.Do(func() error {
		var err error
		if s.v4 {
			if s.fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, proto); err != nil {
				return err
			}
			return unix.Bind(s.fd, &unix.SockaddrInet4{Addr: src.As4()})
		}
		if s.fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW, proto); err != nil {
			return err
		}
		return unix.Bind(s.fd, &unix.SockaddrInet6{Addr: src.As16()})
	}); err != nil {
		t.Fatalf("raw socket in %s: %v", ns.Name(), err)
	}
	t.Cleanup(func() { unix.Close(s.fd) })
	return s
}

// hopLimit sets the IPv6 hop limit of the unicast packets it sends.
func (s *rawSender) hopLimit(t *testing.T, hl int) {
	t.Helper()
	if err := unix.SetsockoptInt(s.fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, hl); err != nil {
		t.Fatal(err)
	}
}

func (s *rawSender) send(t *testing.T, dst netip.Addr, payload []byte) {
	t.Helper()
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
	if s.v4 {
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	}
	if err := unix.Sendto(s.fd, payload, 0, sa); err != nil {
		t.Fatalf("raw send to %s: %v", dst, err)
	}
}

// rawReceiver is a raw ICMP or ICMPv6 socket in a namespace: it gets a
// copy of every ICMP message the namespace receives, before the kernel
// validates or handles it.
type rawReceiver struct {
	fd int
}

func newRawReceiver(t *testing.T, ns *NS, v4 bool) *rawReceiver {
	t.Helper()
	r := &rawReceiver{}
	if err := ns.Do(func() error {
		var err error
		if v4 {
			r.fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_NONBLOCK, unix.IPPROTO_ICMP)
		} else {
			r.fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_NONBLOCK, unix.IPPROTO_ICMPV6)
		}
		return err
	}); err != nil {
		t.Fatalf("raw socket in %s: %v", ns.Name(), err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	return r
}

// seen reports which of markers are in the messages received so far
// (it reads what is queued, without waiting).
func (r *rawReceiver) seen(markers ...string) []string {
	buf := make([]byte, 65536)
	var got []string
	for {
		n, _, err := unix.Recvfrom(r.fd, buf, 0)
		if err != nil {
			break
		}
		for _, m := range markers {
			if bytes.Contains(buf[:n], []byte(m)) {
				got = append(got, m)
			}
		}
	}
	return got
}

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
