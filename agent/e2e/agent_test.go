package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/internal/kubetest"
)

// The test cluster: two nodes, pods on both, two namespaces.
//
//	n1 (192.168.50.1): a/x 10.60.1.1, b/z 10.60.1.2
//	n2 (192.168.50.2): a/y 10.60.2.1, a/w 10.60.2.2
var (
	testNamespaces = map[string]map[string]string{"a": {"team": "a"}, "b": {"team": "b"}}
	testNodes      = []nodeSpec{{"n1", "192.168.50.1"}, {"n2", "192.168.50.2"}}
	testPods       = []podSpec{
		{"a", "x", "n1", map[string]string{"app": "x"}, "10.60.1.1"},
		{"b", "z", "n1", map[string]string{"app": "z"}, "10.60.1.2"},
		{"a", "y", "n2", map[string]string{"app": "y"}, "10.60.2.1"},
		{"a", "w", "n2", map[string]string{"app": "w"}, "10.60.2.2"},
	}
)

const (
	x = "a/x"
	y = "a/y"
	w = "a/w"
	z = "b/z"
)

// TestAgentsEnforceWithRealPackets runs one moat-agent process per lab
// node against a real kube-apiserver (as the agent's ServiceAccount) and
// checks every behaviour with TCP connections between pod namespaces.
func TestAgentsEnforceWithRealPackets(t *testing.T) {
	requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	agentBinary(t)
	// The CRD with one peer field more than the agent knows (a newer API),
	// installed before any agent watches.
	env := kubetest.Start(ctx, t, kubetest.WithCRDs(kubetest.CRDWithNewerFields(t)))
	c := newCluster(ctx, t, env, testNamespaces, testNodes, testPods)
	c.startAgent("n1")
	c.startAgent("n2")
	c.waitReady("n1", "n2")

	c.expect(ctx, "no policy: everything reaches everything", map[flow]bool{
		{y, x, 9090}: true, {z, x, 80}: true, {x, y, 80}: true, {w, z, 8080}: true,
	})

	t.Run("NetworkPolicy with endPort, then deleted", func(t *testing.T) {
		fixture.MustPolicy(ctx, t, env, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-range, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {}}]
    ports: [{port: 8000, endPort: 8100}]
`)
		c.expect(ctx, "endPort range", map[flow]bool{
			{y, x, 8080}: true, {y, x, 9090}: false, {y, x, 80}: false, {z, x, 8080}: false, {x, y, 80}: true,
		})
		fixture.DeletePolicy(ctx, t, env, "NetworkPolicy", "a", "x-range")
		c.expect(ctx, "deleting it restores connectivity", map[flow]bool{{y, x, 9090}: true, {z, x, 8080}: true})
	})

	t.Run("tiers: Admin Deny over NP allow, Pass hands over, Baseline only where no NP selects", func(t *testing.T) {
		fixture.MustPolicy(ctx, t, env, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-from-y, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: "y"}}}]
`)
		fixture.MustPolicy(ctx, t, env, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin-8080}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {matchLabels: {team: a}}, podSelector: {}}}
  ingress:
  - action: Deny
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
`)
		c.expect(ctx, "Admin Deny overrides the NetworkPolicy's allow", map[flow]bool{
			{y, x, 8080}: false, {y, x, 9090}: true, {w, x, 9090}: false,
		})
		fixture.MustPolicy(ctx, t, env, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline-deny}
spec:
  tier: Baseline
  priority: 10
  subject: {namespaces: {matchLabels: {team: a}}}
  ingress:
  - action: Deny
    from: [{namespaces: {}}]
`)
		// Admin Pass instead of Deny: the NetworkPolicy tier decides for x
		// (selected: allowed from y); Baseline Deny applies only to pods no
		// NetworkPolicy selects (y, w).
		patchAction(ctx, t, env, "admin-8080", "Pass")
		c.expect(ctx, "Pass hands over to the NetworkPolicy, Baseline only where no NP selects", map[flow]bool{
			{y, x, 8080}: true, {w, x, 8080}: false, {x, y, 8080}: false, {x, w, 80}: false, {z, x, 9090}: false, {x, z, 80}: true,
		})
		for _, n := range []string{"admin-8080", "baseline-deny"} {
			fixture.DeletePolicy(ctx, t, env, "ClusterNetworkPolicy", "", n)
		}
		fixture.DeletePolicy(ctx, t, env, "NetworkPolicy", "a", "x-from-y")
		c.expect(ctx, "all deleted", map[flow]bool{{w, x, 8080}: true, {x, y, 8080}: true})
	})

	t.Run("relabelling pods and namespaces moves them in and out", func(t *testing.T) {
		fixture.MustPolicy(ctx, t, env, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-peers, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}, {namespaceSelector: {matchLabels: {trusted: "yes"}}}]
`)
		c.expect(ctx, "nobody is a client yet", map[flow]bool{{y, x, 80}: false, {z, x, 80}: false})
		fixture.Relabel(ctx, t, env, "Pod", "a", "y", map[string]string{"app": "y", "role": "client"})
		fixture.Relabel(ctx, t, env, "Namespace", "", "b", map[string]string{"team": "b", "trusted": "yes"})
		c.expect(ctx, "relabelled in", map[flow]bool{{y, x, 80}: true, {z, x, 80}: true, {w, x, 80}: false})
		fixture.Relabel(ctx, t, env, "Pod", "a", "y", map[string]string{"app": "y"})
		fixture.Relabel(ctx, t, env, "Namespace", "", "b", map[string]string{"team": "b"})
		c.expect(ctx, "relabelled out", map[flow]bool{{y, x, 80}: false, {z, x, 80}: false})
		// The subject side: x leaves the policy's selection.
		fixture.Relabel(ctx, t, env, "Pod", "a", "x", map[string]string{"app": "x-retired"})
		c.expect(ctx, "x no longer selected", map[flow]bool{{y, x, 80}: true})
		fixture.Relabel(ctx, t, env, "Pod", "a", "x", map[string]string{"app": "x"})
		fixture.DeletePolicy(ctx, t, env, "NetworkPolicy", "a", "x-peers")
		c.expect(ctx, "policy deleted", map[flow]bool{{y, x, 80}: true, {z, x, 80}: true})
	})

	t.Run("unknown field is enforced fail-closed and reported", func(t *testing.T) {
		fixture.MustPolicy(ctx, t, env, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: future}
spec:
  tier: Admin
  priority: 20
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: z}}}}
  ingress:
  - action: Deny
    from: [{serviceAccounts: {name: intruder}}]
`)
		c.expect(ctx, "a Deny with an unreadable peer denies every source", map[flow]bool{
			{y, z, 80}: false, {x, z, 9090}: false, {z, y, 80}: true,
		})
		fixture.Eventually(t, 30*time.Second, "Accepted=False", func() (bool, string) {
			u, err := env.Dynamic.Resource(fixture.ClusterNetworkPolicies).Get(ctx, "future", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			var cnp v1alpha2.ClusterNetworkPolicy
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cnp); err != nil {
				return false, err.Error()
			}
			cond := meta.FindStatusCondition(cnp.Status.Conditions, "Accepted")
			if cond == nil {
				return false, "no condition"
			}
			return cond.Status == metav1.ConditionFalse && cond.Reason == "UnknownField" && strings.Contains(cond.Message, "serviceAccounts"), fmt.Sprintf("%+v", *cond)
		})
		err := fixture.Policy(ctx, env, fixture.YAML(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: bad-range}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  egress:
  - action: Deny
    to: [{namespaces: {}}]
    protocols: [{udp: {destinationPort: {range: {start: 53, end: 53}}}}]
`))
		if err == nil || !strings.Contains(err.Error(), "Start port must be less than End port") {
			t.Errorf("invalid policy: %v; want the CRD's CEL message", err)
		}
		fixture.DeletePolicy(ctx, t, env, "ClusterNetworkPolicy", "", "future")
		c.expect(ctx, "deleted", map[flow]bool{{y, z, 80}: true})
	})

	// From here on x is isolated: only y may reach it.
	fixture.MustPolicy(ctx, t, env, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-only-y, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: "y"}}}]
`)
	isolated := map[flow]bool{{y, x, 80}: true, {w, x, 80}: false, {z, x, 80}: false}
	c.expect(ctx, "x isolated", isolated)

	t.Run("API server stopped: enforcement unchanged", func(t *testing.T) {
		if err := env.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := env.RestartAPIServer(ctx); err != nil {
				t.Fatal(err)
			}
		}()
		for range 3 {
			time.Sleep(time.Second)
			got := c.probe(ctx, flow{y, x, 80}, flow{w, x, 80}, flow{z, x, 80})
			if !got[0] || got[1] || got[2] {
				t.Fatalf("with the API server down: y->x %v, w->x %v, z->x %v; want true, false, false", got[0], got[1], got[2])
			}
		}
		for _, n := range []string{"n1", "n2"} {
			if ok, why := c.agents[n].ready(); !ok {
				t.Errorf("agent %s not ready while its rules are in force: %s", n, why)
			}
		}
	})

	t.Run("agent restart never opens a window", func(t *testing.T) {
		c.expect(ctx, "reconnected after the API server came back", isolated)
		var wrong, probes atomic.Int64
		var mu sync.Mutex
		var wrongFlows []string
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(2 * time.Minute)
			for time.Now().Before(deadline) {
				select {
				case <-stop:
					return
				default:
				}
				got := c.probe(ctx, flow{w, x, 80}, flow{z, x, 80}, flow{w, x, 9090})
				probes.Add(1)
				for i, g := range got {
					if g {
						wrong.Add(1)
						mu.Lock()
						wrongFlows = append(wrongFlows, fmt.Sprintf("round %d flow %d", probes.Load(), i))
						mu.Unlock()
					}
				}
			}
		}()
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
			before := probes.Load()
			c.agents["n1"].stop(sig)
			// Meanwhile something changes that the old table does not know.
			fixture.Relabel(ctx, t, env, "Pod", "a", "w", map[string]string{"app": "w", "moved": sig.String()})
			time.Sleep(time.Second)
			c.startAgent("n1")
			c.waitReady("n1")
			fixture.Eventually(t, 10*time.Second, "probes continue after the restart", func() (bool, string) {
				return probes.Load() >= before+3, fmt.Sprintf("%d probe rounds", probes.Load()-before)
			})
		}
		close(stop)
		wg.Wait()
		if wrong.Load() > 0 {
			t.Fatalf("%d denied connections got through during restarts: %v", wrong.Load(), wrongFlows)
		}
		t.Logf("%d probe rounds during two restarts, none wrongly allowed", probes.Load())
		c.expect(ctx, "after the restarts", isolated)
	})

	t.Run("a flushed ruleset is programmed again without a signal", func(t *testing.T) {
		// `nft flush ruleset`, as a reload of nftables.service or
		// firewalld does, deletes the table. Nothing changes in the
		// cluster and the default --resync (5 minutes) is far beyond this
		// test: the agent's own check of the table must notice.
		c.nft(ctx, t, "n1", "flush", "ruleset")
		c.expect(ctx, "n1's table programmed again", isolated)
		c.waitReady("n1")
		fixture.Eventually(t, 10*time.Second, "the loss logged", func() (bool, string) {
			b, err := os.ReadFile(c.agents["n1"].log)
			return err == nil && strings.Contains(string(b), "Table inet moat is gone from nftables"), fmt.Sprint("not in the log ", err)
		})
	})

	t.Run("SIGHUP rewrites a table emptied behind the agent's back", func(t *testing.T) {
		// `nft flush table` empties the chains but keeps the counters,
		// which the agent's check of the table does not notice (only a
		// --resync would): the signal brings the rules back.
		c.nft(ctx, t, "n1", "flush", "table", "inet", "moat")
		c.expect(ctx, "n1's table emptied: x is open", map[flow]bool{{y, x, 80}: true, {w, x, 80}: true, {z, x, 80}: true})
		if err := c.agents["n1"].cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		c.expect(ctx, "rewritten after SIGHUP", isolated)
		if ok, why := c.agents["n1"].ready(); !ok {
			t.Fatalf("agent not running after SIGHUP: %s", why)
		}
	})
}

// patchAction sets the action of a ClusterNetworkPolicy's first ingress rule.
func patchAction(ctx context.Context, t *testing.T, env *kubetest.Env, name, action string) {
	t.Helper()
	u, err := env.Dynamic.Resource(fixture.ClusterNetworkPolicies).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rules, _, _ := unstructured.NestedSlice(u.Object, "spec", "ingress")
	rules[0].(map[string]any)["action"] = action
	if err := unstructured.SetNestedSlice(u.Object, rules, "spec", "ingress"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Dynamic.Resource(fixture.ClusterNetworkPolicies).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
