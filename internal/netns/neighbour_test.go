package netns

import (
	"context"
	"net"
	"net/netip"
	"testing"

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
		send(t, l.p, port(f.p, 40000), port(f.c, 9998), "warm-up")
		receiveUntil(t, atC)
		send(t, l.p, port(f.p, 40000), port(f.v, 9998), "warm-up")
		receiveUntil(t, atV)
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
