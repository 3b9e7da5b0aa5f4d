package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// podSrcCluster is spoofCluster with a second node whose pod q the pod p
// of n1 may impersonate.
const podSrcCluster = spoofCluster + `---
apiVersion: v1
kind: Node
metadata: {name: n2}
spec: {podCIDRs: ["10.244.1.0/24", "fd00:245::/64"]}
status:
  addresses:
  - {type: InternalIP, address: 192.168.1.3}
---
apiVersion: v1
kind: Pod
metadata: {name: q, namespace: a, labels: {app: q}}
spec: {nodeName: n2, containers: [{name: c, image: x}]}
status:
  phase: Running
  podIP: 10.244.1.20
  podIPs: [{ip: 10.244.1.20}, {ip: "fd00:245::20"}]
`

// TestForgedSourceOnPodInterface: a pod under deny-all egress (but UDP
// 9998 to the outside host) that forges a source outside the pod CIDRs
// (IPv6, and IPv4 with the node's reverse path filter off) or the address
// of another node's pod gets nothing out, neither forwarded nor to the
// node itself: each forged packet is dropped as spoofed on arrival from
// the pod's interface. The pod's own addresses (both families), replies
// to a connection opened towards it and the pod's traffic to itself still
// pass (its link-local address towards the node: TestPodLinkLocalToNode). Before the pod
// interface check, every forged packet but none of the others got through
// (the review's finding: only forged sources inside the pod CIDRs were
// dropped).
func TestForgedSourceOnPodInterface(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-psi-")
	for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter", "net.ipv4.conf.rp0.rp_filter"} {
		if err := l.r.Sysctl(k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	dp := program(t, l.r, podSrcCluster, policy.Options{})
	P := l.p.Name()
	// The forged addresses, held by the pod as a raw socket would send
	// them.
	run(t,
		"-n "+P+" addr add 198.51.100.7/32 dev eth0",
		"-n "+P+" addr add 2001:db8:dead::1/128 dev eth0 nodad",
		"-n "+P+" addr add 10.244.1.20/32 dev eth0",
		"-n "+P+" addr add fd00:245::20/128 dev eth0 nodad",
	)
	// What the node resolved: the pod's two addresses on rp0 (its
	// routes did not change with the pod's extra addresses).
	if r, err := dp.Sync(context.Background(), compile(t, podSrcCluster, policy.Options{})); err != nil || r.Links != 2 {
		t.Fatalf("sync: %d links, want 2 (the pod's addresses on rp0): %v", r.Links, err)
	}
	out := listen(t, l.c, "udp", 9999, 9998)
	node := listen(t, l.r, "udp", 9999)
	for _, fam := range []struct{ honest, dst string }{{"10.244.0.5", "192.168.1.2"}, {"[fd00:244::5]", "[fd00:1::2]"}} {
		send(t, l.p, ap(fam.honest+":40000"), ap(fam.dst+":9998"), "warm-up")
		receiveUntil(t, out[1])
	}
	forged := []struct{ src, dst string }{
		{"[2001:db8:dead::1]:40000", "[fd00:1::2]:9999"}, // (a) outside IPv6 source, forwarded
		{"198.51.100.7:40000", "192.168.1.2:9999"},       // (b) outside IPv4 source, rp_filter 0
		{"10.244.1.20:40000", "192.168.1.2:9999"},        // (c) another node's pod
		{"[fd00:245::20]:40000", "[fd00:1::2]:9999"},
		{"[2001:db8:dead::1]:40000", "[fd00:1::1]:9999"}, // to the node itself (input)
		{"198.51.100.7:40000", "192.168.1.1:9999"},
	}
	for _, f := range forged {
		send(t, l.p, ap(f.src), ap(f.dst), "forged "+f.src+" to "+f.dst)
	}
	send(t, l.p, ap("10.244.0.5:40000"), ap("192.168.1.2:9998"), "allowed")
	got, before := receiveUntil(t, out[1], out[0], node[0])
	t.Logf("outside host received %q", got)
	send(t, l.p, ap("[fd00:244::5]:40000"), ap("[fd00:1::2]:9998"), "allowed6")
	got, before6 := receiveUntil(t, out[1], out[0], node[0])
	t.Logf("outside host received %q", got)
	if before = append(before, before6...); len(before) > 0 {
		t.Errorf("forged sources got through from the pod's interface: %v", before)
	}

	// A reply: the outside host's datagram to the pod (its ingress allows
	// UDP 9998 from it) is answered from the pod's address.
	for _, fam := range []struct{ pod, host string }{{"10.244.0.5:9998", "192.168.1.2:40002"}, {"[fd00:244::5]:9998", "[fd00:1::2]:40002"}} {
		echo(t, l.c, l.p, ap(fam.host), ap(fam.pod))
	}
	// The pod to itself, through its own address.
	self := listen(t, l.p, "udp", 9997)[0]
	send(t, l.p, ap("10.244.0.5:40000"), ap("10.244.0.5:9997"), "self")
	if got, _ := receiveUntil(t, self); got != "self from 10.244.0.5" {
		t.Errorf("pod received %q from itself", got)
	}

	if n := dropped(t, dp, nft.ReasonSpoofed); n != uint64(len(forged)) {
		t.Errorf("%d packets dropped as spoofed, want %d (each forged packet)", n, len(forged))
	}
}

// TestPodLinksResolved: NetlinkLinks keeps a pod address's interface only
// when the route the node uses for it leads to pods alone: a host route
// or a route inside the pod CIDRs, without a gateway, not through
// loopback or an interface holding a node address. Anything else fails
// open (the interface stays unchecked) rather than making an uplink a pod
// interface.
func TestPodLinksResolved(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	ns := newNS(t, "moat-plr")
	N := "-n " + ns.Name() + " "
	var cmds []string
	for _, d := range []string{"veth1", "bridge", "uplink"} {
		cmds = append(cmds, N+"link add "+d+" type veth peer name "+d+"p", N+"link set "+d+" up", N+"link set "+d+"p up")
	}
	run(t, slices.Concat([]string{N + "link set lo up"}, cmds, []string{
		N + "route add 10.244.0.5/32 dev veth1",      // routed CNI
		N + "-6 route add fd00:244::5/128 dev veth1", // routed CNI, IPv6
		N + "addr add 10.244.0.129/25 dev bridge",    // a bridge's subnet in the pod CIDR
		N + "addr add 192.168.1.1/24 dev uplink",     // the node's address
		N + "route add default via 192.168.1.254",
		N + "route add 10.244.0.7/32 dev uplink",                   // host route on the node's own interface
		N + "route add 10.244.0.8/32 via 192.168.1.254 dev uplink", // through a gateway
		N + "addr add 10.244.0.9/32 dev lo",                        // local
		N + "addr add 10.250.0.1/24 dev veth1",                     // a subnet outside the pod CIDRs
		N + "route add blackhole 10.244.0.64/27",                   // Calico's block of this node
		N + "route add prohibit 10.244.0.96/27",
	})...)
	nl, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	idx := func(name string) int {
		l, err := nl.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}
	q := nft.LinkQuery{
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("fd00:244::/64")},
		NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")},
	}
	for _, s := range []string{"10.244.0.5", "fd00:244::5", "10.244.0.130", "10.244.0.7", "10.244.0.8", "10.244.0.9", "10.250.0.5", "10.99.0.1", "fd00:99::1", "10.244.0.70", "10.244.0.100"} {
		q.Addrs = append(q.Addrs, netip.MustParseAddr(s))
	}
	got, err := nft.NetlinkLinks{Handle: nl}.ResolveLinks(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	want := []nft.PodLink{
		{Index: idx("veth1"), Addr: netip.MustParseAddr("10.244.0.5")},
		{Index: idx("veth1"), Addr: netip.MustParseAddr("fd00:244::5")},
		{Index: idx("bridge"), Addr: netip.MustParseAddr("10.244.0.130")},
	}
	slices.SortFunc(got, func(a, b nft.PodLink) int { return strings.Compare(a.Addr.String(), b.Addr.String()) })
	slices.SortFunc(want, func(a, b nft.PodLink) int { return strings.Compare(a.Addr.String(), b.Addr.String()) })
	if !slices.Equal(got, want) {
		t.Errorf("links = %v, want %v", got, want)
	}
}

// echo has the host in hostNS send a datagram from host to pod, where
// the pod (in podNS) answers it from the same address; the answer must
// come back.
func echo(t *testing.T, hostNS, podNS *NS, host, pod netip.AddrPort) {
	t.Helper()
	var c, conn *net.UDPConn
	if err := hostNS.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(host))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := podNS.Do(func() error {
		var err error
		conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(pod))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := c.WriteToUDPAddrPort([]byte("ping"), pod); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, from, err := conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("pod did not receive the host's datagram from %s: %v", host, err)
	}
	if _, err := conn.WriteToUDPAddrPort([]byte("pong"), from); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "pong" {
		t.Errorf("the pod's reply to %s did not come back: %q, %v", host, buf[:n], err)
	}
}

// TestPodLinkLocalToNode: a pod whose egress is denied (spoofCluster: UDP
// 9998 to the outside host only) does not reach its node's services over
// IPv6 link-local. From its link-local address to
// the node's on its link (fe80::1, as Calico has it) a TCP SYN to a
// listener on :: (kubelet's 10250), a UDP datagram and an echo request
// are each dropped as link scope; before, input let link-local sources
// skip the pod-interface check, dispatch found no egress chain for them
// and the node took all three. Multicast listener reports from the pod
// still reach the node (a table of the test's own, after moat's input
// chain, counts them).
func TestPodLinkLocalToNode(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-pll-")
	P, R := l.p.Name(), l.r.Name()
	run(t,
		"-n "+P+" addr add fe80::5/64 dev eth0 nodad",
		"-n "+R+" addr add fe80::1/64 dev rp0 nodad",
	)
	dp := program(t, l.r, spoofCluster, policy.Options{})
	if r, err := dp.Sync(context.Background(), compile(t, spoofCluster, policy.Options{})); err != nil || r.Links != 2 {
		t.Fatalf("sync: %d links, want 2 (the pod's addresses on rp0): %v", r.Links, err)
	}
	// The pod knows the node's link-local address at once, so that no
	// packet to it waits in a neighbour queue while the marker overtakes.
	var mac net.HardwareAddr
	if err := l.r.Do(func() error {
		ifi, err := net.InterfaceByName("rp0")
		if err == nil {
			mac = ifi.HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	run(t, "-n "+P+" -6 neigh replace fe80::1 lladdr "+mac.String()+" dev eth0 nud permanent")
	if out, err := nftIn(l.r, `table inet moat-test-probe {
	counter mld { }
	chain in {
		type filter hook input priority 10; policy accept;
		iifname "rp0" icmpv6 type { mld-listener-report, mld2-listener-report } counter name mld
	}
}`); err != nil {
		t.Fatalf("probe table: %v: %s", err, out)
	}

	listenTCP(t, l.r, "tcp", net.TCPAddr{IP: net.IPv6unspecified, Port: 10250})
	node := listen(t, l.r, "udp", 9996)
	out := listen(t, l.c, "udp", 9998)
	send(t, l.p, ap("[fd00:244::5]:40000"), ap("[fd00:1::2]:9998"), "warm-up")
	receiveUntil(t, out[0])

	send(t, l.p, ap("[fe80::5%eth0]:40000"), ap("[fe80::1%eth0]:9996"), "link-local")
	if err := l.p.Do(func() error {
		zone := uint32(ifIndex(t, "eth0"))
		ll := netip.MustParseAddr("fe80::1").As16()
		// A SYN, closed at once: the kernel sends it on connect and
		// never again (no retransmission to count twice).
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: netip.MustParseAddr("fe80::5").As16(), ZoneId: zone}); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
		if err := unix.Connect(fd, &unix.SockaddrInet6{Port: 10250, Addr: ll, ZoneId: zone}); err != unix.EINPROGRESS {
			return fmt.Errorf("connect: %w", err)
		}
		// An echo request (type 128, code 0, id 1, seq 1; the kernel
		// fills in the ICMPv6 checksum).
		raw, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
		if err != nil {
			return err
		}
		defer unix.Close(raw)
		if err := unix.Bind(raw, &unix.SockaddrInet6{Addr: netip.MustParseAddr("fe80::5").As16(), ZoneId: zone}); err != nil {
			return fmt.Errorf("bind raw: %w", err)
		}
		return unix.Sendto(raw, []byte{128, 0, 0, 0, 0, 1, 0, 1}, 0, &unix.SockaddrInet6{Addr: ll, ZoneId: zone})
	}); err != nil {
		t.Fatal(err)
	}
	send(t, l.p, ap("[fd00:244::5]:40000"), ap("[fd00:1::2]:9998"), "allowed")
	if _, before := receiveUntil(t, out[0], node[0]); len(before) > 0 {
		t.Errorf("the node received %v from the pod's link-local address", before)
	}
	if n := dropped(t, dp, nft.ReasonLinkScope); n != 3 {
		t.Errorf("%d packets dropped as link scope, want 3 (the SYN to [fe80::1%%eth0]:10250, the datagram, the echo request)", n)
	}

	// A multicast listener report: the pod joins a group on eth0. The
	// node takes reports in only as a multicast router or a listener of
	// their destination: it listens to ff02::16 (MLDv2 routers) on rp0.
	if err := l.r.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		t.Cleanup(func() { unix.Close(fd) })
		mreq := &unix.IPv6Mreq{Interface: uint32(ifIndex(t, "rp0")), Multiaddr: netip.MustParseAddr("ff02::16").As16()}
		return unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, mreq)
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.p.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		mreq := &unix.IPv6Mreq{Interface: uint32(ifIndex(t, "eth0")), Multiaddr: netip.MustParseAddr("ff02::1:3").As16()}
		if err := unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, mreq); err != nil {
			return err
		}
		// The report leaves from the kernel's work queue: wait for it
		// while the group is joined.
		for range 500 {
			if probeCount(t, l.r) > 0 {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return errors.New("no multicast listener report from the pod passed moat's input chain")
	}); err != nil {
		t.Fatal(err)
	}
}

// probeCount is the packets counted by TestPodLinkLocalToNode's probe
// table in ns.
func probeCount(t *testing.T, ns *NS) int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns.Name(), "nft", "list", "counter", "inet", "moat-test-probe", "mld").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list counter: %v: %s", err, out)
	}
	f := strings.Fields(string(out))
	for i, w := range f {
		if w == "packets" && i+1 < len(f) {
			n, err := strconv.Atoi(f[i+1])
			if err != nil {
				t.Fatalf("nft list counter: %q", out)
			}
			return n
		}
	}
	t.Fatalf("nft list counter: no packets in %q", out)
	return 0
}
