package nft

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-net/moat/policy"
)

// noPodCIDRsCluster: node n1 has no spec.podCIDRs (a CNI with its own
// IPAM, a cluster without --allocate-node-cidrs); its pod a/x (10.1.0.1)
// is isolated for ingress and egress.
const noPodCIDRsCluster = `apiVersion: v1
kind: Node
metadata: {name: n1}
status: {addresses: [{type: InternalIP, address: 192.168.1.1}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: Pod
metadata: {name: x, namespace: a, labels: {app: x}}
spec: {nodeName: n1}
status: {podIPs: [{ip: 10.1.0.1}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
`

// podY is a second pod of namespace a on n1, at 10.1.0.5.
const podY = `---
apiVersion: v1
kind: Pod
metadata: {name: "y", namespace: a, labels: {app: "y"}}
spec: {nodeName: n1}
status: {podIPs: [{ip: 10.1.0.5}]}
`

// TestKernelUnknownRoutedPodFailsClosed: on a node without pod CIDRs a
// pod the agent has not learnt yet (its address not in the Program: it is
// new, or the agent is behind) would meet no egress or ingress chain: its
// namespace's isolation would not hold for it. The node routes it through
// a veth of its own with a host route, as routed CNIs do; the Syncer
// finds that route among the kernel's and fails closed for it: new
// connections from it (on its veth) and to it are dropped until the
// agent knows it. A host route through an interface that is no veth (a
// VPN's tunnel; here a bridge) or through the node's own uplink (a veth
// holding the node's address, as in kind) is left alone.
func TestKernelUnknownRoutedPodFailsClosed(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		ip := func(args ...string) {
			t.Helper()
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
		for _, cmd := range [][]string{
			{"link", "add", "veth-x", "type", "veth", "peer", "name", "veth-x-p"},
			{"link", "add", "veth-y", "type", "veth", "peer", "name", "veth-y-p"},
			{"link", "add", "uplink", "type", "veth", "peer", "name", "uplink-p"},
			{"link", "add", "vpn", "type", "bridge"},
			{"link", "set", "lo", "up"},
			{"link", "set", "veth-x", "up"}, {"link", "set", "veth-x-p", "up"},
			{"link", "set", "veth-y", "up"}, {"link", "set", "veth-y-p", "up"},
			{"link", "set", "uplink", "up"}, {"link", "set", "uplink-p", "up"}, {"link", "set", "vpn", "up"},
			{"addr", "add", "192.168.1.1/24", "dev", "uplink"},
			{"route", "add", "10.1.0.1/32", "dev", "veth-x"},
			{"route", "add", "10.1.0.5/32", "dev", "veth-y"},
			{"route", "add", "10.9.9.9/32", "dev", "vpn"},
			{"route", "add", "192.168.1.9/32", "dev", "uplink"},
			// The node's gateway on x's veth, as a /128: the kernel adds
			// a host route to it in the main table; it is no pod.
			{"-6", "addr", "add", "fd00:9::1/128", "dev", "veth-x", "nodad"},
		} {
			ip(cmd...)
		}
		index := func(name string) int {
			t.Helper()
			i, err := net.InterfaceByName(name)
			if err != nil {
				t.Fatal(err)
			}
			return i.Index
		}
		x, y, up, vpn := index("veth-x"), index("veth-y"), index("uplink"), index("vpn")
		nft, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		s := New(nft, Options{Node: "n1"})
		if _, err := s.Sync(ctx, compileYAML(t, noPodCIDRsCluster)); err != nil {
			t.Fatal(err)
		}
		tcp := func(src string, inIf int, dst string) Packet {
			return Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: policy.ProtoTCP, Port: 80, InIf: inIf}
		}
		rs := s.Applied()
		if rs.unknownAddr(netip.MustParseAddr("fd00:9::1")) {
			t.Error("the node's own address on x's veth is taken for an unknown pod's")
		}
		for _, c := range []struct {
			what string
			p    Packet
			want bool
		}{
			{"the unknown pod y to the outside", tcp("10.1.0.5", y, "192.168.1.50"), false},
			{"the outside to the unknown pod y", tcp("192.168.1.50", up, "10.1.0.5"), false},
			{"the isolated pod x to the outside", tcp("10.1.0.1", x, "192.168.1.50"), false},
			{"the VPN's peer to the outside", tcp("10.9.9.9", vpn, "192.168.1.50"), true},
			{"the outside to the VPN's peer", tcp("192.168.1.50", up, "10.9.9.9"), true},
			{"a host on the uplink's host route to the outside", tcp("192.168.1.9", up, "192.168.1.50"), true},
		} {
			if got := rs.Allows(c.p); got != c.want {
				t.Errorf("%s: allowed %v, want %v", c.what, got, c.want)
			}
		}
		// What the kernel holds: y's veth is a pod interface whose
		// address no pod owns, and y's address is an unknown one.
		out, err := exec.Command("nft", "list", "table", "inet", Table).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v: %s", err, out)
		}
		listed := string(out)
		for _, want := range []string{"10.1.0.5"} {
			if !strings.Contains(listed, want) {
				t.Errorf("table lacks %s:\n%s", want, listed)
			}
		}

		// The agent learns y: it is policed as any pod, isolated.
		s.RefreshLinks()
		if _, err := s.Sync(ctx, compileYAML(t, noPodCIDRsCluster+podY)); err != nil {
			t.Fatal(err)
		}
		rs = s.Applied()
		if rs.Allows(tcp("10.1.0.5", y, "192.168.1.50")) || rs.Allows(tcp("192.168.1.50", up, "10.1.0.5")) {
			t.Error("y, known and isolated, is reachable or reaches out")
		}
		if a := netip.MustParseAddr("10.1.0.5"); rs.forgedOn(y, a) || rs.spoofed(a) || rs.unknownDst(a) {
			t.Error("y, known, is still taken for an unknown address")
		}
	})
}

// TestKernelRouteWatchRefreshesLinks: on a node without pod CIDRs, a host
// route added for a new pod makes the Syncer's route watch ask for a sync
// at once, and that sync fails the pod closed (its Unknown link), instead
// of waiting for the periodic LinkRefresh or for the pod's address to reach
// the agent. Routes that are no host routes do not ask.
func TestKernelRouteWatchRefreshesLinks(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ip := func(args ...string) {
			t.Helper()
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
		ip("link", "add", "veth-y", "type", "veth", "peer", "name", "veth-y-p")
		ip("link", "set", "veth-y", "up")
		ip("link", "set", "veth-y-p", "up")
		nft, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		s := New(nft, Options{Node: "n1"})
		prog := compileYAML(t, noPodCIDRsCluster)
		if _, err := s.Sync(ctx, prog); err != nil {
			t.Fatal(err)
		}
		changed := make(chan struct{}, 16)
		if err := s.WatchRoutes(ctx, func() { changed <- struct{}{} }, func(err error) { t.Errorf("route watch failed: %v", err) }); err != nil {
			t.Fatal(err)
		}
		ip("route", "add", "10.7.0.0/24", "dev", "veth-y")
		ip("route", "add", "10.1.0.5/32", "dev", "veth-y")
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatal("no change reported for the new host route")
		}
		// The sync the change asks for (nothing else changed) resolves
		// the links again and fails the new pod closed.
		res, err := s.Sync(ctx, prog)
		if err != nil || res.Reused {
			t.Fatalf("Sync after the route change: %+v, %v (want the link sets patched)", res, err)
		}
		y, err := net.InterfaceByName("veth-y")
		if err != nil {
			t.Fatal(err)
		}
		tcp := Packet{Src: netip.MustParseAddr("10.1.0.5"), Dst: netip.MustParseAddr("192.168.1.50"), Proto: policy.ProtoTCP, Port: 80, InIf: y.Index}
		if s.Applied().Allows(tcp) {
			t.Error("the new pod's connection is allowed after the sync the route watch asked for")
		}
		if len(changed) > 1 {
			t.Errorf("%d changes reported; only the host route's expected", len(changed)+1)
		}
	})
}

// BenchmarkResolveLinksWithoutPodCIDRs: what finding pods the agent does
// not know yet adds to a resolution of the pod links on a node without
// pod CIDRs (NetlinkLinks: one dump of the main routing table, and a link
// lookup per interface of an unknown host route), against the same
// resolution with pod CIDRs (the per-address lookups alone). A full node:
// 220 pods, each a host route through its own veth; one more veth with a
// host route no known pod holds. Alternating in each iteration; CPU as in
// BenchmarkReadCounters.
func BenchmarkResolveLinksWithoutPodCIDRs(b *testing.B) {
	leave := enterPrivateNetns(b)
	defer leave()
	ip := func(args ...string) {
		b.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			b.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	const pods = 220
	var batch strings.Builder
	q := LinkQuery{NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}
	for i := 0; i <= pods; i++ {
		fmt.Fprintf(&batch, "link add v%d type veth peer name v%dp\nlink set v%d up\nlink set v%dp up\n", i, i, i, i)
		a := netip.AddrFrom4([4]byte{10, 1, byte(i / 250), byte(1 + i%250)})
		fmt.Fprintf(&batch, "route add %s/32 dev v%d\n", a, i)
		if i < pods {
			q.Addrs = append(q.Addrs, a)
		}
	}
	f := filepath.Join(b.TempDir(), "batch")
	if err := os.WriteFile(f, []byte(batch.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	ip("-batch", f)
	ctx := context.Background()
	withCIDRs := q
	withCIDRs.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	queries := []struct {
		name    string
		q       LinkQuery
		unknown int
	}{{"with-podcidrs", withCIDRs, 0}, {"without-podcidrs", q, 1}}
	var wall, cpu [2]time.Duration
	n := 0
	for b.Loop() {
		for i, c := range queries {
			c0 := cpuTime(b)
			t0 := time.Now()
			links, err := NetlinkLinks{}.ResolveLinks(ctx, c.q)
			wall[i] += time.Since(t0)
			cpu[i] += cpuTime(b) - c0
			if err != nil {
				b.Fatal(err)
			}
			unknown := 0
			for _, l := range links {
				if l.Unknown {
					unknown++
				}
			}
			if len(links) != pods+c.unknown || unknown != c.unknown {
				b.Fatalf("%s: %d links (%d unknown), want %d (%d unknown)", c.name, len(links), unknown, pods+c.unknown, c.unknown)
			}
		}
		n++
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	for i, c := range queries {
		b.ReportMetric(ms(wall[i]), c.name+"-ms/op")
		b.ReportMetric(ms(cpu[i]), c.name+"-cpu-ms/op")
	}
}
