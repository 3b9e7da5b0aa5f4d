package agent

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/moat-net/moat/agent/internal/fixture"
)

func TestElectionRank(t *testing.T) {
	names := []string{"n1", "n2", "n3", "n4", "n5", "n6"}
	byHash := slices.Clone(names)
	slices.SortFunc(byHash, func(a, b string) int {
		if ha, hb := nodeHash(a), nodeHash(b); ha != hb {
			if ha < hb {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	for want, n := range byHash {
		if got := electionRank(names, n); got != want {
			t.Errorf("rank of %s = %d, want %d (hash order %v)", n, got, want, byHash)
		}
	}
	if got := electionRank(names, "not-a-node"); got != -1 {
		t.Errorf("rank of a node not in the cache = %d, want -1", got)
	}
	// A node that leaves moves every node after it up by one.
	gone := byHash[0]
	rest := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == gone })
	if got := electionRank(rest, byHash[1]); got != 0 {
		t.Errorf("after %s left, rank of %s = %d, want 0", gone, byHash[1], got)
	}
}

func TestLeaseExpired(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	lease := func(holder string, renewed time.Duration, seconds int32) *coordinationv1.Lease {
		rt := metav1.NewMicroTime(now.Add(-renewed))
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &rt, LeaseDurationSeconds: &seconds}}
	}
	for _, c := range []struct {
		what string
		l    *coordinationv1.Lease
		want bool
	}{
		{"renewed just now", lease("n1", time.Second, 15), false},
		{"past its duration but within the margin", lease("n1", 25*time.Second, 15), false},
		{"past duration and margin", lease("n1", 31*time.Second, 15), true},
		{"released long ago", lease("", time.Minute, 1), true},
		{"never renewed nor acquired", &coordinationv1.Lease{}, true},
	} {
		if got, _ := leaseExpired(c.l, now, 15*time.Second); got != c.want {
			t.Errorf("%s: expired = %v, want %v", c.what, got, c.want)
		}
	}
}

// leaseRequests counts one agent's requests to the Lease API.
type leaseRequests struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c leaseRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/leases") {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// TestFewLeaseCandidates: of five agents against a real API server, only
// the two first in hash order campaign; the others read the Lease a few
// times at most. The Lease moves to the other candidate when the leader
// stops, to a standing-by agent when both candidates are gone, and a
// deleted candidate Node makes the next node in the order a candidate.
func TestFewLeaseCandidates(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; runs without -short")
	}
	ctx := context.Background()
	env, _ := startAPIServer(ctx, t)
	cfg := fixture.AgentConfig(ctx, t, env)
	names := []string{"n1", "n2", "n3", "n4", "n5"}
	for i, n := range names {
		fixture.CreateNode(ctx, t, env, fixture.Node(n, nil, fmt.Sprintf("192.168.1.%d", i+1)))
	}
	order := slices.Clone(names)
	slices.SortFunc(order, func(a, b string) int { return electionRank(names, a) - electionRank(names, b) })
	cand, standby := order[:2], order[2:]
	t.Logf("hash order %v: candidates %v", order, cand)

	agents := map[string]*apiAgent{}
	requests := map[string]*atomic.Int64{}
	for _, n := range names {
		c := rest.CopyConfig(cfg)
		count := &atomic.Int64{}
		c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return leaseRequests{rt: rt, n: count} }
		clients, err := NewClients(c)
		if err != nil {
			t.Fatal(err)
		}
		le := testLeaderElection()
		le.Candidates = 2
		agents[n] = runAPIAgent(t, clients, Config{NodeName: n, LeaderElection: le}, newTestDP(n))
		requests[n] = count
	}
	leader := func() string {
		for n, a := range agents {
			if a.status.leading.Load() {
				return n
			}
		}
		return ""
	}
	fixture.Eventually(t, 30*time.Second, "a leader, and 20 Lease requests from each candidate", func() (bool, string) {
		return leader() != "" && requests[cand[0]].Load() >= 20 && requests[cand[1]].Load() >= 20,
			fixture.Explain("leader %q; requests %s %d, %s %d", leader(), cand[0], requests[cand[0]].Load(), cand[1], requests[cand[1]].Load())
	})
	least := min(requests[cand[0]].Load(), requests[cand[1]].Load())
	for _, n := range standby {
		// A candidate reads every 0.5-0.6 s, a standby at most every 4 s
		// after a first wait of 8 s: a standby near the candidates' count
		// campaigns.
		if got := requests[n].Load(); got*4 > least {
			t.Errorf("standing-by agent %s made %d Lease requests, candidates at least %d: it campaigns", n, got, least)
		}
		if v := testutilValue(t, agents[n].Agent, "moat_agent_leader_candidate", ""); v != "0" {
			t.Errorf("moat_agent_leader_candidate of %s = %s, want 0", n, v)
		}
	}
	if l := leader(); !slices.Contains(cand, l) {
		t.Fatalf("leader %s is not a candidate %v", l, cand)
	}

	first := leader()
	agents[first].stop()
	other := cand[0]
	if other == first {
		other = cand[1]
	}
	fixture.Eventually(t, 30*time.Second, "the other candidate "+other+" leads", func() (bool, string) {
		return agents[other].status.leading.Load(), fixture.Explain("leader %q", leader())
	})

	agents[other].stop()
	var standIn string
	fixture.Eventually(t, 60*time.Second, "a standing-by agent leads once both candidates are gone", func() (bool, string) {
		standIn = leader()
		return standIn != "", "no leader"
	})
	if !slices.Contains(standby, standIn) {
		t.Fatalf("leader %s, want one of %v", standIn, standby)
	}
	lease, err := env.Client.CoordinationV1().Leases(fixture.AgentNamespace).Get(ctx, "moat-agent", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != standIn {
		t.Errorf("lease holder %v (%v), want %s", lease.Spec.HolderIdentity, err, standIn)
	}

	// The stopped candidates' Nodes go: the first standby in the order
	// becomes a candidate (it may lead already as the stand-in).
	for _, n := range cand {
		if err := env.Client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	next := standby[0]
	fixture.Eventually(t, 30*time.Second, next+" campaigns as a candidate", func() (bool, string) {
		v := testutilValue(t, agents[next].Agent, "moat_agent_leader_candidate", "")
		return v == "1", "moat_agent_leader_candidate " + v
	})
}

// TestNewLeaderDoesNotResendEvents: a NetworkPolicy problem reported by
// one leader is not reported again by the next: the new
// leader finds the Event its predecessor sent.
func TestNewLeaderDoesNotResendEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; runs without -short")
	}
	ctx := context.Background()
	env, clients := startAPIServer(ctx, t)
	fixture.CreateNamespace(ctx, t, env, fixture.Namespace("a", nil))
	fixture.CreateNode(ctx, t, env, fixture.Node("n1", nil, "192.168.1.1"))
	fixture.CreateNode(ctx, t, env, fixture.Node("n2", nil, "192.168.1.2"))
	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "x", "n1", map[string]string{"app": "x"}, nil), "10.1.0.1")
	namedNowhere := func(name string) string {
		return `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ` + name + `, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - ports: [{port: metrics}]
`
	}
	events := func(name string) ([]corev1.Event, error) {
		evs, err := env.Client.CoreV1().Events("a").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + EventPolicyProblem})
		if err != nil {
			return nil, err
		}
		return evs.Items, nil
	}
	waitEvent := func(name string) {
		t.Helper()
		fixture.Eventually(t, 30*time.Second, "PolicyProblem Event on "+name, func() (bool, string) {
			evs, err := events(name)
			if err != nil {
				return false, err.Error()
			}
			return len(evs) > 0, "no Event"
		})
	}
	fixture.MustPolicy(ctx, t, env, namedNowhere("first"))
	agents := map[string]*apiAgent{}
	for _, n := range []string{"n1", "n2"} {
		agents[n] = runAPIAgent(t, clients, Config{NodeName: n, LeaderElection: testLeaderElection()}, newTestDP(n))
	}
	waitEvent("first")
	var leader, other string
	fixture.Eventually(t, 30*time.Second, "a leader", func() (bool, string) {
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
	fixture.Eventually(t, 30*time.Second, other+" leads and made a status pass", func() (bool, string) {
		return agents[other].status.passes.Load() > 0, "no pass"
	})
	// The new leader's Events go out in order: once the Event about a
	// policy created after its first pass is there, any Event that pass
	// sent again is there too.
	fixture.MustPolicy(ctx, t, env, namedNowhere("second"))
	waitEvent("second")
	evs, err := events("first")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Count > 1 {
		var b strings.Builder
		for _, e := range evs {
			fmt.Fprintf(&b, "\n  %s count %d from %s: %s", e.Name, e.Count, e.Source.Host, e.Message)
		}
		t.Errorf("%d PolicyProblem Events on the first policy after the change of leader, want one sent once:%s", len(evs), b.String())
	}
}
