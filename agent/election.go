package agent

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Leader election among a few agents.
//
// A client-go candidate that does not lead reads the Lease every
// RetryPeriod (up to 1.2 times it), a quorum read: with every agent of a
// DaemonSet campaigning, 5,000 nodes cost the API server and etcd ~1,500
// Lease GETs/s to elect one status writer. So only the
// agents of the LeaderElection.Candidates nodes first in hash order of
// their names campaign. Every agent computes that order from its own Node
// cache and evaluates it again as nodes come and go, so the agents agree
// without talking to each other; hashing instead of sorting the names
// spreads the candidates over node pools named alike.
//
// The other agents stand by: each reads the Lease once every
// standbyPeriod, from the API server's watch cache, a period that grows
// with the number of nodes so that all of them together read it about as
// often as the candidates do. One that finds the Lease abandoned (not
// renewed for the holder's lease duration plus our LeaseDuration, a
// margin for clock skew: every candidate's agent is gone, or their nodes
// are down but still listed) campaigns as a stand-in until some other
// agent holds the Lease. So there is a leader whenever any agent runs,
// after at most a few lease durations more than with every agent
// campaigning.
//
// A leader keeps leading until it loses the Lease, candidate or not: a
// node that joins ahead of it in the order does not move the status
// writer (a change of leader rewrites nothing but costs a status pass).

// DefaultCandidates is how many agents campaign unless configured.
const DefaultCandidates = 3

// nodeHash orders nodes for the election: FNV-1a of the name, the same
// in every agent.
func nodeHash(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}

// electionRank is the place of self among names in hash order (ties by
// name), or -1 when self is not among them (its Node is not in the cache
// yet, or was deleted).
func electionRank(names []string, self string) int {
	sh := nodeHash(self)
	rank, found := 0, false
	for _, n := range names {
		if n == self {
			found = true
			continue
		}
		if h := nodeHash(n); h < sh || h == sh && n < self {
			rank++
		}
	}
	if !found {
		return -1
	}
	return rank
}

// isCandidate reports whether this agent's node is among the candidates
// now.
func (w *statusWriter) isCandidate() bool {
	n := w.a.cfg.LeaderElection.Candidates
	if n < 0 {
		return true
	}
	r := electionRank(w.a.inf.nodes.GetStore().ListKeys(), w.a.cfg.NodeName)
	return r >= 0 && r < n
}

// standbyPeriod is how often a standing-by agent reads the Lease: the
// RetryPeriod times nodes per candidate, so that the cluster's standby
// reads cost about what the candidates' do, and at least LeaseDuration.
func (w *statusWriter) standbyPeriod() time.Duration {
	le := w.a.cfg.LeaderElection
	nodes := len(w.a.inf.nodes.GetStore().ListKeys())
	c := max(le.Candidates, 1)
	return max(le.RetryPeriod*time.Duration((nodes+c-1)/c), le.LeaseDuration)
}

// leaseAbandoned reads the Lease from the API server's watch cache and
// reports whether no agent holds it (missing, released and not taken, or
// not renewed in time) and who held it last.
func (w *statusWriter) leaseAbandoned(ctx context.Context, now time.Time) (bool, string, error) {
	le := w.a.cfg.LeaderElection
	l, err := w.a.clients.Kube.CoordinationV1().Leases(le.Namespace).Get(ctx, le.Name, metav1.GetOptions{ResourceVersion: "0"})
	switch {
	case apierrors.IsNotFound(err):
		return true, "", nil
	case err != nil:
		return false, "", fmt.Errorf("read lease %s/%s: %w", le.Namespace, le.Name, err)
	}
	abandoned, holder := leaseExpired(l, now, le.LeaseDuration)
	return abandoned, holder, nil
}

// leaseExpired reports whether l was last renewed (or acquired) longer
// ago than its duration plus margin, by this agent's clock, and its
// holder ("" once released).
func leaseExpired(l *coordinationv1.Lease, now time.Time, margin time.Duration) (bool, string) {
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	last := l.Spec.RenewTime
	if last == nil {
		last = l.Spec.AcquireTime
	}
	if last == nil {
		return true, holder
	}
	var dur time.Duration
	if l.Spec.LeaseDurationSeconds != nil {
		dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return now.Sub(last.Time) > dur+margin, holder
}

// jittered returns d plus up to a fifth more, at random, so that agents
// started together spread their reads.
func jittered(d time.Duration) time.Duration {
	return d + rand.N(d/5+1)
}

// runElection takes part in the election until ctx ends: campaigning
// while a candidate, standing by otherwise; while leading it writes
// status.
func (w *statusWriter) runElection(ctx context.Context) {
	le := w.a.cfg.LeaderElection
	log := w.a.log.WithValues("lease", le.Namespace+"/"+le.Name)
	// Node additions and deletions can change who is a candidate.
	nodesChanged := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case nodesChanged <- struct{}{}:
		default:
		}
	}
	if reg, err := w.a.inf.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, DeleteFunc: poke}); err == nil {
		defer func() { _ = w.a.inf.nodes.RemoveEventHandler(reg) }()
	}
	// A standby's first read waits for the candidates to have taken the
	// Lease (all agents start together on a new cluster), then spreads.
	firstCheck := func() time.Time {
		return time.Now().Add(2*le.LeaseDuration + rand.N(w.standbyPeriod()))
	}
	next := firstCheck()
	wasCandidate := false
	for ctx.Err() == nil {
		if w.isCandidate() {
			if !wasCandidate {
				log.Info("Campaigning for the status writer's Lease", "candidates", le.Candidates)
			}
			wasCandidate = true
			if err := w.campaign(ctx, log, nodesChanged, func(*leaderelection.LeaderElector) bool { return w.isCandidate() }); err != nil {
				log.Error(err, "Leader election is misconfigured; this agent will not write status")
				return
			}
			if !sleep(ctx, le.RetryPeriod) {
				return
			}
			next = firstCheck()
			continue
		}
		if wasCandidate {
			log.Info("No longer among the candidates for the status writer's Lease; standing by")
			wasCandidate = false
		}
		wait := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			wait.Stop()
			return
		case <-nodesChanged:
			wait.Stop()
			continue
		case <-wait.C:
		}
		next = time.Now().Add(jittered(w.standbyPeriod()))
		abandoned, holder, err := w.leaseAbandoned(ctx, time.Now())
		if err != nil {
			log.V(2).Info("Standing by: could not read the Lease", "err", err)
			continue
		}
		if !abandoned {
			continue
		}
		log.Info("The status writer's Lease is abandoned; campaigning as a stand-in until another agent holds it", "lastHolder", holder)
		err = w.campaign(ctx, log, nodesChanged, func(el *leaderelection.LeaderElector) bool {
			l := el.GetLeader()
			return w.isCandidate() || l == "" || l == holder || l == le.Identity
		})
		if err != nil {
			log.Error(err, "Leader election is misconfigured; this agent will not write status")
			return
		}
		if !sleep(ctx, le.RetryPeriod) {
			return
		}
	}
}

// campaign runs one client-go elector until it stops leading, ctx ends,
// or keep says, while the agent does not lead, that it should stop (it is
// checked every RetryPeriod and at each change of nodes).
func (w *statusWriter) campaign(ctx context.Context, log klog.Logger, nodesChanged <-chan struct{}, keep func(*leaderelection.LeaderElector) bool) error {
	le := w.a.cfg.LeaderElection
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
		Client:     w.a.clients.Kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   le.LeaseDuration,
		RenewDeadline:   le.RenewDeadline,
		RetryPeriod:     le.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            le.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("Became the status writer")
				w.leading.Store(true)
				w.a.metrics.leader.Set(1)
				w.lead(ctx)
			},
			OnStoppedLeading: func() {
				// client-go calls it also when a campaign that never led ends.
				if w.leading.Swap(false) {
					w.a.metrics.leader.Set(0)
					log.Info("No longer the status writer")
				}
			},
		},
	})
	if err != nil {
		return err
	}
	w.a.metrics.candidate.Set(1)
	defer w.a.metrics.candidate.Set(0)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		elector.Run(cctx)
	}()
	tick := time.NewTicker(le.RetryPeriod)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-nodesChanged:
		case <-tick.C:
		}
		if !w.leading.Load() && !keep(elector) {
			cancel()
			<-done
			return nil
		}
	}
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
