package nft

import (
	"context"
	"maps"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/policy"
)

// benchNode is the node the scale benchmarks program: it gets 110 local
// pods, the kubelet's default maximum.
const benchNode = "node-000"

// scaleCluster is clustergen's scale cluster (10,000 pods, 1,000
// namespaces, 100 nodes, 2,000 NetworkPolicies, 200
// ClusterNetworkPolicies) with exactly 110 pods on benchNode.
func scaleCluster() *clustergen.Cluster {
	g := clustergen.Generate(clustergen.Scale)
	local := 0
	for i := range g.Pods {
		if g.Pods[i].Spec.NodeName == benchNode {
			local++
		}
	}
	for i := range g.Pods {
		if local >= 110 {
			break
		}
		if g.Pods[i].Spec.NodeName != benchNode {
			g.Pods[i].Spec.NodeName = benchNode
			local++
		}
	}
	for i := len(g.Pods) - 1; i >= 0 && local > 110; i-- {
		if g.Pods[i].Spec.NodeName == benchNode {
			g.Pods[i].Spec.NodeName = "node-001"
			local--
		}
	}
	return g
}

// enterPrivateNetns moves the benchmark's own thread into a new network
// namespace; the returned function moves it back. Only this goroutine is
// in the namespace: whatever runs nft (or netlink) must run on it, not in
// a sub-benchmark or another goroutine.
func enterPrivateNetns(b testing.TB) func() {
	b.Helper()
	testenv.RequirePrivileged(b)
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		b.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		b.Fatal(err)
	}
	return func() {
		ns.Close()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		orig.Close()
	}
}

// BenchmarkBuild is the Go side of programming benchNode: Program to
// Ruleset, no kernel.
func BenchmarkBuild(b *testing.B) {
	prog := policy.Compile(scaleCluster().ToCluster(), policy.Options{IngressNetworksAndNodes: true})
	var rs *Ruleset
	for b.Loop() {
		rs = Build(prog, benchNode)
	}
	st := rs.Stats()
	b.ReportMetric(float64(st.Rules), "rules")
	b.ReportMetric(float64(st.Sets), "sets")
	b.ReportMetric(float64(st.Elements), "elements")
}

// BenchmarkProgramNode replaces benchNode's whole table in the kernel, as
// on an agent's first sync, and reports the three parts separately: Build
// (Program to Ruleset), render (the full-replace transaction, as the text
// nft reads) and the nft transaction itself. "joined" runs it as the
// agent does (NewInterface: each set's elements in one command),
// "knftables" through knftables' own Run (one command per element).
func BenchmarkProgramNode(b *testing.B) {
	prog := policy.Compile(scaleCluster().ToCluster(), policy.Options{IngressNetworksAndNodes: true})
	for _, joined := range []bool{true, false} {
		name := "knftables"
		if joined {
			name = "joined"
		}
		b.Run(name, func(b *testing.B) {
			// A sub-benchmark runs on a goroutine of its own: the private
			// namespace is entered here, on the thread that runs nft, or
			// the table would be programmed in the machine's namespace.
			defer enterPrivateNetns(b)()
			raw, err := knftables.New(knftables.InetFamily, Table)
			if err != nil {
				b.Fatal(err)
			}
			var iface knftables.Interface = raw
			if joined {
				iface = kernelNFT{raw, "nft"}
			}
			benchProgramNode(b, iface, prog)
		})
	}
}

func benchProgramNode(b *testing.B, iface knftables.Interface, prog *policy.Program) {
	ctx := context.Background()
	var build, render, run time.Duration
	var rs *Ruleset
	var ops int
	for b.Loop() {
		t0 := time.Now()
		rs = Build(prog, benchNode)
		t1 := time.Now()
		tx := iface.NewTransaction()
		fullTransaction(tx, rs, nil)
		_ = tx.String()
		t2 := time.Now()
		if err := iface.Run(ctx, tx); err != nil {
			b.Fatal(err)
		}
		build += t1.Sub(t0)
		render += t2.Sub(t1)
		run += time.Since(t2)
		ops = tx.NumOperations()
	}
	n := float64(b.N)
	st := rs.Stats()
	b.ReportMetric(float64(build.Microseconds())/1000/n, "build-ms")
	b.ReportMetric(float64(render.Microseconds())/1000/n, "render-ms")
	b.ReportMetric(float64(run.Microseconds())/1000/n, "nft-ms")
	b.ReportMetric(float64(ops), "ops")
	b.ReportMetric(float64(st.Rules), "rules")
	b.ReportMetric(float64(st.Sets), "sets")
	b.ReportMetric(float64(st.Elements), "elements")
}

// BenchmarkRelabel changes one pod's labels back and forth and brings
// benchNode's table in the kernel up to date each time: the policy
// compiler's incremental RelabelPod, then Build (cached), diff and one
// transaction. It reports the parts; "local" relabels a pod on
// benchNode, "remote" one elsewhere whose relabel changes benchNode's
// rules, "remote-unchanged" one whose relabel changes none of them.
func BenchmarkRelabel(b *testing.B) {
	g := scaleCluster()
	tier := func(p *policy.Pod) []map[string]string {
		ls := []map[string]string{maps.Clone(p.Labels), maps.Clone(p.Labels)}
		ls[1]["tier"] = "db"
		if ls[0]["tier"] == "db" {
			ls[1]["tier"] = "web"
		}
		return ls
	}
	for _, c := range []relabelCase{{"local", true, true}, {"remote", false, true}, {"remote-unchanged", false, false}} {
		b.Run(c.name, func(b *testing.B) {
			benchRelabel(b, g.ToCluster(), policy.Options{IngressNetworksAndNodes: true}, c, tier)
		})
	}
}

// BenchmarkRelabelWorkloads is BenchmarkRelabel on the agent scale
// benchmark's cluster (agent/e2e, issue 8's workload shape) with its
// toggled NetworkPolicy, compiled for benchNode as the agent does: "local"
// is the agent benchmark's label update (a pod on benchNode selected or
// not), "remote-unchanged" the same label on a pod elsewhere, which
// changes no rule of benchNode.
func BenchmarkRelabelWorkloads(b *testing.B) {
	for _, size := range []struct {
		name string
		cfg  clustergen.Config
	}{
		{"pods=30000", clustergen.Config{Nodes: 300, Namespaces: 3000, Pods: 30000, NetworkPolicies: 19000, ClusterPolicies: 1000, Seed: 1, Workloads: true}},
	} {
		g := clustergen.Generate(size.cfg)
		toggle := func(p *policy.Pod) []map[string]string {
			ls := []map[string]string{maps.Clone(p.Labels), maps.Clone(p.Labels)}
			ls[1]["bench"] = "on"
			return ls
		}
		for _, c := range []relabelCase{{"local", true, true}, {"remote-unchanged", false, false}} {
			b.Run(size.name+"/"+c.name, func(b *testing.B) {
				// The agent benchmark's NetworkPolicy: it selects the
				// first pod on benchNode while that pod carries
				// bench=on (here: every pod that does, in its namespace).
				cluster := g.ToCluster()
				var ns string
				for i := range cluster.Pods {
					p := cluster.Pods[i]
					if (p.NodeName == benchNode) == c.local {
						ns = p.Namespace
						break
					}
				}
				tcp := corev1.ProtocolTCP
				port := intstr.FromInt32(7777)
				cluster.NetworkPolicies = append(cluster.NetworkPolicies, &policy.NetworkPolicy{
					Name: "bench-toggle", Namespace: ns,
					Spec: networkingv1.NetworkPolicySpec{
						PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"bench": "on"}},
						Ingress: []networkingv1.NetworkPolicyIngressRule{{
							From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "198.51.100.7/32"}}},
							Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
						}},
					},
				})
				benchRelabel(b, cluster, policy.Options{IngressNetworksAndNodes: true, Node: benchNode}, c, toggle)
			})
		}
	}
}

// relabelCase says which pod a relabel benchmark changes: the first on
// benchNode (local) or elsewhere whose relabel changes benchNode's rules
// or not (changes).
type relabelCase struct {
	name           string
	local, changes bool
}

// benchRelabel times relabelling one pod picked by c between the two
// label sets labels gives, syncing benchNode's table in a private network
// namespace after each.
func benchRelabel(b *testing.B, cluster *policy.Cluster, opts policy.Options, c relabelCase, labels func(*policy.Pod) []map[string]string) {
	comp := policy.NewCompiler(cluster, opts)
	restore := enterPrivateNetns(b)
	defer restore()
	nft, err := NewInterface()
	if err != nil {
		b.Fatal(err)
	}
	s := New(nft, Options{Node: benchNode})
	ctx := context.Background()
	if _, err := s.Sync(ctx, comp.Program()); err != nil {
		b.Fatal(err)
	}
	var key string
	var ls []map[string]string
	for i := range cluster.Pods {
		p := cluster.Pods[i]
		if (p.NodeName == benchNode) != c.local {
			continue
		}
		try := labels(p)
		prog, _ := comp.RelabelPod(p.Key(), try[1])
		res, err := s.Sync(ctx, prog)
		if err != nil {
			b.Fatal(err)
		}
		prog, _ = comp.RelabelPod(p.Key(), try[0])
		if _, err := s.Sync(ctx, prog); err != nil {
			b.Fatal(err)
		}
		if (res.Operations > 0) == c.changes {
			key, ls = p.Key(), try
			break
		}
	}
	if key == "" {
		b.Fatal("no pod to relabel")
	}
	var compile, sync, build, diff, run time.Duration
	i, ops := 0, 0
	for b.Loop() {
		t0 := time.Now()
		prog, ok := comp.RelabelPod(key, ls[(i+1)%2])
		if !ok {
			b.Fatal("pod not found")
		}
		t1 := time.Now()
		res, err := s.Sync(ctx, prog)
		if err != nil {
			b.Fatal(err)
		}
		compile += t1.Sub(t0)
		sync += time.Since(t1)
		build += res.Build
		diff += res.Diff
		run += res.Transaction
		if res.Full {
			b.Fatal("relabel fell back to a full replace")
		}
		ops += res.Operations
		i++
	}
	n := float64(i)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n }
	b.ReportMetric(float64(ops)/n, "nft-ops/relabel")
	b.ReportMetric(ms(compile), "compile-ms/relabel")
	b.ReportMetric(ms(sync), "sync-ms/relabel")
	b.ReportMetric(ms(build), "build-ms/relabel")
	b.ReportMetric(ms(diff), "diff-ms/relabel")
	b.ReportMetric(ms(run), "nft-ms/relabel")
}

// BenchmarkBuildBurst is the ruleset build of one sync during a burst of
// remote changes, as in the agent scale benchmark's app burst: on the
// 30,000-pod workload cluster compiled for benchNode, each iteration moves
// 25 random remote pods to app-00 (which the generated policies select
// on, so peers of many local pods change), then builds with the Syncer's
// cache. It reports the build's time and allocations alone (build-ms,
// build-MB), not the compile's.
func BenchmarkBuildBurst(b *testing.B) {
	g := clustergen.Generate(clustergen.Config{Nodes: 300, Namespaces: 3000, Pods: 30000, NetworkPolicies: 19000, ClusterPolicies: 1000, Seed: 1, Workloads: true})
	cluster := g.ToCluster()
	comp := policy.NewCompiler(cluster, policy.Options{IngressNetworksAndNodes: true, Node: benchNode})
	cache := newBuildCache()
	rs := buildCached(comp.Program(), benchNode, cache, nil)
	var remote []*policy.Pod
	for _, p := range cluster.Pods {
		if p.NodeName != benchNode {
			remote = append(remote, p)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var took time.Duration
	var allocated uint64
	for b.Loop() {
		var prog *policy.Program
		for range 25 {
			p := remote[rng.IntN(len(remote))]
			ls := maps.Clone(p.Labels)
			ls["app"] = "app-00"
			prog, _ = comp.RelabelPod(p.Key(), ls)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		rs = buildCached(prog, benchNode, cache, nil)
		took += time.Since(start)
		runtime.ReadMemStats(&after)
		allocated += after.TotalAlloc - before.TotalAlloc
	}
	runtime.KeepAlive(rs)
	n := float64(b.N)
	b.ReportMetric(float64(took.Microseconds())/1000/n, "build-ms")
	b.ReportMetric(float64(allocated)/1e6/n, "build-MB")
}
