package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// testDP is the real nft.Syncer on a knftables fake, with a switch to make
// transactions fail as a broken nft would, and a generation of nftables
// as the kernel keeps (recordingNFT).
type testDP struct {
	*nft.Syncer
	fake  *knftables.Fake
	nft   *recordingNFT
	fail  atomic.Bool
	calls atomic.Int32
}

func newTestDP(node string) *testDP {
	return newTestDPOn(knftables.NewFake(knftables.InetFamily, nft.Table), node)
}

// newTestDPOn starts a fresh Syncer (as a restarted agent would) on a
// table that may already hold rules.
func newTestDPOn(f *knftables.Fake, node string) *testDP {
	rec := &recordingNFT{Interface: f, fake: f}
	rec.gen.Store(1)
	return &testDP{Syncer: nft.New(rec, nft.Options{Node: node, Generation: rec}), fake: f, nft: rec}
}

// recordingNFT records the table after every transaction. Like the
// kernel it counts generations: each transaction that runs raises gen by
// one, and a test raises it to stand for another writer's commit.
type recordingNFT struct {
	knftables.Interface
	fake  *knftables.Fake
	gen   atomic.Uint32
	mu    sync.Mutex
	dumps []string
}

func (r *recordingNFT) ReadGeneration(context.Context) (uint32, error) { return r.gen.Load(), nil }

func (r *recordingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	err := r.Interface.Run(ctx, tx)
	if err == nil {
		r.gen.Add(1)
	}
	r.mu.Lock()
	r.dumps = append(r.dumps, r.fake.Dump())
	r.mu.Unlock()
	return err
}

func (r *recordingNFT) transactions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.dumps...)
}

func (d *testDP) Sync(ctx context.Context, prog *policy.Program) (nft.Result, error) {
	d.calls.Add(1)
	if d.fail.Load() {
		return nft.Result{}, errors.New("injected nft failure")
	}
	return d.Syncer.Sync(ctx, prog)
}

// allows asks the programmed ruleset (Go interpreter of the same chains
// and sets) whether a new TCP connection gets through this node.
func (d *testDP) allows(src, dst string, port uint16) (bool, bool) {
	rs := d.Applied()
	if rs == nil {
		return false, false
	}
	return rs.Allows(nft.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: policy.ProtoTCP, Port: port}), true
}

type fakeCluster struct {
	kube *kubefake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
}

func newFakeCluster(t *testing.T, objs ...runtime.Object) *fakeCluster {
	t.Helper()
	var core, policies []runtime.Object
	for _, o := range objs {
		if _, ok := o.(interface{ UnstructuredContent() map[string]any }); ok {
			policies = append(policies, o)
		} else {
			core = append(core, o)
		}
	}
	return &fakeCluster{
		kube: kubefake.NewSimpleClientset(core...),
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
			networkPolicyGVR:        "NetworkPolicyList",
			clusterNetworkPolicyGVR: "ClusterNetworkPolicyList",
		}, policies...),
	}
}

// relabelPod replaces the labels of pod ns/name.
func (c *fakeCluster) relabelPod(t *testing.T, ns, name string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	p, err := c.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels = labels
	if _, err := c.kube.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// clusterX is the fake cluster most agent tests start from: namespace a
// and node n1 (192.168.0.1) with pod a/x (app: x, 10.0.0.1) on it, then
// objs.
func clusterX(t *testing.T, objs ...runtime.Object) *fakeCluster {
	t.Helper()
	return newFakeCluster(t, append([]runtime.Object{
		fixture.Namespace("a", nil),
		fixture.Node("n1", nil, "192.168.0.1"),
		fixture.Pod("a", "x", "n1", map[string]string{"app": "x"}, nil, "10.0.0.1"),
	}, objs...)...)
}

// clusterXY is clusterX with pod a/y (app: y, 10.0.0.2) on n1 as well.
func clusterXY(t *testing.T, objs ...runtime.Object) *fakeCluster {
	t.Helper()
	return clusterX(t, append([]runtime.Object{
		fixture.Pod("a", "y", "n1", map[string]string{"app": "y"}, nil, "10.0.0.2"),
	}, objs...)...)
}

func startAgent(t *testing.T, c *fakeCluster, cfg Config, dp Dataplane) (*Agent, func()) {
	t.Helper()
	if cfg.NodeName == "" {
		cfg.NodeName = "n1"
	}
	a, err := New(cfg, Clients{Kube: c.kube, Dynamic: c.dyn}, dp)
	if err != nil {
		t.Fatal(err)
	}
	return a, runAgent(t, a, cfg.NodeName)
}

// startReady is startAgent, returning once the agent is ready; it stops
// when the test ends.
func startReady(t *testing.T, c *fakeCluster, cfg Config, dp Dataplane) *Agent {
	t.Helper()
	a, _ := startAgent(t, c, cfg, dp)
	fixture.Eventually(t, 10*time.Second, "ready", func() (bool, string) { return a.Ready() == nil, "not ready" })
	return a
}

// runAgent runs a (for node) until stop, which the test's cleanup calls
// too: it cancels Run and waits for it to return, once.
func runAgent(t *testing.T, a *Agent, node string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.Run(ctx); err != nil {
			t.Errorf("agent %s: Run: %v", node, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

const npAllowYtoX = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-y, namespace: a, generation: 1}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: "y"}}}]
    ports: [{port: 80}]
`

func TestAgentFollowsTheCluster(t *testing.T) {
	c := clusterXY(t, fixture.YAML(t, npAllowYtoX))
	dp := newTestDP("n1")
	a := startReady(t, c, Config{AllowNodeLocal: true}, dp)
	ctx := context.Background()

	expect := func(what, src, dst string, port uint16, want bool) {
		t.Helper()
		fixture.Eventually(t, 10*time.Second, what, func() (bool, string) {
			got, ok := dp.allows(src, dst, port)
			return ok && got == want, fixture.Explain("programmed=%v allowed=%v, want %v", ok, got, want)
		})
	}
	expect("NetworkPolicy allows y -> x:80", "10.0.0.2", "10.0.0.1", 80, true)
	expect("NetworkPolicy isolates x on other ports", "10.0.0.2", "10.0.0.1", 81, false)

	// Relabel y out of the policy's peers.
	c.relabelPod(t, "a", "y", map[string]string{"app": "z"})
	expect("relabelled y is no longer allowed", "10.0.0.2", "10.0.0.1", 80, false)
	if v := testutilValue(t, a, "moat_agent_compilations_total", `kind="incremental"`); v == "0" || v == "" {
		t.Errorf("the relabel was not compiled incrementally: %q", v)
	}
	// The incremental result equals a full compilation of the same caches.
	incremental := dp.fake.Dump()
	syncs := a.syncs.Load()
	a.Resync()
	fixture.Eventually(t, 10*time.Second, "full resync", func() (bool, string) { return a.syncs.Load() > syncs, "no sync" })
	if full := dp.fake.Dump(); full != incremental {
		t.Errorf("incremental and full compilation differ:\nincremental:\n%s\nfull:\n%s", incremental, full)
	}

	// Delete the policy: x is open again.
	if err := c.dyn.Resource(networkPolicyGVR).Namespace("a").Delete(ctx, "allow-y", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("no policy: default allow", "10.0.0.2", "10.0.0.1", 81, true)

	// A ClusterNetworkPolicy Admin Deny.
	cnp := fixture.YAML(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-x, generation: 1}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: x}}}}
  ingress:
  - action: Deny
    from: [{namespaces: {}}]
`)
	if _, err := c.dyn.Resource(clusterNetworkPolicyGVR).Create(ctx, cnp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("Admin Deny", "10.0.0.2", "10.0.0.1", 80, false)
	if got := testutilValue(t, a, "moat_agent_policies", `kind="ClusterNetworkPolicy",state="accepted"`); got != "1" {
		t.Errorf("moat_agent_policies{ClusterNetworkPolicy,accepted} = %s, want 1", got)
	}
}

// TestAgentNeverProgramsFromIncompleteCaches: while one resource cannot be
// listed, the agent does not touch the table and is not ready; once it
// can, the first sync replaces the table in one transaction.
func TestAgentNeverProgramsFromIncompleteCaches(t *testing.T) {
	c := clusterX(t, fixture.YAML(t, npAllowYtoX))
	var broken atomic.Bool
	broken.Store(true)
	c.dyn.PrependReactor("list", "clusternetworkpolicies", func(clienttesting.Action) (bool, runtime.Object, error) {
		if broken.Load() {
			return true, nil, errors.New("injected: the server could not find the requested resource")
		}
		return false, nil, nil
	})
	dp := newTestDP("n1")
	// What a previous agent left: an old table that must keep enforcing.
	old := policy.Compile(&policy.Cluster{}, policy.Options{})
	if _, err := dp.Syncer.Sync(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	before := dp.fake.Dump()
	a, _ := startAgent(t, c, Config{}, dp)
	fixture.Eventually(t, 10*time.Second, "watch errors counted", func() (bool, string) {
		v := testutilValue(t, a, "moat_agent_watch_errors_total", `resource="clusternetworkpolicies"`)
		return v != "" && v != "0", "no watch error yet"
	})
	time.Sleep(300 * time.Millisecond)
	if dp.calls.Load() != 0 || a.Ready() == nil {
		t.Fatalf("agent synced %d times (ready=%v) with an unsynced cache", dp.calls.Load(), a.Ready() == nil)
	}
	if dp.fake.Dump() != before {
		t.Fatal("table changed before the caches synced")
	}
	broken.Store(false)
	fixture.Eventually(t, 30*time.Second, "ready after the list succeeds", func() (bool, string) { return a.Ready() == nil, "not ready" })
	if got, _ := dp.allows("10.0.0.9", "10.0.0.1", 81); got {
		t.Error("the new program is not in force: x:81 open")
	}
}

// TestAgentKeepsRulesWhenNftFails: a failing transaction leaves the last
// rules, turns /readyz off, retries with backoff and recovers. The failure
// is the node's: one Event on the Node, none on the ClusterNetworkPolicies
// (one per policy per failing node would be a storm at scale).
func TestAgentKeepsRulesWhenNftFails(t *testing.T) {
	c := clusterXY(t, fixture.YAML(t, npAllowYtoX), fixture.YAML(t, cnpHead+`spec: {tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {selects: nothing}}}, ingress: [{action: Deny, from: [{namespaces: {}}]}]}`))
	dp := newTestDP("n1")
	a := startReady(t, c, Config{}, dp)
	before := dp.fake.Dump()
	dp.fail.Store(true)
	if err := c.dyn.Resource(networkPolicyGVR).Namespace("a").Delete(context.Background(), "allow-y", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fixture.Eventually(t, 10*time.Second, "not ready after a failed sync", func() (bool, string) {
		err := a.Ready()
		return err != nil && strings.Contains(err.Error(), "last sync failed"), fixture.Explain("Ready() = %v", err)
	})
	fixture.Eventually(t, 10*time.Second, "retried", func() (bool, string) {
		return dp.calls.Load() >= 3, fixture.Explain("%d calls", dp.calls.Load())
	})
	if dp.fake.Dump() != before {
		t.Fatal("rules changed although every transaction failed")
	}
	if v := testutilValue(t, a, "moat_agent_syncs_total", `kind="diff",result="error"`); v == "0" || v == "" {
		t.Errorf("failed syncs not counted: %q", v)
	}
	fixture.Eventually(t, 10*time.Second, "NodeSyncFailed Event on the Node", func() (bool, string) {
		evs, err := c.kube.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, e := range evs.Items {
			if e.Reason == EventNodeSyncFailed && e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == "n1" && strings.Contains(e.Message, "injected nft failure") {
				n++
			}
		}
		return n == 1, fixture.Explain("%d matching Events (want exactly one per failure streak) of %d", n, len(evs.Items))
	})
	if err := a.Healthy(); err != nil {
		t.Errorf("Healthy() = %v while syncs fail quickly (not hung)", err)
	}
	dp.fail.Store(false)
	fixture.Eventually(t, 40*time.Second, "recovered", func() (bool, string) {
		got, _ := dp.allows("10.0.0.2", "10.0.0.1", 81)
		return a.Ready() == nil && got, "not recovered"
	})
	// Events are sent in order: the streak's Node Event above was
	// followed by any others long before the recovery.
	evs, err := c.kube.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Reason == EventNodeSyncFailed && e.InvolvedObject.Kind != "Node" {
			t.Errorf("NodeSyncFailed Event on %s %s: a node's failure belongs to the Node only", e.InvolvedObject.Kind, e.InvolvedObject.Name)
		}
	}
}

func TestAgentInputProblems(t *testing.T) {
	c := newFakeCluster(t,
		fixture.Namespace("a", nil),
		fixture.Node("n1", nil, "192.168.0.1"),
		fixture.Node("bare", nil),
		fixture.Pod("a", "x", "n1", map[string]string{"app": "x"}, nil, "10.0.0.1"),
		fixture.Pod("a", "twin", "n1", map[string]string{"app": "x"}, nil, "10.0.0.1"),
		fixture.Pod("a", "pending", "n1", map[string]string{"app": "x"}, nil),
		fixture.Pod("a", "garbage", "n1", map[string]string{"app": "x"}, nil, "not-an-ip"),
		fixture.Pod("a", "on-n1-address", "bare", map[string]string{"app": "y"}, nil, "192.168.0.1"),
		fixture.YAML(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate, namespace: a}
spec: {podSelector: {}, ingress: "everything"}
`),
	)
	dp := newTestDP("n1")
	a := startReady(t, c, Config{AllowNodeLocal: true, PodWithoutIPAfter: -1}, dp) // pod_claims_node_address needs node-local traffic
	for problem, want := range map[string]string{
		problemPodWithoutIP:      "1",
		problemDuplicatePodIP:    "1",
		problemInvalidPodField:   "1",
		problemNodeWithoutAddr:   "1",
		problemUndecodablePolicy: "1",
		problemPodOnNodeAddr:     "1",
	} {
		if got := testutilValue(t, a, "moat_agent_input_problems", `problem="`+problem+`"`); got != want {
			t.Errorf("moat_agent_input_problems{%s} = %s, want %s", problem, got, want)
		}
	}
	// The undecodable NetworkPolicy still isolates the namespace: nothing
	// reaches x, and the duplicate address is dropped, never opened.
	if got, _ := dp.allows("192.168.7.7", "10.0.0.1", 80); got {
		t.Error("pod x reachable although an undecodable NetworkPolicy selects it")
	}
	if v := testutilValue(t, a, "moat_agent_policies", `kind="NetworkPolicy",state="failed_closed"`); v != "1" {
		t.Errorf("failed-closed NetworkPolicies = %s, want 1", v)
	}
}

// TestPodWithoutIPOnlyOwnAndLasting: a pod scheduled without an IP is an
// input problem only on its own node's agent, and only once it has lasted
// PodWithoutIPAfter (every pod is in that state while its sandbox starts;
// reporting each at once made every agent log every starting pod of the
// cluster at -v=0 and flapped the gauge on every rollout). The scan that
// finds the pod due comes by itself: nothing changes in the cluster after
// the start.
func TestPodWithoutIPOnlyOwnAndLasting(t *testing.T) {
	objs := func() []runtime.Object {
		return []runtime.Object{
			fixture.Namespace("a", nil),
			fixture.Node("n1", nil, "192.168.0.1"),
			fixture.Node("n2", nil, "192.168.0.2"),
			fixture.Pod("a", "starting-here", "n1", nil, nil),
			fixture.Pod("a", "starting-there", "n2", nil, nil),
		}
	}
	a := startReady(t, newFakeCluster(t, objs()...), Config{}, newTestDP("n1"))
	if got := testutilValue(t, a, "moat_agent_input_problems", `problem="`+problemPodWithoutIP+`"`); got != "0" {
		t.Errorf("default (60 s): pod_without_ip = %s right after the start, want 0", got)
	}
	a = startReady(t, newFakeCluster(t, objs()...), Config{PodWithoutIPAfter: 50 * time.Millisecond}, newTestDP("n1"))
	fixture.Eventually(t, 10*time.Second, "the own pod reported once it lasted", func() (bool, string) {
		got := testutilValue(t, a, "moat_agent_input_problems", `problem="`+problemPodWithoutIP+`"`)
		return got == "1", fixture.Explain("pod_without_ip = %s, want 1 (the pod on n1 only)", got)
	})
}

// testutilValue returns the value of one series from /metrics ("" if
// absent), found by name and a label substring.
func testutilValue(t *testing.T, a *Agent, name, labels string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(a.Metrics(), promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, labels) {
			f := strings.Fields(line)
			return f[len(f)-1]
		}
		if labels == "" && strings.HasPrefix(line, name+" ") {
			return strings.Fields(line)[1]
		}
	}
	return ""
}

// TestStartTakesNoInitialAddAsChange: the first sync compiles everything
// in full; the initial list's adds must not reach a later sync as changes
// (at 30,000 pods that was seconds of recompiling nothing right after
// the agent turned ready, delaying the first real change). The change
// handler is held back while the informers list, as a busy process holds
// it back, so that it lags the informers' own sync.
func TestStartTakesNoInitialAddAsChange(t *testing.T) {
	objs := []runtime.Object{fixture.Namespace("a", nil), fixture.Node("n1", nil, "192.168.0.1"), fixture.YAML(t, npAllowYtoX)}
	for i := range 3000 {
		objs = append(objs, fixture.Pod("a", fmt.Sprint("p", i), fmt.Sprint("n", i%3+1), map[string]string{"app": fmt.Sprint("app-", i%7)}, nil, fmt.Sprintf("10.%d.%d.%d", i/62500, i/250%250, i%250+1)))
	}
	c := newFakeCluster(t, objs...)
	a, err := New(Config{NodeName: "n1"}, Clients{Kube: c.kube, Dynamic: c.dyn}, newTestDP("n1"))
	if err != nil {
		t.Fatal(err)
	}
	a.pending.mu.Lock()
	runAgent(t, a, "n1")
	fixture.Eventually(t, 20*time.Second, "informers synced", func() (bool, string) { return a.inf.synced(), "not synced" })
	time.Sleep(300 * time.Millisecond)
	a.pending.mu.Unlock()
	fixture.Eventually(t, 20*time.Second, "ready", func() (bool, string) { return a.Ready() == nil, "not ready" })
	time.Sleep(500 * time.Millisecond)
	if v := testutilValue(t, a, "moat_agent_changes_applied_total", ""); v != "0" {
		t.Errorf("%s objects applied as changes after the first sync, none changed", v)
	}
}
