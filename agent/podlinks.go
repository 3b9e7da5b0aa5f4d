package agent

import (
	"context"
	"errors"
	"time"

	"github.com/moat-net/moat/nft"
)

// reportLinks logs when the dataplane could not resolve the interfaces of
// the node's pods (nft.Result.LinksErr), once per failure streak and once
// when it recovers. Meanwhile the node keeps checking sources against the
// links it resolved last (docs/agent.md, "Forged sources"); the sync
// itself succeeded, so nothing else reports it.
func (a *Agent) reportLinks(res nft.Result) {
	msg := ""
	if res.LinksErr != nil {
		msg = res.LinksErr.Error()
	}
	switch {
	case msg == a.linksErr:
	case msg == "":
		a.log.Info("Pod interfaces resolved again", "links", res.Links)
	default:
		a.log.Error(res.LinksErr, "Could not resolve the interfaces of the node's pods; checking sources against the last ones resolved", "links", res.Links)
	}
	a.linksErr = msg
}

// LinkChecker is a Dataplane that checks the sources arriving on pod
// interfaces against the node's routes (nft.Syncer; docs/agent.md,
// "Forged sources"). Routes can change without any object of the API (a
// pod's veth re-created for the same address), so the agent has the
// links resolved again every nft.LinkRefresh even when nothing else
// syncs: a quiet node would otherwise keep stale links until its next
// --resync, or forever with --resync=0.
type LinkChecker interface {
	// ChecksLinks reports whether the dataplane resolves pod links at all.
	ChecksLinks() bool
	// RefreshLinks makes the next Sync resolve them again.
	RefreshLinks()
}

// refreshLinks asks for the links to be resolved again every period, by
// one sync each time, until ctx ends. A sync that finds them unchanged
// keeps the ruleset (nft.Result.Reused): a route lookup per local pod
// address and no transaction.
func (a *Agent) refreshLinks(ctx context.Context, lc LinkChecker, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			lc.RefreshLinks()
			a.queue.Add(syncKey)
		}
	}
}

// RouteWatcher is a Dataplane that can say when the node's host routes
// change (nft.Syncer.WatchRoutes): on a node without pod CIDRs a routed
// CNI's new pod is then failed closed by the next sync (nft.PodLink's
// Unknown), before its address reaches the agent through the API server.
type RouteWatcher interface {
	WatchRoutes(ctx context.Context, changed func(), failed func(error)) error
}

// watchRoutes queues a sync whenever the dataplane reports a route
// change, until ctx ends. Without a watch (not supported, or it failed)
// the periodic link refresh (refreshLinks) still finds new pods' routes,
// within nft.LinkRefresh.
func (a *Agent) watchRoutes(ctx context.Context, rw RouteWatcher) {
	err := rw.WatchRoutes(ctx, func() { a.queue.Add(syncKey) }, func(err error) {
		if ctx.Err() == nil {
			a.log.Error(err, "Stopped watching the node's routes; new pods' routes are found by the periodic link refresh", "period", nft.LinkRefresh)
		}
	})
	switch {
	case errors.Is(err, nft.ErrRoutesNotWatched):
	case err != nil:
		a.log.Info("Not watching the node's routes; new pods' routes are found by the periodic link refresh", "period", nft.LinkRefresh, "err", err)
	}
}
