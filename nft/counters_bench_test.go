package nft

import (
	"context"
	"maps"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/policy"
)

// syncBenchNode programs benchNode of the agent scale benchmark's
// 30,000-pod cluster in a private network namespace, which leave leaves.
func syncBenchNode(b *testing.B) (iface knftables.Interface, s *Syncer, res Result, leave func()) {
	g := clustergen.Generate(clustergen.Config{Nodes: 300, Namespaces: 3000, Pods: 30000, NetworkPolicies: 19000, ClusterPolicies: 1000, Seed: 1, Workloads: true})
	prog := policy.Compile(g.ToCluster(), policy.Options{IngressNetworksAndNodes: true, Node: benchNode})
	leave = enterPrivateNetns(b)
	iface, err := NewInterface()
	if err != nil {
		leave()
		b.Fatal(err)
	}
	s = New(iface, Options{Node: benchNode})
	if res, err = s.Sync(context.Background(), prog); err != nil {
		leave()
		b.Fatal(err)
	}
	return iface, s, res, leave
}

// BenchmarkReadCounters programs benchNode of the agent scale benchmark's
// 30,000-pod cluster (BenchmarkRelabelWorkloads' cluster and options) in
// a private network namespace and reads its drop counters both ways,
// alternating in each iteration: NetlinkCounters (one GETOBJ dump) and
// one `nft --json list counters` (knftables' ListCounters, what
// Syncer.Counters ran before). It reports wall time and CPU per reading; the CPU of a
// reading is this process's (user+system: the netlink dump runs in the
// kernel on its behalf) plus, for nft, that of the nft child it waited
// for.
func BenchmarkReadCounters(b *testing.B) {
	iface, s, res, leave := syncBenchNode(b)
	defer leave()
	ctx := context.Background()
	counters := len(s.Applied().counters)
	readers := []struct {
		name string
		r    CounterReader
	}{{"netlink", NetlinkCounters{}}, {"nft", listedCounters{iface}}}
	var wall, cpu [2]time.Duration
	var readings [2]map[string]CounterValue
	n := 0
	for b.Loop() {
		for i, rd := range readers {
			c0 := cpuTime(b)
			t0 := time.Now()
			got, err := rd.r.ReadCounters(ctx)
			wall[i] += time.Since(t0)
			cpu[i] += cpuTime(b) - c0
			if err != nil {
				b.Fatalf("%s: %v", rd.name, err)
			}
			readings[i] = got
		}
		n++
	}
	if len(readings[0]) != counters || !maps.Equal(readings[0], readings[1]) {
		b.Fatalf("the readings differ or miss counters (%d programmed): netlink %d counters, nft %d", counters, len(readings[0]), len(readings[1]))
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	for i, rd := range readers {
		b.ReportMetric(ms(wall[i]), rd.name+"-ms/read")
		b.ReportMetric(ms(cpu[i]), rd.name+"-cpu-ms/read")
	}
	b.ReportMetric(float64(counters), "counters")
	b.ReportMetric(float64(res.Stats.Rules), "rules")
	b.ReportMetric(float64(res.Stats.Sets), "sets")
	b.ReportMetric(float64(res.Stats.Elements), "elements")
}

// cpuTime is the user and system time of this process and of its
// children that have been waited for.
func cpuTime(b *testing.B) time.Duration {
	var d time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			b.Fatal(err)
		}
		d += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return d
}

// listedCounters reads the counters with one knftables ListCounters, as
// Syncer.Counters did before NetlinkCounters.
type listedCounters struct{ nft knftables.Interface }

func (r listedCounters) ReadCounters(ctx context.Context) (map[string]CounterValue, error) {
	list, err := r.nft.ListCounters(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]CounterValue, len(list))
	for _, c := range list {
		var v CounterValue
		if c.Packets != nil && c.Bytes != nil {
			v = CounterValue{Packets: *c.Packets, Bytes: *c.Bytes}
		}
		out[c.Name] = v
	}
	return out, nil
}
