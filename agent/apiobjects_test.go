package agent

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// TestAgentEqualsAPIObjects: after random changes, the agent's table is
// the table a full compilation of the API objects themselves gives: pods
// through policy.PodFromAPI, policies through the decoders, none of them
// through the agent's caches. TestIncrementalEqualsFull compiles the
// caches, so what the caches drop or project (relabels no selector reads,
// packed labels, label keys that policies start or stop reading) would be
// wrong in both and pass there; here policies start and stop reading the
// keys app, tier, zone and noise while pods churn a key nothing reads
// (hash). The changes also include an egress rule with a named port to
// all destinations, updated, deleted and re-created while a DNS rule of
// the node's namespace keeps its peer set alive and the pods declaring
// the name come and go: the incremental compiler once kept a stale
// Match there, which a compilation of the objects does not have.
func TestAgentEqualsAPIObjects(t *testing.T) {
	t.Run("named port, policy re-created", agentNamedEgressRecreated)
	seeds := []uint64{1, 2, 3}
	if testing.Short() {
		seeds = seeds[:1]
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { agentEqualsAPIObjects(t, seed) })
	}
}

// agentNamedEgressRecreated is F1's sequence, which the random changes
// seldom make: a/https-out (egress to port https, no "to") is deleted
// while a/dns keeps the peer set of all destinations alive, b/server is
// re-created at the same address declaring https on 8443 instead of 443,
// and a/https-out is re-created unchanged. Without the fix the agent kept
// allowing 10.9.1.2:443 and denying :8443.
func agentNamedEgressRecreated(t *testing.T) {
	const node = "n1"
	httpsOut := `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: https-out, namespace: a}
spec:
  podSelector: {}
  egress: [{ports: [{port: https}]}]
  policyTypes: [Egress]
`
	server := func(port int32) *corev1.Pod {
		return fixture.Pod("b", "server", "n2", nil, []fixture.Port{{Name: "https", Port: port}}, "10.9.1.2")
	}
	c := newFakeCluster(t,
		fixture.Namespace("a", nil), fixture.Namespace("b", nil),
		fixture.Node("n1", nil, "192.168.0.1"), fixture.Node("n2", nil, "192.168.0.2"),
		fixture.Pod("a", "client", node, nil, nil, "10.9.0.1"), server(443),
		fixture.YAML(t, dnsEgress), fixture.YAML(t, httpsOut),
	)
	dp := newTestDP(node)
	a := startReady(t, c, Config{NodeName: node, Resync: time.Hour}, dp)
	ctx := context.Background()
	check := func(what string) {
		t.Helper()
		settle(t, a)
		if got, want := sortLines(dp.fake.Dump()), tableOf(t, apiObjects(t, c), a.compilerOptions(), node); got != want {
			t.Fatalf("after %s, the agent's table differs from a full compilation of the API objects:\n%s", what, diffLines(got, want))
		}
	}
	check("the start")
	if err := c.dyn.Resource(networkPolicyGVR).Namespace("a").Delete(ctx, "https-out", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	check("deleting a/https-out")
	if err := c.kube.CoreV1().Pods("b").Delete(ctx, "server", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.kube.CoreV1().Pods("b").Create(ctx, server(8443), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("re-creating b/server with https on 8443")
	if _, err := c.dyn.Resource(networkPolicyGVR).Namespace("a").Create(ctx, fixture.YAML(t, httpsOut), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("re-creating a/https-out")
}

// dnsEgress lets every pod of namespace a reach DNS anywhere: a rule
// with the peer set of all destinations.
const dnsEgress = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: dns, namespace: a}
spec:
  podSelector: {}
  egress: [{ports: [{port: 53, protocol: UDP}]}]
  policyTypes: [Egress]
`

// apiPolicies are the policies the test creates, updates and deletes:
// name (with %d: which of two), namespace, generation, then label keys
// and values to select with.
var apiPolicies = []string{`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p%d, namespace: %s, generation: %d}
spec:
  podSelector: {matchLabels: {%s: %s}}
  ingress:
  - from: [{podSelector: {matchLabels: {%s: %s}}}]
`, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p%d, namespace: %s, generation: %d}
spec:
  podSelector: {matchExpressions: [{key: %s, operator: NotIn, values: [%s]}]}
  egress:
  - to: [{podSelector: {matchExpressions: [{key: %s, operator: NotIn, values: [%s]}]}, namespaceSelector: {}}]
    ports: [{port: 80}]
  policyTypes: [Egress]
`, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: https%d, namespace: %s, generation: %d}
spec:
  podSelector: {matchExpressions: [{key: %s, operator: NotIn, values: [%s]}]}
  egress:
  - ports: [{port: https}]
  policyTypes: [Egress]
`, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: c%d, generation: %d}
spec:
  tier: Admin
  priority: 5
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {%s: %s}}}}
  ingress:
  - action: Deny
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {%s: %s}}}}]
`}

func agentEqualsAPIObjects(t *testing.T, seed uint64) {
	const node = "n1"
	c := newFakeCluster(t,
		fixture.Namespace("a", map[string]string{"team": "a"}), fixture.Namespace("b", map[string]string{"team": "b"}),
		fixture.Node("n1", map[string]string{"pool": "x"}, "192.168.0.1"), fixture.Node("n2", map[string]string{"pool": "y"}, "192.168.0.2"),
		fixture.Pod("a", "client", node, nil, nil, "10.9.0.100"),
		fixture.YAML(t, dnsEgress),
	)
	dp := newTestDP(node)
	a := startReady(t, c, Config{NodeName: node, Resync: time.Hour}, dp)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 17))
	keys := []string{"app", "tier", "zone", "noise"}
	vals := []string{"x", "y", "z"}
	labels := func() map[string]string {
		l := map[string]string{"hash": fmt.Sprint(r.IntN(1000))}
		for _, k := range keys {
			if r.IntN(3) != 0 {
				l[k] = vals[r.IntN(3)]
			}
		}
		return l
	}
	// addr is one of few addresses, so re-created pods often take a freed
	// one, or one another pod holds.
	addr := func() string { return fmt.Sprintf("10.9.%d.%d", r.IntN(2), r.IntN(12)+1) }
	pods := map[string]*corev1.Pod{}
	anyPod := func() (string, *corev1.Pod) {
		for _, k := range slices.Sorted(maps.Keys(pods)) {
			if r.IntN(3) == 0 {
				return k, pods[k]
			}
		}
		return "", nil
	}
	created := map[string]bool{}
	// apply creates, updates or deletes u.
	apply := func(u string) {
		o := fixture.YAML(t, u)
		gvr := networkPolicyGVR
		if o.GetKind() == "ClusterNetworkPolicy" {
			gvr = clusterNetworkPolicyGVR
		}
		res := c.dyn.Resource(gvr).Namespace(o.GetNamespace())
		id := o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
		var err error
		switch {
		case created[id] && r.IntN(3) == 0:
			err = res.Delete(ctx, o.GetName(), metav1.DeleteOptions{})
			created[id] = false
		case created[id]:
			_, err = res.Update(ctx, o, metav1.UpdateOptions{})
		default:
			_, err = res.Create(ctx, o, metav1.CreateOptions{})
			created[id] = true
		}
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	gen := 1
	rounds := 15
	if testing.Short() {
		rounds = 5
	}
	for round := range rounds {
		var did []string
		for range 10 {
			switch op := r.IntN(14); {
			case op <= 1: // create or re-create a pod, maybe declaring https on another port
				ns, name := []string{"a", "b"}[r.IntN(2)], fmt.Sprint("p", r.IntN(10))
				key := ns + "/" + name
				if pods[key] != nil {
					if err := c.kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				var ports []fixture.Port
				if r.IntN(2) == 0 {
					ports = []fixture.Port{{Name: "https", Port: []int32{443, 8443}[r.IntN(2)]}}
				}
				p := fixture.Pod(ns, name, []string{"n1", "n2"}[r.IntN(2)], labels(), ports, addr())
				if _, err := c.kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				pods[key] = p
				did = append(did, fmt.Sprintf("create pod %s on %s at %s %v", key, p.Spec.NodeName, p.Status.PodIP, ports))
			case op <= 5: // change or remove one label of a pod, read or not
				key, p := anyPod()
				if p == nil {
					continue
				}
				p = p.DeepCopy()
				p.Labels = maps.Clone(p.Labels)
				k := slices.Concat(keys, []string{"hash"})[r.IntN(len(keys)+1)]
				if r.IntN(3) == 0 {
					delete(p.Labels, k)
				} else {
					p.Labels[k] = vals[r.IntN(3)]
				}
				if _, err := c.kube.CoreV1().Pods(p.Namespace).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				pods[key] = p
				did = append(did, fmt.Sprintf("relabel pod %s %v", key, p.Labels))
			case op == 6:
				key, p := anyPod()
				if p == nil {
					continue
				}
				if err := c.kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				delete(pods, key)
				did = append(did, "delete pod "+key)
			case op == 7: // finish a pod, or change its address
				key, p := anyPod()
				if p == nil {
					continue
				}
				p = p.DeepCopy()
				if r.IntN(3) == 0 {
					p.Status.Phase = corev1.PodSucceeded
				} else {
					ip := addr()
					p.Status.PodIP = ip
					p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
				}
				if _, err := c.kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				pods[key] = p
				did = append(did, fmt.Sprintf("pod %s status %s %s", key, p.Status.Phase, p.Status.PodIP))
			case op == 8: // relabel a namespace
				ns := fixture.Namespace([]string{"a", "b"}[r.IntN(2)], map[string]string{"team": vals[r.IntN(3)], keys[r.IntN(len(keys))]: vals[r.IntN(3)]})
				if _, err := c.kube.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				did = append(did, fmt.Sprintf("relabel namespace %s %v", ns.Name, ns.Labels))
			case op == 9: // a node's labels or address
				n := fixture.Node("n2", map[string]string{"pool": vals[r.IntN(3)]}, fmt.Sprintf("192.168.0.%d", 2+r.IntN(2)))
				if _, err := c.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				did = append(did, fmt.Sprintf("node n2 %v %s", n.Labels, n.Status.Addresses[0].Address))
			case op == 10: // a ClusterNetworkPolicy on namespaces and nodes, moving tiers and actions
				gen++
				apply(fmt.Sprintf(`
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: cn, generation: %d}
spec:
  tier: %s
  priority: %d
  subject: {namespaces: {matchLabels: {%s: %s}}}
  ingress:
  - action: %s
    from: [{namespaces: {matchLabels: {team: %s}}}, {nodes: {matchLabels: {pool: %s}}}]
`, gen, []string{"Admin", "Baseline"}[r.IntN(2)], r.IntN(3), keys[r.IntN(len(keys))], vals[r.IntN(3)], []string{"Deny", "Accept", "Pass"}[r.IntN(3)], vals[r.IntN(3)], vals[r.IntN(3)]))
				did = append(did, "apply cnp cn")
			default: // create, update or delete a policy
				i := r.IntN(len(apiPolicies))
				gen++
				k1, k2 := keys[r.IntN(len(keys))], keys[r.IntN(len(keys))]
				var y string
				switch i {
				case 3:
					y = fmt.Sprintf(apiPolicies[i], r.IntN(2), gen, k1, vals[r.IntN(3)], k2, vals[r.IntN(3)])
				case 2:
					y = fmt.Sprintf(apiPolicies[i], r.IntN(2), []string{"a", "b"}[r.IntN(2)], gen, k1, vals[r.IntN(3)])
				default:
					y = fmt.Sprintf(apiPolicies[i], r.IntN(2), []string{"a", "b"}[r.IntN(2)], gen, k1, vals[r.IntN(3)], k2, vals[r.IntN(3)])
				}
				apply(y)
				did = append(did, "apply policy "+strings.TrimSpace(strings.Split(y, "\n")[3]))
			}
			if r.IntN(4) == 0 {
				// Let the agent sync some changes apart.
				time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
			}
		}
		settle(t, a)
		want := tableOf(t, apiObjects(t, c), a.compilerOptions(), node)
		if got := sortLines(dp.fake.Dump()); got != want {
			t.Fatalf("round %d, after\n%s\nthe agent's table differs from a full compilation of the API objects:\n%s", round, strings.Join(did, "\n"), diffLines(got, want))
		}
	}
}

// apiObjects converts what the fake API server holds, as a one-off
// reader (moat matrix --live) would: no cache, no projection.
func apiObjects(t *testing.T, c *fakeCluster) *policy.Cluster {
	t.Helper()
	ctx := context.Background()
	out := &policy.Cluster{}
	nss, err := c.kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range nss.Items {
		out.Namespaces = append(out.Namespaces, policy.NamespaceFromAPI(&nss.Items[i]))
	}
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range nodes.Items {
		n, _ := policy.NodeFromAPI(&nodes.Items[i])
		out.Nodes = append(out.Nodes, n)
	}
	pods, err := c.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // finished: its address may be another pod's now
		}
		pp, _ := policy.PodFromAPI(p)
		out.Pods = append(out.Pods, &pp)
	}
	nps, err := c.dyn.Resource(networkPolicyGVR).Namespace("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range nps.Items {
		out.NetworkPolicies = append(out.NetworkPolicies, &decodeNP(&nps.Items[i]).NetworkPolicy)
	}
	cnps, err := c.dyn.Resource(clusterNetworkPolicyGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range cnps.Items {
		out.ClusterNetworkPolicies = append(out.ClusterNetworkPolicies, decodeCNP(&cnps.Items[i]).ClusterNetworkPolicy)
	}
	return out
}

// tableOf is the sorted dump of the table a fresh Syncer programs from a
// full compilation of c.
func tableOf(t *testing.T, c *policy.Cluster, opts policy.Options, node string) string {
	t.Helper()
	fresh := knftables.NewFake(knftables.InetFamily, nft.Table)
	if _, err := nft.New(fresh, nft.Options{Node: node}).Sync(context.Background(), policy.Compile(c, opts)); err != nil {
		t.Fatal(err)
	}
	return sortLines(fresh.Dump())
}

// diffLines lists the lines only one of two sorted dumps has.
func diffLines(agent, objects string) string {
	a, o := strings.Split(agent, "\n"), strings.Split(objects, "\n")
	var b strings.Builder
	for _, l := range a {
		if _, found := slices.BinarySearch(o, l); !found {
			b.WriteString("only the agent's: " + l + "\n")
		}
	}
	for _, l := range o {
		if _, found := slices.BinarySearch(a, l); !found {
			b.WriteString("only the objects': " + l + "\n")
		}
	}
	return b.String()
}
