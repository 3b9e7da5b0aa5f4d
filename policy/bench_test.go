package policy_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/moat-net/moat/internal/clustergen"
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

// sampleFlows picks pod-to-pod flows deterministically.
func sampleFlows(prog *policy.Program, n int) []policy.Flow {
	var flows []policy.Flow
	ports := []uint16{8080, 8443, 9090, 53, 30001, 22}
	for i := 0; len(flows) < n; i++ {
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
