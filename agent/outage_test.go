package agent

import (
	"context"
	"testing"
	"time"

	"github.com/moat-net/moat/agent/internal/fixture"
)

// outage is how long the API server stays down at least. The test then
// restarts it right after the agent's next failed attempt to watch pods.
// With client-go's reflector backoff (800 ms doubling to a 30 s cap, full
// jitter: attempts about 0.8-1.6, 2.4-4.8, 5.6-11, 12-24 s into an
// outage), an attempt 25 s or more into it is followed by a wait of 25 s
// or more, so an agent that backs off like that stays blind well past the
// goal every time, where a fixed outage length leaves it to the jitter. An
// agent that retries every few seconds recovers at once.
const outage = 25 * time.Second

// recoveryGoal: a change made once the API server is back reaches the
// node's rules within this time (issue 9.11). Not tighter: this is a
// goal, not a benchmark.
const recoveryGoal = 10 * time.Second

// TestChangeAfterOutageReachesNodeQuickly stops the real kube-apiserver,
// starts it again on the same address and etcd, revokes access with a
// label change and checks that the node's rules follow within the goal.
func TestChangeAfterOutageReachesNodeQuickly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver and waits out an outage; runs without -short")
	}
	ctx := context.Background()
	env, clients := startAPIServer(ctx, t)
	fixture.CreateNamespace(ctx, t, env, fixture.Namespace("a", nil))
	fixture.CreateNode(ctx, t, env, fixture.Node("n1", nil, "192.168.1.1"))
	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "x", "n1", map[string]string{"app": "x"}, nil), "10.1.0.1")
	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "y", "n1", map[string]string{"app": "y", "role": "client"}, nil), "10.1.0.2")
	const x, y = "10.1.0.1", "10.1.0.2"
	fixture.MustPolicy(ctx, t, env, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-from-clients, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
`)
	n1 := runAPIAgent(t, clients, Config{NodeName: "n1", AllowNodeLocal: true}, newTestDP("n1"))
	allowed := func() (bool, bool) { return n1.dp.allows(y, x, 80) }
	fixture.Eventually(t, 30*time.Second, "client y reaches x", func() (bool, string) {
		got, programmed := allowed()
		return programmed && got, fixture.Explain("programmed %v, allowed %v", programmed, got)
	})

	stopping := time.Now()
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Logf("kube-apiserver stopped in %s", stopped.Sub(stopping).Round(10*time.Millisecond))
	// While the server is down, every cache says how stale it is.
	fixture.Eventually(t, 15*time.Second, "staleness reported", func() (bool, string) {
		for _, w := range n1.Watches() {
			if w.Watching || w.Stale == 0 || w.LastError == nil {
				return false, w.String()
			}
		}
		v := testutilValue(t, n1.Agent, "moat_agent_watch_stale_seconds", `resource="pods"`)
		return v != "" && v != "0", "moat_agent_watch_stale_seconds{resource=pods} = " + v
	})
	time.Sleep(outage - time.Since(stopped))
	failed := testutilValue(t, n1.Agent, "moat_agent_watch_errors_total", `resource="pods"`)
	fixture.Eventually(t, 90*time.Second, "another failed attempt to watch pods", func() (bool, string) {
		v := testutilValue(t, n1.Agent, "moat_agent_watch_errors_total", `resource="pods"`)
		return v != failed, "still " + v + " failed calls"
	})
	down := time.Since(stopped)
	if err := env.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("kube-apiserver down %s, ready again %s later", down.Round(10*time.Millisecond), time.Since(stopped.Add(down)).Round(10*time.Millisecond))
	fixture.Relabel(ctx, t, env, "Pod", "a", "y", map[string]string{"app": "y"})
	fixture.Eventually(t, recoveryGoal-time.Since(back), "revocation reaches the node after the outage", func() (bool, string) {
		got, _ := allowed()
		return !got, "y still reaches x"
	})
	t.Logf("revocation reached the node %s after the API server was back", time.Since(back).Round(10*time.Millisecond))
	// And every cache follows the server again within the goal (while the
	// server starts it answers 403 until its RBAC caches fill, so a cache
	// that waited in client-go's backoff after that stayed blind here for
	// a minute).
	fixture.Eventually(t, recoveryGoal-time.Since(back), "every watch current again", func() (bool, string) {
		for _, w := range n1.Watches() {
			if !w.Watching {
				return false, w.String()
			}
		}
		return true, ""
	})
	t.Logf("every watch current %s after the API server was back", time.Since(back).Round(10*time.Millisecond))
}
