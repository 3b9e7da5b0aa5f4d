package agent

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/nft"
)

// routes is a LinkResolver whose answer the test changes, as the node's
// routes change.
type routes struct {
	mu    sync.Mutex
	links []nft.PodLink
	calls int
}

func (r *routes) ResolveLinks(context.Context, nft.LinkQuery) ([]nft.PodLink, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return append([]nft.PodLink(nil), r.links...), nil
}

func (r *routes) set(links ...nft.PodLink) {
	r.mu.Lock()
	r.links = links
	r.mu.Unlock()
}

// TestLinksRefreshedWithoutChanges: a pod's veth is re-created with the
// same address (a new interface index) while nothing in the cluster
// changes. The agent's link refresh finds the new interface and programs
// it, without any event or resync.
func TestLinksRefreshedWithoutChanges(t *testing.T) {
	c := newFakeCluster(t,
		fixture.Namespace("a", nil),
		fixture.Node("n1", nil, "192.168.0.1"),
		fixture.Pod("a", "x", "n1", map[string]string{"app": "x"}, nil, "10.0.0.1"),
	)
	x := netip.MustParseAddr("10.0.0.1")
	r := &routes{links: []nft.PodLink{{Index: 7, Addr: x}}}
	dp := newTestDP("n1")
	dp.Syncer = nft.New(dp.nft, nft.Options{Node: "n1", Generation: dp.nft, Links: r})
	a, _ := startAgent(t, c, Config{}, dp)
	fixture.Eventually(t, 10*time.Second, "ready with x's link", func() (bool, string) {
		return a.Ready() == nil && strings.Contains(dp.fake.Dump(), "7 . 10.0.0.1"), fixture.Explain("Ready() = %v", a.Ready())
	})
	syncs := dp.calls.Load()

	r.set(nft.PodLink{Index: 9, Addr: x})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.refreshLinks(ctx, dp, 20*time.Millisecond)
	fixture.Eventually(t, 10*time.Second, "x's new interface programmed", func() (bool, string) {
		d := dp.fake.Dump()
		return strings.Contains(d, "9 . 10.0.0.1") && !strings.Contains(d, "7 . 10.0.0.1"), d
	})
	if dp.calls.Load() == syncs {
		t.Error("no sync ran, yet the links changed")
	}
}

// watchedRoutes is routes that also watch: the test calls change as the
// kernel would report a new host route.
type watchedRoutes struct {
	*routes
	mu      sync.Mutex
	changed func()
}

func (w *watchedRoutes) WatchRoutes(_ context.Context, changed func(), _ func(error)) error {
	w.mu.Lock()
	w.changed = changed
	w.mu.Unlock()
	return nil
}

func (w *watchedRoutes) change() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.changed != nil {
		w.changed()
	}
	return w.changed != nil
}

// TestRouteChangeFailsNewPodClosed: on a node without pod CIDRs, a routed
// CNI installs a new pod's host route before the pod's address reaches
// the agent. The agent watches the node's routes: the change queues a
// sync, which resolves the links again and programs the new pod's
// address as unknown (dropped from and to), without waiting for the
// periodic refresh (nft.LinkRefresh, 10 s after the agent started).
func TestRouteChangeFailsNewPodClosed(t *testing.T) {
	c := clusterX(t, fixture.YAML(t, npIsolateX))
	x := netip.MustParseAddr("10.0.0.1")
	w := &watchedRoutes{routes: &routes{links: []nft.PodLink{{Index: 7, Addr: x}}}}
	dp := newTestDP("n1")
	dp.Syncer = nft.New(dp.nft, nft.Options{Node: "n1", Generation: dp.nft, Links: w})
	a := startReady(t, c, Config{}, dp)
	if !strings.Contains(dp.fake.Dump(), "7 . 10.0.0.1") {
		t.Fatalf("x's link not programmed:\n%s", dp.fake.Dump())
	}
	w.set(nft.PodLink{Index: 7, Addr: x}, nft.PodLink{Index: 9, Addr: netip.MustParseAddr("10.0.0.5"), Unknown: true})
	if !w.change() {
		t.Fatal("the agent does not watch the node's routes")
	}
	fixture.Eventually(t, 5*time.Second, "the new pod's address programmed as unknown", func() (bool, string) {
		d := dp.fake.Dump()
		return strings.Contains(d, "podnet4 { 10.0.0.5/32 }") && strings.Contains(d, "podifs { 9 }"), d
	})
	if got, ok := dp.allows("10.0.0.9", "10.0.0.5", 80); !ok || got {
		t.Errorf("the unknown pod is reachable=%v (programmed %v)", got, ok)
	}
	if a.Ready() != nil {
		t.Errorf("Ready() = %v", a.Ready())
	}
}
