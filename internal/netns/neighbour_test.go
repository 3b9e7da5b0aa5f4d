package netns

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Packets of one pod against another pod's flows, in spoofLab with its
// second pod (addNeighbour): a pod P whose egress allows only UDP 9998
// (to the outside host C and to pod V) forging its way into the
// connections of V, an ingress-isolated pod whose egress is open, and the
// outside host forging V. Each test sends the packets the rules must stop
// and, after them on the same path, one they let through.

// podVDual is pod v of spoofLab's addNeighbour.
const podVDual = `---
apiVersion: v1
kind: Pod
metadata: {name: v, namespace: a, labels: {app: v}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status:
  phase: Running
  podIP: 10.244.0.6
  podIPs: [{ip: 10.244.0.6}, {ip: "fd00:244::6"}]
`

// neighbourCluster: P may send UDP 9998 to C and to V, and receive UDP
// 9998 from C and UDP 9997 from V; V receives UDP 9998 and 9996 from C
// and UDP 9998 from P, and may send anything.
const neighbourCluster = spoofNode + namespaceA + podPDual + podVDual + `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec:
  podSelector: {matchLabels: {app: p}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{ipBlock: {cidr: "fd00:1::2/128"}}, {ipBlock: {cidr: "192.168.1.2/32"}}]
    ports: [{protocol: UDP, port: 9998}]
  - from: [{podSelector: {matchLabels: {app: v}}}]
    ports: [{protocol: UDP, port: 9997}]
  egress:
  - to: [{ipBlock: {cidr: "192.168.1.2/32"}}, {ipBlock: {cidr: "fd00:1::2/128"}}, {podSelector: {matchLabels: {app: v}}}]
    ports: [{protocol: UDP, port: 9998}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: v, namespace: a}
spec:
  podSelector: {matchLabels: {app: v}}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: "fd00:1::2/128"}}, {ipBlock: {cidr: "192.168.1.2/32"}}]
    ports: [{protocol: UDP, port: 9998}, {protocol: UDP, port: 9996}]
  - from: [{podSelector: {matchLabels: {app: p}}}]
    ports: [{protocol: UDP, port: 9998}]
`

// family holds spoofLab's addresses of one family.
type family struct {
	p, v, c, node netip.Addr
}

var families = []family{
	{p: netip.MustParseAddr("10.244.0.5"), v: netip.MustParseAddr("10.244.0.6"), c: netip.MustParseAddr("192.168.1.2"), node: netip.MustParseAddr("192.168.1.1")},
	{p: netip.MustParseAddr("fd00:244::5"), v: netip.MustParseAddr("fd00:244::6"), c: netip.MustParseAddr("fd00:1::2"), node: netip.MustParseAddr("fd00:1::1")},
}

func port(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }

// newNeighbourLab is spoofLab with pod V, programmed with cluster, the
// node's reverse path filter off (Moat does not rely on it; IPv6 has
// none) unless rpFilter says otherwise; it checks that the node resolved
// both pods' links.
func newNeighbourLab(t *testing.T, prefix, cluster, rpFilter string) (*spoofLab, *NS, *nft.Syncer) {
	t.Helper()
	l := newSpoofLab(t, prefix)
	v := l.addNeighbour(t)
	for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter", "net.ipv4.conf.rp0.rp_filter", "net.ipv4.conf.rv0.rp_filter", "net.ipv4.conf.rc0.rp_filter"} {
		if err := l.r.Sysctl(k, rpFilter); err != nil {
			t.Fatal(err)
		}
	}
	dp := program(t, l.r, cluster, policy.Options{})
	if r, err := dp.Sync(context.Background(), compile(t, cluster, policy.Options{})); err != nil || r.Links != 4 {
		t.Fatalf("sync: %d links, want 4 (P's addresses on rp0, V's on rv0): %v", r.Links, err)
	}
	return l, v, dp
}

// warmUp sends P's allowed datagram to C and to V (listening on atC and
// atV) and waits for both: the routes and neighbours are resolved before
// a test's first packet that must not arrive.
func warmUp(t *testing.T, l *spoofLab, f family, atC, atV *net.UDPConn) {
	t.Helper()
	send(t, l.p, port(f.p, 40000), port(f.c, 9998), "warm-up")
	receiveUntil(t, atC)
	send(t, l.p, port(f.p, 40000), port(f.v, 9998), "warm-up")
	receiveUntil(t, atV)
}

// openFlow has V send from V:5000 to C:7000 and C answer: the node then
// holds an established entry for the flow. It returns V's and C's
// sockets.
func openFlow(t *testing.T, l *spoofLab, v *NS, f family) (vs, cs *net.UDPConn) {
	t.Helper()
	network := "udp4"
	if f.v.Is6() {
		network = "udp6"
	}
	vs, cs = listen(t, v, network, 5000)[0], listen(t, l.c, network, 7000)[0]
	if _, err := vs.WriteToUDPAddrPort([]byte("request"), port(f.c, 7000)); err != nil {
		t.Fatal(err)
	}
	receiveUntil(t, cs)
	if _, err := cs.WriteToUDPAddrPort([]byte("reply"), port(f.v, 5000)); err != nil {
		t.Fatal(err)
	}
	receiveUntil(t, vs)
	return vs, cs
}

// TestForgedSourceInEstablishedFlow: P forges V's address and port to
// send into V's established UDP flow with C, and C's to send to V. Both
// are dropped as spoofed on arrival from P's interface, in both families;
// before, the pod-interface check came after the accept of established
// packets, so P reached C (against its egress) and V (against V's
// ingress) through V's flow.
func TestForgedSourceInEstablishedFlow(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l, v, dp := newNeighbourLab(t, "moat-efl-", neighbourCluster, "0")
	atC, atV := listen(t, l.c, "udp", 9998)[0], listen(t, v, "udp", 9998)[0]
	for _, f := range families {
		warmUp(t, l, f, atC, atV)
		vs, cs := openFlow(t, l, v, f)

		sendAs(t, l.p, port(f.v, 5000), port(f.c, 7000), "as V")
		send(t, l.p, port(f.p, 40000), port(f.c, 9998), "allowed")
		if _, got := receiveUntil(t, atC, cs); len(got) > 0 {
			t.Errorf("C received %v in V's flow from P", got)
		}
		sendAs(t, l.p, port(f.c, 7000), port(f.v, 5000), "as C")
		send(t, l.p, port(f.p, 40000), port(f.v, 9998), "allowed")
		if _, got := receiveUntil(t, atV, vs); len(got) > 0 {
			t.Errorf("V received %v in its flow with C from P", got)
		}
		// The flow itself goes on.
		if _, err := cs.WriteToUDPAddrPort([]byte("more"), port(f.v, 5000)); err != nil {
			t.Fatal(err)
		}
		if got, _ := receiveUntil(t, vs); got != "more from "+f.c.String() {
			t.Errorf("V received %q in its flow, want C's", got)
		}
	}
	if n := dropped(t, dp, nft.ReasonSpoofed); n != 4 {
		t.Errorf("%d packets dropped as spoofed, want 4 (two forged packets per family)", n)
	}
}

// TestOutsideHostForgesLocalPod: the outside host C sends with V's
// address to P, whose ingress allows V (UDP 9997) but not C: dropped as
// spoofed, V's address arriving elsewhere than on V's interface (IPv4
// with the loose reverse path filter several distributions set; IPv6
// has none). Before, it was judged as V's. V's own packet passes.
func TestOutsideHostForgesLocalPod(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l, v, dp := newNeighbourLab(t, "moat-ofl-", neighbourCluster, "2")
	ls := listen(t, l.p, "udp", 9997, 9998)
	for _, f := range families {
		send(t, l.c, port(f.c, 40000), port(f.p, 9998), "warm-up")
		receiveUntil(t, ls[1])
		send(t, v, port(f.v, 40000), port(f.p, 9997), "from V")
		if got, _ := receiveUntil(t, ls[0]); got != "from V from "+f.v.String() {
			t.Errorf("P received %q, want V's datagram", got)
		}
		sendAs(t, l.c, port(f.v, 40001), port(f.p, 9997), "as V from outside")
		send(t, l.c, port(f.c, 40000), port(f.p, 9998), "allowed")
		if _, got := receiveUntil(t, ls[1], ls[0]); len(got) > 0 {
			t.Errorf("P received %v: the outside host passed as V", got)
		}
	}
	if n := dropped(t, dp, nft.ReasonSpoofed); n != 2 {
		t.Errorf("%d packets dropped as spoofed, want 2 (one forged packet per family)", n)
	}
}

// tunnelCluster: node n2 with pod q, which alone may reach V's UDP 7777;
// P (no policy of its own) may reach V's UDP 9998.
const tunnelCluster = spoofNode + namespaceA + podPDual + podVDual + `---
apiVersion: v1
kind: Node
metadata: {name: n2}
spec: {podCIDRs: ["10.244.1.0/24"]}
status:
  addresses:
  - {type: InternalIP, address: 192.168.1.3}
---
apiVersion: v1
kind: Pod
metadata: {name: q, namespace: a, labels: {app: q}}
spec: {nodeName: n2, containers: [{name: c, image: x}]}
status: {phase: Running, podIP: 10.244.1.20}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: v, namespace: a}
spec:
  podSelector: {matchLabels: {app: v}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: q}}}]
    ports: [{protocol: UDP, port: 7777}]
  - from: [{podSelector: {matchLabels: {app: p}}}]
    ports: [{protocol: UDP, port: 9998}]
`

// TestTunnelFromPodToNode: the node has an overlay as flannel sets it up
// (VXLAN device on UDP 8472 taking packets from any source, a route to
// node n2's pod CIDR through it). P sends its node, at two of its
// addresses, a VXLAN packet whose inner packet claims to be q's, to V's
// UDP 7777, which only q may reach. The node decapsulated it and V took
// it as q's; now each is dropped on arrival from P's interface. So is
// P's VXLAN packet to node n2's address (here held by the outside host),
// which only this node can tell from its own tunnel traffic. P's direct
// packet to V:7777 is dropped as before, and P's VXLAN packet to the
// outside host, a tunnel that is no business of the nodes', arrives.
func TestTunnelFromPodToNode(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-tun-")
	v := l.addNeighbour(t)
	R := l.r.Name()
	run(t,
		"-n "+R+" link add vx0 type vxlan id 1 dstport 8472 local 192.168.1.1 dev rc0 nolearning",
		"-n "+R+" link set vx0 up", "-n "+R+" addr add 10.244.0.0/32 dev vx0",
		"-n "+R+" route add 10.244.1.0/24 via 10.244.1.0 dev vx0 onlink",
		"-n "+l.c.Name()+" addr add 192.168.1.3/24 dev eth0", // node n2's address
	)
	for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter", "net.ipv4.conf.vx0.rp_filter"} {
		if err := l.r.Sysctl(k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	dp := program(t, l.r, tunnelCluster, policy.Options{})
	if r, err := dp.Sync(context.Background(), compile(t, tunnelCluster, policy.Options{})); err != nil || r.Links != 4 {
		t.Fatalf("sync: %d links, want 4: %v", r.Links, err)
	}
	nl, err := l.r.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	vx, err := nl.LinkByName("vx0")
	if err != nil {
		t.Fatal(err)
	}
	ls := listen(t, v, "udp4", 7777, 9998)
	var outside, n2 *net.UDPConn
	if err := l.c.Do(func() error {
		var err error
		if outside, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(192, 168, 1, 2), Port: 8472}); err != nil {
			return err
		}
		t.Cleanup(func() { outside.Close() })
		n2, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(192, 168, 1, 3), Port: 8472})
		if err == nil {
			t.Cleanup(func() { n2.Close() })
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	p, q, vAddr := netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("10.244.1.20"), netip.MustParseAddr("10.244.0.6")
	send(t, l.p, port(p, 40000), port(vAddr, 9998), "warm-up")
	receiveUntil(t, ls[1])

	inner := func(msg string) []byte { return udpPacket(port(q, 40000), port(vAddr, 7777), []byte(msg)) }
	// VXLAN header (flags, VNI 1), then an Ethernet frame to vx0.
	frame := append([]byte{0x08, 0, 0, 0, 0, 0, 1, 0}, vx.Attrs().HardwareAddr...)
	frame = append(frame, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00)
	vxlan := append(frame, inner("as q through VXLAN")...)
	send(t, l.p, port(p, 40001), port(netip.MustParseAddr("10.244.0.1"), 8472), string(vxlan))
	send(t, l.p, port(p, 40001), port(netip.MustParseAddr("192.168.1.1"), 8472), string(vxlan))
	send(t, l.p, port(p, 40002), port(vAddr, 7777), "direct")
	send(t, l.p, port(p, 40000), port(vAddr, 9998), "allowed")
	if _, got := receiveUntil(t, ls[1], ls[0]); len(got) > 0 {
		t.Errorf("V received %v on the port only q may reach", got)
	}
	send(t, l.p, port(p, 40003), port(netip.MustParseAddr("192.168.1.3"), 8472), string(vxlan))
	send(t, l.p, port(p, 40003), port(netip.MustParseAddr("192.168.1.2"), 8472), string(vxlan))
	if _, got := receiveUntil(t, outside, n2); len(got) > 0 {
		t.Errorf("node n2's address received %d VXLAN packets from P", len(got))
	}
	if n := dropped(t, dp, nft.ReasonSpoofed); n != 3 {
		t.Errorf("%d packets dropped as spoofed, want 3 (the encapsulated ones to nodes)", n)
	}
}

// TestICMPErrorsAboutOthersFlows: P sends, from its own address, port
// unreachable errors quoting V's flow with C, with data after the quoted
// header: to C and to V. Conntrack relates both to the flow and checked
// only their destination; both are dropped now (P is no end of the flow),
// in both families. V's own error about C's datagram to a closed port
// still reaches C.
func TestICMPErrorsAboutOthersFlows(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l, v, dp := newNeighbourLab(t, "moat-ier-", neighbourCluster, "0")
	atC, atV := listen(t, l.c, "udp", 9998)[0], listen(t, v, "udp", 9998)[0]
	for _, f := range families {
		proto := unix.IPPROTO_ICMP
		if f.p.Is6() {
			proto = unix.IPPROTO_ICMPV6
		}
		warmUp(t, l, f, atC, atV)
		openFlow(t, l, v, f)
		rc, rv := newRawReceiver(t, l.c, f.p.Is4()), newRawReceiver(t, v, f.p.Is4())
		raw := newRawSender(t, l.p, f.p, proto)
		data := append([]byte("error from P"), make([]byte, 200)...)

		raw.send(t, f.c, portUnreachable(port(f.c, 7000), port(f.v, 5000), data))
		send(t, l.p, port(f.p, 40000), port(f.c, 9998), "allowed")
		receiveUntil(t, atC)
		if got := rc.seen("error from P"); len(got) > 0 {
			t.Errorf("C received P's ICMP error about V's flow, with P's data")
		}
		raw.send(t, f.v, portUnreachable(port(f.v, 5000), port(f.c, 7000), data))
		send(t, l.p, port(f.p, 40000), port(f.v, 9998), "allowed")
		receiveUntil(t, atV)
		if got := rv.seen("error from P"); len(got) > 0 {
			t.Errorf("V received P's ICMP error about its flow with C")
		}

		// V's kernel answers C's datagram to its closed port 9996.
		send(t, l.c, port(f.c, 40002), port(f.v, 9996), "to a closed port")
		deadline := time.Now().Add(10 * time.Second)
		for len(rc.seen("to a closed port")) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("V's port unreachable about C's datagram to %s did not reach C", port(f.v, 9996))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if n := dropped(t, dp, nft.ReasonSpoofed); n != 4 {
		t.Errorf("%d packets dropped as spoofed, want 4 (two errors per family)", n)
	}
}

// TestRoutedNeighbourDiscovery: P sends neighbour solicitations and
// advertisements with data, at hop limit 255, to C's and V's routable
// addresses; the node routes them (hop limit 254), and forward drops them
// as link scope: before, it accepted neighbour discovery from anyone to
// anyone, a channel out of any egress policy and into any isolated pod.
// The node itself no longer takes a solicitation whose hop limit is not
// 255; one at 255 on the pod's link still reaches it (link
// infrastructure, which no rule can tell from a message with data).
func TestRoutedNeighbourDiscovery(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l, v, dp := newNeighbourLab(t, "moat-rnd-", neighbourCluster, "0")
	f := families[1]
	atC, atV := listen(t, l.c, "udp6", 9998)[0], listen(t, v, "udp6", 9998)[0]
	warmUp(t, l, f, atC, atV)
	rc, rv, rr := newRawReceiver(t, l.c, false), newRawReceiver(t, v, false), newRawReceiver(t, l.r, false)
	onLink := newRawSender(t, l.p, f.p, unix.IPPROTO_ICMPV6)
	onLink.hopLimit(t, 255)
	nd := func(typ byte, target netip.Addr, data string) []byte {
		return icmpMessage(false, typ, 0, append(append(make([]byte, 4), target.AsSlice()...), data...))
	}
	for _, dst := range []struct {
		addr   netip.Addr
		raw    *rawReceiver
		marker *net.UDPConn
	}{{f.c, rc, atC}, {f.v, rv, atV}} {
		onLink.send(t, dst.addr, nd(135, dst.addr, "solicitation"))
		onLink.send(t, dst.addr, nd(136, dst.addr, "advertisement"))
		send(t, l.p, port(f.p, 40000), port(dst.addr, 9998), "allowed")
		receiveUntil(t, dst.marker)
		if got := dst.raw.seen("solicitation", "advertisement"); len(got) > 0 {
			t.Errorf("%s received P's routed neighbour discovery: %v", dst.addr, got)
		}
	}
	routed := newRawSender(t, l.p, f.p, unix.IPPROTO_ICMPV6)
	routed.hopLimit(t, 64)
	routed.send(t, f.node, nd(135, f.node, "hop limit 64"))
	onLink.send(t, f.node, nd(135, f.node, "hop limit 255"))
	deadline := time.Now().Add(10 * time.Second)
	var got []string
	for !slices.Contains(got, "hop limit 255") {
		if time.Now().After(deadline) {
			t.Fatal("the node did not receive P's on-link neighbour solicitation")
		}
		time.Sleep(10 * time.Millisecond)
		got = append(got, rr.seen("hop limit 64", "hop limit 255")...)
	}
	if slices.Contains(got, "hop limit 64") {
		t.Error("the node received P's neighbour solicitation at hop limit 64")
	}
	if n := dropped(t, dp, nft.ReasonLinkScope); n != 5 {
		t.Errorf("%d packets dropped as link scope, want 5 (four routed, one to the node)", n)
	}
}

// TestBridgePodsKeepTheirFlows: on a bridge CNI with br_netfilter, where
// forward sees the bridge as the incoming interface of bridged frames,
// the pod-interface checks that now judge every packet (and a local pod's
// address arriving elsewhere than on its own interface) leave the pods'
// own traffic alone: a new flow between two pods of the bridge and its
// replies pass, nothing is dropped as spoofed, and a forged source from
// outside the bridge's pods is still dropped.
func TestBridgePodsKeepTheirFlows(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	r, v, o := newNS(t, "moat-brf-r"), newNS(t, "moat-brf-v"), newNS(t, "moat-brf-o")
	for _, kv := range [][2]string{{"net.bridge.bridge-nf-call-iptables", "1"}, {"net.bridge.bridge-nf-call-ip6tables", "1"}} {
		if err := r.Sysctl(kv[0], kv[1]); err != nil {
			testenv.Require(t, "br_netfilter (modprobe br_netfilter; setting "+kv[0]+": "+err.Error()+")")
		}
	}
	R, V, O := r.Name(), v.Name(), o.Name()
	run(t,
		"-n "+R+" link add br0 type bridge", "-n "+R+" link set br0 up",
		"-n "+R+" addr add 10.244.0.1/24 dev br0",
		"-n "+V+" link add eth0 type veth peer name rv0 netns "+R,
		"-n "+O+" link add eth0 type veth peer name ro0 netns "+R,
		"-n "+R+" link set rv0 master br0", "-n "+R+" link set ro0 master br0",
		"-n "+R+" link set rv0 up", "-n "+R+" link set ro0 up",
		"-n "+V+" link set lo up", "-n "+O+" link set lo up",
		"-n "+V+" link set eth0 up", "-n "+O+" link set eth0 up",
		"-n "+V+" addr add 10.244.0.5/24 dev eth0", "-n "+O+" addr add 10.244.0.6/24 dev eth0",
	)
	// bridgeCluster's node with pod CIDRs: the bridge's subnet route is
	// inside them, so the node resolves both pods' links to the bridge.
	cluster := strings.Replace(bridgeCluster, "metadata: {name: n1}\n", "metadata: {name: n1}\nspec: {podCIDRs: [\"10.244.0.0/24\"]}\n", 1)
	dp := program(t, r, cluster, policy.Options{})
	if res, err := dp.Sync(context.Background(), compile(t, cluster, policy.Options{})); err != nil || res.Links != 2 {
		t.Fatalf("sync: %d links, want 2 (both pods on br0): %v", res.Links, err)
	}
	atV, atO := listen(t, v, "udp4", 9998, 9999), listen(t, o, "udp4", 40000)[0]
	if _, err := atO.WriteToUDPAddrPort([]byte("request"), ap("10.244.0.5:9998")); err != nil {
		t.Fatal(err)
	}
	if got, _ := receiveUntil(t, atV[0]); got != "request from 10.244.0.6" {
		t.Fatalf("the victim received %q", got)
	}
	for range 3 {
		if _, err := atV[0].WriteToUDPAddrPort([]byte("reply"), ap("10.244.0.6:40000")); err != nil {
			t.Fatal(err)
		}
		if got, _ := receiveUntil(t, atO); got != "reply from 10.244.0.5" {
			t.Fatalf("the other pod received %q", got)
		}
	}
	sendAs(t, o, ap("10.244.0.77:40001"), ap("10.244.0.5:9999"), "forged")
	if _, err := atO.WriteToUDPAddrPort([]byte("allowed"), ap("10.244.0.5:9998")); err != nil {
		t.Fatal(err)
	}
	if _, got := receiveUntil(t, atV[0], atV[1]); len(got) > 0 {
		t.Errorf("the victim received %v from a source no pod of the bridge holds", got)
	}
	if n := dropped(t, dp, nft.ReasonSpoofed); n != 1 {
		t.Errorf("%d packets dropped as spoofed, want 1 (the forged one)", n)
	}
}
