package policy_test

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/cputime"
	"github.com/moat-net/moat/policy"
)

// BenchmarkCompileScale compiles the scale cluster: 10,000 pods,
// 1,000 namespaces, 100 nodes, 2,000 NetworkPolicies, 200
// ClusterNetworkPolicies. It reports the heap the Program keeps alive.
func BenchmarkCompileScale(b *testing.B) {
	c := clustergen.Generate(clustergen.Scale).ToCluster()
	var prog *policy.Program
	b.ReportAllocs()
	for b.Loop() {
		prog = policy.Compile(c, policy.Options{IngressNetworksAndNodes: true})
	}
	b.StopTimer()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(prog)
	prog = nil
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "program-MiB")
	b.ReportMetric(float64(after.Sys)/(1<<20), "sys-MiB")
}

// BenchmarkCompileWorkloads compiles issue 8's workload shape at 10,000,
// 20,000, 40,000 and 100,000 pods (policies grow with pods: 7
// NetworkPolicies per namespace, one ClusterNetworkPolicy per 20 pods). It
// reports the heap the Program keeps alive. Run one size with
// -bench 'CompileWorkloads/pods=100000$'.
func BenchmarkCompileWorkloads(b *testing.B) {
	for _, cfg := range []clustergen.Config{clustergen.Scale10k, clustergen.Scale20k, clustergen.Scale40k, clustergen.Scale100k} {
		b.Run(fmt.Sprintf("pods=%d", cfg.Pods), func(b *testing.B) {
			c := clustergen.Generate(cfg).ToCluster()
			runtime.GC()
			var base runtime.MemStats
			runtime.ReadMemStats(&base)
			var prog *policy.Program
			cpu := cputime.Process()
			for b.Loop() {
				prog = nil
				prog = policy.Compile(c, policy.Options{IngressNetworksAndNodes: true})
			}
			b.StopTimer()
			b.ReportMetric((cputime.Process()-cpu).Seconds()/float64(b.N), "cpu-s/op")
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(prog)
			runtime.KeepAlive(c)
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(base.HeapAlloc))/(1<<20), "program-MiB")
			b.ReportMetric(float64(after.Sys)/(1<<20), "sys-MiB")
		})
	}
}

// BenchmarkEvaluate measures one flow's verdict as the number of policies
// grows; pods are fixed at 10,000. "verdict" is Program.Allowed, "explained"
// is Program.Evaluate with both directions put into words.
func BenchmarkEvaluate(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			cfg := clustergen.Scale
			cfg.NetworkPolicies = n * 10 / 11
			cfg.ClusterPolicies = n - cfg.NetworkPolicies
			prog := policy.Compile(clustergen.Generate(cfg).ToCluster(), policy.Options{IngressNetworksAndNodes: true})
			flows := sampleFlows(prog, 1024)
			for _, f := range flows {
				prog.Evaluate(f) // build the lazy per-pod indexes first
			}
			b.Run("verdict", func(b *testing.B) {
				i := 0
				for b.Loop() {
					prog.Allowed(flows[i%len(flows)])
					i++
				}
			})
			b.Run("explained", func(b *testing.B) {
				i := 0
				for b.Loop() {
					prog.Evaluate(flows[i%len(flows)])
					i++
				}
			})
		})
	}
}

// BenchmarkEvaluateWorkloads measures one flow's verdict in issue 8's
// workload clusters at 10,000 and 100,000 pods (policies grow with pods).
// cpu-ns/op is the process's CPU time per verdict: on a loaded machine
// it leaves out the time the benchmark waited for a core, which ns/op
// counts.
func BenchmarkEvaluateWorkloads(b *testing.B) {
	for _, cfg := range []clustergen.Config{clustergen.Scale10k, clustergen.Scale100k} {
		b.Run(fmt.Sprintf("pods=%d", cfg.Pods), func(b *testing.B) {
			prog := policy.Compile(clustergen.Generate(cfg).ToCluster(), policy.Options{IngressNetworksAndNodes: true})
			flows := sampleFlows(prog, 1024)
			// The heap the flows' first verdicts add (the per-pod table
			// and the indexes they build) is what later verdicts read:
			// the working set that decides how often they miss the caches.
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for _, f := range flows {
				prog.Evaluate(f) // build the lazy indexes first
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			indexMiB := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / (1 << 20)
			b.Run("verdict", func(b *testing.B) {
				i := 0
				cpu := cputime.Process()
				for b.Loop() {
					benchVerdict(prog, flows[i%len(flows)])
					i++
				}
				b.ReportMetric(float64(cputime.Process()-cpu)/float64(b.N), "cpu-ns/op")
				b.ReportMetric(indexMiB, "index-MiB")
			})
			b.Run("explained", func(b *testing.B) {
				i := 0
				cpu := cputime.Process()
				for b.Loop() {
					prog.Evaluate(flows[i%len(flows)])
					i++
				}
				b.ReportMetric(float64(cputime.Process()-cpu)/float64(b.N), "cpu-ns/op")
			})
		})
	}
}

// benchVerdict is one verdict of BenchmarkEvaluateWorkloads, kept out of
// line so that callgrind can count its instructions alone
// (--toggle-collect='*benchVerdict*'): instructions per verdict do not
// depend on the machine's load or caches, so they tell whether the
// evaluator's work stays flat as the cluster grows when its time does not
// (BENCHMARKS.md, evaluator).
//
//go:noinline
func benchVerdict(prog *policy.Program, f policy.Flow) bool {
	return prog.Allowed(f)
}

// sampleFlows picks pod-to-pod flows deterministically.
func sampleFlows(prog *policy.Program, n int) []policy.Flow {
	var flows []policy.Flow
	ports := []uint16{8080, 8443, 9090, 53, 30001, 22}
	if len(prog.Pods) == 0 {
		return nil
	}
	for i := 0; len(flows) < n && i < 100*n; i++ {
		s := (i * 7919) % len(prog.Pods)
		d := (i * 104729) % len(prog.Pods)
		if len(prog.Pods[s].IPs) == 0 || len(prog.Pods[d].IPs) == 0 {
			continue
		}
		proto := policy.ProtoTCP
		if ports[i%len(ports)] == 53 {
			proto = policy.ProtoUDP
		}
		flows = append(flows, policy.Flow{
			Src: policy.Endpoint{Pod: s, Addr: prog.Pods[s].IPs[0]}, Dst: policy.Endpoint{Pod: d, Addr: prog.Pods[d].IPs[0]},
			Proto: proto, Port: ports[i%len(ports)],
		})
	}
	return flows
}

// scale30k is the agent's goal size: 30,000 pods of issue 8's workload
// shape.
var scale30k = clustergen.Config{Nodes: 300, Namespaces: 3000, Pods: 30000, NetworkPolicies: 21000, ClusterPolicies: 1500, Seed: 1, Workloads: true}

// BenchmarkIncremental measures one change applied by a Compiler and the
// new Program published, at 30,000 pods (issue 8's workload shape): a pod
// relabelled (its app changes, so it leaves and joins selector peers and
// classes), a pod added then deleted, a NetworkPolicy added then deleted,
// a ClusterNetworkPolicy added then deleted, a pod given a node's address
// then its own again, a namespace relabelled. It
// reports the median and the 99th percentile of one change, and what it
// allocates, for the whole cluster and scoped to one node (as moat-agent
// compiles, where nearly every change is of a pod elsewhere).
func BenchmarkIncremental(b *testing.B) {
	for _, node := range []string{"", "node-000"} {
		b.Run(fmt.Sprintf("node=%q", node), func(b *testing.B) { benchIncremental(b, node) })
	}
}

func benchIncremental(b *testing.B, node string) {
	gen := clustergen.Generate(scale30k)
	cluster := gen.ToCluster()
	spare := clustergen.Generate(clustergen.Config{Nodes: 10, Namespaces: 300, Pods: 10, NetworkPolicies: 2100, ClusterPolicies: 150, Seed: 2, Workloads: true}).ToCluster()
	opts := policy.Options{IngressNetworksAndNodes: true, Node: node}
	comp := policy.NewCompiler(cluster, opts)
	apps := []string{"app-00", "app-03", "app-07", "app-11"}
	changes := []struct {
		name string
		do   func(i int)
	}{
		{"relabel", func(i int) {
			p := *cluster.Pods[(i*7919)%len(cluster.Pods)] // a copy: the compiler keeps what it is given
			p.Labels = maps.Clone(p.Labels)
			p.Labels["app"] = apps[i%len(apps)]
			comp.UpsertPod(&p)
		}},
		{"pod-add-delete", func(i int) {
			p := *cluster.Pods[(i*7919)%len(cluster.Pods)]
			if i%2 == 0 {
				p.Name += "-new"
				p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 250, byte(i >> 8), byte(i)})}
				comp.UpsertPod(&p)
			} else {
				comp.DeletePod(p.Namespace + "/" + p.Name + "-new")
			}
		}},
		{"networkpolicy-add-delete", func(i int) {
			np := *spare.NetworkPolicies[(i/2)%len(spare.NetworkPolicies)] // a copy: the compiler keeps what it is given
			np.Namespace = cluster.Namespaces[(i*31)%len(cluster.Namespaces)].Name
			np.Name = fmt.Sprintf("bench-%d", i/2)
			if i%2 == 0 {
				comp.UpsertNetworkPolicy(&np)
			} else {
				comp.DeleteNetworkPolicy(cluster.Namespaces[((i-1)*31)%len(cluster.Namespaces)].Name, np.Name)
			}
		}},
		{"clusternetworkpolicy-add-delete", func(i int) {
			cnp := spare.ClusterNetworkPolicies[(i/2)%len(spare.ClusterNetworkPolicies)]
			cnp.ClusterNetworkPolicy = cnp.ClusterNetworkPolicy.DeepCopy()
			cnp.Name = fmt.Sprintf("bench-%d", i/2)
			if i%2 == 0 {
				comp.UpsertClusterNetworkPolicy(cnp)
			} else {
				comp.DeleteClusterNetworkPolicy(cnp.Name)
			}
		}},
		{"pod-takes-node-address", func(i int) {
			// A pod takes a node's address and gives it back: the nodes
			// peers leave it out meanwhile (nodeClaimsChanged).
			p := *cluster.Pods[(i/2*7919)%len(cluster.Pods)]
			if i%2 == 0 {
				p.IPs = []netip.Addr{cluster.Nodes[(i/2)%len(cluster.Nodes)].Addrs[0]}
			}
			comp.UpsertPod(&p)
		}},
		{"namespace-relabel", func(i int) {
			ns := cluster.Namespaces[(i*31)%len(cluster.Namespaces)]
			ns.Labels = maps.Clone(ns.Labels)
			ns.Labels["team"] = fmt.Sprintf("team-%02d", i%40)
			comp.UpsertNamespace(ns)
		}},
	}
	for _, ch := range changes {
		b.Run(ch.name, func(b *testing.B) {
			b.ReportAllocs()
			var times []time.Duration
			i := 0
			for b.Loop() {
				start := time.Now()
				ch.do(i)
				comp.Program()
				times = append(times, time.Since(start))
				i++
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(times[len(times)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// BenchmarkCompilerMemory reports the heap a Compiler keeps at 30,000 and
// 100,000 pods of issue 8's workload shape, for the whole cluster and
// scoped to one node (Options.Node, as moat-agent compiles): its Program
// and everything it keeps for incremental changes.
func BenchmarkCompilerMemory(b *testing.B) {
	for _, cfg := range []clustergen.Config{scale30k, clustergen.Scale100k} {
		c := clustergen.Generate(cfg).ToCluster()
		for _, node := range []string{"", "node-000"} {
			b.Run(fmt.Sprintf("pods=%d/node=%q", cfg.Pods, node), func(b *testing.B) {
				var comp *policy.Compiler
				cpu := cputime.Process()
				for b.Loop() {
					comp = nil
					runtime.GC()
					var base runtime.MemStats
					runtime.ReadMemStats(&base)
					comp = policy.NewCompiler(c, policy.Options{IngressNetworksAndNodes: true, Node: node})
					runtime.GC()
					var after runtime.MemStats
					runtime.ReadMemStats(&after)
					b.ReportMetric(float64(int64(after.HeapAlloc)-int64(base.HeapAlloc))/(1<<20), "compiler-MiB")
				}
				b.ReportMetric((cputime.Process()-cpu).Seconds()/float64(b.N), "cpu-s/op")
				runtime.KeepAlive(comp)
			})
		}
	}
}

// BenchmarkValidatePolicies validates the 100,000-pod workload cluster's
// 75,000 policies on one goroutine, alternately without and with the
// validator remembering the selectors it found valid (as a compile's
// workers do), and reports the CPU time of each.
func BenchmarkValidatePolicies(b *testing.B) {
	c := clustergen.Generate(clustergen.Scale100k).ToCluster()
	var spent [2]time.Duration
	for b.Loop() {
		for i, remember := range []bool{false, true} {
			start := cputime.Process()
			policy.ValidatePolicies(c, remember)
			spent[i] += cputime.Process() - start
		}
	}
	b.ReportMetric(spent[0].Seconds()/float64(b.N), "plain-cpu-s")
	b.ReportMetric(spent[1].Seconds()/float64(b.N), "remembering-cpu-s")
}
