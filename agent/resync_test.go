package agent

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// TestResyncRequestsFold: requests fold into the greatest kind, whatever
// their order, and a sync takes one once.
func TestResyncRequestsFold(t *testing.T) {
	for _, tc := range []struct {
		name string
		asks []resyncKind
		want resyncKind
	}{
		{"none", nil, resyncNone},
		{"checked", []resyncKind{resyncChecked, resyncChecked}, resyncChecked},
		{"forced after checked", []resyncKind{resyncChecked, resyncForced}, resyncForced},
		{"checked after forced", []resyncKind{resyncForced, resyncChecked}, resyncForced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
			defer a.queue.ShutDown()
			for _, k := range tc.asks {
				a.requestResync(k)
			}
			if got := a.takeResync(); got != tc.want {
				t.Errorf("took %v, want %v", got, tc.want)
			}
			if got := a.takeResync(); got != resyncNone {
				t.Errorf("took %v a second time", got)
			}
			if len(tc.asks) > 0 && a.queue.Len() != 1 {
				t.Errorf("%d syncs queued, want 1", a.queue.Len())
			}
		})
	}
}

// resyncDP records which resync each sync was prepared for, and can hold
// a sync in progress.
type resyncDP struct {
	*testDP
	mu    sync.Mutex
	kinds []string
	hold  chan struct{}
}

func (d *resyncDP) Invalidate() {
	d.mu.Lock()
	d.kinds = append(d.kinds, "forced")
	d.mu.Unlock()
	d.testDP.Invalidate()
}

func (d *resyncDP) InvalidateIfChanged() {
	d.mu.Lock()
	d.kinds = append(d.kinds, "checked")
	d.mu.Unlock()
	d.testDP.InvalidateIfChanged()
}

func (d *resyncDP) Sync(ctx context.Context, prog *policy.Program) (nft.Result, error) {
	d.mu.Lock()
	hold := d.hold
	d.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return d.testDP.Sync(ctx, prog)
}

func (d *resyncDP) prepared() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.kinds...)
}

// TestCheckedResync: a checked resync patches the table while nobody else
// committed to nftables, replaces it after someone did, and a forced one
// asked for while a sync runs wins over checked ones asked for around it.
func TestCheckedResync(t *testing.T) {
	c := clusterXY(t, fixture.YAML(t, npAllowYtoX))
	dp := &resyncDP{testDP: newTestDP("n1")}
	a := startReady(t, c, Config{}, dp)
	programmed := dp.fake.Dump()
	resync := func(step string, ask func(), kind, result string) {
		t.Helper()
		series := `kind="` + kind + `",result="` + result + `"`
		before := testutilValue(t, a, "moat_agent_resyncs_total", series)
		txs := len(dp.nft.transactions())
		ask()
		// Counted once the sync is over.
		fixture.Eventually(t, 10*time.Second, step, func() (bool, string) {
			return testutilValue(t, a, "moat_agent_resyncs_total", series) != before, "moat_agent_resyncs_total{" + series + "} stayed " + before
		})
		// The cluster did not change: a patch is empty, a replace is one
		// transaction.
		wantTxs := txs
		if result == resyncReplaced {
			wantTxs++
		}
		if got := len(dp.nft.transactions()); got != wantTxs {
			t.Errorf("%s: %d transactions, want %d", step, got-txs, wantTxs-txs)
		}
		if got := dp.fake.Dump(); got != programmed {
			t.Errorf("%s: table changed:\n%s\nwant\n%s", step, got, programmed)
		}
	}
	resync("quiet checked resync", a.CheckedResync, "checked", resyncUnchanged)
	resync("checked resync after another commit", func() { dp.nft.gen.Add(1); a.CheckedResync() }, "checked", resyncReplaced)
	resync("quiet checked resync after the replace", a.CheckedResync, "checked", resyncUnchanged)
	resync("forced resync", a.Resync, "forced", resyncReplaced)

	// A sync held in the dataplane; meanwhile checked and forced resyncs
	// are asked for: the next sync is one forced resync.
	hold := make(chan struct{})
	dp.mu.Lock()
	dp.hold = hold
	dp.kinds = nil
	dp.mu.Unlock()
	syncs := a.syncs.Load()
	a.CheckedResync()
	fixture.Eventually(t, 10*time.Second, "held sync prepared", func() (bool, string) {
		return len(dp.prepared()) == 1, fixture.Explain("prepared %v", dp.prepared())
	})
	a.CheckedResync()
	a.Resync()
	a.CheckedResync()
	dp.mu.Lock()
	dp.hold = nil
	dp.mu.Unlock()
	close(hold)
	fixture.Eventually(t, 10*time.Second, "two syncs", func() (bool, string) { return a.syncs.Load() >= syncs+2, "no second sync" })
	if got := dp.prepared(); len(got) != 2 || got[0] != "checked" || got[1] != "forced" {
		t.Errorf("syncs prepared for %v, want [checked forced]", got)
	}
	if k := resyncKind(a.resync.Load()); k != resyncNone {
		t.Errorf("a %v resync is still asked for", k)
	}
}

// TestResyncPeriodIsChecked: the --resync ticker asks for checked
// resyncs, which leave a table nobody else touched alone.
func TestResyncPeriodIsChecked(t *testing.T) {
	c := clusterX(t, fixture.YAML(t, npAllowYtoX))
	dp := newTestDP("n1")
	a, stop := startAgent(t, c, Config{Resync: 10 * time.Millisecond}, dp)
	fixture.Eventually(t, 10*time.Second, "two checked resyncs", func() (bool, string) {
		v := testutilValue(t, a, "moat_agent_resyncs_total", `kind="checked",result="unchanged"`)
		return v != "0" && v != "1", "checked resyncs that left the table: " + v
	})
	stop()
	for _, series := range []string{`kind="checked",result="replaced"`, `kind="forced",result="replaced"`} {
		if v := testutilValue(t, a, "moat_agent_resyncs_total", series); v != "0" {
			t.Errorf("moat_agent_resyncs_total{%s} = %s, want 0", series, v)
		}
	}
	// The first sync's replace, and nothing since.
	if n := len(dp.nft.transactions()); n != 1 {
		t.Errorf("%d transactions, want 1", n)
	}
}
