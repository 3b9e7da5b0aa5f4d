package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// findCounter returns the counter of a policy's rule (or of isolation)
// in one direction, nil if none.
func findCounter(cs []DropCounter, policyName, dir string, rule int, reason string) *DropCounter {
	for i := range cs {
		c := &cs[i]
		if c.Direction != dir || c.Rule != rule || c.Reason != reason {
			continue
		}
		for _, p := range c.Policies {
			if p.Name == policyName {
				return c
			}
		}
		if policyName == "" && len(c.Policies) == 0 {
			return c
		}
	}
	return nil
}

func rulesetCounters(rs *Ruleset) []DropCounter {
	var out []DropCounter
	for _, name := range sortedKeys(rs.counters) {
		out = append(out, *rs.counters[name])
	}
	return out
}

func TestDropCountersPerRule(t *testing.T) {
	// Two consecutive Deny rules would share one lookup; they keep one
	// rule and one counter each so that drops are told apart.
	prog := compileYAML(t, `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
spec: {nodeName: n1}
status: {podIP: 10.0.0.1}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: iso, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  egress:
  - {name: one, action: Deny, to: [{networks: ["192.0.2.0/24"]}]}
  - {name: two, action: Deny, to: [{networks: ["198.51.100.0/24"]}]}
`)
	rs := Build(prog, "n1")
	cs := rulesetCounters(rs)
	one := findCounter(cs, "guard", "egress", 0, ReasonDeny)
	two := findCounter(cs, "guard", "egress", 1, ReasonDeny)
	iso := findCounter(cs, "iso", "ingress", -1, ReasonIsolation)
	if one == nil || two == nil || iso == nil || one.Name == two.Name {
		t.Fatalf("want distinct counters for guard egress[0], egress[1] and isolation by iso; got %+v", cs)
	}
	if one.Tier != policy.TierAdmin || one.Policies[0].Kind != "ClusterNetworkPolicy" || iso.Policies[0] != (policy.PolicyRef{Kind: "NetworkPolicy", Namespace: "x", Name: "iso"}) {
		t.Errorf("counter descriptions: %+v %+v", one, iso)
	}
	for _, r := range []string{ReasonInvalid, ReasonNotSYN, ReasonConflict} {
		if findCounter(cs, "", "", -1, r) == nil {
			t.Errorf("fixed counter %s missing", r)
		}
	}
	var lines []string
	for _, c := range rs.chains {
		for _, r := range renderChainRules(c) {
			lines = append(lines, r.Rule)
		}
	}
	all := strings.Join(lines, "\n")
	for _, c := range []*DropCounter{one, two, iso} {
		if n := strings.Count(all, "counter name "+c.Name+" drop"); n == 0 {
			t.Errorf("no rule counts into %s (%s):\n%s", c.Name, c.counterComment(), all)
		}
	}
	// The two Deny rules still drop what they should.
	for _, dst := range []string{"192.0.2.5", "198.51.100.5"} {
		if rs.Allows(Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr(dst), Proto: policy.ProtoUDP, Port: 53}) {
			t.Errorf("10.0.0.1 -> %s allowed", dst)
		}
	}
}

func TestCountersSurvivePatchAndReplace(t *testing.T) {
	ctx := context.Background()
	base := mustRead(t, "testdata/tiers.yaml")
	fake := knftables.NewFake(knftables.InetFamily, Table)
	s := New(fake, Options{Node: "node-1"})
	if cs, err := s.Counters(ctx); err != nil || len(cs) != 0 {
		t.Fatalf("counters before any sync: %v, %v; want none", cs, err)
	}
	if _, err := s.Sync(ctx, compileYAML(t, base)); err != nil {
		t.Fatal(err)
	}
	cs, err := s.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deny := findCounter(cs, "admin-guard", "egress", 0, ReasonDeny)
	iso := findCounter(cs, "web-in", "ingress", -1, ReasonIsolation)
	if deny == nil || iso == nil {
		t.Fatalf("counters lack admin-guard egress[0] or web-in isolation: %+v", cs)
	}
	// Pretend the kernel counted.
	fake.Table.Counters[deny.Name].Packets = knftables.PtrTo[uint64](5)
	fake.Table.Counters[deny.Name].Bytes = knftables.PtrTo[uint64](300)
	fake.Table.Counters[iso.Name].Packets = knftables.PtrTo[uint64](2)
	fake.Table.Counters[iso.Name].Bytes = knftables.PtrTo[uint64](120)

	check := func(step string, wantDeny, wantIso uint64) {
		t.Helper()
		cs, err := s.Counters(ctx)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		d := findCounter(cs, "admin-guard", "egress", 0, ReasonDeny)
		i := findCounter(cs, "web-in", "ingress", -1, ReasonIsolation)
		if d == nil || d.Packets != wantDeny || (wantDeny > 0 && d.Bytes != 300) {
			t.Errorf("%s: deny counter %+v, want %d packets", step, d, wantDeny)
		}
		if i == nil || i.Packets != wantIso {
			t.Errorf("%s: isolation counter %+v, want %d packets", step, i, wantIso)
		}
	}
	check("after counting", 5, 2)

	// A peer moves: the patch is elements only and the counts stay.
	res, err := s.Sync(ctx, compileYAML(t, strings.ReplaceAll(base, "10.0.2.10", "10.0.2.99")))
	if err != nil || res.Full {
		t.Fatalf("patch: %+v, %v", res, err)
	}
	if tx := fake.LastTransaction.String(); strings.Contains(tx, "counter") {
		t.Errorf("element-only patch touched counters:\n%s", tx)
	}
	check("after patch", 5, 2)

	// A full replace carries the counts over.
	s.Invalidate()
	res, err = s.Sync(ctx, compileYAML(t, base))
	if err != nil || !res.Full {
		t.Fatalf("replace: %+v, %v", res, err)
	}
	if tx := fake.LastTransaction.String(); !strings.Contains(tx, "packets 5 bytes 300") {
		t.Errorf("full replace does not carry the deny counter over:\n%s", tx)
	}
	check("after full replace", 5, 2)

	// The rule goes: so does its counter, in the kernel and in Counters.
	noAdmin := base[:strings.Index(base, "---\napiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: admin-guard}")] +
		base[strings.Index(base, "---\napiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: baseline-external}"):]
	if _, err := s.Sync(ctx, compileYAML(t, noAdmin)); err != nil {
		t.Fatal(err)
	}
	if _, ok := fake.Table.Counters[deny.Name]; ok {
		t.Errorf("counter %s of a deleted policy still in the table", deny.Name)
	}
	cs, err = s.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := findCounter(cs, "admin-guard", "egress", 0, ReasonDeny); d != nil {
		t.Errorf("Counters still reports a deleted policy's rule: %+v", d)
	}
	if i := findCounter(cs, "web-in", "ingress", -1, ReasonIsolation); i == nil || i.Packets != 2 {
		t.Errorf("isolation counter after an unrelated policy went: %+v", i)
	}
}

// failingCounters is a CounterReader whose every reading fails, as a
// netlink reading does when the socket cannot be opened.
type failingCounters struct{}

var errNoReading = errors.New("no reading")

func (failingCounters) ReadCounters(context.Context) (map[string]CounterValue, error) {
	return nil, errNoReading
}

// TestCounterReadErrors: a failed reading is Counters' error, and a full
// replace that cannot read the old counters still replaces the table,
// its counters starting from zero.
func TestCounterReadErrors(t *testing.T) {
	ctx := context.Background()
	base := mustRead(t, "testdata/tiers.yaml")
	fake := knftables.NewFake(knftables.InetFamily, Table)
	s := New(fake, Options{Node: "node-1"})
	if _, err := s.Sync(ctx, compileYAML(t, base)); err != nil {
		t.Fatal(err)
	}
	for _, c := range fake.Table.Counters {
		c.Packets, c.Bytes = knftables.PtrTo[uint64](5), knftables.PtrTo[uint64](300)
	}
	s = New(fake, Options{Node: "node-1", Counters: failingCounters{}})
	if cs, err := s.Counters(ctx); err != nil || cs != nil {
		t.Fatalf("counters before this Syncer programmed: %v, %v; want none, no error", cs, err)
	}
	res, err := s.Sync(ctx, compileYAML(t, base))
	if err != nil || !res.Full {
		t.Fatalf("replace without a reading of the old counters: %+v, %v", res, err)
	}
	if tx := fake.LastTransaction.String(); strings.Contains(tx, "packets") {
		t.Errorf("counters carried over without a reading:\n%s", tx)
	}
	cs, err := s.Counters(ctx)
	if !errors.Is(err, errNoReading) || !strings.Contains(fmt.Sprint(err), "node-1") || cs != nil {
		t.Errorf("Counters after a failed reading: %v, %v; want the reading's error, with the node", cs, err)
	}
}
