package agent

import (
	"bytes"
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

func TestSelectorKeys(t *testing.T) {
	np := decodeNP(fixture.YAML(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a, labels: {owner: me}}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from:
    - podSelector: {matchExpressions: [{key: role, operator: Exists}]}
      namespaceSelector: {matchLabels: {team: a}}
  egress:
  - to: [{podSelector: {matchExpressions: [{key: tier, operator: NotIn, values: [db]}]}}]
`))
	cnp := decodeCNP(fixture.YAML(t, cnpHead+`spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {matchLabels: {env: prod}}, podSelector: {matchLabels: {svc: api}}}}
  ingress:
  - action: Accept
    from: [{nodes: {matchLabels: {pool: gpu}}}, {namespaces: {matchExpressions: [{key: zone, operator: DoesNotExist}]}}]
`))
	for _, tc := range []struct {
		obj  any
		want []string
	}{
		{np, []string{"app", "role", "team", "tier"}},
		{cnp, []string{"env", "pool", "svc", "zone"}},
	} {
		got := selectorKeys(tc.obj)
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("selectorKeys = %v, want %v (metadata labels are no selector)", got, tc.want)
		}
	}
}

func TestKeySetMentions(t *testing.T) {
	s := &keySet{"app": {}, "tier": {}}
	for _, tc := range []struct {
		old, cur map[string]string
		want     bool
	}{
		{map[string]string{"app": "x", "hash": "1"}, map[string]string{"app": "x", "hash": "2"}, false},
		{map[string]string{"app": "x"}, map[string]string{"app": "y"}, true},
		{map[string]string{"app": "x"}, map[string]string{"app": "x", "tier": "db"}, true},
		{map[string]string{"app": "x", "tier": "db"}, map[string]string{"app": "x"}, true},
		{map[string]string{}, map[string]string{"other": "1"}, false},
	} {
		if got := s.mentions(tc.old, tc.cur); got != tc.want {
			t.Errorf("mentions(%v -> %v) = %v, want %v", tc.old, tc.cur, got, tc.want)
		}
	}
	var unknown *keySet
	if !unknown.mentions(map[string]string{"a": "1"}, nil) {
		t.Error("a nil set must let every change through")
	}
}

// TestUnreadLabelChangesChangeNoRule: on random clusters, relabelling a
// pod on keys no policy's selector reads leaves every node's ruleset as it
// was, byte for byte; on read keys it sometimes does not (so the test can
// fail).
func TestUnreadLabelChangesChangeNoRule(t *testing.T) {
	cfg := randcluster.Default()
	cfg.Nodes, cfg.Namespaces, cfg.MaxPods = 2, 3, 10
	r := rand.New(rand.NewPCG(7, 7))
	changedByRead := 0
	for seed := int64(1); seed <= 100; seed++ {
		y, err := randcluster.Generate(seed, cfg).Manifests()
		if err != nil {
			t.Fatal(err)
		}
		res, err := (&manifest.Loader{Stdin: strings.NewReader(string(y))}).Load("-")
		if err != nil {
			t.Fatal(err)
		}
		keys := keySet{}
		for i := range res.Cluster.NetworkPolicies {
			for _, k := range selectorKeys(res.Cluster.NetworkPolicies[i]) {
				keys[k] = struct{}{}
			}
		}
		for i := range res.Cluster.ClusterNetworkPolicies {
			for _, k := range selectorKeys(&res.Cluster.ClusterNetworkPolicies[i]) {
				keys[k] = struct{}{}
			}
		}
		render := func(c *policy.Cluster) string {
			prog := policy.Compile(c, policy.Options{IngressNetworksAndNodes: true})
			var b bytes.Buffer
			for _, n := range c.Nodes {
				if _, err := nft.WriteReplace(&b, prog, n.Name); err != nil {
					t.Fatal(err)
				}
			}
			return b.String()
		}
		before := render(&res.Cluster)
		for range 4 {
			c := res.Cluster
			c.Pods = slices.Clone(c.Pods)
			i := r.IntN(len(c.Pods))
			old := c.Pods[i].Labels
			cur := maps.Clone(old)
			if cur == nil {
				cur = map[string]string{}
			}
			// A key no selector reads, or one some selector may read.
			candidates := []string{"pod-template-hash", "app", "tier", "team", "role"}
			k := candidates[r.IntN(len(candidates))]
			if r.IntN(3) == 0 {
				delete(cur, k)
			} else {
				cur[k] = []string{"web", "db", "api", "fe", "be", "red", "x"}[r.IntN(7)]
			}
			relabelled := *c.Pods[i] // a copy: the pods are shared with res
			relabelled.Labels = cur
			c.Pods[i] = &relabelled
			after := render(&c)
			if !(&keys).mentions(old, cur) {
				if after != before {
					t.Fatalf("seed %d: pod %s relabelled %v -> %v on keys no selector reads (%v), and a ruleset changed", seed, c.Pods[i].Key(), old, cur, keys)
				}
			} else if after != before {
				changedByRead++
			}
		}
	}
	if changedByRead == 0 {
		t.Fatal("no relabel on a read key ever changed a ruleset: the test proves nothing")
	}
}

// TestAgentIgnoresUnreadLabelChanges: a relabel on a key no policy reads
// costs no sync; once a policy reads the key, the pod's current labels
// count.
func TestAgentIgnoresUnreadLabelChanges(t *testing.T) {
	c := clusterXY(t, fixture.YAML(t, npAllowYtoX))
	dp := newTestDP("n1")
	a := startReady(t, c, Config{}, dp)
	ctx := context.Background()
	syncs := a.syncs.Load()
	c.relabelPod(t, "a", "y", map[string]string{"app": "y", "role": "client"})
	fixture.Eventually(t, 10*time.Second, "ignored", func() (bool, string) {
		v := testutilValue(t, a, "moat_agent_label_changes_ignored_total", "")
		return v == "1", "ignored = " + v
	})
	time.Sleep(200 * time.Millisecond)
	if a.syncs.Load() != syncs {
		t.Errorf("a change of an unread label caused %d syncs", a.syncs.Load()-syncs)
	}
	// The cache packed role away (labelproj.go): what follows proves it
	// comes back.
	if o, ok, _ := a.inf.pods.GetStore().GetByKey("a/y"); !ok || o.(*cachedPod).Labels["role"] != "" || o.(*cachedPod).rest == "" {
		t.Fatalf("cached y: %+v", o)
	}
	// A policy that reads role arrives: y, a client by its current labels,
	// may reach x on 81.
	if _, err := c.dyn.Resource(networkPolicyGVR).Namespace("a").Create(ctx, fixture.YAML(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: clients, namespace: a, generation: 1}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: 81}]
`), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fixture.Eventually(t, 10*time.Second, "y reaches x:81 as a client", func() (bool, string) {
		got, _ := dp.allows("10.0.0.2", "10.0.0.1", 81)
		return got, "denied"
	})
	// Now role is read: taking it away is a sync, not ignored.
	c.relabelPod(t, "a", "y", map[string]string{"app": "y"})
	fixture.Eventually(t, 10*time.Second, "y no longer a client", func() (bool, string) {
		got, _ := dp.allows("10.0.0.2", "10.0.0.1", 81)
		return !got, "allowed"
	})
}
