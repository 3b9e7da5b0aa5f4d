package nft

import (
	"context"
	"fmt"
	"maps"
	"math/rand"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// loadCluster reads manifests given as a string into the compiler's model.
func loadCluster(t testing.TB, yaml string) *policy.Cluster {
	t.Helper()
	res, err := (&manifest.Loader{Stdin: strings.NewReader(yaml)}).Load("-")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return &res.Cluster
}

// podOf returns a copy of pod key in prog that the caller may change (a
// node-scoped Program lists only its node's pods: see podIn).
func podOf(t testing.TB, prog *policy.Program, key string) policy.Pod {
	t.Helper()
	i, ok := prog.PodByKey(key)
	if !ok {
		t.Fatalf("no pod %s", key)
	}
	return editable(prog.Pods[i])
}

// podIn returns a copy of pod key in a cluster that the caller may change.
func podIn(t testing.TB, c *policy.Cluster, key string) policy.Pod {
	t.Helper()
	for _, p := range c.Pods {
		if p.Key() == key {
			return editable(*p)
		}
	}
	t.Fatalf("no pod %s", key)
	return policy.Pod{}
}

func editable(p policy.Pod) policy.Pod {
	p.Labels = maps.Clone(p.Labels)
	p.IPs = slices.Clone(p.IPs)
	p.Ports = slices.Clone(p.Ports)
	return p
}

// checkSyncedAsFresh fails unless the table s programmed through fake is
// the one a new Syncer programs for prog.
func checkSyncedAsFresh(t *testing.T, fake *knftables.Fake, node string, prog *policy.Program, what string) {
	t.Helper()
	fresh := knftables.NewFake(knftables.InetFamily, Table)
	if _, err := New(fresh, Options{Node: node}).Sync(context.Background(), prog); err != nil {
		t.Fatal(err)
	}
	if got, want := sortedLines(fake.Dump()), sortedLines(fresh.Dump()); got != want {
		t.Fatalf("%s: the table differs from a fresh sync's:\ngot:\n%s\nwant:\n%s", what, got, want)
	}
}

// idle is a pod on node-2 that no selector of tiers.yaml picks.
const idle = `---
apiVersion: v1
kind: Pod
metadata: {name: idle, namespace: shop, labels: {app: idle}}
spec: {nodeName: node-2}
status: {podIPs: [{ip: 10.0.2.20}]}
`

// TestReuseIsExact: Sync keeps the programmed ruleset without building
// it when a change cannot reach node-1's rules, and builds it whenever
// one can (a remote pod's address joining or leaving a peer the node
// uses, an address two pods claim, anything about the local pods, the
// node's addresses, the policies judging its pods, the options). Either
// way the table must equal a fresh sync's.
func TestReuseIsExact(t *testing.T) {
	base := mustRead(t, "testdata/tiers.yaml") + idle
	cluster := loadCluster(t, base) // never changed: pods to edit come from it
	type change func(t *testing.T, c *policy.Compiler, prog *policy.Program) *policy.Program
	relabel := func(key string, labels map[string]string) change {
		return func(t *testing.T, c *policy.Compiler, _ *policy.Program) *policy.Program {
			prog, ok := c.RelabelPod(key, labels)
			if !ok {
				t.Fatalf("no pod %s", key)
			}
			return prog
		}
	}
	upsert := func(key string, edit func(*policy.Pod)) change {
		return func(t *testing.T, c *policy.Compiler, prog *policy.Program) *policy.Program {
			p := podIn(t, cluster, key)
			edit(&p)
			c.UpsertPod(&p)
			return c.Program()
		}
	}
	addr := netip.MustParseAddr
	// copyPod adds a pod like key, named name, with address ip.
	copyPod := func(key, name, ip string) change {
		return func(t *testing.T, c *policy.Compiler, _ *policy.Program) *policy.Program {
			p := podIn(t, cluster, key)
			p.Name, p.IPs = name, []netip.Addr{addr(ip)}
			c.UpsertPod(&p)
			return c.Program()
		}
	}
	for _, tc := range []struct {
		name   string
		change change
		reuse  bool
	}{
		{"nothing", func(_ *testing.T, c *policy.Compiler, _ *policy.Program) *policy.Program { return c.Program() }, true},
		{"remote pod relabelled, read by no peer", relabel("shop/idle", map[string]string{"app": "idle2"}), true},
		{"remote pod relabelled back and forth", func(t *testing.T, c *policy.Compiler, _ *policy.Program) *policy.Program {
			c.RelabelPod("shop/idle", map[string]string{"app": "idle3"})
			prog, _ := c.RelabelPod("shop/idle", map[string]string{"app": "idle"})
			return prog
		}, true},
		// The new pod joins admin-guard's peer of every namespace: the
		// node's DirPolicies are new, though the table does not use
		// that peer (a Pass ending the Admin tier): built, to no change.
		{"new remote pod", copyPod("shop/idle", "idle2", "10.0.2.21"), false},
		{"remote pod joins a peer the node uses", relabel("shop/idle", map[string]string{"app": "client"}), false},
		{"remote pod leaves a peer the node uses", relabel("shop/client", map[string]string{"app": "other"}), false},
		{"remote peer pod's address changes", upsert("shop/client", func(p *policy.Pod) { p.IPs[0] = addr("10.0.2.99") }), false},
		{"remote peer pod goes", func(t *testing.T, c *policy.Compiler, _ *policy.Program) *policy.Program {
			c.DeletePod("shop/client")
			return c.Program()
		}, false},
		{"remote pod takes a local pod's address", upsert("shop/idle", func(p *policy.Pod) { p.IPs[0] = addr("10.0.1.10") }), false},
		{"local pod relabelled", relabel("shop/web", map[string]string{"app": "web2"}), false},
		{"local pod relabelled, read by no policy", relabel("shop/web", map[string]string{"app": "web", "x": "y"}), true},
		{"local pod's named port moves", upsert("shop/web", func(p *policy.Pod) { p.Ports[0].Port = 8081 }), false},
		{"local pod gets another address", upsert("shop/db", func(p *policy.Pod) { p.IPs = append(p.IPs, addr("10.0.1.12")) }), false},
		{"local pod moves to another node", upsert("shop/db", func(p *policy.Pod) { p.NodeName = "node-2" }), false},
		{"local pod goes", func(t *testing.T, c *policy.Compiler, _ *policy.Program) *policy.Program {
			c.DeletePod("shop/db")
			return c.Program()
		}, false},
		{"new local pod", copyPod("shop/db", "db2", "10.0.1.13"), false},
		{"node's address changes", func(t *testing.T, c *policy.Compiler, prog *policy.Program) *policy.Program {
			n := prog.Nodes[0]
			if n.Name != "node-1" {
				t.Fatalf("first node is %s", n.Name)
			}
			n.Addrs = []netip.Addr{addr("192.168.0.9")}
			c.UpsertNode(n)
			return c.Program()
		}, false},
		{"policy of local pods changes", func(t *testing.T, c *policy.Compiler, _ *policy.Program) *policy.Program {
			cl := loadCluster(t, strings.Replace(base, "ports: [{port: 5432}]", "ports: [{port: 5433}]", 1))
			for _, np := range cl.NetworkPolicies {
				if np.Name == "db-in" {
					c.UpsertNetworkPolicy(np)
				}
			}
			return c.Program()
		}, false},
		{"node-local traffic policed", func(_ *testing.T, _ *policy.Compiler, prog *policy.Program) *policy.Program {
			p := *prog
			p.Options.DenyNodeLocal = true
			return &p
		}, false},
	} {
		for _, node := range []string{"node-1", ""} {
			t.Run(fmt.Sprintf("%s/scope=%q", tc.name, node), func(t *testing.T) {
				ctx := context.Background()
				c := policy.NewCompiler(loadCluster(t, base), policy.Options{Node: node, IngressNetworksAndNodes: true})
				fake := knftables.NewFake(knftables.InetFamily, Table)
				s := New(fake, Options{Node: "node-1"})
				prog := c.Program()
				if _, err := s.Sync(ctx, prog); err != nil {
					t.Fatal(err)
				}
				prog = tc.change(t, c, prog)
				res, err := s.Sync(ctx, prog)
				if err != nil {
					t.Fatal(err)
				}
				checkSyncedAsFresh(t, fake, "node-1", prog, tc.name)
				if res.Reused != tc.reuse {
					t.Errorf("Reused = %v, want %v (%d operations)", res.Reused, tc.reuse, res.Operations)
				}
				if res.Reused && (res.Operations != 0 || !res.Applied || res.Stats != s.Applied().Stats()) {
					t.Errorf("reused result %+v", res)
				}
				// After a sync that built, the next one of the same
				// Program reuses, unless pods claim one address.
				if res, err := s.Sync(ctx, prog); err != nil || res.Reused != (len(prog.DuplicateAddrs()) == 0) {
					t.Errorf("second sync of the same Program: %+v, %v", res, err)
				}
			})
		}
	}
}

// TestNoReuseAfterInvalidate: a sync after Invalidate programs the whole
// table even when nothing changed (a failed transaction clears the
// applied ruleset the same way: TestKernelSyncFullDiffAndFailure).
func TestNoReuseAfterInvalidate(t *testing.T) {
	ctx := context.Background()
	c := policy.NewCompiler(loadCluster(t, mustRead(t, "testdata/tiers.yaml")), policy.Options{Node: "node-1"})
	fake := knftables.NewFake(knftables.InetFamily, Table)
	s := New(fake, Options{Node: "node-1"})
	prog := c.Program()
	if _, err := s.Sync(ctx, prog); err != nil {
		t.Fatal(err)
	}
	s.Invalidate()
	if res, err := s.Sync(ctx, prog); err != nil || res.Reused || !res.Full {
		t.Errorf("after Invalidate: %+v, %v; want a full replace", res, err)
	}
	// A ruleset applied without what it was built from (as the kernel
	// test's bad one) is never kept.
	if _, err := s.apply(ctx, Build(prog, "node-1"), nil, nil); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Sync(ctx, prog); err != nil || res.Reused {
		t.Errorf("after apply of a ruleset of unknown inputs: %+v, %v; want a build", res, err)
	}
}

// TestRandomReuseIsExact applies random changes to random clusters
// through a Compiler (relabels, new addresses, addresses taken from other
// pods, moves, deletions, new pods) and checks after each that the table
// Sync left, reused or not, is the one a fresh sync programs. The
// Syncer's build cache lives through the changes, a fresh one has none:
// the test also checks the chains the cache keeps (chainMemo).
func TestRandomReuseIsExact(t *testing.T) {
	cfg := randcluster.Default()
	ctx := context.Background()
	reused, built := 0, 0
	for seed := int64(1); seed <= int64(*randomRounds)/4+1; seed++ {
		y, err := randcluster.Generate(seed, cfg).Manifests()
		if err != nil {
			t.Fatal(err)
		}
		cl := loadCluster(t, string(y))
		var apps, tiers, nodes []string
		for _, p := range cl.Pods {
			apps = append(apps, p.Labels["app"])
			tiers = append(tiers, p.Labels["tier"])
			nodes = append(nodes, p.NodeName)
		}
		apps = append(apps, "nobody")
		r := rand.New(rand.NewSource(seed))
		pick := func(ss []string) string { return ss[r.Intn(len(ss))] }
		addIPBlockPolicy(cl, r)
		scope := ""
		if seed%2 == 0 {
			scope = "node-0"
		}
		c := policy.NewCompiler(cl, policy.Options{Node: scope, IngressNetworksAndNodes: true})
		fake := knftables.NewFake(knftables.InetFamily, Table)
		s := New(fake, Options{Node: "node-0"})
		prog := c.Program()
		if _, err := s.Sync(ctx, prog); err != nil {
			t.Fatal(err)
		}
		// The cluster's pods as the compiler has them: a node-scoped
		// Program lists only its node's.
		pods := map[string]policy.Pod{}
		for _, p := range cl.Pods {
			pods[p.Key()] = *p
		}
		anyPod := func() policy.Pod { return editable(pods[slices.Sorted(maps.Keys(pods))[r.Intn(len(pods))]]) }
		fresh := 0
		for step := 0; step < 30; step++ {
			if len(pods) == 0 {
				break
			}
			p := anyPod()
			var what string
			switch k := r.Intn(11); {
			case k < 5:
				p.Labels["app"], p.Labels["tier"] = pick(apps), pick(tiers)
				what = "relabel " + p.Key()
			case k == 5 && len(p.IPs) > 0:
				if o := anyPod(); len(o.IPs) > 0 {
					p.IPs[0] = o.IPs[0]
				}
				what = "address of another pod to " + p.Key()
			case k == 6 && len(p.IPs) > 0:
				fresh++
				p.IPs[0] = netip.AddrFrom4([4]byte{10, 99, byte(seed), byte(fresh)})
				what = "new address of " + p.Key()
			case k == 7:
				p.NodeName = pick(nodes)
				what = "move " + p.Key()
			case k == 8:
				c.DeletePod(p.Key())
				what = "delete " + p.Key()
			case k == 9:
				// Swapped labels swap which addresses the selector
				// peers hold, and so the names of their shared sets,
				// while the ipBlock peers keep theirs.
				if o := anyPod(); o.Key() != p.Key() {
					p.Labels, o.Labels = o.Labels, p.Labels
					c.UpsertPod(&o)
					pods[o.Key()] = o
					what = "swap labels of " + p.Key() + " and " + o.Key()
				}
			default:
				fresh++
				p.Name = fmt.Sprintf("new%d", fresh)
				p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 98, byte(seed), byte(fresh)})}
				what = "new pod " + p.Key()
			}
			if strings.HasPrefix(what, "delete") {
				delete(pods, p.Key())
			} else {
				c.UpsertPod(&p)
				pods[p.Key()] = p
			}
			prog = c.Program()
			res, err := s.Sync(ctx, prog)
			if err != nil {
				t.Fatal(err)
			}
			if res.Reused {
				reused++
			} else {
				built++
			}
			checkSyncedAsFresh(t, fake, "node-0", prog, fmt.Sprintf("seed %d step %d (%s, reused %v)", seed, step, what, res.Reused))
		}
	}
	t.Logf("%d syncs reused the ruleset, %d built it", reused, built)
	if reused == 0 || built == 0 {
		t.Errorf("%d syncs reused the ruleset, %d built it: the test does not exercise both", reused, built)
	}
}

// addIPBlockPolicy adds a NetworkPolicy to the namespace of a pod on
// node-0 admitting four pods' addresses, each as a /32 ipBlock on a
// port of its own: a peer whose content equals a selector peer's (one
// pod selected) shares its set, named after the smallest rule using
// it, so relabels elsewhere rename the sets these rules look up while
// their DirPolicy stays the same.
func addIPBlockPolicy(cl *policy.Cluster, r *rand.Rand) {
	var ns string
	var withIP []*policy.Pod
	for _, p := range cl.Pods {
		if ns == "" && p.NodeName == "node-0" {
			ns = p.Namespace
		}
		if len(p.IPs) > 0 {
			withIP = append(withIP, p)
		}
	}
	if ns == "" || len(withIP) == 0 {
		return
	}
	np := &policy.NetworkPolicy{Namespace: ns, Name: "ipblocks"}
	tcp := corev1.ProtocolTCP
	for i := range 4 {
		a := withIP[r.Intn(len(withIP))].IPs[0]
		port := intstr.FromInt32(int32(2000 + i))
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(a, a.BitLen()).String()}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
		})
	}
	cl.NetworkPolicies = append(cl.NetworkPolicies, np)
}

// TestReuseSeesLocalPorts: the sets of a union run (over 32 peers) whose
// named port resolves differently per pod are named after the smallest
// port list of the pods using each variant, so a local pod's declared
// ports reach the table even when its DirPolicy stays the same.
func TestReuseSeesLocalPorts(t *testing.T) {
	var b strings.Builder
	for _, p := range []struct{ name, ip, ports string }{
		{"a", "10.0.0.1", "[{name: http, containerPort: 8080}, {name: zz, containerPort: 9000}]"},
		{"b", "10.0.0.2", "[{name: http, containerPort: 8081}]"},
		{"c", "10.0.0.3", "[{name: http, containerPort: 8080}]"},
	} {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: a, labels: {app: srv}}\n", p.name)
		fmt.Fprintf(&b, "spec: {nodeName: n1, containers: [{name: c, ports: %s}]}\nstatus: {podIP: %s}\n", p.ports, p.ip)
	}
	for i := 0; i < 40; i++ {
		b.WriteString("---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n")
		fmt.Fprintf(&b, "metadata: {name: np%d, namespace: a}\n", i)
		fmt.Fprintf(&b, "spec:\n  podSelector: {matchLabels: {app: srv}}\n  ingress:\n  - from: [{ipBlock: {cidr: 10.%d.0.0/16}}]\n    ports: [{port: http}]\n", 100+i)
	}
	ctx := context.Background()
	for _, scope := range []string{"n1", ""} {
		c := policy.NewCompiler(loadCluster(t, b.String()), policy.Options{Node: scope})
		fake := knftables.NewFake(knftables.InetFamily, Table)
		s := New(fake, Options{Node: "n1"})
		prog := c.Program()
		if _, err := s.Sync(ctx, prog); err != nil {
			t.Fatal(err)
		}
		p := podOf(t, prog, "a/c")
		p.Ports = append(p.Ports, policy.ContainerPort{Name: "aa", Protocol: policy.ProtoTCP, Port: 1})
		c.UpsertPod(&p)
		prog = c.Program()
		res, err := s.Sync(ctx, prog)
		if err != nil {
			t.Fatal(err)
		}
		checkSyncedAsFresh(t, fake, "n1", prog, "pod c declares another port")
		if res.Reused {
			t.Error("reused the ruleset after a local pod's ports changed")
		}
	}
}

// TestReuseSeesClaimants: a third pod claiming a duplicated address
// changes no rule (the address goes to the conflict chain either way) but
// the warning naming its claimants.
func TestReuseSeesClaimants(t *testing.T) {
	base := mustRead(t, "testdata/tiers.yaml") + strings.ReplaceAll(idle, "10.0.2.20", "10.0.1.10")
	ctx := context.Background()
	for _, scope := range []string{"node-1", ""} {
		cluster := loadCluster(t, base)
		c := policy.NewCompiler(cluster, policy.Options{Node: scope})
		fake := knftables.NewFake(knftables.InetFamily, Table)
		s := New(fake, Options{Node: "node-1"})
		prog := c.Program()
		if _, err := s.Sync(ctx, prog); err != nil {
			t.Fatal(err)
		}
		p := podIn(t, cluster, "shop/idle")
		p.Name = "idle2"
		c.UpsertPod(&p)
		prog = c.Program()
		res, err := s.Sync(ctx, prog)
		if err != nil {
			t.Fatal(err)
		}
		checkSyncedAsFresh(t, fake, "node-1", prog, "third claimant")
		if want := Build(prog, "node-1").warnings; !slices.Equal(res.Warnings, want) {
			t.Errorf("warnings %q, want %q", res.Warnings, want)
		}
	}
}

// TestReuseSeesPolicedPods: a local pod with a PodPolicy is policed even
// if the PodPolicy has no DirPolicy (Programs built by other means than
// the compiler).
func TestReuseSeesPolicedPods(t *testing.T) {
	ctx := context.Background()
	prog := compileYAML(t, mustRead(t, "testdata/tiers.yaml"))
	i, _ := prog.PodByKey("shop/web")
	with := *prog
	with.Policies = slices.Clone(prog.Policies)
	with.Policies[i] = &policy.PodPolicy{}
	without := *prog
	without.Policies = slices.Clone(prog.Policies)
	without.Policies[i] = nil
	fake := knftables.NewFake(knftables.InetFamily, Table)
	s := New(fake, Options{Node: "node-1"})
	for _, p := range []*policy.Program{&with, &without, &with} {
		res, err := s.Sync(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if res.Reused {
			t.Error("reused the ruleset after a local pod's policy came or went")
		}
		checkSyncedAsFresh(t, fake, "node-1", p, "policy of shop/web")
	}
}

// TestNodeAddressAPodClaims: a node address that a pod-network pod
// elsewhere claims too is not node-local on the node (as the evaluator
// judges it), and a pod taking it makes the next sync build, though no
// peer of the node selects that pod.
func TestNodeAddressAPodClaims(t *testing.T) {
	const cluster = localDE + `---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: z}
spec: {nodeName: node-2}
status: {podIPs: [{ip: 10.0.2.1}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: a}
spec: {podSelector: {}}
`
	ctx := context.Background()
	c := policy.NewCompiler(loadCluster(t, cluster), policy.Options{Node: "node-1"})
	fake := knftables.NewFake(knftables.InetFamily, Table)
	s := New(fake, Options{Node: "node-1"})
	plain := c.Program()
	if _, err := s.Sync(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if got := s.Applied().nodeLocal; len(got) != 1 {
		t.Errorf("node-local addresses without the claim: %v, want the node's", got)
	}
	p := podIn(t, loadCluster(t, cluster), "z/c")
	p.IPs = []netip.Addr{netip.MustParseAddr("192.168.0.1")}
	c.UpsertPod(&p)
	claimed := c.Program()
	res, err := s.Sync(ctx, claimed)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reused {
		t.Error("the sync after a pod took the node's address kept the ruleset")
	}
	checkSyncedAsFresh(t, fake, "node-1", claimed, "pod takes the node's address")
	if got := s.Applied().nodeLocal; len(got) != 0 {
		t.Errorf("node-local addresses with the claim: %v, want none", got)
	}
	ports := []Packet{{Proto: 6, Port: 80}}
	extra := []netip.Addr{netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("192.168.0.2")}
	checkAgainstEvaluator(t, claimed, extra, ports)
	checkAgainstEvaluator(t, plain, extra, ports)
}
