package policy_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// mutator changes a snapshot and stages the same change on a Compiler; it
// returns what it did.
type mutator func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, spare *policy.Cluster) string

var tiersOfLabels = []string{"web", "api", "db", "cache", "worker"}

var mutators = []mutator{
	// Relabel a pod.
	func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, _ *policy.Cluster) string {
		i := r.IntN(len(c.Pods))
		p := *c.Pods[i] // a copy: the compiler keeps the pods it is given
		l := maps.Clone(p.Labels)
		l["tier"] = tiersOfLabels[r.IntN(len(tiersOfLabels))]
		if r.IntN(3) == 0 {
			l["app"] = fmt.Sprintf("app-%02d", r.IntN(20))
		}
		if r.IntN(4) == 0 {
			delete(l, "app")
		}
		p.Labels = l
		c.Pods[i] = &p
		comp.UpsertPod(&p)
		return "relabel " + p.Key()
	},
	// Add a pod (a copy of another with a new name and address).
	func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, _ *policy.Cluster) string {
		p := *c.Pods[r.IntN(len(c.Pods))]
		p.Name = fmt.Sprintf("new-%d", r.Uint32())
		p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 250, byte(r.IntN(256)), byte(r.IntN(256))})}
		if r.IntN(8) == 0 {
			p.IPs = append(p.IPs, c.Pods[r.IntN(len(c.Pods))].IPs...) // a duplicate address
		}
		c.Pods = append(c.Pods, &p)
		comp.UpsertPod(&p)
		return "add " + p.Key()
	},
	// Delete a pod.
	func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, _ *policy.Cluster) string {
		if len(c.Pods) < 20 {
			return "nothing"
		}
		i := r.IntN(len(c.Pods))
		key := c.Pods[i].Key()
		c.Pods = slices.Delete(c.Pods, i, i+1)
		comp.DeletePod(key)
		return "delete " + key
	},
	// Change a pod's addresses, ports, or pod network.
	func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, _ *policy.Cluster) string {
		i := r.IntN(len(c.Pods))
		p := *c.Pods[i]
		switch r.IntN(5) {
		case 0:
			p.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 251, byte(r.IntN(256)), byte(r.IntN(256))})}
		case 1:
			p.IPs = nil
		case 2:
			p.Ports = slices.Clone(c.Pods[r.IntN(len(c.Pods))].Ports)
		case 3:
			p.NodeName = c.Nodes[r.IntN(len(c.Nodes))].Name
		default:
			p.HostNetwork = !p.HostNetwork
		}
		c.Pods[i] = &p
		comp.UpsertPod(&p)
		return "change " + p.Key()
	},
	// Relabel, add or delete a namespace.
	func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, _ *policy.Cluster) string {
		if len(c.Namespaces) == 0 {
			return "nothing"
		}
		i := r.IntN(len(c.Namespaces))
		ns := &c.Namespaces[i]
		switch r.IntN(4) {
		case 0:
			name := ns.Name
			c.Namespaces = slices.Delete(c.Namespaces, i, i+1)
			comp.DeleteNamespace(name)
			return "delete namespace " + name
		case 1:
			n := policy.Namespace{Name: fmt.Sprintf("ns-new-%d", r.IntN(1000)), Labels: map[string]string{"team": fmt.Sprintf("team-%02d", r.IntN(40))}}
			if slices.ContainsFunc(c.Namespaces, func(x policy.Namespace) bool { return x.Name == n.Name }) {
				return "nothing"
			}
			c.Namespaces = append(c.Namespaces, n)
			comp.UpsertNamespace(n)
			return "add namespace " + n.Name
		}
		l := maps.Clone(ns.Labels)
		l["team"] = fmt.Sprintf("team-%02d", r.IntN(40))
		l["env"] = []string{"prod", "staging", "dev"}[r.IntN(3)]
		ns.Labels = l
		comp.UpsertNamespace(*ns)
		return "relabel namespace " + ns.Name
	},
	// Change a node.
	func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, _ *policy.Cluster) string {
		n := &c.Nodes[r.IntN(len(c.Nodes))]
		l := maps.Clone(n.Labels)
		l["pool"] = []string{"general", "gpu"}[r.IntN(2)]
		n.Labels = l
		if r.IntN(3) == 0 {
			n.Addrs = []netip.Addr{netip.AddrFrom4([4]byte{172, 17, 0, byte(r.IntN(256))})}
		}
		comp.UpsertNode(*n)
		return "change node " + n.Name
	},
	// A pod takes a node's address, or a node a pod's: `nodes` peers
	// leave such an address out while a pod-network pod claims it.
	func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, _ *policy.Cluster) string {
		i := r.IntN(len(c.Pods))
		n := &c.Nodes[r.IntN(len(c.Nodes))]
		if r.IntN(2) == 0 || len(c.Pods[i].IPs) == 0 {
			if len(n.Addrs) == 0 {
				return "nothing"
			}
			p := *c.Pods[i]
			p.IPs = []netip.Addr{n.Addrs[r.IntN(len(n.Addrs))]}
			p.HostNetwork = false
			c.Pods[i] = &p
			comp.UpsertPod(&p)
			return "pod " + p.Key() + " takes node " + n.Name + "'s address"
		}
		n.Addrs = append(slices.Clone(n.Addrs), c.Pods[i].IPs[0])
		comp.UpsertNode(*n)
		return "node " + n.Name + " lists pod " + c.Pods[i].Key() + "'s address"
	},
	// Add, replace, touch or delete a NetworkPolicy. A deleted one joins
	// the spares, so that its rules come back later (a policy deleted and
	// applied again, or copied elsewhere) while the pods have changed.
	func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, spare *policy.Cluster) string {
		src := spare.NetworkPolicies[r.IntN(len(spare.NetworkPolicies))]
		op := r.IntN(4)
		if len(c.NetworkPolicies) == 0 {
			op = 0
		}
		switch op {
		case 0:
			np := &policy.NetworkPolicy{Spec: *src.Spec.DeepCopy()}
			np.Name = fmt.Sprintf("new-%d", r.Uint32())
			np.Namespace = c.Pods[r.IntN(len(c.Pods))].Namespace
			c.NetworkPolicies = append(c.NetworkPolicies, np)
			comp.UpsertNetworkPolicy(np)
			return "add NetworkPolicy " + np.Namespace + "/" + np.Name
		case 1:
			i := r.IntN(len(c.NetworkPolicies))
			np := &policy.NetworkPolicy{Spec: *src.Spec.DeepCopy()}
			np.Name, np.Namespace = c.NetworkPolicies[i].Name, c.NetworkPolicies[i].Namespace
			c.NetworkPolicies[i] = np
			comp.UpsertNetworkPolicy(np)
			return "replace NetworkPolicy " + np.Namespace + "/" + np.Name
		case 2:
			// The same spec again (a new generation): every rule is new.
			i := r.IntN(len(c.NetworkPolicies))
			np := &policy.NetworkPolicy{Spec: *c.NetworkPolicies[i].Spec.DeepCopy()}
			np.Name, np.Namespace, np.Generation = c.NetworkPolicies[i].Name, c.NetworkPolicies[i].Namespace, c.NetworkPolicies[i].Generation+1
			c.NetworkPolicies[i] = np
			comp.UpsertNetworkPolicy(np)
			return "touch NetworkPolicy " + np.Namespace + "/" + np.Name
		}
		i := r.IntN(len(c.NetworkPolicies))
		np := c.NetworkPolicies[i]
		c.NetworkPolicies = slices.Delete(c.NetworkPolicies, i, i+1)
		comp.DeleteNetworkPolicy(np.Namespace, np.Name)
		spare.NetworkPolicies = append(spare.NetworkPolicies, np)
		return "delete NetworkPolicy " + np.Namespace + "/" + np.Name
	},
	// Add, replace, touch or delete a ClusterNetworkPolicy; a deleted one
	// joins the spares.
	func(r *rand.Rand, c *policy.Cluster, comp *policy.Compiler, spare *policy.Cluster) string {
		src := spare.ClusterNetworkPolicies[r.IntN(len(spare.ClusterNetworkPolicies))]
		op := r.IntN(4)
		if len(c.ClusterNetworkPolicies) == 0 {
			op = 0
		}
		switch op {
		case 0:
			cnp := policy.ClusterNetworkPolicy{ClusterNetworkPolicy: src.ClusterNetworkPolicy.DeepCopy()}
			cnp.Name = fmt.Sprintf("new-%d", r.Uint32())
			c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, cnp)
			comp.UpsertClusterNetworkPolicy(cnp)
			return "add ClusterNetworkPolicy " + cnp.Name
		case 1:
			i := r.IntN(len(c.ClusterNetworkPolicies))
			cnp := policy.ClusterNetworkPolicy{ClusterNetworkPolicy: src.ClusterNetworkPolicy.DeepCopy()}
			cnp.Name = c.ClusterNetworkPolicies[i].Name
			c.ClusterNetworkPolicies[i] = cnp
			comp.UpsertClusterNetworkPolicy(cnp)
			return "replace ClusterNetworkPolicy " + cnp.Name
		case 2:
			i := r.IntN(len(c.ClusterNetworkPolicies))
			cnp := policy.ClusterNetworkPolicy{ClusterNetworkPolicy: c.ClusterNetworkPolicies[i].ClusterNetworkPolicy.DeepCopy()}
			cnp.Generation++
			c.ClusterNetworkPolicies[i] = cnp
			comp.UpsertClusterNetworkPolicy(cnp)
			return "touch ClusterNetworkPolicy " + cnp.Name
		}
		i := r.IntN(len(c.ClusterNetworkPolicies))
		cnp := c.ClusterNetworkPolicies[i]
		c.ClusterNetworkPolicies = slices.Delete(c.ClusterNetworkPolicies, i, i+1)
		comp.DeleteClusterNetworkPolicy(cnp.Name)
		spare.ClusterNetworkPolicies = append(spare.ClusterNetworkPolicies, cnp)
		return "delete ClusterNetworkPolicy " + cnp.Name
	},
}

// TestIncrementalMatchesFullCompile applies random sequences of changes
// (pods relabelled, added, deleted, readdressed; namespaces, nodes and
// policies added, replaced, deleted), a few at a time, and checks after
// each batch that the incremental Program explains every sampled flow
// exactly as a full compilation of the same snapshot does, with the same
// statuses and diagnostics, and that the Program from before the batch
// still answers as before.
func TestIncrementalMatchesFullCompile(t *testing.T) {
	for _, tc := range []struct {
		cfg  clustergen.Config
		opts policy.Options
	}{
		{clustergen.Config{Nodes: 4, Namespaces: 12, Pods: 150, NetworkPolicies: 30, ClusterPolicies: 12, Seed: 7}, policy.Options{IngressNetworksAndNodes: true}},
		{clustergen.Config{Nodes: 4, Namespaces: 12, Pods: 150, NetworkPolicies: 84, ClusterPolicies: 12, Seed: 8, Workloads: true}, policy.Options{}},
		{clustergen.Config{Nodes: 4, Namespaces: 12, Pods: 150, NetworkPolicies: 84, ClusterPolicies: 12, Seed: 9, Workloads: true}, policy.Options{IngressNetworksAndNodes: true, Node: "node-001"}},
	} {
		t.Run(fmt.Sprintf("seed=%d/workloads=%v/node=%q", tc.cfg.Seed, tc.cfg.Workloads, tc.opts.Node), func(t *testing.T) {
			cluster := clustergen.Generate(tc.cfg).ToCluster()
			spareCfg := tc.cfg
			spareCfg.Seed += 100
			spare := clustergen.Generate(spareCfg).ToCluster()
			spareMix := clustergen.Generate(clustergen.Config{Nodes: 4, Namespaces: 12, Pods: 10, NetworkPolicies: 30, ClusterPolicies: 12, Seed: 11}).ToCluster()
			spare.NetworkPolicies = append(spare.NetworkPolicies, spareMix.NetworkPolicies...)
			spare.ClusterNetworkPolicies = append(spare.ClusterNetworkPolicies, spareMix.ClusterNetworkPolicies...)
			comp := policy.NewCompiler(cluster, tc.opts)
			r := rand.New(rand.NewPCG(tc.cfg.Seed, 4))
			for step := 0; step < 60; step++ {
				before := comp.Program()
				flows := sampleFlows(before, 300)
				was := make([]policy.Verdict, len(flows))
				for i, f := range flows {
					was[i] = before.Evaluate(f)
				}
				var did []string
				for range 1 + r.IntN(3) {
					did = append(did, mutators[r.IntN(len(mutators))](r, cluster, comp, spare))
				}
				inc := comp.Program()
				full := policy.Compile(cluster, tc.opts)
				what := fmt.Sprintf("step %d (%s)", step, strings.Join(did, "; "))
				sameProgram(t, what, inc, full, addrFlows(full, cluster, 300)...)
				for i, f := range flows {
					if v := before.Evaluate(f); !sameVerdict(v, was[i]) {
						t.Fatalf("%s: the previous Program changed its answer for %+v", what, f)
					}
				}
			}
		})
	}
}

// randomSeeds is how many random clusters TestIncrementalMatchesFullCompileRandom
// changes.
var randomSeeds = 12

// TestIncrementalMatchesFullCompileRandom runs the same change sequences on
// the lab's random clusters: few pods, many policies, dual-stack pods,
// named ports towards ipBlocks, node peers.
func TestIncrementalMatchesFullCompileRandom(t *testing.T) {
	load := func(seed int64) *policy.Cluster {
		y, err := randcluster.Generate(seed, randcluster.Default()).Manifests()
		if err != nil {
			t.Fatal(err)
		}
		l := manifest.Loader{Stdin: strings.NewReader(string(y))}
		res, err := l.Load("-")
		if err != nil {
			t.Fatal(err)
		}
		return &res.Cluster
	}
	for seed := int64(1); seed <= int64(randomSeeds); seed++ {
		cluster, spare := load(seed), load(seed+1000)
		spare.NetworkPolicies = append(spare.NetworkPolicies, load(seed+2000).NetworkPolicies...)
		spare.ClusterNetworkPolicies = append(spare.ClusterNetworkPolicies, load(seed+2000).ClusterNetworkPolicies...)
		if len(spare.NetworkPolicies) == 0 || len(spare.ClusterNetworkPolicies) == 0 || len(cluster.Nodes) == 0 {
			continue
		}
		opts := policy.Options{IngressNetworksAndNodes: seed%2 == 0, DenyNodeLocal: seed%3 == 0}
		if seed%4 == 0 {
			opts.Node = cluster.Nodes[0].Name
		}
		comp := policy.NewCompiler(cluster, opts)
		r := rand.New(rand.NewPCG(uint64(seed), 5))
		for step := 0; step < 40; step++ {
			var did []string
			for range 1 + r.IntN(3) {
				did = append(did, mutators[r.IntN(len(mutators))](r, cluster, comp, spare))
			}
			full := policy.Compile(cluster, opts)
			sameProgram(t, fmt.Sprintf("seed %d step %d (%s)", seed, step, strings.Join(did, "; ")), comp.Program(), full, addrFlows(full, cluster, 200)...)
		}
	}
}

// sameProgram compares two Programs of the same snapshot: pods, statuses,
// diagnostics, and the verdict and explanation of sampled flows and of
// extra ones.
func sameProgram(t *testing.T, what string, inc, full *policy.Program, extra ...policy.Flow) {
	t.Helper()
	if len(inc.Pods) != len(full.Pods) {
		t.Fatalf("%s: %d pods, full compile %d", what, len(inc.Pods), len(full.Pods))
	}
	for i := range inc.Pods {
		if inc.Pods[i].Key() != full.Pods[i].Key() || (inc.Policies[i] == nil) != (full.Policies[i] == nil) {
			t.Fatalf("%s: pod %d: %s policed=%v, full compile %s policed=%v", what, i, inc.Pods[i].Key(), inc.Policies[i] != nil, full.Pods[i].Key(), full.Policies[i] != nil)
		}
		if j, ok := inc.PodByKey(full.Pods[i].Key()); !ok || j != i {
			t.Fatalf("%s: PodByKey(%s) = %d, %v; want %d", what, full.Pods[i].Key(), j, ok, i)
		}
		for _, a := range full.Pods[i].IPs {
			j1, ok1 := inc.PodByIP(a)
			j2, ok2 := full.PodByIP(a)
			if j1 != j2 || ok1 != ok2 || inc.DuplicateAddr(a) != full.DuplicateAddr(a) {
				t.Fatalf("%s: PodByIP(%s) = %d, %v; full compile %d, %v", what, a, j1, ok1, j2, ok2)
			}
		}
	}
	// The address sets a dataplane programs (the evaluator finds pods by
	// slot, so only these show an address a peer kept or lost wrongly).
	for i := range inc.Pods {
		if a, b := renderMatches(inc.Policies[i]), renderMatches(full.Policies[i]); a != b {
			t.Fatalf("%s: pod %s's rules\n%s\nfull compile\n%s", what, inc.Pods[i].Key(), a, b)
		}
	}
	if fmt.Sprint(inc.Status) != fmt.Sprint(full.Status) || inc.Counts != full.Counts {
		t.Fatalf("%s: status\n%v %+v\nfull compile\n%v %+v", what, inc.Status, inc.Counts, full.Status, full.Counts)
	}
	diags := func(p *policy.Program) []string {
		var out []string
		for _, d := range p.Diagnostics {
			out = append(out, d.String())
		}
		slices.Sort(out)
		return out
	}
	if a, b := diags(inc), diags(full); !slices.Equal(a, b) {
		t.Fatalf("%s: diagnostics\n%s\nfull compile\n%s", what, strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
	for _, f := range extra {
		for _, a := range []netip.Addr{f.Src.Addr, f.Dst.Addr} {
			j1, ok1 := inc.PodByIP(a)
			j2, ok2 := full.PodByIP(a)
			if j1 != j2 || ok1 != ok2 {
				t.Fatalf("%s: PodByIP(%s) = %d, %v; full compile %d, %v", what, a, j1, ok1, j2, ok2)
			}
		}
	}
	flows := append(append(sampleFlows(full, 500), outsideFlows(full)...), lastAddrFlows(full)...)
	for _, f := range append(flows, extra...) {
		if a, b := inc.Evaluate(f), full.Evaluate(f); !sameVerdict(a, b) {
			t.Fatalf("%s: flow %s -> %s %s/%d:\nincremental %+v\nfull compile %+v", what, f.Src.Addr, f.Dst.Addr, f.Proto, f.Port, a, b)
		}
	}
}

// outsideFlows are flows between some pods and addresses outside the
// pod network (nodes, ipBlocks, the internet).
func outsideFlows(p *policy.Program) []policy.Flow {
	var out []policy.Flow
	outside := []string{"192.168.7.9", "192.168.7.200", "203.0.0.5", "8.8.8.8", "172.16.0.2", "172.17.0.5"}
	for i := 0; i < len(p.Pods); i += 7 {
		if len(p.Pods[i].IPs) == 0 {
			continue
		}
		pod := policy.Endpoint{Pod: i, Addr: p.Pods[i].IPs[0]}
		ext := policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr(outside[i%len(outside)])}
		for _, port := range []uint16{443, 8443, 10250, 53} {
			out = append(out, policy.Flow{Src: pod, Dst: ext, Proto: policy.ProtoTCP, Port: port}, policy.Flow{Src: ext, Dst: pod, Proto: policy.ProtoTCP, Port: port})
		}
	}
	return out
}

// lastAddrFlows are flows between pods' last addresses (IPv6 on
// dual-stack pods), on named and numbered ports.
func lastAddrFlows(p *policy.Program) []policy.Flow {
	var eps []policy.Endpoint
	for i := range p.Pods {
		if n := len(p.Pods[i].IPs); n > 1 {
			eps = append(eps, policy.Endpoint{Pod: i, Addr: p.Pods[i].IPs[n-1], Fixed: true})
		}
	}
	var out []policy.Flow
	for i := 0; i < len(eps) && len(out) < 400; i++ {
		for j := 0; j < len(eps) && len(out) < 400; j += 1 + i%3 {
			for _, port := range []uint16{53, 80, 443, 5432, 8080} {
				out = append(out, policy.Flow{Src: eps[i], Dst: eps[j], Proto: policy.ProtoTCP, Port: port})
			}
		}
	}
	return out
}

// addrFlows pairs the cluster's pods with each other by address, as a
// node-scoped Program sees them: pods it does not list (those on other
// nodes) are addresses only (Pod -1).
func addrFlows(p *policy.Program, c *policy.Cluster, n int) []policy.Flow {
	var eps []policy.Endpoint
	for i := range c.Pods {
		if len(c.Pods[i].IPs) == 0 {
			continue
		}
		j, ok := p.PodByKey(c.Pods[i].Key())
		if !ok {
			j = -1
		}
		eps = append(eps, policy.Endpoint{Pod: j, Addr: c.Pods[i].IPs[0]})
	}
	var out []policy.Flow
	for i := 0; len(eps) > 0 && len(out) < n; i++ {
		s, d := eps[(i*7919)%len(eps)], eps[(i*104729+1)%len(eps)]
		out = append(out, policy.Flow{Src: s, Dst: d, Proto: policy.ProtoTCP, Port: []uint16{80, 443, 8080, 5432}[i%4]})
	}
	return out
}

func sameVerdict(a, b policy.Verdict) bool {
	return fmt.Sprintf("%v|%s|%s|%v|%s|%s|%v", a.Allowed, a.Egress.Tier, a.Egress.Reason, a.Egress.Passed, a.Ingress.Tier, a.Ingress.Reason, a.Ingress.Passed) ==
		fmt.Sprintf("%v|%s|%s|%v|%s|%s|%v", b.Allowed, b.Egress.Tier, b.Egress.Reason, b.Egress.Passed, b.Ingress.Tier, b.Ingress.Reason, b.Ingress.Passed)
}

// TestRelabelMatchesFullCompile relabels random pods one after another
// through RelabelPod and checks each step against a full compilation.
func TestRelabelMatchesFullCompile(t *testing.T) {
	gen := clustergen.Generate(clustergen.Config{Nodes: 4, Namespaces: 12, Pods: 150, NetworkPolicies: 30, ClusterPolicies: 12, Seed: 7})
	cluster := gen.ToCluster()
	comp := policy.NewCompiler(cluster, policy.Options{})
	r := rand.New(rand.NewPCG(3, 4))
	for step := 0; step < 40; step++ {
		pi := r.IntN(len(cluster.Pods))
		labels := maps.Clone(cluster.Pods[pi].Labels)
		labels["tier"] = tiersOfLabels[r.IntN(len(tiersOfLabels))]
		if r.IntN(3) == 0 {
			delete(labels, "app")
		}
		relabelled := *cluster.Pods[pi]
		relabelled.Labels = labels
		cluster.Pods[pi] = &relabelled
		inc, ok := comp.RelabelPod(cluster.Pods[pi].Key(), labels)
		if !ok {
			t.Fatalf("pod %s unknown", cluster.Pods[pi].Key())
		}
		sameProgram(t, fmt.Sprintf("step %d (relabel %s)", step, cluster.Pods[pi].Key()), inc, policy.Compile(cluster, policy.Options{}))
	}
	if _, ok := comp.RelabelPod("nowhere/nothing", nil); ok {
		t.Error("RelabelPod of an unknown pod succeeded")
	}
}

// BenchmarkRelabelScale measures the incremental recompile after one pod
// relabel in the scale cluster.
func BenchmarkRelabelScale(b *testing.B) {
	cluster := clustergen.Generate(clustergen.Scale).ToCluster()
	comp := policy.NewCompiler(cluster, policy.Options{})
	i := 0
	for b.Loop() {
		p := cluster.Pods[(i*7919)%len(cluster.Pods)]
		labels := maps.Clone(p.Labels)
		labels["tier"] = tiersOfLabels[i%len(tiersOfLabels)]
		if _, ok := comp.RelabelPod(p.Key(), labels); !ok {
			b.Fatal("unknown pod")
		}
		i++
	}
}

// renderMatches prints a pod's rules with their address and port sets.
func renderMatches(pp *policy.PodPolicy) string {
	if pp == nil {
		return "not policed"
	}
	var b strings.Builder
	match := func(m policy.Match) {
		for _, term := range m {
			fmt.Fprintf(&b, " [%s %s]", term.Addrs, term.Ports)
		}
		b.WriteByte('\n')
	}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		dp := pp.Dir(dir)
		if dp == nil {
			continue
		}
		for _, r := range dp.Admin {
			fmt.Fprintf(&b, "%v admin %v:", dir, r.Rule)
			match(r.Match)
		}
		if dp.NP != nil {
			for _, r := range dp.NP.Rules {
				fmt.Fprintf(&b, "%v np %v/%d:", dir, r.Policy, r.Index)
				match(r.Match)
			}
		}
		for _, r := range dp.Baseline {
			fmt.Fprintf(&b, "%v baseline %v:", dir, r.Rule)
			match(r.Match)
		}
	}
	return b.String()
}

// Compiler.NetworkPolicies finds NetworkPolicies as the Compiler holds
// them, staged changes included: the agent reports on exactly the
// generation it compiled.
func TestCompilerFindsNetworkPolicies(t *testing.T) {
	cluster := load(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: q, namespace: a}
spec: {podSelector: {}}
`)
	comp := policy.NewCompiler(cluster, policy.Options{Node: "n1"})
	got := comp.NetworkPolicies([]string{"a/p", "a/q", "a/r", "b/p", "nowhere/p", "a/p"})
	if len(got) != 2 || got["a/p"] != cluster.NetworkPolicies[0] || got["a/q"] != cluster.NetworkPolicies[1] {
		t.Fatalf("NetworkPolicies = %v, want a/p and a/q as given", got)
	}
	next := *cluster.NetworkPolicies[0]
	next.Generation++
	comp.UpsertNetworkPolicy(&next)
	if got := comp.NetworkPolicies([]string{"a/p"}); got["a/p"] != &next {
		t.Fatalf("after an update: %v, want the new generation", got)
	}
	comp.DeleteNetworkPolicy("a", "p")
	if got := comp.NetworkPolicies([]string{"a/p"}); got != nil {
		t.Fatalf("after delete: %v", got)
	}
}

// An egress rule to a named port gives one term per port number the
// destinations declare it on. The terms are listed by port, not by the
// first destination pod met: after a destination pod is deleted and added
// back (a new slot), the incremental Program must still list them as a
// fresh compile does, or rulesets rendered from the two would differ.
func TestIncrementalNamedPortTermOrder(t *testing.T) {
	cluster := load(t, `
apiVersion: v1
kind: Pod
metadata: {name: m1, namespace: a, labels: {role: metrics}}
spec: {nodeName: n1, containers: [{name: c, image: x, ports: [{name: metrics, containerPort: 9300}]}]}
status: {podIPs: [{ip: 10.9.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: m2, namespace: a, labels: {role: metrics}}
spec: {nodeName: n1, containers: [{name: c, image: x, ports: [{name: metrics, containerPort: 9100}]}]}
status: {podIPs: [{ip: 10.9.0.2}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: scrape, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  policyTypes: [Egress]
  egress: [{to: [{podSelector: {matchLabels: {role: metrics}}}], ports: [{port: metrics}]}]
`)
	comp := policy.NewCompiler(cluster, policy.Options{})
	for _, key := range []string{"a/m1", "a/m2"} {
		i := slices.IndexFunc(cluster.Pods, func(p *policy.Pod) bool { return p.Key() == key })
		p := cluster.Pods[i]
		if !comp.DeletePod(key) {
			t.Fatalf("DeletePod(%s): unknown", key)
		}
		comp.Program()
		// Another pod takes the freed slot before it comes back.
		filler := &policy.Pod{Namespace: "a", Name: "filler-" + p.Name, NodeName: "n1", IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 9, 1, byte(len(cluster.Pods))})}}
		comp.UpsertPod(filler)
		cluster.Pods = append(cluster.Pods, filler)
		comp.Program()
		comp.UpsertPod(p)
		inc, full := comp.Program(), policy.Compile(cluster, policy.Options{})
		for j := range full.Policies {
			if a, b := renderMatches(inc.Policies[j]), renderMatches(full.Policies[j]); a != b {
				t.Fatalf("after %s left and came back, pod %s's rules differ:\nincremental:\n%s\nfresh:\n%s", key, full.Pods[j].Key(), a, b)
			}
		}
	}
}
