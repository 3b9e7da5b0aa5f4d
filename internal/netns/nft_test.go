package netns

import (
	"context"
	"maps"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// oneDeny: pod a on n1 may not send to 10.0.1.2.
const oneDeny = `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
spec: {nodeName: n1}
status: {podIP: 10.0.1.1}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: a-deny}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: a}}}}
  egress:
  - action: Deny
    to: [{networks: ["10.0.1.2/32"]}]
`

// TestDataplaneCountersInside: a Dataplane reads the drop counters of
// the table in its namespace, not of the caller's, as nft inside lists
// them.
func TestDataplaneCountersInside(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	ns := newNS(t, "moat-nstest-counters")
	dp := program(t, ns, oneDeny, policy.Options{})
	ctx := context.Background()
	cs, err := dp.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inside, err := ns.Tables(knftables.InetFamily, nft.Table)
	if err != nil {
		t.Fatal(err)
	}
	want, err := nft.NFTCounters{NFT: inside}.ReadCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]nft.CounterValue{}
	for _, c := range cs {
		got[c.Name] = nft.CounterValue{Packets: c.Packets, Bytes: c.Bytes}
	}
	// One Deny rule beside the fixed counters ("drop-...").
	rules := 0
	for name := range got {
		if !strings.HasPrefix(name, "drop-") {
			rules++
		}
	}
	if rules != 1 || !maps.Equal(got, want) {
		t.Errorf("Dataplane counters %v; nft inside the namespace lists %v", got, want)
	}
}

// TestDataplaneGenerationInside: a Dataplane checks the nftables
// generation of its namespace, not the caller's: a checked resync patches
// while nobody commits there, and replaces after a commit inside.
func TestDataplaneGenerationInside(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	ns := newNS(t, "moat-nstest-gen")
	prog := compile(t, oneDeny, policy.Options{})
	dp, err := ns.Dataplane(nft.Options{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := dp.Sync(ctx, prog); err != nil {
		t.Fatal(err)
	}
	dp.InvalidateIfChanged()
	if res, err := dp.Sync(ctx, prog); err != nil || res.Full || !res.Check.Unchanged() {
		t.Fatalf("quiet checked resync: %+v (check %+v), %v; want a patch", res, res.Check, err)
	}
	other, err := ns.Tables(knftables.InetFamily, "other")
	if err != nil {
		t.Fatal(err)
	}
	tx := other.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := other.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	dp.InvalidateIfChanged()
	if res, err := dp.Sync(ctx, prog); err != nil || !res.Full {
		t.Fatalf("checked resync after a commit inside: %+v (check %+v), %v; want a replace", res, res.Check, err)
	}
}
