package app

import (
	"context"
	"os"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/internal/netns"
	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
)

func TestMain(m *testing.M) {
	netnstest.Main()
	os.Exit(m.Run())
}

// TestCleanupDeletesTable: moat-agent --cleanup --netns deletes the table
// an agent left in that namespace and exits 0, without a node name or an
// API server; a second run on the clean node succeeds too. What the
// deletion does to packets is TestOrphanTableUntilRemoved
// (internal/netns).
func TestCleanupDeletesTable(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	t.Setenv("NODE_NAME", "")
	ns, err := netns.Create("moat-cleanup")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.Delete(ns.Name()); err != nil {
			t.Error(err)
		}
	})
	tables, err := ns.Tables(knftables.InetFamily, nft.Table)
	if err != nil {
		t.Fatal(err)
	}
	// A table with a chain, as an agent leaves one.
	tx := tables.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "forward", Type: knftables.PtrTo(knftables.FilterType), Hook: knftables.PtrTo(knftables.ForwardHook), Priority: knftables.PtrTo(knftables.FilterPriority)})
	if err := tables.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	exists := func() bool {
		t.Helper()
		_, err := tables.List(context.Background(), "chains")
		if err != nil && !knftables.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	if !exists() {
		t.Fatal("the test's table is not there")
	}
	for i := range 2 {
		if out, err := execute(t, "--cleanup", "--netns="+ns.Name(), "--kubeconfig=/nonexistent/kubeconfig"); err != nil {
			t.Fatalf("run %d: moat-agent --cleanup: %v\n%s", i+1, err, out)
		}
		if exists() {
			t.Fatalf("run %d: table inet %s still there after --cleanup", i+1, nft.Table)
		}
	}
}
