package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// releaseRecorder records the addresses each DeleteAddrs was given; fail
// fails the next call.
type releaseRecorder struct {
	calls [][]netip.Addr
	cuts  int
	fail  bool
}

func (r *releaseRecorder) Delete(context.Context, func(Packet) bool) (int, error) {
	r.cuts++
	return 0, nil
}

func (r *releaseRecorder) DeleteAddrs(_ context.Context, addrs []netip.Addr) (int, error) {
	r.calls = append(r.calls, slices.Clone(addrs))
	if r.fail {
		r.fail = false
		return 0, errors.New("injected conntrack failure")
	}
	return len(addrs), nil
}

// releaseCluster is node-1 (192.168.1.1) with the pods given as
// "name=address" (name h: host network, at the node's address; a name
// ending in @2: on node-2).
func releaseCluster(pods ...string) string {
	var b strings.Builder
	b.WriteString(`apiVersion: v1
kind: Node
metadata: {name: node-1}
status: {addresses: [{type: InternalIP, address: 192.168.1.1}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-2}
status: {addresses: [{type: InternalIP, address: 192.168.1.2}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: a}
`)
	for _, p := range pods {
		name, addr, _ := strings.Cut(p, "=")
		node, host := "node-1", name == "h"
		if n, ok := strings.CutSuffix(name, "@2"); ok {
			name, node = n, "node-2"
		}
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: a, labels: {app: %s}}
spec: {nodeName: %s, hostNetwork: %v, containers: [{name: c, image: x}]}
status: {phase: Running, podIP: %s}
`, name, name, node, host, addr)
	}
	return b.String()
}

// TestReleasedAddressesLoseTheirConnections: whatever CutDenied says, a
// sync removes the conntrack entries of the node's pod addresses that
// left the node, passed to another pod or are new to it, after the first
// sync (which only learns them); the node's own addresses (a host-network
// pod's, or one a pod claims) and other nodes' pods are never released. A
// release that failed is retried by the next sync, also when nothing
// changed.
func TestReleasedAddressesLoseTheirConnections(t *testing.T) {
	ctx := context.Background()
	ct := &releaseRecorder{}
	f := &genFake{Fake: knftables.NewFake(knftables.InetFamily, Table), gen: 1}
	s := New(f, Options{Node: "node-1", Conntrack: ct, Generation: f})
	step := func(name string, want []string, wantErr bool, pods ...string) {
		t.Helper()
		ct.calls = nil
		res, err := s.Sync(ctx, compileYAML(t, releaseCluster(pods...)))
		if (err != nil) != wantErr || !res.Applied {
			t.Fatalf("%s: %+v, %v (want an error: %v)", name, res, err, wantErr)
		}
		var got []string
		for _, c := range ct.calls {
			for _, a := range c {
				got = append(got, a.String())
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: released %v, want %v", name, got, want)
		}
		if !wantErr && res.ConntrackReleased != len(want) {
			t.Errorf("%s: ConntrackReleased %d, want %d", name, res.ConntrackReleased, len(want))
		}
	}
	base := []string{"p=10.0.0.5", "q=10.0.0.6", "h=192.168.1.1", "r@2=10.0.1.5"}
	step("first sync", nil, false, base...)
	ct.cuts = 0 // the first sync found no table: it cuts once (cutOnce)
	step("nothing changed", nil, false, base...)
	step("p deleted, r on node-2 deleted", []string{"10.0.0.5"}, false, "q=10.0.0.6", "h=192.168.1.1")
	step("q's address to db, new is new", []string{"10.0.0.6", "10.0.0.7"}, false, "db=10.0.0.6", "new=10.0.0.7", "h=192.168.1.1")
	step("host-network pod deleted, a pod claims the node's address", nil, false, "db=10.0.0.6", "new=10.0.0.7", "x=192.168.1.1")
	step("the claim ends", nil, false, "db=10.0.0.6", "new=10.0.0.7")
	ct.fail = true
	step("new deleted, the release fails", []string{"10.0.0.7"}, true, "db=10.0.0.6")
	step("nothing changed: the release is retried", []string{"10.0.0.7"}, false, "db=10.0.0.6")
	step("nothing changed, nothing pending", nil, false, "db=10.0.0.6")
	// Two pods claim one address (the Program's inputs then always
	// rebuild): its owners are both, and change when one goes.
	step("two pods claim a new address", []string{"10.0.0.8"}, false, "db=10.0.0.6", "x=10.0.0.8", "y=10.0.0.8")
	step("both still claim it", nil, false, "db=10.0.0.6", "y=10.0.0.8", "x=10.0.0.8")
	step("one claimant goes", []string{"10.0.0.8"}, false, "db=10.0.0.6", "y=10.0.0.8")
	if ct.cuts != 0 {
		t.Errorf("%d cuts of denied connections without CutDenied", ct.cuts)
	}
}
