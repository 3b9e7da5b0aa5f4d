package nft

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// The tests of this file drive moat-agent's path, an incremental
// policy.Compiler and one long-lived Syncer (table diffs, reuse of
// unchanged inputs), through random event sequences, and compare what it
// programs after every batch with a from-scratch policy.Compile of the
// same snapshot programmed into a fresh table. The events are those the
// compiler's own random tests lacked when this test found a bug (a dropped
// egress rule with named ports left its Match in a shared peer set, and
// the same policy updated or re-created took it stale): policies touched
// with the same spec or re-created after pod changes, pods' ports changed,
// addresses and names of deleted pods reused, nodes added, deleted and
// readdressed, namespaces deleted and re-created, priority and tier
// moves, updates that fail closed, host-network flips, pods on nodes that
// do not exist.

// eventCluster is a random cluster the events change, and the
// incremental Compiler they are staged on.
type eventCluster struct {
	r     *rand.Rand
	c     *policy.Cluster
	comp  *policy.Compiler
	spare *policy.Cluster // policies to add or replace with
	freed []netip.Addr    // addresses of deleted or readdressed pods
	gone  []string        // keys of deleted pods
	// deleted policies, to re-create unchanged
	delNP  []*policy.NetworkPolicy
	delCNP []policy.ClusterNetworkPolicy
	seq    int
}

// newEventCluster loads randcluster's scenario of seed, with the policies
// of two more seeds as spares, and an incremental Compiler of it.
func newEventCluster(t *testing.T, seed int64, cfg randcluster.Config, opts policy.Options) *eventCluster {
	t.Helper()
	c, spare, more := loadRandom(t, seed, cfg), loadRandom(t, seed+1000, cfg), loadRandom(t, seed+2000, cfg)
	spare.NetworkPolicies = append(spare.NetworkPolicies, more.NetworkPolicies...)
	spare.ClusterNetworkPolicies = append(spare.ClusterNetworkPolicies, more.ClusterNetworkPolicies...)
	return &eventCluster{r: rand.New(rand.NewPCG(uint64(seed), 88)), c: c, spare: spare, comp: policy.NewCompiler(cloneCluster(c), opts)}
}

func loadRandom(t *testing.T, seed int64, cfg randcluster.Config) *policy.Cluster {
	t.Helper()
	y, err := randcluster.Generate(seed, cfg).Manifests()
	if err != nil {
		t.Fatal(err)
	}
	res, err := (&manifest.Loader{Stdin: strings.NewReader(string(y))}).Load("-")
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	return &res.Cluster
}

// eventsConfig is a randcluster with three nodes and their pod CIDRs.
func eventsConfig() randcluster.Config {
	cfg := randcluster.Default()
	cfg.PodCIDRs = true
	cfg.Nodes = 3
	cfg.MaxPods = 16
	cfg.MaxNetworkPolicies = 6
	cfg.MaxClusterPolicies = 4
	return cfg
}

// cloneCluster copies the snapshot's slices: the compiler keeps the
// objects it is given, which the events replace and never change.
func cloneCluster(c *policy.Cluster) *policy.Cluster {
	return &policy.Cluster{Namespaces: slices.Clone(c.Namespaces), Pods: slices.Clone(c.Pods), Nodes: slices.Clone(c.Nodes),
		NetworkPolicies: slices.Clone(c.NetworkPolicies), ClusterNetworkPolicies: slices.Clone(c.ClusterNetworkPolicies)}
}

// eventAddr4 and eventAddr6 are in node's pod CIDRs (randcluster's plan),
// above the addresses randcluster gives.
func eventAddr4(node, i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 77, byte(node), byte(i)}) }
func eventAddr6(node, i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0x00, 0, 0x78, 7: byte(node), 15: byte(i)})
}

func nodeIndex(name string) int {
	var i int
	fmt.Sscanf(name, "node-%d", &i)
	return i
}

func (s *eventCluster) pickPod() (int, *policy.Pod) {
	if len(s.c.Pods) == 0 {
		return -1, nil
	}
	i := s.r.IntN(len(s.c.Pods))
	return i, s.c.Pods[i]
}

// someAddrs is a freed address half the time, else a fresh one (and a
// fresh IPv6 address half the time).
func (s *eventCluster) someAddrs(node string) []netip.Addr {
	if len(s.freed) > 0 && s.r.IntN(2) == 0 {
		i := s.r.IntN(len(s.freed))
		a := s.freed[i]
		s.freed = slices.Delete(s.freed, i, i+1)
		return []netip.Addr{a}
	}
	s.seq++
	n, at := nodeIndex(node), 150+s.seq%100
	out := []netip.Addr{eventAddr4(n, at)}
	if s.r.IntN(2) == 0 {
		out = append(out, eventAddr6(n, at))
	}
	return out
}

func (s *eventCluster) labels() map[string]string {
	l := map[string]string{}
	if s.r.IntN(6) != 0 {
		l["app"] = []string{"web", "db", "api", "cache"}[s.r.IntN(4)]
	}
	if s.r.IntN(4) != 0 {
		l["tier"] = []string{"fe", "be"}[s.r.IntN(2)]
	}
	return l
}

// nodeName is an existing node's, or sometimes one that may not exist.
func (s *eventCluster) nodeName() string {
	if len(s.c.Nodes) == 0 || s.r.IntN(15) == 0 {
		return "node-9"
	}
	return s.c.Nodes[s.r.IntN(len(s.c.Nodes))].Name
}

func (s *eventCluster) setPod(i int, p *policy.Pod) {
	if i < 0 {
		s.c.Pods = append(s.c.Pods, p)
	} else {
		s.c.Pods[i] = p
	}
	s.comp.UpsertPod(p)
}

// step makes one random change to the snapshot, stages it on the
// compiler, and says what it did.
func (s *eventCluster) step() string {
	switch s.r.IntN(19) {
	case 0, 1:
		return s.relabelPod()
	case 2, 3:
		return s.addPod()
	case 4, 5:
		return s.deletePod()
	case 6:
		return s.readdressPod()
	case 7:
		return s.movePod()
	case 8:
		return s.flipHostNetwork()
	case 9, 10:
		return s.changeNode()
	case 11:
		return s.changeNamespace()
	case 12, 13:
		return s.changeNetworkPolicy()
	case 14, 15:
		return s.changeClusterPolicy()
	case 16:
		return s.touchOrRecreateNetworkPolicy()
	case 17:
		return s.touchOrRecreateClusterPolicy()
	default:
		return s.changePorts()
	}
}

func (s *eventCluster) relabelPod() string {
	i, p := s.pickPod()
	if p == nil {
		return "nothing"
	}
	q := *p
	q.Labels = s.labels()
	s.setPod(i, &q)
	return "relabel " + q.Key()
}

// addPod adds a pod, maybe with a freed address or a deleted pod's name.
func (s *eventCluster) addPod() string {
	q := policy.Pod{Namespace: s.c.Namespaces[s.r.IntN(len(s.c.Namespaces))].Name, Labels: s.labels(), NodeName: s.nodeName()}
	s.seq++
	q.Name = fmt.Sprintf("ev-%d", s.seq)
	if len(s.gone) > 0 && s.r.IntN(3) == 0 {
		k := s.gone[s.r.IntN(len(s.gone))]
		if !slices.ContainsFunc(s.c.Pods, func(p *policy.Pod) bool { return p.Key() == k }) {
			q.Namespace, q.Name, _ = strings.Cut(k, "/")
		}
	}
	if s.r.IntN(8) != 0 {
		q.IPs = s.someAddrs(q.NodeName)
	}
	if len(s.c.Pods) > 0 {
		q.Ports = slices.Clone(s.c.Pods[s.r.IntN(len(s.c.Pods))].Ports)
	}
	s.setPod(-1, &q)
	return fmt.Sprintf("add %s on %s %v %v", q.Key(), q.NodeName, q.IPs, q.Ports)
}

// deletePod deletes a pod; its addresses and name are free for reuse.
func (s *eventCluster) deletePod() string {
	i, p := s.pickPod()
	if p == nil || len(s.c.Pods) < 4 {
		return "nothing"
	}
	s.c.Pods = slices.Delete(s.c.Pods, i, i+1)
	s.comp.DeletePod(p.Key())
	if !p.HostNetwork {
		s.freed = append(s.freed, p.IPs...)
	}
	s.gone = append(s.gone, p.Key())
	return "delete " + p.Key()
}

// readdressPod gives a pod no address, a live pod's too (a duplicate), a
// freed one or a fresh one.
func (s *eventCluster) readdressPod() string {
	i, p := s.pickPod()
	if p == nil {
		return "nothing"
	}
	q := *p
	switch s.r.IntN(4) {
	case 0:
		q.IPs = nil
	case 1:
		_, o := s.pickPod()
		q.IPs = append(slices.Clone(q.IPs), o.IPs...)
	default:
		if !q.HostNetwork {
			s.freed = append(s.freed, q.IPs...)
		}
		q.IPs = s.someAddrs(q.NodeName)
	}
	s.setPod(i, &q)
	return fmt.Sprintf("readdress %s %v", q.Key(), q.IPs)
}

// movePod moves a pod to another node with a new address (a StatefulSet
// pod re-created, the deletion and creation folded into one update).
func (s *eventCluster) movePod() string {
	i, p := s.pickPod()
	if p == nil {
		return "nothing"
	}
	q := *p
	q.NodeName = s.nodeName()
	if !q.HostNetwork {
		s.freed = append(s.freed, q.IPs...)
		q.IPs = s.someAddrs(q.NodeName)
	}
	s.setPod(i, &q)
	return fmt.Sprintf("move %s to %s %v", q.Key(), q.NodeName, q.IPs)
}

func (s *eventCluster) flipHostNetwork() string {
	i, p := s.pickPod()
	if p == nil {
		return "nothing"
	}
	q := *p
	q.HostNetwork = !q.HostNetwork
	if q.HostNetwork {
		q.IPs = nil
		for _, n := range s.c.Nodes {
			if n.Name == q.NodeName {
				q.IPs = slices.Clone(n.Addrs)
			}
		}
	} else {
		q.IPs = s.someAddrs(q.NodeName)
	}
	s.setPod(i, &q)
	return fmt.Sprintf("hostNetwork %s=%v %v", q.Key(), q.HostNetwork, q.IPs)
}

// changePorts gives a pod another pod's container ports, sometimes with
// the first one's number moved: named ports resolve anew.
func (s *eventCluster) changePorts() string {
	i, p := s.pickPod()
	if p == nil {
		return "nothing"
	}
	q := *p
	_, o := s.pickPod()
	q.Ports = slices.Clone(o.Ports)
	if s.r.IntN(3) == 0 && len(q.Ports) > 0 {
		q.Ports[0].Port++
	}
	s.setPod(i, &q)
	return fmt.Sprintf("ports %s %v", q.Key(), q.Ports)
}

// changeNode adds or deletes a node, or changes one's pod CIDRs,
// addresses (sometimes to a pod's) or labels.
func (s *eventCluster) changeNode() string {
	switch s.r.IntN(6) {
	case 0:
		for k := range 4 {
			name := fmt.Sprintf("node-%d", k)
			if !slices.ContainsFunc(s.c.Nodes, func(n policy.Node) bool { return n.Name == name }) {
				n := policy.Node{Name: name, Labels: map[string]string{"zone": fmt.Sprintf("z%d", k%2)},
					Addrs:    []netip.Addr{randcluster.NodeAddr4(k)},
					PodCIDRs: []netip.Prefix{netip.PrefixFrom(eventAddr4(k, 0), 24)}}
				s.c.Nodes = append(s.c.Nodes, n)
				s.comp.UpsertNode(n)
				return "add node " + name
			}
		}
		return "nothing"
	case 1:
		if len(s.c.Nodes) < 2 {
			return "nothing"
		}
		i := s.r.IntN(len(s.c.Nodes))
		name := s.c.Nodes[i].Name
		s.c.Nodes = slices.Delete(s.c.Nodes, i, i+1)
		s.comp.DeleteNode(name)
		return "delete node " + name
	}
	if len(s.c.Nodes) == 0 {
		return "nothing"
	}
	i := s.r.IntN(len(s.c.Nodes))
	n := s.c.Nodes[i]
	k := nodeIndex(n.Name)
	var what string
	switch s.r.IntN(4) {
	case 0:
		n.PodCIDRs = [][]netip.Prefix{
			nil,
			{netip.PrefixFrom(eventAddr4(k, 128), 25)},
			{netip.PrefixFrom(eventAddr4(k, 0), 24), netip.PrefixFrom(eventAddr6(k, 0), 64)},
			{netip.PrefixFrom(eventAddr4(k, 0), 23).Masked()},
		}[s.r.IntN(4)]
		what = fmt.Sprint("podCIDRs ", n.PodCIDRs)
	case 1:
		switch s.r.IntN(3) {
		case 0:
			n.Addrs = nil
		case 1:
			if _, p := s.pickPod(); p != nil {
				n.Addrs = slices.Clone(p.IPs)
			}
		default:
			n.Addrs = []netip.Addr{randcluster.NodeAddr4(k), randcluster.NodeAddr6(k)}
		}
		what = fmt.Sprint("addrs ", n.Addrs)
	default:
		n.Labels = map[string]string{"zone": []string{"z0", "z1"}[s.r.IntN(2)], "role": []string{"edge", "core"}[s.r.IntN(2)]}
		what = fmt.Sprint("labels ", n.Labels)
	}
	s.c.Nodes[i] = n
	s.comp.UpsertNode(n)
	return "node " + n.Name + " " + what
}

// changeNamespace relabels a namespace, or deletes it and maybe
// re-creates it in the same batch.
func (s *eventCluster) changeNamespace() string {
	i := s.r.IntN(len(s.c.Namespaces))
	name := s.c.Namespaces[i].Name
	team := map[string]string{"team": []string{"red", "blue"}[s.r.IntN(2)]}
	if s.r.IntN(3) != 0 {
		n := policy.Namespace{Name: name, Labels: team}
		if s.r.IntN(3) == 0 {
			n.Labels = nil
		}
		s.c.Namespaces[i] = n
		s.comp.UpsertNamespace(n)
		return "relabel namespace " + name
	}
	s.c.Namespaces = slices.Delete(s.c.Namespaces, i, i+1)
	s.comp.DeleteNamespace(name)
	if s.r.IntN(2) == 0 || len(s.c.Namespaces) == 0 {
		n := policy.Namespace{Name: name, Labels: team}
		s.c.Namespaces = append(s.c.Namespaces, n)
		s.comp.UpsertNamespace(n)
		return "delete and re-create namespace " + name
	}
	return "delete namespace " + name
}

// changeNetworkPolicy adds a spare, replaces a policy with one (maybe
// refused by decoding: fail-closed), or deletes a policy.
func (s *eventCluster) changeNetworkPolicy() string {
	if len(s.spare.NetworkPolicies) == 0 {
		return "nothing"
	}
	src := s.spare.NetworkPolicies[s.r.IntN(len(s.spare.NetworkPolicies))]
	op := s.r.IntN(4)
	if len(s.c.NetworkPolicies) == 0 {
		op = 0
	}
	np := &policy.NetworkPolicy{Spec: *src.Spec.DeepCopy(), Namespace: s.c.Namespaces[s.r.IntN(len(s.c.Namespaces))].Name}
	switch op {
	case 0:
		s.seq++
		np.Name = fmt.Sprintf("evnp-%d", s.seq)
		s.c.NetworkPolicies = append(s.c.NetworkPolicies, np)
		s.comp.UpsertNetworkPolicy(np)
		return "add np " + np.Namespace + "/" + np.Name
	case 1, 2:
		i := s.r.IntN(len(s.c.NetworkPolicies))
		np.Name, np.Namespace = s.c.NetworkPolicies[i].Name, s.c.NetworkPolicies[i].Namespace
		if op == 2 {
			np.SetDecoding([]string{"spec.ingress[0].from[0].bogus"}, nil)
		}
		s.c.NetworkPolicies[i] = np
		s.comp.UpsertNetworkPolicy(np)
		return fmt.Sprintf("replace np %s/%s (fail-closed %v)", np.Namespace, np.Name, op == 2)
	}
	i := s.r.IntN(len(s.c.NetworkPolicies))
	old := s.c.NetworkPolicies[i]
	s.delNP = append(s.delNP, old)
	s.c.NetworkPolicies = slices.Delete(s.c.NetworkPolicies, i, i+1)
	s.comp.DeleteNetworkPolicy(old.Namespace, old.Name)
	return "delete np " + old.Namespace + "/" + old.Name
}

// changeClusterPolicy adds a spare, replaces a policy with one, changes
// one's priority or tier, makes one fail closed, or deletes one.
func (s *eventCluster) changeClusterPolicy() string {
	if len(s.spare.ClusterNetworkPolicies) == 0 {
		return "nothing"
	}
	src := s.spare.ClusterNetworkPolicies[s.r.IntN(len(s.spare.ClusterNetworkPolicies))]
	op := s.r.IntN(6)
	if len(s.c.ClusterNetworkPolicies) == 0 {
		op = 0
	}
	if op == 0 {
		cnp := policy.ClusterNetworkPolicy{ClusterNetworkPolicy: src.ClusterNetworkPolicy.DeepCopy()}
		s.seq++
		cnp.Name = fmt.Sprintf("evcnp-%d", s.seq)
		s.c.ClusterNetworkPolicies = append(s.c.ClusterNetworkPolicies, cnp)
		s.comp.UpsertClusterNetworkPolicy(cnp)
		return "add cnp " + cnp.Name
	}
	i := s.r.IntN(len(s.c.ClusterNetworkPolicies))
	cur := s.c.ClusterNetworkPolicies[i]
	if op == 5 {
		s.delCNP = append(s.delCNP, cur)
		s.c.ClusterNetworkPolicies = slices.Delete(s.c.ClusterNetworkPolicies, i, i+1)
		s.comp.DeleteClusterNetworkPolicy(cur.Name)
		return "delete cnp " + cur.Name
	}
	cnp := policy.ClusterNetworkPolicy{ClusterNetworkPolicy: cur.ClusterNetworkPolicy.DeepCopy()}
	what := "replace"
	switch op {
	case 1:
		cnp.ClusterNetworkPolicy = src.ClusterNetworkPolicy.DeepCopy()
		cnp.Name = cur.Name
	case 2:
		cnp.Spec.Priority = int32(s.r.IntN(6))
		what = fmt.Sprint("priority ", cnp.Spec.Priority)
	case 3:
		cnp.Spec.Tier = v1alpha2.AdminTier
		if cur.Spec.Tier == v1alpha2.AdminTier {
			cnp.Spec.Tier = v1alpha2.BaselineTier
		}
		what = "tier " + string(cnp.Spec.Tier)
	default:
		cnp.UnknownFields = []string{"spec.ingress[0].from[0].bogus"}
		what = "fail-closed"
	}
	s.c.ClusterNetworkPolicies[i] = cnp
	s.comp.UpsertClusterNetworkPolicy(cnp)
	return what + " cnp " + cnp.Name
}

// touchOrRecreateNetworkPolicy re-creates a deleted NetworkPolicy
// unchanged (kubectl delete and apply), or updates one with the same spec
// and a new generation: to the compiler every rule is new, while its
// peers and ports, and the Matches cached for them, stay.
func (s *eventCluster) touchOrRecreateNetworkPolicy() string {
	if len(s.delNP) > 0 && s.r.IntN(2) == 0 {
		np := s.delNP[s.r.IntN(len(s.delNP))]
		if slices.ContainsFunc(s.c.NetworkPolicies, func(o *policy.NetworkPolicy) bool { return o.Namespace == np.Namespace && o.Name == np.Name }) {
			return "nothing"
		}
		cp := *np
		s.c.NetworkPolicies = append(s.c.NetworkPolicies, &cp)
		s.comp.UpsertNetworkPolicy(&cp)
		return "re-create np " + np.Namespace + "/" + np.Name
	}
	if len(s.c.NetworkPolicies) == 0 {
		return "nothing"
	}
	i := s.r.IntN(len(s.c.NetworkPolicies))
	cp := *s.c.NetworkPolicies[i]
	cp.Generation++
	s.c.NetworkPolicies[i] = &cp
	s.comp.UpsertNetworkPolicy(&cp)
	return "touch np " + cp.Namespace + "/" + cp.Name
}

// touchOrRecreateClusterPolicy is touchOrRecreateNetworkPolicy for
// ClusterNetworkPolicies.
func (s *eventCluster) touchOrRecreateClusterPolicy() string {
	if len(s.delCNP) > 0 && s.r.IntN(2) == 0 {
		cnp := s.delCNP[s.r.IntN(len(s.delCNP))]
		if slices.ContainsFunc(s.c.ClusterNetworkPolicies, func(o policy.ClusterNetworkPolicy) bool { return o.Name == cnp.Name }) {
			return "nothing"
		}
		s.c.ClusterNetworkPolicies = append(s.c.ClusterNetworkPolicies, cnp)
		s.comp.UpsertClusterNetworkPolicy(cnp)
		return "re-create cnp " + cnp.Name
	}
	if len(s.c.ClusterNetworkPolicies) == 0 {
		return "nothing"
	}
	i := s.r.IntN(len(s.c.ClusterNetworkPolicies))
	cp := s.c.ClusterNetworkPolicies[i]
	cp.ClusterNetworkPolicy = cp.ClusterNetworkPolicy.DeepCopy()
	cp.Generation++
	s.c.ClusterNetworkPolicies[i] = cp
	s.comp.UpsertClusterNetworkPolicy(cp)
	return "touch cnp " + cp.Name
}

// batch makes 1 to n changes and says what they were.
func (s *eventCluster) batch(n int) string {
	var did []string
	for range 1 + s.r.IntN(n) {
		did = append(did, s.step())
	}
	return strings.Join(did, "; ")
}

// TestIncrementalTableEqualsFull: after every batch of random events, the
// table a long-lived Syncer patched from the incremental Compiler's
// Programs is the table a fresh Syncer programs from a full compile of
// the same snapshot, for a node-scoped compiler (as moat-agent runs it)
// and a cluster-wide one; and the two Programs' verdicts agree every
// tenth batch. That comparison found the bug above (the cluster-wide
// run of seed 21 fails without its fix). -rounds scales it: rounds/4
// seeds of 60 batches each.
func TestIncrementalTableEqualsFull(t *testing.T) {
	ctx := context.Background()
	const node = "node-0"
	for seed := int64(1); seed <= int64(*randomRounds)/4; seed++ {
		for _, scoped := range []bool{true, false} {
			opts := policy.Options{IngressNetworksAndNodes: seed%2 == 0, DenyNodeLocal: seed%3 == 0}
			if scoped {
				opts.Node = node
			}
			s := newEventCluster(t, seed, eventsConfig(), opts)
			patched := knftables.NewFake(knftables.InetFamily, Table)
			syncer := New(patched, Options{Node: node})
			if _, err := syncer.Sync(ctx, s.comp.Program()); err != nil {
				t.Fatal(err)
			}
			var steps []string
			for step := range 60 {
				steps = append(steps, fmt.Sprintf("step %d: %s", step, s.batch(4)))
				inc := s.comp.Program()
				if _, err := syncer.Sync(ctx, inc); err != nil {
					t.Fatalf("seed %d node-scoped=%v, after\n%s\nsync: %v", seed, scoped, strings.Join(steps, "\n"), err)
				}
				full := policy.Compile(cloneCluster(s.c), opts)
				fresh := knftables.NewFake(knftables.InetFamily, Table)
				if _, err := New(fresh, Options{Node: node}).Sync(ctx, full); err != nil {
					t.Fatal(err)
				}
				if got, want := sortedLines(patched.Dump()), sortedLines(fresh.Dump()); got != want {
					t.Fatalf("seed %d node-scoped=%v %+v, after\n%s\nthe patched table differs from a full compile's:\n%s\nsnapshot:\n%s",
						seed, scoped, opts, strings.Join(steps, "\n"), lineDiff(got, want, "patched", "full"), dumpCluster(s.c))
				}
				if step%10 == 9 {
					sameVerdicts(t, fmt.Sprintf("seed %d node-scoped=%v, after\n%s", seed, scoped, strings.Join(steps, "\n")), s.c, inc, full)
				}
			}
		}
	}
}

// TestKernelIncrementalTableEqualsFull: the patches of the agent's path
// (as in TestIncrementalTableEqualsFull, node-scoped) are taken by the
// kernel, and leave the table a full replace makes in another private
// namespace. -rounds scales it: rounds/25 seeds of 30 batches each.
func TestKernelIncrementalTableEqualsFull(t *testing.T) {
	const node = "node-0"
	inPrivateNetns(t, func() {
		ctx := context.Background()
		patchedNS, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer patchedNS.Close()
		freshNS, err := netns.New() // and switches to it
		if err != nil {
			t.Fatal(err)
		}
		defer freshNS.Close()
		if err := netns.Set(patchedNS); err != nil {
			t.Fatal(err)
		}
		fullSync := func(prog *policy.Program) string {
			if err := netns.Set(freshNS); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := netns.Set(patchedNS); err != nil {
					t.Fatal(err)
				}
			}()
			iface, err := NewInterface()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := New(iface, Options{Node: node}).Sync(ctx, prog); err != nil {
				t.Fatal(err)
			}
			return normalizeListing(nftList(t))
		}
		patches, refused := 0, 0
		for seed := int64(1); seed <= max(1, int64(*randomRounds)/25); seed++ {
			opts := policy.Options{IngressNetworksAndNodes: seed%2 == 0, DenyNodeLocal: seed%3 == 0, Node: node}
			s := newEventCluster(t, seed, eventsConfig(), opts)
			iface, err := NewInterface()
			if err != nil {
				t.Fatal(err)
			}
			// A new Syncer replaces whatever table the previous seed left.
			syncer := New(iface, Options{Node: node})
			if _, err := syncer.Sync(ctx, s.comp.Program()); err != nil {
				t.Fatal(err)
			}
			var steps []string
			for step := range 30 {
				steps = append(steps, fmt.Sprintf("step %d: %s", step, s.batch(4)))
				res, err := syncer.Sync(ctx, s.comp.Program())
				if err != nil {
					t.Fatalf("seed %d, after\n%s\nsync: %v", seed, strings.Join(steps, "\n"), err)
				}
				if res.Operations > 0 {
					patches++
					if res.Full {
						refused++
						t.Errorf("seed %d, after\n%s\nthe kernel refused the patch (a full replace followed)", seed, strings.Join(steps, "\n"))
					}
				}
				if got, want := normalizeListing(nftList(t)), fullSync(policy.Compile(cloneCluster(s.c), opts)); got != want {
					t.Fatalf("seed %d, after\n%s\nthe patched kernel table differs from a full replace's:\n%s", seed, strings.Join(steps, "\n"), lineDiff(got, want, "patched", "full"))
				}
				// Verify's shape of the patched table is the one the
				// ruleset programs: a patch never reads as an edit.
				sh, err := NetlinkShape{}.ReadShape(ctx, countedChains())
				if err != nil {
					t.Fatal(err)
				}
				if d := shapeDiff(syncer.Applied().expectedShape(), sh, true); d != "" {
					t.Fatalf("seed %d, after\n%s\nthe patched table's shape differs from the ruleset's: %s", seed, strings.Join(steps, "\n"), d)
				}
			}
		}
		t.Logf("%d patches, %d refused by the kernel", patches, refused)
	})
}

// normalizeListing sorts the lines of `nft list table` and the elements
// of each set: their order follows insertion history.
func normalizeListing(s string) string {
	var lines []string
	var elems strings.Builder
	inElems := false
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if rest, ok := strings.CutPrefix(l, "elements = {"); ok {
			inElems = true
			elems.Reset()
			l = rest
		}
		if !inElems {
			lines = append(lines, l)
			continue
		}
		rest, done := strings.CutSuffix(l, "}")
		elems.WriteString(rest + ",")
		if done {
			inElems = false
			var els []string
			for _, e := range strings.Split(elems.String(), ",") {
				if e = strings.TrimSpace(e); e != "" {
					els = append(els, e)
				}
			}
			slices.Sort(els)
			lines = append(lines, "elements = { "+strings.Join(els, ", ")+" }")
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// lineDiff lists the lines only one of two sorted listings has.
func lineDiff(got, want, gotName, wantName string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	var b strings.Builder
	for _, l := range g {
		if _, found := slices.BinarySearch(w, l); !found {
			fmt.Fprintf(&b, "only %s: %s\n", gotName, l)
		}
	}
	for _, l := range w {
		if _, found := slices.BinarySearch(g, l); !found {
			fmt.Fprintf(&b, "only %s: %s\n", wantName, l)
		}
	}
	return b.String()
}

// sameVerdicts compares the verdicts of two Programs of snapshot c for
// TCP flows between every two addresses of pods, nodes and peers.
func sameVerdicts(t *testing.T, what string, c *policy.Cluster, inc, full *policy.Program) {
	t.Helper()
	var addrs []netip.Addr
	for _, p := range c.Pods {
		addrs = append(addrs, p.IPs...)
	}
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addrs...)
	}
	addrs = append(addrs, randcluster.Peer4, randcluster.StrayPeer4)
	end := func(p *policy.Program, a netip.Addr) policy.Endpoint {
		if i, ok := p.PodByIP(a); ok {
			return policy.Endpoint{Pod: i, Addr: a}
		}
		return policy.Endpoint{Pod: -1, Addr: a}
	}
	for _, x := range addrs {
		for _, y := range addrs {
			if x.Is4() != y.Is4() {
				continue
			}
			for _, port := range []uint16{53, 80, 443, 5432, 8080} {
				a := inc.Evaluate(policy.Flow{Src: end(inc, x), Dst: end(inc, y), Proto: policy.ProtoTCP, Port: port})
				b := full.Evaluate(policy.Flow{Src: end(full, x), Dst: end(full, y), Proto: policy.ProtoTCP, Port: port})
				if a.Allowed != b.Allowed {
					t.Fatalf("%s\nflow %s -> %s TCP/%d: incremental allowed=%v, full compile allowed=%v\nincremental %+v\nfull %+v", what, x, y, port, a.Allowed, b.Allowed, a, b)
				}
			}
		}
	}
}

// dumpCluster prints a snapshot compactly, to reproduce a failure.
func dumpCluster(c *policy.Cluster) string {
	var b strings.Builder
	for _, n := range c.Namespaces {
		fmt.Fprintf(&b, "namespace %s %v\n", n.Name, n.Labels)
	}
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "node %s %v %v %v\n", n.Name, n.Labels, n.Addrs, n.PodCIDRs)
	}
	for _, p := range c.Pods {
		fmt.Fprintf(&b, "pod %s node=%s hostNetwork=%v %v %v %v\n", p.Key(), p.NodeName, p.HostNetwork, p.Labels, p.IPs, p.Ports)
	}
	for _, np := range c.NetworkPolicies {
		spec, _ := json.Marshal(np.Spec)
		fmt.Fprintf(&b, "np %s/%s %s %v\n", np.Namespace, np.Name, spec, np.UnknownFields())
	}
	for _, cnp := range c.ClusterNetworkPolicies {
		spec, _ := json.Marshal(cnp.Spec)
		fmt.Fprintf(&b, "cnp %s %s %v\n", cnp.Name, spec, cnp.UnknownFields)
	}
	return b.String()
}
