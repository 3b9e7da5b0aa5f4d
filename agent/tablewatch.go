package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/moat-net/moat/nft"
)

// TableVerifier is the optional part of a Dataplane that checks the
// kernel still holds what it last programmed; *nft.Syncer has it. Without
// it, a table deleted behind the agent's back is only noticed by a checked
// resync (--resync).
type TableVerifier interface {
	// Verify returns an error wrapping nft.ErrTableMissing when the
	// table last programmed is gone, one wrapping nft.ErrTableEdited
	// when another program edited it (its chains, the rules of its fixed
	// chains or the kernel's use count of a chain differ, or it is
	// dormant), another error when it cannot tell.
	Verify(ctx context.Context) error
}

// tableCheckPeriod is how often the table is verified. While nobody else
// commits to nftables a check is one netlink request (the generation);
// otherwise it is one dump of the drop counters too (4-6 ms at 30,000
// pods, nft.NetlinkCounters). Five seconds bounds how long a flushed
// ruleset (`nft flush ruleset` by a firewall reload) leaves the node
// unpoliced before the agent starts programming it again.
const tableCheckPeriod = 5 * time.Second

// EventNodeTableMissing: table inet moat was found gone from nftables;
// the agent programs it again. On the Node.
const EventNodeTableMissing = "NodeTableMissing"

// EventNodeTableEdited: table inet moat was found edited by another
// program; the agent replaces it. On the Node.
const EventNodeTableEdited = "NodeTableEdited"

// watchTable verifies the table every period until ctx ends. Sync alone
// would not notice its loss or an edit: when nothing changed it keeps the
// last ruleset without asking the kernel (nft.Result.Reused), and the
// node would enforce nothing, with /readyz green, until the next --resync
// (or never, with --resync=0).
func (a *Agent) watchTable(ctx context.Context, v TableVerifier, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := v.Verify(vctx)
		cancel()
		switch {
		case err == nil:
			failing = false
		case ctx.Err() != nil:
			return
		case errors.Is(err, nft.ErrTableMissing):
			a.tableLost(err)
		case errors.Is(err, nft.ErrTableEdited):
			a.tableEdited(err)
		case !failing:
			// Cannot tell (a netlink error): the next period tries again;
			// --resync still repairs whatever happened.
			failing = true
			a.log.Error(err, "Cannot verify that table inet moat is in nftables")
		}
	}
}

// tableLost reacts to the table's loss: not ready until a full replace
// programs it again (Agent.sync clears it), counted, logged and reported
// as an Event once per loss, and a forced resync is asked for: the table
// is known to differ from what the agent last programmed, so only a
// replace restores it. That replace also cuts the established
// connections its ruleset denies (nft.Syncer.Verify): they were accepted
// while no table judged them.
func (a *Agent) tableLost(err error) {
	a.tableDrifted(&a.tableMissing, a.metrics.tableMissing, err, EventNodeTableMissing,
		"Table inet moat is gone from nftables: the node enforces nothing until it is programmed again; programming it now",
		"was deleted or flushed by another program (nft flush ruleset, a firewall reload); programming it again")
}

// tableEdited reacts to an edit of the table by another program as
// tableLost to its loss: not ready until a full replace (Agent.sync
// clears it), counted, logged and reported as an Event once per edit,
// and a forced resync, since only a replace restores what the agent
// programmed. That replace also cuts the established connections its
// ruleset denies (nft.Syncer.Verify): they may have been accepted while
// the edit let them through.
func (a *Agent) tableEdited(err error) {
	a.tableDrifted(&a.tableChanged, a.metrics.tableEdited, err, EventNodeTableEdited,
		"Table inet moat was edited by another program: the node may not enforce the policies until it is replaced; replacing it now",
		"was edited by another program (nft flush chain, insert rule, flush table, flags dormant); replacing it")
}

// tableDrifted is tableLost's and tableEdited's reaction: the first time
// flag is raised it counts the drift, marks the agent not ready, logs
// logMsg and sends the Node an Event ("table inet moat of node N " +
// what + ": " + err); every time it asks for a forced resync.
func (a *Agent) tableDrifted(flag *atomic.Bool, count prometheus.Counter, err error, reason, logMsg, what string) {
	if !flag.Swap(true) {
		count.Inc()
		a.metrics.ready.Set(0)
		a.log.Error(err, logMsg)
		a.status.event(&corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: a.cfg.NodeName, UID: types.UID(a.cfg.NodeName)}, corev1.EventTypeWarning, reason,
			"table inet moat of node "+a.cfg.NodeName+" "+what+": "+err.Error())
	}
	a.requestResync(resyncForced)
}
