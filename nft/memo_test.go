package nft

import (
	"context"
	"net/netip"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// peerSwap: pod d (node-1) admits 10.9.0.1 on port 81 and 10.9.0.2 on
// port 82 (ipBlocks); pod e's rules select the remote pods w and q by
// label, and the shared sets of those addresses are named after e's
// rules.
const peerSwap = `
apiVersion: v1
kind: Node
metadata: {name: node-1}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-2}
status: {addresses: [{type: InternalIP, address: 192.168.0.2}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: Namespace
metadata: {name: z}
---
apiVersion: v1
kind: Pod
metadata: {name: d, namespace: z, labels: {app: d}}
spec: {nodeName: node-1}
status: {podIPs: [{ip: 10.0.1.10}]}
---
apiVersion: v1
kind: Pod
metadata: {name: e, namespace: a, labels: {app: e}}
spec: {nodeName: node-1}
status: {podIPs: [{ip: 10.0.1.11}]}
---
apiVersion: v1
kind: Pod
metadata: {name: w, namespace: a, labels: {app: web}}
spec: {nodeName: node-2}
status: {podIPs: [{ip: 10.9.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: q, namespace: a, labels: {app: db}}
spec: {nodeName: node-2}
status: {podIPs: [{ip: 10.9.0.2}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: z}
spec:
  podSelector: {matchLabels: {app: d}}
  ingress:
  - from: [{ipBlock: {cidr: 10.9.0.1/32}}]
    ports: [{port: 81}]
  - from: [{ipBlock: {cidr: 10.9.0.2/32}}]
    ports: [{port: 82}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a, namespace: a}
spec:
  podSelector: {matchLabels: {app: e}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{port: 90}]
  - from: [{podSelector: {matchLabels: {app: db}}}]
    ports: [{port: 91}]
`

// TestChainMemoAfterPeerNamesSwap: swapping two remote pods' labels
// swaps the names of the sets holding 10.9.0.1 and 10.9.0.2 while d's
// DirPolicy is unchanged. d's chains must follow (a memo of its chains
// that knew only the set names, not which ports go with each, kept
// "@<set of 10.9.0.1 now 10.9.0.2> port 81": 10.9.0.2 reached port 81,
// which no policy allows).
func TestChainMemoAfterPeerNamesSwap(t *testing.T) {
	ctx := context.Background()
	c := policy.NewCompiler(loadCluster(t, peerSwap), policy.Options{Node: "node-1"})
	fake := knftables.NewFake(knftables.InetFamily, Table)
	s := New(fake, Options{Node: "node-1"})
	if _, err := s.Sync(ctx, c.Program()); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.RelabelPod("a/w", map[string]string{"app": "db"}); !ok {
		t.Fatal("no pod a/w")
	}
	prog, ok := c.RelabelPod("a/q", map[string]string{"app": "web"})
	if !ok {
		t.Fatal("no pod a/q")
	}
	if _, err := s.Sync(ctx, prog); err != nil {
		t.Fatal(err)
	}
	checkSyncedAsFresh(t, fake, "node-1", prog, "after the swap")
	d := netip.MustParseAddr("10.0.1.10")
	for _, c := range []struct {
		src  string
		port uint16
		want bool
	}{{"10.9.0.1", 81, true}, {"10.9.0.2", 82, true}, {"10.9.0.2", 81, false}, {"10.9.0.1", 82, false}} {
		p := Packet{Src: netip.MustParseAddr(c.src), Dst: d, Proto: policy.ProtoTCP, Port: c.port}
		if got := s.Applied().Allows(p); got != c.want {
			t.Errorf("%s -> d:%d allowed %v, want %v", c.src, c.port, got, c.want)
		}
	}
}
