package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// BenchmarkResolveLinks is what resolving the pod links adds to every
// sync of moat-agent on a full node: 110 pods (the kubelet's default
// limit), each with an IPv4 and an IPv6 host route on a veth of its own.
// One op resolves all 220 addresses (two dumps, 220 route lookups).
//
//	go test -run '^$' -bench BenchmarkResolveLinks -count 5 ./internal/netns/
func BenchmarkResolveLinks(b *testing.B) {
	testenv.RequirePrivileged(b)
	ns := newNS(b, fmt.Sprintf("moat-bench-links-%d", os.Getpid()))
	nl, err := ns.Netlink()
	if err != nil {
		b.Fatal(err)
	}
	N := "-n " + ns.Name() + " "
	q := nft.LinkQuery{NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}
	cmds := []string{N + "link add uplink type veth peer name uplinkp", N + "link set uplink up", N + "link set uplinkp up", N + "addr add 192.168.1.1/24 dev uplink", N + "route add default via 192.168.1.254"}
	for i := range 110 {
		v4, v6 := netip.AddrFrom4([4]byte{10, 244, 0, byte(i + 2)}), netip.MustParseAddr(fmt.Sprintf("fd00:244::%x", i+2))
		cmds = append(cmds, fmt.Sprintf("%slink add v%d type veth peer name v%dp", N, i, i), fmt.Sprintf("%slink set v%d up", N, i), fmt.Sprintf("%slink set v%dp up", N, i),
			fmt.Sprintf("%sroute add %s/32 dev v%d", N, v4, i), fmt.Sprintf("%s-6 route add %s/128 dev v%d", N, v6, i))
		q.Addrs = append(q.Addrs, v4, v6)
	}
	run(b, cmds...)
	r := nft.NetlinkLinks{Handle: nl}
	for b.Loop() {
		links, err := r.ResolveLinks(context.Background(), q)
		if err != nil || len(links) != len(q.Addrs) {
			b.Fatalf("%d links of %d addresses: %v", len(links), len(q.Addrs), err)
		}
	}
}

// BenchmarkEstablishedRoundTrip is the cost of the pod-interface checks
// on packets of established connections (podLinkRules come before the
// conntrack accepts): one op is a UDP round trip between pod P and the
// outside host C over one established flow, two packets through the
// node's forward hook, one from P's interface (the interface and the
// interface-address lookups, and the lookup of the source among the pod
// addresses) and one from the uplink (the interface and source lookups,
// which miss).
//
//	go test -run '^$' -bench BenchmarkEstablishedRoundTrip -benchtime 20000x -count 3 ./internal/netns/
func BenchmarkEstablishedRoundTrip(b *testing.B) {
	testenv.RequirePrivileged(b)
	l := newSpoofLab(b, fmt.Sprintf("moat-bench-est-%d-", os.Getpid()))
	dp, err := l.r.Dataplane(nft.Options{Node: "n1"})
	if err != nil {
		b.Fatal(err)
	}
	prog := compile(b, spoofCluster, policy.Options{})
	for range 2 {
		if _, err := dp.Sync(context.Background(), prog); err != nil {
			b.Fatal(err)
		}
	}
	echo := listen(b, l.c, "udp4", 9998)[0]
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := echo.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if _, err := echo.WriteToUDPAddrPort(buf[:n], from); err != nil {
				return
			}
		}
	}()
	var c *net.UDPConn
	if err := l.p.Do(func() error {
		var err error
		c, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 244, 0, 5)}, &net.UDPAddr{IP: net.IPv4(192, 168, 1, 2), Port: 9998})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	for b.Loop() {
		if _, err := c.Write([]byte("ping")); err != nil {
			b.Fatal(err)
		}
		if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
}
