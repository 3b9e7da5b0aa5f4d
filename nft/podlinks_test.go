package nft

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// fixedLinks is a LinkResolver that answers what the test sets, and
// records what it was asked.
type fixedLinks struct {
	links []PodLink
	err   error
	asked LinkQuery
	calls int
}

func (f *fixedLinks) ResolveLinks(_ context.Context, q LinkQuery) ([]PodLink, error) {
	f.asked = q
	f.calls++
	return f.links, f.err
}

const podLinkCluster = podCIDRCluster + `---
apiVersion: v1
kind: Pod
metadata: {name: h, namespace: a}
spec: {nodeName: n1, hostNetwork: true}
status: {podIP: 192.168.1.1}
---
apiVersion: v1
kind: Pod
metadata: {name: r, namespace: a}
spec: {nodeName: n1}
status: {podIP: 10.244.0.6, podIPs: [{ip: 10.244.0.6}, {ip: "fd00:244::6"}]}
`

func link(i int, a string) PodLink { return PodLink{Index: i, Addr: netip.MustParseAddr(a)} }

// TestSyncPodLinks: the Syncer asks its resolver about the node's
// pod-network pods (not host-network ones, not other nodes'), programs
// what it answers in podifs and podsrc4/6, re-resolves on every sync and
// patches only the link sets when only they changed, and keeps the last
// links when resolving fails.
func TestSyncPodLinks(t *testing.T) {
	ctx := context.Background()
	prog := compileYAML(t, podLinkCluster)
	fake := knftables.NewFake(knftables.InetFamily, Table)
	r := &fixedLinks{links: []PodLink{link(7, "10.244.0.6"), link(5, "10.244.0.5"), link(7, "fd00:244::6"), link(7, "10.244.0.6")}}
	s := New(fake, Options{Node: "n1", Links: r})
	res, err := s.Sync(ctx, prog)
	if err != nil || res.Links != 3 || res.LinksErr != nil {
		t.Fatalf("first sync: %d links, %v, %v", res.Links, res.LinksErr, err)
	}
	wantQ := LinkQuery{
		Addrs:     []netip.Addr{netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("10.244.0.6"), netip.MustParseAddr("fd00:244::6")},
		PodCIDRs:  prog.PodCIDRs("n1"),
		NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")},
	}
	if !slices.Equal(r.asked.Addrs, wantQ.Addrs) || !slices.Equal(r.asked.PodCIDRs, wantQ.PodCIDRs) || !slices.Equal(r.asked.NodeAddrs, wantQ.NodeAddrs) {
		t.Errorf("resolver asked %+v, want %+v", r.asked, wantQ)
	}
	tx := fake.LastTransaction.String()
	for _, want := range []string{
		"add element inet moat podifs { 5 }", "add element inet moat podifs { 7 }",
		"add element inet moat podsrc4 { 5 . 10.244.0.5 }", "add element inet moat podsrc4 { 7 . 10.244.0.6 }",
		"add element inet moat podsrc6 { 7 . fd00:244::6 }",
	} {
		if !strings.Contains(tx, want) {
			t.Errorf("first transaction lacks %q:\n%s", want, tx)
		}
	}
	if n := strings.Count(tx, "add element inet moat podsrc4 {"); n != 2 {
		t.Errorf("%d podsrc4 elements, want 2 (duplicates dropped)", n)
	}

	// Same Program: nothing to do, and the links resolved a moment ago
	// are not asked for again.
	if res, err := s.Sync(ctx, prog); err != nil || !res.Reused || r.calls != 1 {
		t.Fatalf("second sync: reused %v, resolver asked %d times, %v", res.Reused, r.calls, err)
	}
	// Same Program, pod 10.244.0.5 moved to a new interface, found when
	// the links are resolved again: after RefreshLinks, as moat-agent
	// asks every LinkRefresh (a resync asks too, but this one would
	// replace the whole table on the fake, which has no nftables
	// generation).
	moved := []PodLink{link(9, "10.244.0.5"), link(7, "10.244.0.6"), link(7, "fd00:244::6")}
	r.links = moved
	if res, err := s.Sync(ctx, prog); err != nil || !res.Reused || r.calls != 1 {
		t.Fatalf("sync before RefreshLinks: reused %v, resolver asked %d times, %v", res.Reused, r.calls, err)
	}
	if !s.ChecksLinks() {
		t.Fatal("a Syncer with a LinkResolver says it does not check links")
	}
	stale := s.RefreshLinks
	stale()
	res, err = s.Sync(ctx, prog)
	if err != nil || res.Reused || !res.Applied || res.Full {
		t.Fatalf("sync after a route change: reused %v applied %v full %v, %v", res.Reused, res.Applied, res.Full, err)
	}
	tx = fake.LastTransaction.String()
	var ops []string
	for _, l := range strings.Split(strings.TrimSpace(tx), "\n") {
		if !strings.Contains(l, commitMark) {
			ops = append(ops, l)
		}
	}
	want := []string{
		"delete element inet moat podifs { 5 }",
		"add element inet moat podifs { 9 }",
		"delete element inet moat podsrc4 { 5 . 10.244.0.5 }",
		"add element inet moat podsrc4 { 9 . 10.244.0.5 }",
	}
	if !slices.Equal(ops, want) {
		t.Errorf("route change patched:\n%s\nwant:\n%s", strings.Join(ops, "\n"), strings.Join(want, "\n"))
	}
	if s.Applied().forgedOn(5, netip.MustParseAddr("198.51.100.7")) {
		t.Error("interface 5 is still a pod interface")
	}

	// Resolving fails: the last links stay, and the sync says why.
	r.links, r.err = nil, errors.New("netlink: no buffer space")
	stale()
	res, err = s.Sync(ctx, prog)
	if err != nil || res.LinksErr == nil || res.Links != 3 || !res.Reused {
		t.Fatalf("sync with a failing resolver: %d links, reused %v, %v, %v", res.Links, res.Reused, res.LinksErr, err)
	}
	if !slices.Equal(s.Applied().links, normaliseLinks(moved)) {
		t.Errorf("links after a failed resolve = %v", s.Applied().links)
	}

	// A failed resolve is tried again by the next sync.
	calls := r.calls
	if _, err := s.Sync(ctx, prog); err != nil || r.calls != calls+1 {
		t.Errorf("sync after a failed resolve: resolver asked %d times more, %v", r.calls-calls, err)
	}
	// Another pod given a pod's address: asked again at once.
	r.err = nil
	if _, err := s.Sync(ctx, prog); err != nil {
		t.Fatal(err)
	}
	calls = r.calls
	other := compileYAML(t, strings.Replace(podLinkCluster, "name: r, namespace: a", "name: r2, namespace: a", 1))
	if _, err := s.Sync(ctx, other); err != nil || r.calls != calls+1 {
		t.Errorf("sync with another pod on the address: resolver asked %d times more, %v", r.calls-calls, err)
	}

	// moat nft, and a Syncer without resolver on a fake: empty sets.
	if rs := Build(prog, "n1"); len(rs.links) != 0 {
		t.Errorf("Build has links %v", rs.links)
	}
}

// TestAllowsPodLinks: the interpreter drops what podLinkRules drop: a new
// connection arriving on a pod interface from a source not routed through
// it, but for the IPv6 sources the input hook exempts, and one from a
// local pod's resolved address arriving on another interface; an
// interface that is no pod's, and a packet whose interface is not known,
// are not checked otherwise.
func TestAllowsPodLinks(t *testing.T) {
	rs := Build(compileYAML(t, podLinkCluster), "n1").withLinks(normaliseLinks([]PodLink{link(5, "10.244.0.5"), link(7, "10.244.0.6"), link(7, "fd00:244::6")}))
	dst := netip.MustParseAddr("192.168.9.9")
	for _, c := range []struct {
		iif  int
		src  string
		want bool
	}{
		{5, "10.244.0.5", true},
		{7, "10.244.0.6", true},
		{7, "fd00:244::6", true},
		{5, "10.244.0.6", false},   // another local pod's address
		{5, "10.244.7.9", false},   // another node's pod
		{5, "198.51.100.7", false}, // outside the pod CIDRs
		{7, "2001:db8:dead::1", false},
		{7, "fe80::6", false},     // link-local: input drops it (podLinkScopeRules), forward as link scope
		{3, "198.51.100.7", true}, // not a pod interface
		{3, "10.244.0.6", false},  // a local pod's address from elsewhere (an uplink)
		{3, "fd00:244::6", false},
		{0, "198.51.100.7", true}, // interface not known
	} {
		p := Packet{Src: netip.MustParseAddr(c.src), Dst: dst, Proto: policy.ProtoUDP, Port: 53, InIf: c.iif}
		if got := rs.Allows(p); got != c.want {
			t.Errorf("Allows from %s on %d = %v, want %v", c.src, c.iif, got, c.want)
		}
	}
}
