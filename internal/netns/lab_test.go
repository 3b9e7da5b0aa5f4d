package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// What the packet tests share: namespaces that remove themselves, the
// routed node lab (spoofLab), the clusters its node is programmed with,
// and the probes that send, receive and count drops. Each packet test
// sends the packet the rules must judge and, after it on the same path, a
// packet they let through: when the second arrives, the first has been
// judged.

// The documents the test clusters are made of, joined in order: a node,
// namespace a, then pods and policies, each document after the first
// starting with "---". nodeN1V4 is node n1 listing its IPv4 address
// alone, without pod CIDRs; podPV4 is pod p at 10.244.0.5 and podPDual
// the same pod also at fd00:244::5.
const (
	nodeN1V4 = `apiVersion: v1
kind: Node
metadata: {name: n1}
status:
  addresses:
  - {type: InternalIP, address: 192.168.1.1}
`
	namespaceA = `---
apiVersion: v1
kind: Namespace
metadata: {name: a}
`
	podPV4 = `---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {app: p}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {phase: Running, podIP: 10.244.0.5}
`
	podPDual = `---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {app: p}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status:
  phase: Running
  podIP: 10.244.0.5
  podIPs: [{ip: 10.244.0.5}, {ip: "fd00:244::5"}]
`
)

// spoofNode is node n1 as spoofLab has it: its pod CIDRs and addresses
// of both families.
const spoofNode = `apiVersion: v1
kind: Node
metadata: {name: n1}
spec: {podCIDRs: ["10.244.0.0/24", "fd00:244::/64"]}
status:
  addresses:
  - {type: InternalIP, address: 192.168.1.1}
  - {type: InternalIP, address: "fd00:1::1"}
`

// spoofCluster: pod p of n1, ingress- and egress-isolated but for UDP
// 9998 to and from the outside host C, in spoofLab's addresses.
const spoofCluster = spoofNode + namespaceA + podPDual + `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{ipBlock: {cidr: "fd00:1::2/128"}}, {ipBlock: {cidr: "192.168.1.2/32"}}]
    ports: [{protocol: UDP, port: 9998}]
  egress:
  - to: [{ipBlock: {cidr: "192.168.1.2/32"}}, {ipBlock: {cidr: "fd00:1::2/128"}}]
    ports: [{protocol: UDP, port: 9998}]
`

// newNS creates the namespace name, closed and deleted when the test
// ends.
func newNS(t testing.TB, name string) *NS {
	t.Helper()
	ns, err := Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := Delete(ns.Name()); err != nil {
			t.Error(err)
		}
	})
	return ns
}

// spoofLab is the topology: node R (192.168.1.1, fd00:1::1 towards the
// outside; 10.244.0.1, fd00:244::1 towards the pod), pod P (10.244.0.5,
// fd00:244::5) and outside host C (192.168.1.2, fd00:1::2). P and C may
// bind addresses they do not have, to forge sources.
type spoofLab struct {
	r, p, c *NS
	prefix  string
}

func newSpoofLab(t testing.TB, prefix string) *spoofLab {
	t.Helper()
	l := &spoofLab{r: newNS(t, prefix+"r"), p: newNS(t, prefix+"p"), c: newNS(t, prefix+"c"), prefix: prefix}
	r, p, c := l.r.Name(), l.p.Name(), l.c.Name()
	run(t,
		"-n "+r+" link set lo up", "-n "+p+" link set lo up", "-n "+c+" link set lo up",
		"-n "+r+" link add rp0 type veth peer name eth0 netns "+p,
		"-n "+r+" link add rc0 type veth peer name eth0 netns "+c,
		"-n "+r+" link set rp0 up", "-n "+r+" link set rc0 up",
		"-n "+p+" link set eth0 up", "-n "+c+" link set eth0 up",
		"-n "+r+" addr add 10.244.0.1/24 dev rp0", "-n "+r+" addr add fd00:244::1/64 dev rp0 nodad",
		"-n "+r+" addr add 192.168.1.1/24 dev rc0", "-n "+r+" addr add fd00:1::1/64 dev rc0 nodad",
		"-n "+p+" addr add 10.244.0.5/24 dev eth0", "-n "+p+" addr add fd00:244::5/64 dev eth0 nodad",
		"-n "+p+" route add default via 10.244.0.1", "-n "+p+" -6 route add default via fd00:244::1",
		"-n "+c+" addr add 192.168.1.2/24 dev eth0", "-n "+c+" addr add fd00:1::2/64 dev eth0 nodad",
		"-n "+c+" route add 10.244.0.0/24 via 192.168.1.1 src 192.168.1.2",
		"-n "+c+" -6 route add fd00:244::/64 via fd00:1::1 src fd00:1::2",
	)
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}} {
		if err := l.r.Sysctl(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	// C and P may bind addresses they do not hold, to forge sources.
	for _, ns := range []*NS{l.c, l.p} {
		for _, k := range []string{"net.ipv4.ip_nonlocal_bind", "net.ipv6.ip_nonlocal_bind"} {
			if err := ns.Sysctl(k, "1"); err != nil {
				t.Fatal(err)
			}
		}
	}
	return l
}

// addNeighbour adds a second pod V to the lab (10.244.0.6, fd00:244::6)
// behind a veth of its own, rv0, with host routes as a routed CNI (ptp,
// Calico) sets them up; P, behind the pod CIDR's subnet route on rp0,
// reaches it through the node. V may bind addresses it does not hold.
func (l *spoofLab) addNeighbour(t *testing.T) *NS {
	t.Helper()
	v := newNS(t, l.prefix+"v")
	// V's link-local address usable at once, for its IPv6 default route.
	if err := v.Sysctl("net.ipv6.conf.default.accept_dad", "0"); err != nil {
		t.Fatal(err)
	}
	R, P, V := l.r.Name(), l.p.Name(), v.Name()
	run(t,
		"-n "+V+" link set lo up",
		"-n "+R+" link add rv0 type veth peer name eth0 netns "+V,
		"-n "+R+" link set rv0 up", "-n "+V+" link set eth0 up",
		"-n "+R+" addr add 10.244.0.1/32 dev rv0", "-n "+R+" addr add fe80::1/64 dev rv0 nodad",
		"-n "+R+" route add 10.244.0.6/32 dev rv0", "-n "+R+" -6 route add fd00:244::6/128 dev rv0",
		"-n "+V+" addr add 10.244.0.6/32 dev eth0", "-n "+V+" addr add fd00:244::6/128 dev eth0 nodad",
		"-n "+V+" route add 10.244.0.1 dev eth0 scope link", "-n "+V+" route add default via 10.244.0.1 dev eth0",
		"-n "+V+" -6 route add default via fe80::1 dev eth0",
		"-n "+P+" route add 10.244.0.6/32 via 10.244.0.1", "-n "+P+" -6 route add fd00:244::6/128 via fd00:244::1",
	)
	for _, k := range []string{"net.ipv4.ip_nonlocal_bind", "net.ipv6.ip_nonlocal_bind"} {
		if err := v.Sysctl(k, "1"); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// run runs ip with each of cmds' words in turn.
func run(t testing.TB, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if out, err := exec.Command("ip", strings.Fields(c)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", c, err, out)
		}
	}
}

// nftIn loads ruleset with nft inside ns: the tables a test adds beside
// moat's (conntrack exemptions, helpers).
func nftIn(ns *NS, ruleset string) ([]byte, error) {
	cmd := exec.Command("ip", "netns", "exec", ns.Name(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	return cmd.CombinedOutput()
}

// compile loads the cluster's manifests and compiles them with opts.
func compile(t testing.TB, cluster string, opts policy.Options) *policy.Program {
	t.Helper()
	res, err := (&manifest.Loader{Stdin: strings.NewReader(cluster)}).Load("-")
	if err != nil {
		t.Fatal(err)
	}
	return policy.Compile(&res.Cluster, opts)
}

// program syncs the table of node n1 in ns with the cluster, compiled
// with opts.
func program(t *testing.T, ns *NS, cluster string, opts policy.Options) *nft.Syncer {
	t.Helper()
	dp, err := ns.Dataplane(nft.Options{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dp.Sync(context.Background(), compile(t, cluster, opts)); err != nil {
		t.Fatal(err)
	}
	return dp
}

// listen opens UDP sockets in ns on every address, one per port.
func listen(t testing.TB, ns *NS, network string, ports ...int) []*net.UDPConn {
	t.Helper()
	var out []*net.UDPConn
	err := ns.Do(func() error {
		for _, port := range ports {
			c, err := net.ListenUDP(network, &net.UDPAddr{Port: port})
			if err != nil {
				return err
			}
			out = append(out, c)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range out {
		t.Cleanup(func() { c.Close() })
	}
	return out
}

// listenTCP opens a TCP listener in ns, closed when the test ends.
func listenTCP(t *testing.T, ns *NS, network string, addr net.TCPAddr) *net.TCPListener {
	t.Helper()
	var l *net.TCPListener
	if err := ns.Do(func() error {
		var err error
		l, err = net.ListenTCP(network, &addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// send sends one UDP datagram from src to dst inside ns.
func send(t *testing.T, ns *NS, src, dst netip.AddrPort, msg string) {
	t.Helper()
	if err := sendUDP(ns, src, dst, msg, false); err != nil {
		t.Fatalf("send %s from %s to %s: %v", msg, src, dst, err)
	}
}

// trySend is send for a packet the node's own rules may drop: the output
// hook's drop fails the write (EPERM), which is not an error here.
func trySend(t *testing.T, ns *NS, src, dst netip.AddrPort, msg string) {
	t.Helper()
	if err := sendUDP(ns, src, dst, msg, true); err != nil {
		t.Fatalf("send %s from %s to %s: %v", msg, src, dst, err)
	}
}

// sendUDP sends one UDP datagram from src to dst inside ns; with mayDrop,
// a write the output hook dropped (EPERM) is no error.
func sendUDP(ns *NS, src, dst netip.AddrPort, msg string, mayDrop bool) error {
	return ns.Do(func() error {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(src), net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err = c.Write([]byte(msg)); mayDrop && errors.Is(err, syscall.EPERM) {
			return nil
		}
		return err
	})
}

// receiveUntil reads datagrams on marker until one arrives and returns
// it; what arrived on other sockets by then is in others. The deadline
// only keeps a broken test from hanging.
func receiveUntil(t *testing.T, marker *net.UDPConn, others ...*net.UDPConn) (got string, others_ []string) {
	t.Helper()
	buf := make([]byte, 256)
	if err := marker.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, from, err := marker.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("the allowed packet did not arrive: %v", err)
	}
	got = fmt.Sprintf("%s from %s", buf[:n], from.Addr().Unmap())
	for _, o := range others {
		// Whatever came before the marker is queued already: read
		// without waiting (a passed deadline would not even try).
		rc, err := o.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		for {
			var n int
			var from unix.Sockaddr
			var rerr error
			if err := rc.Read(func(fd uintptr) bool {
				n, from, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
				return true
			}); err != nil || rerr != nil {
				break
			}
			others_ = append(others_, fmt.Sprintf("%s from %s", buf[:n], sockaddrIP(from)))
		}
	}
	return got, others_
}

func sockaddrIP(sa unix.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap()
	}
	return netip.Addr{}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// dropped reads the node's drop counters and sums the packets of those
// with reason.
func dropped(t *testing.T, dp *nft.Syncer, reason string) uint64 {
	t.Helper()
	cs, err := dp.Counters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range cs {
		if c.Reason == reason {
			n += c.Packets
		}
	}
	return n
}
