package nft

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// counterPods: a may not reach b (Admin Deny on a's egress); c is
// isolated for ingress by a NetworkPolicy without rules.
const counterPods = `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
spec: {nodeName: n1}
status: {podIP: 10.0.1.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: x, labels: {app: b}}
spec: {nodeName: n1}
status: {podIP: 10.0.1.2}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: other, labels: {app: c}}
spec: {nodeName: n1}
status: {podIP: 10.0.1.3}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: c-closed, namespace: other}
spec: {podSelector: {matchLabels: {app: c}}, policyTypes: [Ingress]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: a-not-b}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: a}}}}
  egress:
  - name: allow-dns
    action: Accept
    to: [{networks: ["192.0.2.53/32"]}]
  - name: no-b
    action: Deny
    to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: b}}}}]
`

// counterPodsMore adds a pod b2 on n2 to counterPods: a new peer address,
// which n1's table takes in a patch of set elements.
const counterPodsMore = counterPods + `---
apiVersion: v1
kind: Pod
metadata: {name: b2, namespace: x, labels: {app: b}}
spec: {nodeName: n2}
status: {podIP: 10.0.1.4}
`

// addLoopbackAddrs brings lo up in the current (private) namespace and
// gives it the pods' addresses, so that packets between them cross the
// output hook like pod traffic crosses forward.
func addLoopbackAddrs(t *testing.T, addrs ...string) {
	t.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatalf("lo: %v", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatalf("lo up: %v", err)
	}
	for _, a := range addrs {
		addr, err := netlink.ParseAddr(a + "/32")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.AddrAdd(lo, addr); err != nil {
			t.Fatalf("add %s to lo: %v", a, err)
		}
	}
}

// sendUDP sends n datagrams of size bytes from src to dst:9. Drops in the
// output hook surface as send errors, which are the point here.
func sendUDP(t *testing.T, src, dst string, n, size int) {
	t.Helper()
	c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(src), 0)),
		net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(dst), 9)))
	if err != nil {
		t.Fatalf("udp %s -> %s: %v", src, dst, err)
	}
	defer c.Close()
	buf := make([]byte, size)
	for i := 0; i < n; i++ {
		_, _ = c.Write(buf)
	}
}

// sameAsNFT checks that the netlink reading of every counter of the
// table, in the calling thread's namespace and through the namespace's
// descriptor from a thread outside it, equals what nft lists.
func sameAsNFT(t *testing.T, step string, iface knftables.Interface) {
	t.Helper()
	ctx := context.Background()
	want, err := NFTCounters{NFT: iface}.ReadCounters(ctx)
	if err != nil {
		t.Fatalf("%s: nft reading: %v", step, err)
	}
	if len(want) == 0 {
		t.Fatalf("%s: nft lists no counters", step)
	}
	got, err := NetlinkCounters{}.ReadCounters(ctx)
	if err != nil {
		t.Fatalf("%s: netlink reading: %v", step, err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("%s: netlink reading differs from nft's:\n netlink %v\n nft     %v", step, got, want)
	}
	ns, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	type reading struct {
		got map[string]CounterValue
		err error
	}
	done := make(chan reading)
	go func() { // an unlocked goroutine: not on this namespace's thread
		got, err := NetlinkCounters{NetNS: int(ns)}.ReadCounters(ctx)
		done <- reading{got, err}
	}()
	if r := <-done; r.err != nil || !maps.Equal(r.got, want) {
		t.Errorf("%s: netlink reading through the namespace's descriptor: %v, %v; nft lists %v", step, r.got, r.err, want)
	}
}

func TestKernelDropCounters(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		addLoopbackAddrs(t, "10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.4")
		nft, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := (NetlinkCounters{}).ReadCounters(ctx); err != nil || len(got) != 0 {
			t.Fatalf("netlink reading without a table: %v, %v; want no counters, no error", got, err)
		}
		s := New(nft, Options{Node: "n1"})
		if _, err := s.Sync(ctx, compileYAML(t, counterPods)); err != nil {
			t.Fatalf("sync: %v", err)
		}
		read := func(step string) (deny, iso *DropCounter) {
			t.Helper()
			sameAsNFT(t, step, nft)
			cs, err := s.Counters(ctx)
			if err != nil {
				t.Fatalf("%s: counters: %v", step, err)
			}
			deny = findCounter(cs, "a-not-b", "egress", 1, ReasonDeny)
			iso = findCounter(cs, "c-closed", "ingress", -1, ReasonIsolation)
			if deny == nil || iso == nil {
				t.Fatalf("%s: no counter for a-not-b egress[1] or c-closed isolation in %+v", step, cs)
			}
			return deny, iso
		}
		if d, i := read("before traffic"); d.Packets != 0 || i.Packets != 0 {
			t.Fatalf("counters start at %d and %d packets, want 0", d.Packets, i.Packets)
		}

		// 100-byte payloads: 128-byte IPv4 packets.
		sendUDP(t, "10.0.1.1", "10.0.1.2", 3, 100) // Admin Deny
		sendUDP(t, "10.0.1.2", "10.0.1.3", 2, 100) // isolation
		sendUDP(t, "10.0.1.2", "10.0.1.1", 4, 100) // allowed: counts nowhere
		d, i := read("after probes")
		if d.Packets != 3 || d.Bytes != 3*128 {
			t.Errorf("Deny counter: %d packets, %d bytes; want 3, 384", d.Packets, d.Bytes)
		}
		if i.Packets != 2 || i.Bytes != 2*128 {
			t.Errorf("isolation counter: %d packets, %d bytes; want 2, 256", i.Packets, i.Bytes)
		}
		if d.Tier != policy.TierAdmin {
			t.Errorf("Deny counter tier %q", d.Tier)
		}

		// A new pod b2 joins the Deny rule's peers: an element-only
		// patch, which must not reset the counts.
		tx := nft.NewTransaction()
		diffTransaction(tx, s.Applied(), Build(compileYAML(t, counterPodsMore), "n1"))
		for _, line := range strings.Split(strings.TrimSpace(tx.String()), "\n") {
			if !strings.Contains(line, " element ") {
				t.Errorf("new peer pod patch touches more than elements: %q", line)
			}
		}
		res, err := s.Sync(ctx, compileYAML(t, counterPodsMore))
		if err != nil || res.Full || res.Operations == 0 {
			t.Fatalf("patch: %+v, %v", res, err)
		}
		if d, i := read("after patch"); d.Packets != 3 || i.Packets != 2 {
			t.Errorf("after an element-only patch: %d and %d packets, want 3 and 2", d.Packets, i.Packets)
		}
		sendUDP(t, "10.0.1.1", "10.0.1.4", 1, 100) // the new peer, same rule
		if d, _ := read("after probe to new peer"); d.Packets != 4 {
			t.Errorf("Deny counter after a drop to the new peer: %d packets, want 4", d.Packets)
		}

		// A full replace (periodic resync, restart) carries them over.
		s.Invalidate()
		if res, err := s.Sync(ctx, compileYAML(t, counterPodsMore)); err != nil || !res.Full {
			t.Fatalf("replace: %+v, %v", res, err)
		}
		if d, i := read("after full replace"); d.Packets != 4 || i.Packets != 2 || d.Bytes != 4*128 {
			t.Errorf("after a full replace: %+v and %+v, want 4 and 2 packets", d, i)
		}
		// A fresh Syncer (agent restart) also starts from the old table.
		s = New(nft, Options{Node: "n1"})
		if _, err := s.Sync(ctx, compileYAML(t, counterPodsMore)); err != nil {
			t.Fatal(err)
		}
		if d, _ := read("after restart"); d.Packets != 4 {
			t.Errorf("after a restart: %d packets, want 4", d.Packets)
		}
		if listed := nftList(t); !strings.Contains(listed, `counter name "`+d.Name+`" drop`) {
			t.Errorf("kernel table lacks rules counting into %s:\n%s", d.Name, listed)
		}
	})
}
