package nft

import (
	"context"
	"fmt"
	"math/rand"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// localDE: two nodes, namespaces a and z, and the pods on node-1 the
// memo tests police: z/d and a/e.
const localDE = `
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
`

// peerSwap: pod d (node-1) admits 10.9.0.1 on port 81 and 10.9.0.2 on
// port 82 (ipBlocks); pod e's rules select the remote pods w and q by
// label, and the shared sets of those addresses are named after e's
// rules.
const peerSwap = localDE + `---
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

// TestRandomPeerRenames: remote pods move between four apps at random
// (relabels and swaps); a local pod's NetworkPolicy selects each app on
// a port of its own, and another local pod admits each remote address as
// a /32 ipBlock on a port of its own. Shared sets are named after their
// smallest use, so membership changes rename the sets the ipBlock pod's
// unchanged DirPolicy looks up. After every change the patched table
// must be the one a fresh sync programs, and the Go twin of the rules
// must admit exactly what the policies say.
func TestRandomPeerRenames(t *testing.T) {
	const remote = 5
	var b strings.Builder
	b.WriteString(localDE + `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: by-app, namespace: a}
spec:
  podSelector: {matchLabels: {app: e}}
  ingress:
`)
	for app := range 4 {
		fmt.Fprintf(&b, "  - from: [{podSelector: {matchLabels: {app: app%d}}}]\n    ports: [{port: %d}]\n", app, 90+app)
	}
	b.WriteString(`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: by-address, namespace: z}
spec:
  podSelector: {matchLabels: {app: d}}
  ingress:
`)
	for i := range remote {
		fmt.Fprintf(&b, "  - from: [{ipBlock: {cidr: 10.9.0.%d/32}}]\n    ports: [{port: %d}]\n", i+1, 80+i)
	}
	for i := range remote {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Pod\nmetadata: {name: r%d, namespace: a, labels: {app: app%d}}\nspec: {nodeName: node-2}\nstatus: {podIPs: [{ip: 10.9.0.%d}]}\n", i, i%4, i+1)
	}
	ctx := context.Background()
	for seed := range uint64(20) {
		c := policy.NewCompiler(loadCluster(t, b.String()), policy.Options{Node: "node-1"})
		fake := knftables.NewFake(knftables.InetFamily, Table)
		s := New(fake, Options{Node: "node-1"})
		if _, err := s.Sync(ctx, c.Program()); err != nil {
			t.Fatal(err)
		}
		apps := make([]int, remote)
		for i := range apps {
			apps[i] = i % 4
		}
		r := rand.New(rand.NewSource(int64(seed)))
		for step := range 40 {
			i, j := r.Intn(remote), r.Intn(remote)
			what := ""
			if r.Intn(2) == 0 {
				apps[i], apps[j] = apps[j], apps[i]
				what = fmt.Sprintf("swap r%d and r%d", i, j)
			} else {
				apps[i] = r.Intn(4)
				what = fmt.Sprintf("r%d to app%d", i, apps[i])
			}
			var prog *policy.Program
			for _, k := range []int{i, j} {
				var ok bool
				if prog, ok = c.RelabelPod(fmt.Sprintf("a/r%d", k), map[string]string{"app": fmt.Sprintf("app%d", apps[k])}); !ok {
					t.Fatalf("no pod r%d", k)
				}
			}
			if _, err := s.Sync(ctx, prog); err != nil {
				t.Fatal(err)
			}
			at := fmt.Sprintf("seed %d step %d (%s)", seed, step, what)
			checkSyncedAsFresh(t, fake, "node-1", prog, at)
			rs := s.Applied()
			d, e := netip.MustParseAddr("10.0.1.10"), netip.MustParseAddr("10.0.1.11")
			for k := range remote {
				src := netip.AddrFrom4([4]byte{10, 9, 0, byte(k + 1)})
				for port := uint16(80); port < 80+remote; port++ {
					want := port == uint16(80+k)
					if got := rs.Allows(Packet{Src: src, Dst: d, Proto: policy.ProtoTCP, Port: port}); got != want {
						t.Fatalf("%s: %s -> d:%d allowed %v, want %v", at, src, port, got, want)
					}
				}
				for port := uint16(90); port < 94; port++ {
					want := port == uint16(90+apps[k])
					if got := rs.Allows(Packet{Src: src, Dst: e, Proto: policy.ProtoTCP, Port: port}); got != want {
						t.Fatalf("%s: %s -> e:%d allowed %v, want %v", at, src, port, got, want)
					}
				}
			}
		}
	}
}
