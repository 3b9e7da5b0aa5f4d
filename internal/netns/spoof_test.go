package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Real packets through the agent's rules in a routed node (spoofLab): the
// node's namespace (moat's table, forwarding on), a pod behind a veth and
// a host outside behind another. These tests check the holes an
// adversarial review found (forged sources), so each sends the packet the
// rules must stop and, after it on the same path, a packet they let
// through: when the second arrives, the first has been judged.

// TestForgedNodeAddressFromOutside: the node-local exemption is for
// connections the node starts. A packet from outside forging the node's
// IPv6 address (the kernel drops the IPv4 martian itself) does not reach
// an ingress-isolated pod; the node's own packet from that address does.
func TestForgedNodeAddressFromOutside(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-fna-")
	program(t, l.r, spoofCluster, policy.Options{})
	ls := listen(t, l.p, "udp", 9999, 9998)
	// The first packet resolves the neighbours on the way, so that the
	// next two are not held in neighbour queues, whose order is not kept.
	send(t, l.c, ap("[fd00:1::2]:40000"), ap("[fd00:244::5]:9998"), "warm-up")
	receiveUntil(t, ls[1])
	send(t, l.c, ap("[fd00:1::1]:40000"), ap("[fd00:244::5]:9999"), "forged")
	send(t, l.c, ap("[fd00:1::2]:40000"), ap("[fd00:244::5]:9998"), "allowed")
	got, before := receiveUntil(t, ls[1], ls[0])
	t.Logf("pod received %q", got)
	if len(before) > 0 {
		t.Errorf("the isolated pod received %v: a forged node address from outside passed as node-local", before)
	}
	// The node itself, from the same address: node-local, allowed.
	send(t, l.r, ap("[fd00:1::1]:40001"), ap("[fd00:244::5]:9999"), "node")
	send(t, l.r, ap("192.168.1.1:40001"), ap("10.244.0.5:9999"), "node4")
	for _, want := range []string{"node from fd00:1::1", "node4 from 192.168.1.1"} {
		if got, _ := receiveUntil(t, ls[0]); got != want {
			t.Errorf("pod received %q, want %q (node-local traffic)", got, want)
		}
	}
}

// TestForgedPodSourceEgress: a pod under deny-all egress (but for one
// port) that forges a source address in the node's pod CIDR, which no pod
// owns, does not get out: its packet is dropped as spoofed, not let
// through because no egress chain is keyed by that address.
func TestForgedPodSourceEgress(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-fps-")
	dp := program(t, l.r, spoofCluster, policy.Options{})
	// The node's own reverse path filter would drop the forged IPv4
	// source only in strict mode on some setups; keep it off so that
	// only the rules decide (the review reproduced the hole with 1 too).
	for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.rp0.rp_filter"} {
		if err := l.r.Sysctl(k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	// The pod holds the forged addresses, as a raw socket would send them.
	run(t, "-n "+l.p.Name()+" addr add 10.244.0.77/32 dev eth0", "-n "+l.p.Name()+" addr add fd00:244::77/128 dev eth0 nodad")
	ls := listen(t, l.c, "udp", 9999, 9998)
	for _, fam := range []struct{ honest, forged, dst string }{
		{"10.244.0.5", "10.244.0.77", "192.168.1.2"},
		{"[fd00:244::5]", "[fd00:244::77]", "[fd00:1::2]"},
	} {
		send(t, l.p, ap(fam.honest+":40000"), ap(fam.dst+":9998"), "warm-up")
		receiveUntil(t, ls[1])
		send(t, l.p, ap(fam.forged+":40000"), ap(fam.dst+":9999"), "forged")
		send(t, l.p, ap(fam.honest+":40000"), ap(fam.dst+":9998"), "allowed")
		got, before := receiveUntil(t, ls[1], ls[0])
		t.Logf("outside host received %q", got)
		if len(before) > 0 {
			t.Errorf("outside host received %v: a forged source escaped deny-all egress", before)
		}
	}
	if n := dropped(t, dp, nft.ReasonSpoofed); n != 2 {
		t.Errorf("%d packets dropped as spoofed, want 2 (one forged packet per family)", n)
	}
}

const bridgeCluster = nodeN1V4 + namespaceA + `---
apiVersion: v1
kind: Pod
metadata: {name: victim, namespace: a, labels: {app: victim}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {phase: Running, podIP: 10.244.0.5}
---
apiVersion: v1
kind: Pod
metadata: {name: other, namespace: a, labels: {app: other}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {phase: Running, podIP: 10.244.0.6}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-victim, namespace: a}
spec:
  podSelector: {matchLabels: {app: victim}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: other}}}]
    ports: [{protocol: UDP, port: 9998}]
`

// TestBridgeLinkLocalToIsolatedPod: on a bridge CNI (pods' veths in one
// bridge, br_netfilter on), a pod's TCP connection to an ingress-isolated
// pod's IPv6 link-local address, in an IPv4-only cluster, is dropped;
// before, no ingress map held the address and the base chain accepted it.
func TestBridgeLinkLocalToIsolatedPod(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	r, v, o := newNS(t, "moat-br-r"), newNS(t, "moat-br-v"), newNS(t, "moat-br-o")
	for _, ns := range []*NS{v, o} {
		// Link-local addresses usable at once (no duplicate detection).
		if err := ns.Sysctl("net.ipv6.conf.default.accept_dad", "0"); err != nil {
			t.Fatal(err)
		}
	}
	for _, kv := range [][2]string{{"net.bridge.bridge-nf-call-iptables", "1"}, {"net.bridge.bridge-nf-call-ip6tables", "1"}} {
		if err := r.Sysctl(kv[0], kv[1]); err != nil {
			// Without br_netfilter nftables never sees bridged frames, so
			// the check the bridge-CNI requirement (docs/agent.md) relies
			// on would go untested: under CI a failure, not a skip.
			testenv.Require(t, fmt.Sprintf("br_netfilter (modprobe br_netfilter; setting %s: %v)", kv[0], err))
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
	dp := program(t, r, bridgeCluster, policy.Options{})
	ll := linkLocal(t, v)
	listenTCP(t, v, "tcp", net.TCPAddr{Port: 8080})
	ls := listen(t, v, "udp", 9998)
	send(t, o, ap("10.244.0.6:40000"), ap("10.244.0.5:9998"), "warm-up")
	receiveUntil(t, ls[0])
	// A SYN to the link-local address, without waiting for the answer.
	var fd int
	if err := o.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return err
		}
		err = unix.Connect(fd, &unix.SockaddrInet6{Port: 8080, Addr: ll.As16(), ZoneId: uint32(ifIndex(t, "eth0"))})
		if err == unix.EINPROGRESS {
			return nil
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// And a datagram to the subnet broadcast, which no ingress map holds.
	bcast := listen(t, v, "udp4", 9999)
	if err := o.Do(func() error {
		d := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1)
			}); err != nil {
				return err
			}
			return serr
		}}
		c, err := d.ListenPacket(context.Background(), "udp4", "10.244.0.6:0")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.WriteTo([]byte("broadcast"), &net.UDPAddr{IP: net.IPv4(10, 244, 0, 255), Port: 9999})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	send(t, o, ap("10.244.0.6:40000"), ap("10.244.0.5:9998"), "allowed")
	if _, before := receiveUntil(t, ls[0], bcast[0]); len(before) > 0 {
		t.Errorf("the isolated pod received %v over the bridge", before)
	}
	if n := dropped(t, dp, nft.ReasonLinkScope); n < 2 {
		t.Errorf("%d link-scope drops counted, want 2 or more: the SYN from the other pod to %s%%eth0 or its broadcast was let through the bridge", n, ll)
	}
}

// linkLocal waits for the IPv6 link-local address of eth0 in ns (the
// kernel adds it when the link comes up; no duplicate detection here).
func linkLocal(t *testing.T, ns *NS) netip.Addr {
	t.Helper()
	for range 1000 {
		var found netip.Addr
		if err := ns.Do(func() error {
			ifi, err := net.InterfaceByName("eth0")
			if err != nil {
				return err
			}
			addrs, err := ifi.Addrs()
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Is6() && ip.IsLinkLocalUnicast() {
						found = ip
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if found.IsValid() {
			return found
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("eth0 got no link-local address")
	return netip.Addr{}
}

// ifIndex is the index of the interface name in the calling thread's
// namespace.
func ifIndex(t *testing.T, name string) int {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return ifi.Index
}

// orphanCluster: node n1 with pod CIDRs and its one pod p, no policy at
// all: the spoof check is the only rule that can drop anything.
const orphanCluster = spoofNode + namespaceA + podPDual

// TestOrphanTableUntilRemoved: a table no agent updates any more (the
// agents were deleted, or a new agent image cannot start) keeps the pod
// sets of its last sync, so a pod that starts afterwards is an unknown
// source in the pod CIDR and its traffic is dropped as spoofed, with no
// policy in the cluster. That is the documented fail-closed behaviour
// (docs/agent.md, "While the agent is down"); Remove, which moat-agent
// --cleanup runs at uninstall, deletes the table and the new pod's packets
// pass.
func TestOrphanTableUntilRemoved(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-orp-")
	dp := program(t, l.r, orphanCluster, policy.Options{})
	// The agent is gone; the kubelet starts a pod at 10.244.0.9 (here the
	// same veth gets the address, as the new pod's veth would).
	run(t, "-n "+l.p.Name()+" addr add 10.244.0.9/24 dev eth0")
	ls := listen(t, l.c, "udp", 9999, 9998)
	send(t, l.p, ap("10.244.0.5:40000"), ap("192.168.1.2:9998"), "warm-up")
	receiveUntil(t, ls[1])
	send(t, l.p, ap("10.244.0.9:40000"), ap("192.168.1.2:9999"), "new pod")
	send(t, l.p, ap("10.244.0.5:40000"), ap("192.168.1.2:9998"), "known pod")
	got, before := receiveUntil(t, ls[1], ls[0])
	t.Logf("with the orphan table the outside host received %q, before it %v", got, before)
	if len(before) > 0 {
		t.Errorf("the new pod's packet passed a table that does not know it: %v", before)
	}
	if n := dropped(t, dp, nft.ReasonSpoofed); n != 1 {
		t.Errorf("%d packets dropped as spoofed, want 1 (the new pod's)", n)
	}

	if err := dp.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	send(t, l.p, ap("10.244.0.9:40000"), ap("192.168.1.2:9999"), "new pod")
	send(t, l.p, ap("10.244.0.5:40000"), ap("192.168.1.2:9998"), "known pod")
	got, before = receiveUntil(t, ls[1], ls[0])
	t.Logf("after Remove the outside host received %q, before it %v", got, before)
	if len(before) != 1 || before[0] != "new pod from 10.244.0.9" {
		t.Errorf("after Remove the new pod's packet did not arrive: %v", before)
	}
	// Remove again: a node without the table is not an error (--cleanup
	// may run twice on a node).
	if err := dp.Remove(context.Background()); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}
