package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// stuckAfter is how long a sync may run before Healthy reports the agent
// as hung (nft blocked, a deadlock), so the kubelet restarts it. The old
// rules stay in force through the restart.
const stuckAfter = 3 * time.Minute

// Healthy returns an error when a sync has been running for longer than
// three minutes: the liveness check (/healthz).
func (a *Agent) Healthy() error { return a.healthy(time.Now()) }

func (a *Agent) healthy(now time.Time) error {
	if s := a.syncStarted.Load(); s != 0 {
		if d := now.Sub(time.Unix(0, s)); d > stuckAfter {
			return fmt.Errorf("a sync has been running for %s", d.Round(time.Second))
		}
	}
	return nil
}

// Ready returns nil once the first sync from complete caches is programmed,
// while the last sync succeeded, while the Node named --node-name exists
// and while table inet moat is in nftables as the agent programmed it:
// the readiness check (/readyz).
// Each of those failing means the node does not enforce what the cluster
// asks: no rules, old rules, or none at all.
func (a *Agent) Ready() error {
	switch {
	case a.nodeMissing.Load():
		return fmt.Errorf("node %s not found: no Node of that name in the cluster (check --node-name); nothing is programmed meanwhile", a.cfg.NodeName)
	case !a.programmed.Load():
		return errors.New("the first full sync has not been programmed yet")
	case a.tableMissing.Load():
		return errors.New("table inet moat is missing from nftables (deleted or flushed by another program); programming it again")
	case a.tableChanged.Load():
		return errors.New("table inet moat was edited by another program; replacing it")
	case a.lastFailed.Load():
		return errors.New("the last sync failed; the previous rules are in force")
	}
	return nil
}

// Metrics gathers the agent's series (moat_agent_*). The process and Go
// runtime series are the caller's to add.
func (a *Agent) Metrics() prometheus.Gatherer { return a.metrics.reg }
