package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/deploy"
	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Integration tests: the agent against a real etcd and kube-apiserver,
// authenticated as its ServiceAccount under the shipped RBAC, programming
// a knftables fake through the real nft package. The kernel side is
// covered by agent/e2e.

func testLeaderElection() LeaderElection {
	return LeaderElection{Enabled: true, LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond}
}

// apiAgent is an agent running against the test API server.
type apiAgent struct {
	*Agent
	dp   *testDP
	stop func()
}

func runAPIAgent(t *testing.T, clients Clients, cfg Config, dp *testDP) *apiAgent {
	t.Helper()
	a, err := New(cfg, clients, dp)
	if err != nil {
		t.Fatal(err)
	}
	return &apiAgent{Agent: a, dp: dp, stop: runAgent(t, a, cfg.NodeName)}
}

// pathAllows judges a new TCP connection with the rules of the nodes it
// crosses, as the kernel would: egress on the source's node, ingress on
// the destination's.
func pathAllows(src, dst string, port uint16, nodes ...*testDP) bool {
	var rs []*nft.Ruleset
	for _, n := range nodes {
		rs = append(rs, n.Applied())
	}
	return nft.PathAllows(nft.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: policy.ProtoTCP, Port: port}, rs...)
}

// expectPath waits until every node of the path is programmed and the
// path judges src -> dst:port as want.
func expectPath(t *testing.T, what, src, dst string, port uint16, want bool, nodes ...*testDP) {
	t.Helper()
	fixture.Eventually(t, 15*time.Second, what, func() (bool, string) {
		for _, n := range nodes {
			if n.Applied() == nil {
				return false, "not programmed"
			}
		}
		got := pathAllows(src, dst, port, nodes...)
		return got == want, fixture.Explain("%s -> %s:%d allowed=%v, want %v", src, dst, port, got, want)
	})
}

func acceptedCondition(ctx context.Context, env *kubetest.Env, name string) (*metav1.Condition, int64, error) {
	u, err := env.Dynamic.Resource(fixture.ClusterNetworkPolicies).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, 0, err
	}
	var cnp v1alpha2.ClusterNetworkPolicy
	js, _ := u.MarshalJSON()
	if err := yaml.Unmarshal(js, &cnp); err != nil {
		return nil, 0, err
	}
	return meta.FindStatusCondition(cnp.Status.Conditions, ConditionAccepted), cnp.Generation, nil
}

func waitCondition(ctx context.Context, t *testing.T, env *kubetest.Env, name string, status metav1.ConditionStatus, reason, msgPart string) {
	t.Helper()
	fixture.Eventually(t, 30*time.Second, "Accepted condition of "+name, func() (bool, string) {
		c, gen, err := acceptedCondition(ctx, env, name)
		switch {
		case err != nil:
			return false, err.Error()
		case c == nil:
			return false, "no Accepted condition"
		}
		ok := c.Status == status && c.Reason == reason && strings.Contains(c.Message, msgPart) && c.ObservedGeneration == gen
		return ok, fixture.Explain("%s/%s %q (generation %d of %d)", c.Status, c.Reason, c.Message, c.ObservedGeneration, gen)
	})
}

// startAPIServer starts a real kube-apiserver (and etcd) with Moat's
// CRDs, and the agent's clients to it: the environment of every agent
// test against an API server.
func startAPIServer(ctx context.Context, t *testing.T) (*kubetest.Env, Clients) {
	t.Helper()
	crds, err := deploy.CRDs(deploy.Experimental)
	if err != nil {
		t.Fatal(err)
	}
	return startAPIServerWith(ctx, t, crds)
}

// startAPIServerWith is startAPIServer with the CRDs given.
func startAPIServerWith(ctx context.Context, t *testing.T, crds []byte) (*kubetest.Env, Clients) {
	t.Helper()
	env := kubetest.Start(ctx, t, kubetest.WithCRDs(crds))
	clients, err := NewClients(fixture.AgentConfig(ctx, t, env))
	if err != nil {
		t.Fatal(err)
	}
	return env, clients
}

func TestAgentAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; runs without -short")
	}
	ctx := context.Background()
	env, clients := startAPIServer(ctx, t)

	fixture.CreateNamespace(ctx, t, env, fixture.Namespace("a", map[string]string{"team": "a"}))
	fixture.CreateNamespace(ctx, t, env, fixture.Namespace("b", map[string]string{"team": "b"}))
	fixture.CreateNode(ctx, t, env, fixture.Node("n1", map[string]string{"zone": "one"}, "192.168.1.1"))
	fixture.CreateNode(ctx, t, env, fixture.Node("n2", map[string]string{"zone": "two"}, "192.168.1.2"))
	http := []fixture.Port{{Name: "http", Port: 8080}}
	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "x", "n1", map[string]string{"app": "x"}, http), "10.1.0.1")
	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "y", "n2", map[string]string{"app": "y"}, nil), "10.1.0.2")
	fixture.CreatePod(ctx, t, env, fixture.Pod("b", "z", "n1", map[string]string{"app": "z"}, nil), "10.1.0.3")
	const x, y, z = "10.1.0.1", "10.1.0.2", "10.1.0.3"

	n1 := runAPIAgent(t, clients, Config{NodeName: "n1", AllowNodeLocal: true, LeaderElection: testLeaderElection()}, newTestDP("n1"))
	n2 := runAPIAgent(t, clients, Config{NodeName: "n2", AllowNodeLocal: true, LeaderElection: testLeaderElection()}, newTestDP("n2"))
	expect := func(what, src, dst string, port uint16, want bool, nodes ...*testDP) {
		t.Helper()
		expectPath(t, what, src, dst, port, want, nodes...)
	}
	fixture.Eventually(t, 30*time.Second, "both agents ready", func() (bool, string) {
		return n1.Ready() == nil && n2.Ready() == nil, fixture.Explain("n1 %v, n2 %v", n1.Ready() == nil, n2.Ready() == nil)
	})

	t.Run("NetworkPolicy with endPort", func(t *testing.T) {
		fixture.MustPolicy(ctx, t, env, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-range, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {}}, {namespaceSelector: {matchLabels: {team: a}}}]
    ports: [{port: 8000, endPort: 8100}]
`)
		expect("y -> x inside the range", y, x, 8080, true, n2.dp, n1.dp)
		expect("y -> x outside the range", y, x, 8101, false, n2.dp, n1.dp)
		expect("z (namespace b) -> x", z, x, 8080, false, n1.dp)
	})

	t.Run("relabel namespace into the policy", func(t *testing.T) {
		fixture.Relabel(ctx, t, env, "Namespace", "", "b", map[string]string{"team": "a"})
		expect("z after its namespace joined team a", z, x, 8080, true, n1.dp)
		fixture.Relabel(ctx, t, env, "Namespace", "", "b", map[string]string{"team": "b"})
		expect("z after its namespace left", z, x, 8080, false, n1.dp)
	})

	t.Run("ClusterNetworkPolicy Admin Deny and status", func(t *testing.T) {
		fixture.MustPolicy(ctx, t, env, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-8080}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: x}}}}
  ingress:
  - name: no-8080
    action: Deny
    from: [{namespaces: {matchLabels: {team: a}}}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
`)
		expect("Admin Deny overrides the NetworkPolicy", y, x, 8080, false, n2.dp, n1.dp)
		expect("the NetworkPolicy still allows the rest of its range", y, x, 8081, true, n2.dp, n1.dp)
		waitCondition(ctx, t, env, "deny-8080", metav1.ConditionTrue, ReasonAccepted, "")
		if n1.status.leading.Load() == n2.status.leading.Load() {
			t.Errorf("leading: n1 %v, n2 %v; want exactly one", n1.status.leading.Load(), n2.status.leading.Load())
		}
	})

	t.Run("API server rejects an invalid ClusterNetworkPolicy", func(t *testing.T) {
		err := fixture.Policy(ctx, env, fixture.YAML(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: bad-range}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {}}
  egress:
  - action: Deny
    to: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {range: {start: 9000, end: 8000}}}}]
`))
		if err == nil || !strings.Contains(err.Error(), "Start port must be less than End port") {
			t.Fatalf("create: %v; want the CRD's CEL message", err)
		}
	})

	t.Run("NetworkPolicy named port that resolves nowhere gets an Event", func(t *testing.T) {
		fixture.MustPolicy(ctx, t, env, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: named-nowhere, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - ports: [{port: metrics}]
`)
		fixture.Eventually(t, 30*time.Second, "Event on named-nowhere", func() (bool, string) {
			evs, err := env.Client.CoreV1().Events("a").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=named-nowhere,involvedObject.kind=NetworkPolicy"})
			if err != nil {
				return false, err.Error()
			}
			for _, e := range evs.Items {
				if e.Reason == EventPolicyProblem && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, `named port "metrics"`) && strings.Contains(e.Message, "spec.ingress[0].ports[0].port") {
					return true, ""
				}
			}
			return false, fixture.Explain("%d events, none about the named port", len(evs.Items))
		})
		fixture.DeletePolicy(ctx, t, env, "NetworkPolicy", "a", "named-nowhere")
	})

	t.Run("API server stopped: rules unchanged, then catch up", func(t *testing.T) {
		if err := env.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		restarted := false
		defer func() {
			if !restarted {
				if err := env.RestartAPIServer(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
		errsBefore := testutilValue(t, n1.Agent, "moat_agent_watch_errors_total", `resource="pods"`)
		fixture.Eventually(t, 30*time.Second, "watch errors while the API server is down", func() (bool, string) {
			v := testutilValue(t, n1.Agent, "moat_agent_watch_errors_total", `resource="pods"`)
			return v != errsBefore, "no new watch error"
		})
		// Everything the server sent before it stopped has been programmed
		// by now (the watches have failed since).
		time.Sleep(500 * time.Millisecond)
		before1, before2 := n1.dp.fake.Dump(), n2.dp.fake.Dump()
		// A full resync from the caches meanwhile must write the same rules.
		n1.Resync()
		syncs := n1.syncs.Load()
		fixture.Eventually(t, 10*time.Second, "resync during the outage", func() (bool, string) { return n1.syncs.Load() > syncs, "no sync" })
		time.Sleep(2 * time.Second)
		if after := n1.dp.fake.Dump(); after != before1 {
			t.Fatalf("rules of n1 changed while the API server was down:\nbefore:\n%s\nafter:\n%s", before1, after)
		}
		if n2.dp.fake.Dump() != before2 {
			t.Fatal("rules of n2 changed while the API server was down")
		}
		if n1.Ready() != nil || n2.Ready() != nil {
			t.Error("agents turned unready although their rules are in force")
		}
		restarted = true
		if err := env.RestartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		fixture.DeletePolicy(ctx, t, env, "ClusterNetworkPolicy", "", "deny-8080")
		expect("after reconnecting, a deletion reaches the rules", y, x, 8080, true, n2.dp, n1.dp)
	})

	t.Run("agent restart: old table until one full transaction replaces it", func(t *testing.T) {
		n1.stop()
		// While no agent runs, a change happens.
		fixture.Relabel(ctx, t, env, "Pod", "a", "y", map[string]string{"app": "y2"})
		fixture.MustPolicy(ctx, t, env, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y2, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: y2}}}]
`)
		old := n1.dp.fake.Dump()
		restarted := newTestDPOn(n1.dp.fake, "n1")
		n1b := runAPIAgent(t, clients, Config{NodeName: "n1", AllowNodeLocal: true, LeaderElection: testLeaderElection()}, restarted)
		fixture.Eventually(t, 30*time.Second, "restarted agent ready", func() (bool, string) { return n1b.Ready() == nil, "not ready" })
		txs := restarted.nft.transactions()
		if len(txs) == 0 || txs[0] == old {
			t.Fatalf("restarted agent made %d transactions; the first must change the table", len(txs))
		}
		if !strings.Contains(txs[0], "table inet moat") {
			t.Fatalf("after the first transaction the table is gone:\n%s", txs[0])
		}
		if pathAllows(y, x, 5000, n2.dp, n1.dp) {
			t.Fatal("the old table already allowed y -> x:5000; the check below would prove nothing")
		}
		if !pathAllows(y, x, 5000, n2.dp, restarted) {
			t.Error("after the restart's first sync, relabelled y does not reach x through the new policy")
		}
		// Leadership moved or stayed, but someone leads and writes status.
		fixture.MustPolicy(ctx, t, env, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: after-restart}
spec:
  tier: Baseline
  priority: 1
  subject: {namespaces: {}}
  ingress:
  - action: Accept
    from: [{namespaces: {}}]
`)
		waitCondition(ctx, t, env, "after-restart", metav1.ConditionTrue, ReasonAccepted, "")
	})
}

// TestUnknownFieldAndLeaderFailover runs against a CRD with one ingress
// peer field more than this agent knows (a newer API): a policy using it
// is enforced fail-closed and reported, by whichever agent leads; the
// status writer moves to the other agent when the leader stops.
//
// The CRD variant is installed before the agents watch: a watch opened
// before a CRD update keeps being served, for up to two minutes, by the
// old schema, which prunes the new field (docs/agent.md).
func TestUnknownFieldAndLeaderFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; runs without -short")
	}
	ctx := context.Background()
	env, clients := startAPIServerWith(ctx, t, kubetest.CRDWithNewerFields(t))
	fixture.CreateNamespace(ctx, t, env, fixture.Namespace("a", nil))
	fixture.CreateNode(ctx, t, env, fixture.Node("n1", nil, "192.168.1.1"))
	fixture.CreateNode(ctx, t, env, fixture.Node("n2", nil, "192.168.1.2"))
	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "z", "n1", map[string]string{"app": "z"}, nil), "10.1.0.3")
	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "y", "n2", map[string]string{"app": "y"}, nil), "10.1.0.2")
	const y, z = "10.1.0.2", "10.1.0.3"
	agents := map[string]*apiAgent{}
	for _, n := range []string{"n1", "n2"} {
		agents[n] = runAPIAgent(t, clients, Config{NodeName: n, LeaderElection: testLeaderElection()}, newTestDP(n))
	}
	n1, n2 := agents["n1"], agents["n2"]
	expect := func(what string, want bool) {
		t.Helper()
		expectPath(t, what, y, z, 5000, want, n2.dp, n1.dp)
	}
	expect("before any policy", true)

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
	// The peer is unreadable: the Deny applies to every source.
	expect("unknown peer field: fail-closed Deny", false)
	waitCondition(ctx, t, env, "future", metav1.ConditionFalse, ReasonUnknownField, "spec.ingress[0].from[0].serviceAccounts")
	fixture.Eventually(t, 30*time.Second, "Event on future", func() (bool, string) {
		evs, err := env.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=future,reason=" + EventPolicyProblem})
		if err != nil {
			return false, err.Error()
		}
		return len(evs.Items) > 0, "no PolicyProblem Event"
	})
	if v := testutilValue(t, n1.Agent, "moat_agent_policies", `kind="ClusterNetworkPolicy",state="failed_closed"`); v != "1" {
		t.Errorf("failed-closed ClusterNetworkPolicies = %s, want 1", v)
	}

	var leader, other string
	fixture.Eventually(t, 30*time.Second, "a leader", func() (bool, string) {
		leader, other = "", ""
		for n, a := range agents {
			if a.status.leading.Load() {
				leader = n
			} else {
				other = n
			}
		}
		return leader != "" && other != "", "no single leader"
	})
	agents[leader].stop()
	fixture.Eventually(t, 30*time.Second, other+" takes over", func() (bool, string) { return agents[other].status.leading.Load(), "not leading" })
	fixture.MustPolicy(ctx, t, env, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: gated-peer}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  ingress:
  - action: Accept
    from: [{networks: ["10.0.0.0/8"]}]
`)
	// The gate is off: the NPEP-127 peer is enforced fail-closed and the
	// condition says which gate would enable it.
	waitCondition(ctx, t, env, "gated-peer", metav1.ConditionFalse, ReasonUnknownField, "--feature-gates=IngressNetworksAndNodes=true")
	lease, err := env.Client.CoordinationV1().Leases(fixture.AgentNamespace).Get(ctx, "moat-agent", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != other {
		t.Errorf("lease holder = %v (%v), want %s", lease.Spec.HolderIdentity, err, other)
	}
	fixture.DeletePolicy(ctx, t, env, "ClusterNetworkPolicy", "", "future")
	if leader == "n1" {
		return // z's ingress is judged on n1, whose agent is stopped
	}
	expect("deleting it restores y -> z", true)
}
