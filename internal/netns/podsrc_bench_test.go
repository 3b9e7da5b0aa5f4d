package netns

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
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
