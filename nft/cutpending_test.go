package nft

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// flakyConntrack fails its first failures deletions, then succeeds.
type flakyConntrack struct {
	mu       sync.Mutex
	failures int
	calls    int
}

func (c *flakyConntrack) Delete(ctx context.Context, deny func(Packet) bool) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.calls <= c.failures {
		return 0, errors.New("injected conntrack failure")
	}
	return 1, nil
}

func (c *flakyConntrack) DeleteAddrs(context.Context, []netip.Addr) (int, error) { return 0, nil }

func (c *flakyConntrack) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// TestFailedCutIsRetried: with CutDenied, a cut that failed is tried
// again by the next Sync although nothing changed (the rules are reused),
// until it succeeds; after that, syncs that change nothing cut nothing.
func TestFailedCutIsRetried(t *testing.T) {
	ctx := context.Background()
	ct := &flakyConntrack{failures: 2}
	f := &genFake{Fake: knftables.NewFake(knftables.InetFamily, Table), gen: 1}
	s := New(f, Options{Node: "node-1", CutDenied: true, Conntrack: ct, Generation: f})
	prog := compileFile(t, "tiers.yaml", policy.Options{IngressNetworksAndNodes: true})
	res, err := s.Sync(ctx, prog)
	if err == nil || !res.Applied {
		t.Fatalf("first sync: %+v, %v (want the rules applied and the cut's error)", res, err)
	}
	res, err = s.Sync(ctx, prog)
	if err == nil || !res.Reused || ct.count() != 2 {
		t.Fatalf("second sync: %+v, %v, %d cuts (want the cut tried again on the reused rules, failing)", res, err, ct.count())
	}
	res, err = s.Sync(ctx, prog)
	if err != nil || !res.Reused || ct.count() != 3 || res.ConntrackDeleted != 1 {
		t.Fatalf("third sync: %+v, %v, %d cuts (want the cut tried again and succeeding)", res, err, ct.count())
	}
	if _, err = s.Sync(ctx, prog); err != nil || ct.count() != 3 {
		t.Fatalf("fourth sync: %v, %d cuts (nothing pending: no cut)", err, ct.count())
	}
	// A checked resync patches nothing (empty diff) and also retries a
	// pending cut.
	ct.mu.Lock()
	ct.failures = 4
	ct.mu.Unlock()
	s.Invalidate()
	if _, err := s.Sync(ctx, prog); err == nil {
		t.Fatal("sync with a failing cut succeeded")
	}
	s.InvalidateIfChanged()
	if res, err := s.Sync(ctx, prog); err != nil || res.Full || res.Reused || res.Operations != 0 || ct.count() != 5 {
		t.Fatalf("checked resync: %+v, %v, %d cuts (want an empty patch and the pending cut retried)", res, err, ct.count())
	}
}
