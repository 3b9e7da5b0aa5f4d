package agent

import (
	"context"
	"fmt"
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

// settle waits until the agent has synced every change so far.
func settle(t *testing.T, a *Agent) {
	t.Helper()
	last, still := int64(-1), time.Now()
	fixture.Eventually(t, 20*time.Second, "agent idle", func() (bool, string) {
		n := a.syncs.Load()
		a.pending.mu.Lock()
		queued := 0
		for _, k := range a.pending.keys {
			queued += len(k)
		}
		a.pending.mu.Unlock()
		if n != last || queued > 0 || a.queue.Len() > 0 || a.syncStarted.Load() != 0 {
			last, still = n, time.Now()
			return false, "busy"
		}
		return time.Since(still) > 300*time.Millisecond, "settling"
	})
}

// TestIncrementalEqualsFull: after random changes of every kind (pods
// created, relabelled, moved to new addresses, finished and deleted;
// namespaces and nodes relabelled, created and deleted; policies created,
// changed and deleted), the table the agent patched incrementally is the
// table a full compilation of its caches gives.
func TestIncrementalEqualsFull(t *testing.T) {
	const node = "n1"
	c := newFakeCluster(t,
		fixture.Namespace("a", map[string]string{"team": "a"}), fixture.Namespace("b", map[string]string{"team": "b"}),
		fixture.Node("n1", map[string]string{"pool": "x"}, "192.168.0.1"), fixture.Node("n2", map[string]string{"pool": "y"}, "192.168.0.2"),
	)
	dp := newTestDP(node)
	a := startReady(t, c, Config{NodeName: node, Resync: time.Hour}, dp)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(11, 13))
	apps := []string{"web", "db", "api"}
	policies := []string{`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p1, namespace: a, generation: %d}
spec:
  podSelector: {matchLabels: {app: %s}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: %s}}}, {namespaceSelector: {matchLabels: {team: b}}}]
    ports: [{port: http}, {port: 8000, endPort: 8100}]
`, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p2, namespace: b, generation: %d}
spec:
  podSelector: {matchExpressions: [{key: app, operator: In, values: [%s, %s]}]}
  egress:
  - to: [{podSelector: {}, namespaceSelector: {matchLabels: {team: a}}}]
  policyTypes: [Egress]
`, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: c1, generation: %d}
spec:
  tier: Admin
  priority: 5
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: %s}}}}
  ingress:
  - action: Deny
    from: [{pods: {namespaceSelector: {matchLabels: {team: a}}, podSelector: {matchLabels: {app: %s}}}}]
  - action: Accept
    from: [{nodes: {matchLabels: {pool: x}}}]
`}
	created := map[string]bool{}
	pods := map[string]*corev1.Pod{}
	gen := 1
	for round := range 12 {
		for range 6 {
			switch op := r.IntN(9); {
			case op <= 2: // create or replace a pod
				ns := []string{"a", "b"}[r.IntN(2)]
				name := fmt.Sprint("p", r.IntN(8))
				key := ns + "/" + name
				p := fixture.Pod(ns, name, []string{"n1", "n2"}[r.IntN(2)], map[string]string{"app": apps[r.IntN(3)]},
					[]fixture.Port{{Name: "http", Port: int32(8000 + r.IntN(3)*50)}}, fmt.Sprintf("10.9.%d.%d", r.IntN(2), r.IntN(12)+1))
				if old := pods[key]; old != nil {
					if err := c.kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := c.kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				pods[key] = p
			case op == 3: // relabel or finish a pod
				for key, p := range pods {
					p = p.DeepCopy()
					if r.IntN(4) == 0 {
						p.Status.Phase = corev1.PodSucceeded
					} else {
						p.Labels = map[string]string{"app": apps[r.IntN(3)], "noise": fmt.Sprint(r.IntN(9))}
					}
					if _, err := c.kube.CoreV1().Pods(p.Namespace).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
					pods[key] = p
					break
				}
			case op == 4: // delete a pod
				for key, p := range pods {
					if err := c.kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
					delete(pods, key)
					break
				}
			case op == 5: // relabel a namespace or a node
				if r.IntN(2) == 0 {
					ns := fixture.Namespace("b", map[string]string{"team": []string{"a", "b"}[r.IntN(2)]})
					if _, err := c.kube.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
				} else {
					n := fixture.Node("n2", map[string]string{"pool": []string{"x", "y"}[r.IntN(2)]}, "192.168.0.2")
					if _, err := c.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
			default: // create, change or delete a policy
				i := r.IntN(len(policies))
				gen++
				u := fixture.YAML(t, fmt.Sprintf(policies[i], gen, apps[r.IntN(3)], apps[r.IntN(3)]))
				gvr, ns := networkPolicyGVR, u.GetNamespace()
				if u.GetKind() == "ClusterNetworkPolicy" {
					gvr = clusterNetworkPolicyGVR
				}
				res := c.dyn.Resource(gvr).Namespace(ns)
				var err error
				switch {
				case created[u.GetName()] && r.IntN(3) == 0:
					err = res.Delete(ctx, u.GetName(), metav1.DeleteOptions{})
					created[u.GetName()] = false
				case created[u.GetName()]:
					_, err = res.Update(ctx, u, metav1.UpdateOptions{})
				default:
					_, err = res.Create(ctx, u, metav1.CreateOptions{})
					created[u.GetName()] = true
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		settle(t, a)
		incremental := dp.fake.Dump()
		s := a.takeSnapshot()
		fresh := knftables.NewFake(knftables.InetFamily, nft.Table)
		if _, err := nft.New(fresh, nft.Options{Node: node}).Sync(ctx, policy.Compile(&s.cluster, a.compilerOptions())); err != nil {
			t.Fatal(err)
		}
		if got, want := sortLines(incremental), sortLines(fresh.Dump()); got != want {
			t.Fatalf("round %d: the incrementally patched table differs from a full compilation of the caches:\nincremental:\n%s\nfull:\n%s", round, got, want)
		}
	}
	t.Logf("compilations: full %s, incremental %s", testutilValue(t, a, "moat_agent_compilations_total", `kind="full"`), testutilValue(t, a, "moat_agent_compilations_total", `kind="incremental"`))
	if v := testutilValue(t, a, "moat_agent_compilations_total", `kind="incremental"`); v == "0" || v == "" {
		t.Errorf("nothing was compiled incrementally (%q): the test proves nothing", v)
	}
}

func sortLines(s string) string {
	lines := strings.Split(s, "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
