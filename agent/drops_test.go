package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

func TestDropLabelValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    nft.DropCounter
		want string
	}{
		{"cnp deny", nft.DropCounter{Policies: []policy.PolicyRef{{Kind: "ClusterNetworkPolicy", Name: "guard"}}, Direction: "egress", Rule: 2, Reason: nft.ReasonDeny},
			"ClusterNetworkPolicy||guard|egress|2|deny"},
		{"isolation by two policies", nft.DropCounter{Policies: []policy.PolicyRef{{Kind: "NetworkPolicy", Namespace: "a", Name: "p"}, {Kind: "NetworkPolicy", Namespace: "a", Name: "q"}}, Direction: "ingress", Rule: -1, Reason: nft.ReasonIsolation},
			"NetworkPolicy|a|p,q|ingress||isolation"},
		{"fixed drop", nft.DropCounter{Rule: -1, Reason: nft.ReasonInvalid}, "|||||invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(dropLabelValues(tc.c), "|"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// stubCounters is a DropCounterReader whose answers the test sets.
type stubCounters struct {
	Dataplane
	cs  []nft.DropCounter
	err error
}

func (s *stubCounters) Counters(context.Context) ([]nft.DropCounter, error) { return s.cs, s.err }

func TestDropsCollectAndKeepLastReading(t *testing.T) {
	stub := &stubCounters{cs: []nft.DropCounter{
		{Name: "c-1", Policies: []policy.PolicyRef{{Kind: "ClusterNetworkPolicy", Name: "g"}}, Direction: "egress", Rule: 0, Reason: nft.ReasonDeny, Packets: 3, Bytes: 180},
		// Same labels (cannot happen today): summed, not a duplicate
		// series that would break the scrape.
		{Name: "c-2", Policies: []policy.PolicyRef{{Kind: "ClusterNetworkPolicy", Name: "g"}}, Direction: "egress", Rule: 0, Reason: nft.ReasonDeny, Packets: 1, Bytes: 60},
		{Name: "drop-invalid", Rule: -1, Reason: nft.ReasonInvalid, Packets: 7, Bytes: 400},
		// A fixed drop that counted nothing is exported; a policy
		// rule's that counted nothing is not.
		{Name: "drop-not-syn", Rule: -1, Reason: nft.ReasonNotSYN},
		{Name: "c-3", Policies: []policy.PolicyRef{{Kind: "ClusterNetworkPolicy", Name: "quiet"}}, Direction: "ingress", Rule: 2, Reason: nft.ReasonDeny},
	}}
	reg := prometheus.NewRegistry()
	d := newDrops(stub, reg, klog.Background())
	ctx := context.Background()
	d.read(ctx)
	want := map[string]float64{
		`direction="",kind="",name="",namespace="",reason="invalid",rule=""`:                          7,
		`direction="",kind="",name="",namespace="",reason="not_syn",rule=""`:                          0,
		`direction="egress",kind="ClusterNetworkPolicy",name="g",namespace="",reason="deny",rule="0"`: 4,
	}
	wantBytes := map[string]float64{
		`direction="",kind="",name="",namespace="",reason="invalid",rule=""`:                          400,
		`direction="",kind="",name="",namespace="",reason="not_syn",rule=""`:                          0,
		`direction="egress",kind="ClusterNetworkPolicy",name="g",namespace="",reason="deny",rule="0"`: 240,
	}
	check := func(step string) {
		t.Helper()
		if got := gatherDrops(t, reg); !maps.Equal(got, want) {
			t.Errorf("%s: moat_agent_dropped_packets_total = %v, want %v", step, got, want)
		}
		if got := gatherMetric(t, reg, "moat_agent_dropped_bytes_total"); !maps.Equal(got, wantBytes) {
			t.Errorf("%s: moat_agent_dropped_bytes_total = %v, want %v", step, got, wantBytes)
		}
	}
	check("first reading")
	// A failed read keeps the last reading and is counted.
	stub.err = errors.New("nft: no such file")
	d.read(ctx)
	check("after a failed read")
	var m dto.Metric
	if err := d.errors.Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("read errors = %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
	// A rule that goes takes its series with it.
	stub.err, stub.cs = nil, stub.cs[2:]
	// (c-3 counts now: its series appears.)
	stub.cs[2].Packets, stub.cs[2].Bytes = 1, 80
	want[`direction="ingress",kind="ClusterNetworkPolicy",name="quiet",namespace="",reason="deny",rule="2"`] = 1
	wantBytes[`direction="ingress",kind="ClusterNetworkPolicy",name="quiet",namespace="",reason="deny",rule="2"`] = 80
	d.read(ctx)
	delete(want, `direction="egress",kind="ClusterNetworkPolicy",name="g",namespace="",reason="deny",rule="0"`)
	delete(wantBytes, `direction="egress",kind="ClusterNetworkPolicy",name="g",namespace="",reason="deny",rule="0"`)
	check("after the rule went")
}

// gatherDrops returns moat_agent_dropped_packets_total by its labels.
func gatherDrops(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	return gatherMetric(t, reg, "moat_agent_dropped_packets_total")
}

// gatherMetric returns the counter series name by their labels.
func gatherMetric(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		if mf.GetType() != dto.MetricType_COUNTER {
			t.Errorf("type %v, want counter", mf.GetType())
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[strings.Join(ls, ",")] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestAgentExportsDropCounters: the agent reads the real nft.Syncer's
// counters (on the knftables fake), exports them per policy rule and
// drops the series of a deleted policy after the sync that removes it.
func TestAgentExportsDropCounters(t *testing.T) {
	c := clusterXY(t,
		fixture.YAML(t, npAllowYtoX),
		fixture.YAML(t, `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-x, generation: 1}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: x}}}}
  ingress:
  - action: Accept
    from: [{networks: ["192.0.2.0/24"]}]
  - action: Deny
    from: [{namespaces: {}}]
`),
	)
	dp := newTestDP("n1")
	a := startReady(t, c, Config{AllowNodeLocal: true}, dp)
	ctx := context.Background()

	cs, err := dp.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]uint64{}
	for _, c := range cs {
		switch {
		case c.Reason == nft.ReasonDeny && c.Rule == 1 && c.Policies[0].Name == "deny-x":
			set[c.Name] = 5
		case c.Reason == nft.ReasonIsolation && c.Policies[0].Name == "allow-y":
			set[c.Name] = 2
		}
	}
	if len(set) != 2 {
		t.Fatalf("want counters for deny-x ingress[1] and allow-y isolation, got %+v", cs)
	}
	dp.fake.Lock()
	for name, n := range set {
		dp.fake.Table.Counters[name].Packets = knftables.PtrTo(n)
		dp.fake.Table.Counters[name].Bytes = knftables.PtrTo(n * 60)
	}
	dp.fake.Unlock()
	a.drops.read(ctx)

	deny := `kind="ClusterNetworkPolicy",name="deny-x",namespace="",reason="deny",rule="1"`
	iso := `kind="NetworkPolicy",name="allow-y",namespace="a",reason="isolation",rule=""`
	if got := testutilValue(t, a, "moat_agent_dropped_packets_total", deny); got != "5" {
		t.Errorf("dropped packets by deny-x ingress[1] = %q, want 5", got)
	}
	if got := testutilValue(t, a, "moat_agent_dropped_bytes_total", deny); got != "300" {
		t.Errorf("dropped bytes by deny-x ingress[1] = %q, want 300", got)
	}
	if got := testutilValue(t, a, "moat_agent_dropped_packets_total", iso); got != "2" {
		t.Errorf("dropped packets by allow-y isolation = %q, want 2", got)
	}
	if got := testutilValue(t, a, "moat_agent_dropped_packets_total", `reason="not_syn"`); got != "0" {
		t.Errorf("fixed not_syn series = %q, want 0", got)
	}

	// The policy goes: after the sync that removes its rule the series
	// is gone, without waiting for the periodic read.
	if err := c.dyn.Resource(clusterNetworkPolicyGVR).Delete(ctx, "deny-x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fixture.Eventually(t, 10*time.Second, "deny-x series removed", func() (bool, string) {
		v := testutilValue(t, a, "moat_agent_dropped_packets_total", `name="deny-x"`)
		return v == "", fixture.Explain("still exported: %s", v)
	})
	if got := testutilValue(t, a, "moat_agent_dropped_packets_total", iso); got != "2" {
		t.Errorf("isolation series after an unrelated policy went = %q, want 2", got)
	}
}
