package agent

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/nft"
)

const npIsolateX = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-x, namespace: a, generation: 1}
spec:
  podSelector: {matchLabels: {app: x}}
  policyTypes: [Ingress]
`

// flakyConntrack fails its first failures deletions, then succeeds.
type flakyConntrack struct {
	mu       sync.Mutex
	failures int
	calls    int
}

func (c *flakyConntrack) Delete(ctx context.Context, deny func(nft.Packet) bool) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.calls <= c.failures {
		return 0, errors.New("injected conntrack failure")
	}
	return 0, nil
}

func (c *flakyConntrack) DeleteAddrs(context.Context, []netip.Addr) (int, error) { return 0, nil }

func (c *flakyConntrack) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// TestFailedCutIsRetriedWithoutChange (--cut-denied-established): a cut
// that failed is retried, with backoff, although nothing changes in the
// cluster; the rules stay in force and the agent ready meanwhile.
func TestFailedCutIsRetriedWithoutChange(t *testing.T) {
	c := clusterX(t, fixture.YAML(t, npIsolateX))
	ct := &flakyConntrack{failures: 2}
	f := knftables.NewFake(knftables.InetFamily, nft.Table)
	rec := &recordingNFT{Interface: f, fake: f}
	rec.gen.Store(1)
	dp := &testDP{Syncer: nft.New(rec, nft.Options{Node: "n1", Generation: rec, CutDenied: true, Conntrack: ct}), fake: f, nft: rec}
	a, _ := startAgent(t, c, Config{}, dp)
	fixture.Eventually(t, 20*time.Second, "the cut retried until it succeeds", func() (bool, string) {
		return ct.count() >= 3, fixture.Explain("%d cuts", ct.count())
	})
	if err := a.Ready(); err != nil {
		t.Errorf("not ready although the rules are in force: %v", err)
	}
	if v := testutilValue(t, a, "moat_agent_syncs_total", `kind="full",result="conntrack_error"`); v != "1" {
		t.Errorf("syncs{full,conntrack_error} = %s, want 1", v)
	}
	time.Sleep(500 * time.Millisecond)
	if n := ct.count(); n != 3 {
		t.Errorf("%d cuts, want 3: none after the one that succeeded", n)
	}
}
