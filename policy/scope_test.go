package policy_test

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/policy"
)

// A Program scoped to a node (Options.Node) lists that node's pods only,
// gives a PodPolicy to its pod-network pods, and judges them exactly as
// the whole cluster's Program does: peers are resolved cluster-wide, and
// pods elsewhere are addresses to it.
func TestNodeScopedProgram(t *testing.T) {
	for _, cfg := range []clustergen.Config{
		{Nodes: 4, Namespaces: 12, Pods: 150, NetworkPolicies: 30, ClusterPolicies: 12, Seed: 3},
		{Nodes: 5, Namespaces: 10, Pods: 150, NetworkPolicies: 70, ClusterPolicies: 10, Seed: 4, Workloads: true},
	} {
		cluster := clustergen.Generate(cfg).ToCluster()
		opts := policy.Options{IngressNetworksAndNodes: true}
		full := policy.Compile(cluster, opts)
		flows := append(sampleFlows(full, 3000), outsideFlows(full)...)
		named := 0
		for _, d := range full.Diagnostics {
			if strings.HasPrefix(d.Object, "NetworkPolicy ") && strings.Contains(d.Message, "pods the policy selects") {
				named++
			}
		}
		t.Logf("seed %d: %d NetworkPolicy warnings of named ports no selected pod declares", cfg.Seed, named)
		for _, node := range []string{"node-000", "node-002", "no-such-node"} {
			opts.Node = node
			scoped := policy.Compile(cluster, opts)
			var want []string
			local := 0
			for i, p := range full.Pods {
				if p.NodeName != node {
					continue
				}
				want = append(want, p.Key())
				j, ok := scoped.PodByKey(p.Key())
				if !ok || scoped.Pods[j].Key() != p.Key() || (scoped.Policies[j] != nil) != (full.Policies[i] != nil) {
					t.Fatalf("%s: pod %s: listed %v, policed %v", node, p.Key(), ok, ok && scoped.Policies[j] != nil)
				}
				if full.Policies[i] != nil {
					local++
				}
			}
			var got []string
			for _, p := range scoped.Pods {
				got = append(got, p.Key())
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: scoped Program lists %v, want the node's pods %v", node, got, want)
			}
			if node != "no-such-node" && local == 0 {
				t.Fatalf("%s: no local pod", node)
			}
			// The full Program's flows as the scoped one sees them.
			scope := func(e policy.Endpoint) policy.Endpoint {
				if e.Pod >= 0 {
					j, ok := scoped.PodByKey(full.Pods[e.Pod].Key())
					if !ok {
						j = -1
					}
					e.Pod = j
				}
				return e
			}
			judged := 0
			for _, f := range flows {
				sf := f
				sf.Src, sf.Dst = scope(f.Src), scope(f.Dst)
				for _, d := range []struct {
					ep  policy.Endpoint
					dir policy.Direction
				}{{sf.Src, policy.Egress}, {sf.Dst, policy.Ingress}} {
					if d.ep.Pod < 0 || scoped.Policies[d.ep.Pod] == nil {
						continue
					}
					judged++
					a, b := scoped.Evaluate(sf), full.Evaluate(f)
					da, db := a.Egress, b.Egress
					if d.dir == policy.Ingress {
						da, db = a.Ingress, b.Ingress
					}
					if fmt.Sprintf("%+v", stripPtr(da)) != fmt.Sprintf("%+v", stripPtr(db)) {
						t.Fatalf("%s: %s of %+v: scoped %+v, full %+v", node, d.dir, f, da, db)
					}
				}
			}
			if node != "no-such-node" && judged == 0 {
				t.Fatalf("%s: no decision compared", node)
			}
			// Every agent reports the same problems, named-port warnings
			// included, whatever pods it classified.
			if fmt.Sprint(scoped.Diagnostics) != fmt.Sprint(full.Diagnostics) || fmt.Sprint(scoped.Status) != nodeStatus(full) || scoped.Counts != full.Counts {
				t.Fatalf("%s: diagnostics, statuses or counts differ from the full Program's:\n%v\n%v", node, scoped.Diagnostics, full.Diagnostics)
			}
			t.Logf("seed %d %s: %d local pods, %d decisions compared", cfg.Seed, node, local, judged)
		}
	}
}

// nodeStatus is what a node-scoped Program's Status lists of a full
// Program's: every ClusterNetworkPolicy, and the NetworkPolicies not
// accepted.
func nodeStatus(full *policy.Program) string {
	var out []policy.PolicyStatus
	for _, st := range full.Status {
		if st.Policy.Kind == "ClusterNetworkPolicy" || !st.Accepted {
			out = append(out, st)
		}
	}
	return fmt.Sprint(out)
}

func stripPtr(d policy.Decision) string {
	return fmt.Sprintf("%v %s %s %v %s", d.Allowed, d.Tier, d.Action, d.Passed, d.Reason)
}

// Terms whose addresses come from the same peer share one *AddrSet,
// whichever policies use it, and keep it across incremental changes that
// do not change the peer's addresses: the nftables backend keys its
// shared sets by it.
func TestPeersShareAddrSets(t *testing.T) {
	cluster := load(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-dev-z, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {env: dev}}, podSelector: {matchLabels: {app: z}}}], ports: [{port: 80}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-dev-z-too, namespace: b}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {env: dev}}, podSelector: {matchLabels: {app: z}}}], ports: [{port: 443}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-dev-z}
spec:
  tier: Baseline
  priority: 1
  subject: {namespaces: {}}
  egress: [{action: Deny, to: [{pods: {namespaceSelector: {matchLabels: {env: dev}}, podSelector: {matchLabels: {app: z}}}}]}]
`)
	prog := policy.Compile(cluster, policy.Options{})
	addrsOf := func(p *policy.Program) map[string]*policy.AddrSet {
		out := map[string]*policy.AddrSet{}
		for i, pp := range p.Policies {
			if pp == nil {
				continue
			}
			if np := pp.Ingress.NP; np != nil {
				for _, r := range np.Rules {
					out[r.Policy.Name+"@"+p.Pods[i].Key()] = r.Match[0].Addrs
				}
			}
			for _, r := range pp.Egress.Baseline {
				out[r.Rule.Policy.Name+"@"+p.Pods[i].Key()] = r.Match[0].Addrs
			}
		}
		return out
	}
	sets := addrsOf(prog)
	var first *policy.AddrSet
	for k, s := range sets {
		if first == nil {
			first = s
		}
		if s != first {
			t.Errorf("%s: its peer's addresses are another AddrSet (%s vs %s)", k, s, first)
		}
	}
	if len(sets) < 4 || first.String() != "{10.1.1.2, fd00::1:2}" {
		t.Fatalf("peer sets %v", sets)
	}

	// The same through a Compiler: a change elsewhere keeps the pointer, a
	// change of the peer's pods makes one new set for every user.
	comp := policy.NewCompiler(cluster, policy.Options{})
	before := addrsOf(comp.Program())
	i, _ := prog.PodByKey("a/y")
	y := prog.Pods[i]
	y.Labels = maps.Clone(y.Labels)
	y.Labels["other"] = "label"
	comp.UpsertPod(&y)
	after := addrsOf(comp.Program())
	for k := range before {
		if before[k] != after[k] {
			t.Errorf("%s: a change outside the peer replaced its AddrSet", k)
		}
	}
	comp.UpsertPod(&policy.Pod{Namespace: "b", Name: "w", NodeName: "n2", Labels: map[string]string{"app": "z"}, IPs: []netip.Addr{netip.MustParseAddr("10.1.3.3")}})
	moved := addrsOf(comp.Program())
	var next *policy.AddrSet
	for k, s := range moved {
		if next == nil {
			next = s
		}
		if s != next || s == first {
			t.Errorf("%s: after a pod joined the peer: %s", k, s)
		}
	}
	if next.String() != "{10.1.1.2, 10.1.3.3, fd00::1:2}" {
		t.Errorf("peer after the new pod: %s", next)
	}
}

// A node-scoped compile classifies only that node's pods, and compiles
// the rules and resolves the peers only of the policies that select them.
func TestNodeScopedCompilesLocalPodsOnly(t *testing.T) {
	cluster := clustergen.Generate(clustergen.Config{Nodes: 10, Namespaces: 40, Pods: 400, NetworkPolicies: 280, ClusterPolicies: 20, Seed: 5, Workloads: true}).ToCluster()
	all, _, _, fullPeers, fullNPs, fullCNPs := policy.CompileStats(cluster, policy.Options{})
	subjects, classified, stray, peers, nps, cnps := policy.CompileStats(cluster, policy.Options{Node: "node-003"})
	if fullNPs == 0 || nps == 0 || nps >= fullNPs/2 {
		t.Errorf("node-scoped compile compiled the rules of %d NetworkPolicies, the full one %d", nps, fullNPs)
	}
	if fullCNPs == 0 || cnps == 0 || cnps >= fullCNPs {
		t.Errorf("node-scoped compile compiled the rules of %d ClusterNetworkPolicies, the full one %d", cnps, fullCNPs)
	}
	if subjects == 0 || subjects >= all/5 || classified != subjects || stray != 0 {
		t.Errorf("%d of %d pods local, %d classified, %d namespaces classified without a local pod", subjects, all, classified, stray)
	}
	if peers >= fullPeers/2 {
		t.Errorf("node-scoped compile resolved %d peers, the full one %d", peers, fullPeers)
	}
}

// A node-scoped Compiler compiles a ClusterNetworkPolicy's rules only
// once it selects a local pod, and then exactly as a full compile does,
// fail-closed parts included; an invalid policy that selects no local pod
// is still reported (status, diagnostics) as by every other agent.
func TestNodeScopedCompilesCNPRulesOnUse(t *testing.T) {
	cluster := load(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: for-y}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: "y"}}}}
  ingress:
  - {name: from-dev, action: Deny, from: [{namespaces: {matchLabels: {env: dev}}}], protocols: [{tcp: {destinationPort: {number: 80}}}]}
  - {name: named, action: Accept, from: [{namespaces: {}}], protocols: [{destinationNamedPort: nosuchport}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: bad-for-y}
spec:
  tier: Admin
  priority: 2
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: "y"}}}}
  ingress:
  - {name: bad-peer, action: Pass, from: [{namespaces: {matchExpressions: [{key: env, operator: Bogus}]}}], protocols: [{tcp: {destinationPort: {number: 81}}}]}
  - {name: bad-accept, action: Accept, from: [{namespaces: {matchExpressions: [{key: env, operator: Bogus}]}}], protocols: [{destinationNamedPort: http}]}
`)
	opts := policy.Options{Node: "n1"}
	comp := policy.NewCompiler(cluster, opts)
	prog := comp.Program()
	if n := policy.CompiledCNPs(comp); n != 0 {
		t.Fatalf("before any local pod is selected: rules of %d ClusterNetworkPolicies compiled, want none", n)
	}
	// Reported as a full compile reports them, without their rules.
	full := policy.Compile(cluster, policy.Options{})
	if fmt.Sprint(prog.Status) != nodeStatus(full) || prog.Counts != full.Counts {
		t.Fatalf("status\n%v %+v\nfull compile\n%v %+v", prog.Status, prog.Counts, full.Status, full.Counts)
	}
	rejected, warned := false, false
	for _, st := range prog.Status {
		rejected = rejected || st.Policy.Name == "bad-for-y" && !st.Accepted
	}
	for _, d := range prog.Diagnostics {
		warned = warned || strings.Contains(d.String(), "nosuchport")
	}
	if !rejected || !warned {
		t.Fatalf("bad-for-y rejected %v, for-y's named port warned %v: %v %v", rejected, warned, prog.Status, prog.Diagnostics)
	}

	// a/x (on n1) becomes a subject of both.
	prog, ok := comp.RelabelPod("a/x", map[string]string{"app": "y"})
	if !ok {
		t.Fatal("a/x unknown")
	}
	if n := policy.CompiledCNPs(comp); n != 2 {
		t.Fatalf("after a/x is selected: rules of %d ClusterNetworkPolicies compiled, want 2", n)
	}
	for i, p := range cluster.Pods {
		if p.Key() == "a/x" {
			q := *p
			q.Labels = map[string]string{"app": "y"}
			cluster.Pods[i] = &q
		}
	}
	sameProgram(t, "relabeled", prog, policy.Compile(cluster, opts))
	runFlows(t, prog, []flowCase{
		{name: "from-dev denies b/z", from: "b/z", to: "a/x", port: 80, allowed: false, ingress: policy.TierAdmin, reasonHas: "from-dev"},
		{name: "bad Pass rule is a Deny of every peer", from: "10.1.2.1", to: "a/x", port: 81, allowed: false, ingress: policy.TierAdmin, reasonHas: "bad-peer"},
		{name: "bad Accept rule allows nothing", from: "10.1.2.1", to: "a/x", port: 80, allowed: true, ingress: policy.TierDefault},
	})
}

// A Program scoped to some pods (Options.Pods, as moat explain uses it)
// judges them exactly as the whole cluster's Program does, and only them.
func TestPodScopedProgram(t *testing.T) {
	cluster := clustergen.Generate(clustergen.Config{Nodes: 5, Namespaces: 10, Pods: 150, NetworkPolicies: 70, ClusterPolicies: 10, Seed: 6, Workloads: true}).ToCluster()
	opts := policy.Options{IngressNetworksAndNodes: true}
	full := policy.Compile(cluster, opts)
	flows := append(sampleFlows(full, 2000), outsideFlows(full)...)
	for i := 0; i < 20; i++ {
		a, b := full.Pods[(i*37)%len(full.Pods)], full.Pods[(i*53+11)%len(full.Pods)]
		opts.Pods = []string{a.Key(), b.Key()}
		scoped := policy.Compile(cluster, opts)
		for j, p := range scoped.Pods {
			want := full.Policies[j] != nil && (p.Key() == a.Key() || p.Key() == b.Key())
			if (scoped.Policies[j] != nil) != want {
				t.Fatalf("pods %v: %s policed %v", opts.Pods, p.Key(), scoped.Policies[j] != nil)
			}
		}
		if fmt.Sprint(scoped.Diagnostics) != fmt.Sprint(full.Diagnostics) || fmt.Sprint(scoped.Status) != fmt.Sprint(full.Status) {
			t.Fatalf("pods %v: diagnostics or statuses differ from the full Program's", opts.Pods)
		}
		for _, f := range flows {
			if f.Src.Pod < 0 || f.Dst.Pod < 0 || scoped.Policies[f.Src.Pod] == nil || scoped.Policies[f.Dst.Pod] == nil {
				continue
			}
			if x, y := scoped.Evaluate(f), full.Evaluate(f); !sameVerdict(x, y) {
				t.Fatalf("pods %v: %+v: scoped %+v, full %+v", opts.Pods, f, x, y)
			}
		}
		src, dst := policy.Endpoint{Pod: indexOf(full, a.Key()), Addr: a.IPs[0]}, policy.Endpoint{Pod: indexOf(full, b.Key()), Addr: b.IPs[0]}
		for _, port := range []uint16{53, 80, 8080, 9090, 9100, 5432, 8443} {
			f := policy.Flow{Src: src, Dst: dst, Proto: policy.ProtoTCP, Port: port}
			if x, y := scoped.Evaluate(f), full.Evaluate(f); !sameVerdict(x, y) {
				t.Fatalf("pods %v: %+v: scoped %+v, full %+v", opts.Pods, f, x, y)
			}
		}
	}
}

func indexOf(p *policy.Program, key string) int {
	i, _ := p.PodByKey(key)
	return i
}
