package agent

import (
	"context"
	"strings"
	"testing"
	"time"

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
