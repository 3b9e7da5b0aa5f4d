package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/agent/internal/fixture"
)

// TestDeletedTableIsProgrammedAgain: someone deletes table inet moat (a
// firewall reload's `nft flush ruleset`) while nothing in the cluster
// changes. The agent notices without a --resync, is not ready while the
// table is missing, counts and programs it again, and is ready after.
// While programming fails (injected), readiness says why.
func TestDeletedTableIsProgrammedAgain(t *testing.T) {
	c := clusterX(t, fixture.YAML(t, npIsolateX))
	dp := newTestDP("n1")
	a := startReady(t, c, Config{}, dp)
	ctx := context.Background()
	programmed := dp.fake.Dump()

	// Programming fails from now on, so the loss stays visible.
	dp.fail.Store(true)
	tx := dp.fake.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := dp.fake.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	dp.nft.gen.Add(1) // the other writer's commit, as the kernel counts it
	fixture.Eventually(t, 20*time.Second, "not ready: table missing", func() (bool, string) {
		err := a.Ready()
		return err != nil && strings.Contains(err.Error(), "table inet moat is missing"), fixture.Explain("Ready() = %v", err)
	})
	if v := testutilValue(t, a, "moat_agent_ready", ""); v != "0" {
		t.Errorf("moat_agent_ready = %s while the table is missing", v)
	}
	if v := testutilValue(t, a, "moat_agent_table_missing_total", ""); v != "1" {
		t.Errorf("moat_agent_table_missing_total = %s, want 1", v)
	}

	dp.fail.Store(false)
	fixture.Eventually(t, 20*time.Second, "programmed again and ready", func() (bool, string) {
		return a.Ready() == nil && dp.fake.Dump() == programmed, fixture.Explain("Ready() = %v", a.Ready())
	})
	if got, ok := dp.allows("10.0.0.9", "10.0.0.1", 80); !ok || got {
		t.Errorf("x reachable=%v (programmed %v) after the table came back", got, ok)
	}
	if v := testutilValue(t, a, "moat_agent_ready", ""); v != "1" {
		t.Errorf("moat_agent_ready = %s after the table came back", v)
	}
	if v := testutilValue(t, a, "moat_agent_table_missing_total", ""); v != "1" {
		t.Errorf("moat_agent_table_missing_total = %s, want 1 (one loss)", v)
	}
}

// TestTableRestoredWhileNodeMissing: the agent's Node is deleted while it
// runs (the node leaves the cluster, someone deletes it by mistake): the
// agent programs nothing new, and the last table keeps enforcing. Then
// someone deletes that table (a firewall reload). The agent has no Node
// to compile for, but it knows what was in force: it programs that
// ruleset again at once (fail closed), instead of leaving the node
// unpoliced until the Node comes back. It stays not ready: the Node is
// still missing.
func TestTableRestoredWhileNodeMissing(t *testing.T) {
	c := clusterX(t, fixture.YAML(t, npIsolateX))
	dp := newTestDP("n1")
	a := startReady(t, c, Config{}, dp)
	ctx := context.Background()
	programmed := dp.fake.Dump()

	if err := c.kube.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fixture.Eventually(t, 10*time.Second, "not ready: node not found", func() (bool, string) {
		err := a.Ready()
		return err != nil && strings.Contains(err.Error(), "node n1 not found"), fixture.Explain("Ready() = %v", err)
	})
	if got := dp.fake.Dump(); got != programmed {
		t.Fatalf("the table changed when the Node was deleted:\n%s", got)
	}

	tx := dp.fake.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := dp.fake.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	dp.nft.gen.Add(1) // the other writer's commit, as the kernel counts it
	fixture.Eventually(t, 20*time.Second, "the last table programmed again", func() (bool, string) {
		return dp.fake.Dump() == programmed, "table not restored"
	})
	if got, ok := dp.allows("10.0.0.9", "10.0.0.1", 80); !ok || got {
		t.Errorf("x reachable=%v (programmed %v) after the table was restored", got, ok)
	}
	if v := testutilValue(t, a, "moat_agent_table_missing_total", ""); v != "1" {
		t.Errorf("moat_agent_table_missing_total = %s, want 1", v)
	}
	if err := a.Ready(); err == nil || !strings.Contains(err.Error(), "node n1 not found") {
		t.Errorf("Ready() = %v after the restore, want node n1 not found", err)
	}
	// Restored, the table is verified as any other: no second loss.
	time.Sleep(2 * tableCheckPeriod)
	if v := testutilValue(t, a, "moat_agent_table_missing_total", ""); v != "1" {
		t.Errorf("moat_agent_table_missing_total = %s after the restore, want 1", v)
	}

	// The Node comes back: the agent compiles for it again and is ready.
	if _, err := c.kube.CoreV1().Nodes().Create(ctx, fixture.Node("n1", nil, "192.168.0.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fixture.Eventually(t, 10*time.Second, "ready once the Node is back", func() (bool, string) {
		return a.Ready() == nil, fixture.Explain("Ready() = %v", a.Ready())
	})
}
