package nft

import (
	"context"
	"maps"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netns"

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
// namespace; the returned function moves it back.
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
// nft reads) and the nft transaction itself.
func BenchmarkProgramNode(b *testing.B) {
	prog := policy.Compile(scaleCluster().ToCluster(), policy.Options{IngressNetworksAndNodes: true})
	defer enterPrivateNetns(b)()
	iface, err := NewInterface()
	if err != nil {
		b.Fatal(err)
	}
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
// transaction. It reports both parts; "local" relabels a pod on
// benchNode, "remote" one elsewhere.
func BenchmarkRelabel(b *testing.B) {
	g := scaleCluster()
	for _, where := range []string{"local", "remote"} {
		b.Run(where, func(b *testing.B) {
			cluster := g.ToCluster()
			comp := policy.NewCompiler(cluster, policy.Options{IngressNetworksAndNodes: true})
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
			// The first pod (on benchNode, or elsewhere) whose relabel
			// changes benchNode's rules.
			var key string
			var labels []map[string]string
			for i := range cluster.Pods {
				p := &cluster.Pods[i]
				if (p.NodeName == benchNode) != (where == "local") {
					continue
				}
				ls := []map[string]string{maps.Clone(p.Labels), maps.Clone(p.Labels)}
				ls[1]["tier"] = "db"
				if ls[0]["tier"] == "db" {
					ls[1]["tier"] = "web"
				}
				prog, _ := comp.RelabelPod(p.Key(), ls[1])
				res, err := s.Sync(ctx, prog)
				if err != nil {
					b.Fatal(err)
				}
				prog, _ = comp.RelabelPod(p.Key(), ls[0])
				if _, err := s.Sync(ctx, prog); err != nil {
					b.Fatal(err)
				}
				if res.Operations > 0 {
					key, labels = p.Key(), ls
					break
				}
			}
			if key == "" {
				b.Fatal("no relabel changes the node's rules")
			}
			var compile, sync time.Duration
			i, ops := 0, 0
			for b.Loop() {
				t0 := time.Now()
				prog, ok := comp.RelabelPod(key, labels[(i+1)%2])
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
				if res.Full {
					b.Fatal("relabel fell back to a full replace")
				}
				ops += res.Operations
				i++
			}
			b.ReportMetric(float64(ops)/float64(i), "nft-ops/relabel")
			b.ReportMetric(float64(compile.Microseconds())/1000/float64(i), "compile-ms/relabel")
			b.ReportMetric(float64(sync.Microseconds())/1000/float64(i), "sync-ms/relabel")
		})
	}
}
