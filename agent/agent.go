package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Dataplane programs a node from a compiled Program. *nft.Syncer is the
// real one; it keeps the previous rules in force when a transaction fails.
type Dataplane interface {
	Sync(ctx context.Context, prog *policy.Program) (nft.Result, error)
	// Invalidate makes the next Sync replace the whole table.
	Invalidate()
	// InvalidateIfChanged makes the next Sync build the ruleset anew and
	// replace the whole table only if someone else may have changed
	// nftables since the dataplane's last commit; otherwise it patches.
	InvalidateIfChanged()
}

// resyncKind is what a sync is asked to do beyond applying the changes
// since the last one. A greater kind includes the lesser ones.
type resyncKind int32

const (
	resyncNone resyncKind = iota
	// resyncChecked compiles from scratch (which repairs any drift of
	// the incremental path) and has the dataplane replace the table only
	// when nftables' generation moved since its last commit: --resync.
	resyncChecked
	// resyncForced compiles from scratch and replaces the whole table:
	// the first sync, and SIGHUP (an operator's explicit request).
	resyncForced
)

// String is the kind label of moat_agent_resyncs_total.
func (k resyncKind) String() string {
	switch k {
	case resyncChecked:
		return "checked"
	case resyncForced:
		return "forced"
	}
	return "none"
}

// problemScanGap is the least time between two reads of the caches for
// input problems: a read touches every object, and a burst of changes
// needs only the last one.
const problemScanGap = 2 * time.Second

// syncKey is the workqueue's only key: every change means "the program
// may differ", so events that arrive while one is queued or running fold
// into a single next sync.
const syncKey = "sync"

// Agent keeps one node's nftables in step with the cluster.
type Agent struct {
	cfg     Config
	clients Clients
	dp      Dataplane
	log     klog.Logger
	metrics *metrics

	inf *informers
	// labelSets shares equal pod labels maps in the pod cache.
	labelSets *labelSets
	// watches are the informers' list and watch states, for staleness.
	watches []*watchState
	queue   workqueue.TypedRateLimitingInterface[string]

	// resync holds the resyncKind the next sync is asked for; requests
	// fold into the greatest (requestResync), the sync takes it once.
	resync atomic.Int32
	// programmed: the first sync has been applied. lastFailed: the last
	// sync attempt failed (the previous rules are still in force).
	programmed, lastFailed atomic.Bool
	// nodeMissing: the last sync found no Node named cfg.NodeName and
	// programmed nothing. tableMissing: the table was found gone from
	// nftables (tablewatch.go) and no full replace has run since;
	// tableChanged: the same for an edit of it by another program.
	nodeMissing, tableMissing, tableChanged atomic.Bool
	// syncStarted holds the start time (UnixNano) of the sync in progress,
	// 0 when none runs; /healthz fails when one hangs.
	syncStarted atomic.Int64
	// syncs counts completed syncs that reached the dataplane.
	syncs atomic.Int64

	// The sync worker's state. reported: see reportProblems. pending:
	// the changes since the last sync. compiler: the incremental compiler
	// of this node's program; compiled: the policy objects in it (see
	// compile.go). problemsScanned: when the caches were last read for
	// input problems; problemsDirty: something changed since.
	reported        map[string]string
	pending         pending
	compiler        *policy.Compiler
	compiled        compiled
	problemsScanned time.Time
	problemsDirty   bool
	// noIPSince: when the scans first saw each pod of this node
	// ("namespace/name") scheduled without an IP; othersNoIP: other
	// nodes' pods without an IP already logged at -v=2.
	noIPSince    map[string]time.Time
	othersNoIP   map[string]bool
	lastWarnings []string
	// linksErr is the last sync's error resolving the pods' interfaces
	// ("" for none; see reportLinks).
	linksErr string
	// selectorKeys are the label keys some policy's selector reads
	// (see labelkeys.go).
	selectorKeys atomic.Pointer[keySet]

	status *statusWriter
	drops  *drops

	runOnce sync.Once
}

// New prepares an agent: it validates cfg and sets up the informers.
// Nothing is watched or programmed before Run.
func New(cfg Config, clients Clients, dp Dataplane) (*Agent, error) {
	if err := cfg.complete(); err != nil {
		return nil, err
	}
	if clients.Kube == nil || clients.Dynamic == nil {
		return nil, errors.New("agent needs both a kubernetes and a dynamic client")
	}
	if dp == nil {
		return nil, errors.New("agent needs a dataplane")
	}
	a := &Agent{
		cfg:        cfg,
		clients:    clients,
		dp:         dp,
		log:        klog.Background().WithName("moat-agent").WithValues("node", cfg.NodeName),
		metrics:    newMetrics(),
		reported:   map[string]string{},
		noIPSince:  map[string]time.Time{},
		othersNoIP: map[string]bool{},
		labelSets:  newLabelSets(),
	}
	// Failed syncs back off exponentially (100 ms to 30 s); the bucket
	// bounds retries of any kind to 10/s with bursts of 50.
	a.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
			&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(10), 50)},
		),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "moat-agent"},
	)
	var err error
	if a.inf, err = a.newInformers(); err != nil {
		return nil, fmt.Errorf("set up informers: %w", err)
	}
	a.status = newStatusWriter(a)
	a.drops = newDrops(dp, a.metrics.reg, a.log)
	return a, nil
}

// Run watches the API server and programs the node until ctx ends. It
// returns only after every goroutine it started has stopped. The table is
// left in the kernel on return: a restarted agent finds the old rules
// enforcing and replaces them in one transaction once its caches are
// complete.
func (a *Agent) Run(ctx context.Context) error {
	started := false
	a.runOnce.Do(func() { started = true })
	if !started {
		return errors.New("agent: Run called twice")
	}
	ctx = klog.NewContext(ctx, a.log)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer a.queue.ShutDown()

	a.status.startEvents(ctx)
	defer a.status.stopEvents()
	run := func(infs ...cache.SharedIndexInformer) {
		for _, inf := range infs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				inf.RunWithContext(ctx)
			}()
		}
	}
	// Pods last: the label keys the policies' selectors read decide which
	// labels the pod cache keeps in a form to share (labelproj.go).
	a.log.Info("Waiting for caches to sync")
	run(a.inf.nps, a.inf.cnps, a.inf.namespaces, a.inf.nodes)
	if !cache.WaitForCacheSync(ctx.Done(), a.inf.nps.HasSynced, a.inf.cnps.HasSynced) {
		return nil
	}
	a.updateSelectorKeys(a.cachedKeyLists())
	run(a.inf.pods)
	if !cache.WaitForCacheSync(ctx.Done(), a.inf.pods.HasSynced, a.inf.namespaces.HasSynced, a.inf.nodes.HasSynced, a.inf.nps.HasSynced, a.inf.cnps.HasSynced, a.inf.handlersSynced) {
		// Stopped before the caches synced: nothing was programmed, the
		// node keeps whatever table it had.
		return nil
	}
	a.log.Info("Caches synced: programming the node")
	// The first sync replaces whatever table a previous agent left, in one
	// transaction.
	a.requestResync(resyncForced)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for a.processNext(ctx) {
		}
	}()
	if a.cfg.Resync > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(a.cfg.Resync)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					a.CheckedResync()
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.drops.run(ctx)
	}()
	if lc, ok := a.dp.(LinkChecker); ok && lc.ChecksLinks() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.refreshLinks(ctx, lc, nft.LinkRefresh)
		}()
	}
	if rw, ok := a.dp.(RouteWatcher); ok {
		a.watchRoutes(ctx, rw)
	}
	if v, ok := a.dp.(TableVerifier); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.watchTable(ctx, v, tableCheckPeriod)
		}()
	}
	if a.cfg.LeaderElection.Enabled {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.status.runElection(ctx)
		}()
	}
	<-ctx.Done()
	a.log.Info("Stopping; the node's rules stay in force")
	return nil
}

// Resync asks for a forced resync now: the next sync compiles from the
// caches from scratch and replaces the whole table in one transaction,
// repairing edits made to it behind the agent's back whether or not
// nftables shows any. moat-agent calls it on SIGHUP. Before the first
// sync it changes nothing (the first sync is a forced one).
func (a *Agent) Resync() {
	a.requestResync(resyncForced)
}

// CheckedResync asks for the resync each --resync period does: the next
// sync compiles from scratch, and the dataplane replaces the whole table
// only if nftables changed since its last commit (someone else committed:
// they may have edited or deleted the table), and otherwise patches it
// with whatever the new compilation changed. On a node where nothing else
// writes nftables it costs a compilation, not a transaction of the whole
// table. A forced resync asked for before the sync takes the request
// wins.
func (a *Agent) CheckedResync() {
	a.requestResync(resyncChecked)
}

// requestResync asks the next sync for k at least and queues it.
func (a *Agent) requestResync(k resyncKind) {
	for {
		cur := a.resync.Load()
		if resyncKind(cur) >= k || a.resync.CompareAndSwap(cur, int32(k)) {
			break
		}
	}
	a.queue.Add(syncKey)
}

// takeResync returns the resync the next sync is asked for and clears
// the request: each is taken by one sync.
func (a *Agent) takeResync() resyncKind {
	return resyncKind(a.resync.Swap(int32(resyncNone)))
}

func (a *Agent) processNext(ctx context.Context) bool {
	key, quit := a.queue.Get()
	if quit {
		return false
	}
	defer a.queue.Done(key)
	if err := a.sync(ctx); err != nil {
		if ctx.Err() != nil {
			return false
		}
		if errors.Is(err, errCutPending) {
			// The rules are in force; only the cut is retried, with the
			// same backoff (sync logged the error).
			a.queue.AddRateLimited(key)
			return true
		}
		a.log.Error(err, "Sync failed; the previous rules stay in force, retrying", "retries", a.queue.NumRequeues(key))
		a.queue.AddRateLimited(key)
		return true
	}
	a.queue.Forget(key)
	return true
}

// sync compiles the caches' current content and programs it.
func (a *Agent) sync(ctx context.Context) error {
	if !a.inf.synced() {
		// Never program from incomplete caches: an empty list would read as
		// "no policies".
		return errors.New("caches not synced")
	}
	if _, ok, _ := a.inf.nodes.GetStore().GetByKey(a.cfg.NodeName); !ok {
		a.nodeNotFound()
		return a.restoreTable(ctx)
	}
	if a.nodeMissing.Swap(false) {
		a.log.Info("Node found: programming it", "node", a.cfg.NodeName)
		a.problemsDirty = true
	}
	start := time.Now()
	a.syncStarted.Store(start.UnixNano())
	defer a.syncStarted.Store(0)

	resync := a.takeResync()
	// Before compiling: the dataplane lets go of what it keeps of the
	// old Program (its build cache; for a forced resync its last ruleset
	// too), so that a resync does not hold them beside the new
	// compiler's state. A checked resync keeps the last ruleset, to patch
	// against.
	switch resync {
	case resyncForced:
		a.dp.Invalidate()
	case resyncChecked:
		a.dp.InvalidateIfChanged()
	}
	// The first sync is no resync.
	countResync := resync != resyncNone && a.programmed.Load()
	prog, full, changed := a.compile(resync != resyncNone)
	compiled := time.Now()
	a.metrics.syncDuration.WithLabelValues("compile").Observe(compiled.Sub(start).Seconds())
	a.status.publish(a.compiled, prog, a.compiler.NetworkPolicies)
	if changed {
		a.countPolicies(prog)
	}

	sctx, cancel := context.WithTimeout(ctx, a.cfg.SyncTimeout)
	res, err := a.dp.Sync(sctx, prog)
	cancel()
	done := time.Now()
	a.metrics.syncDuration.WithLabelValues("program").Observe(done.Sub(compiled).Seconds())
	a.metrics.syncDuration.WithLabelValues("total").Observe(done.Sub(start).Seconds())
	a.metrics.operations.Observe(float64(res.Operations))
	kind := "diff"
	if res.Full {
		kind = "full"
	}
	a.problemsDirty = a.problemsDirty || changed || !slices.Equal(res.Warnings, a.lastWarnings)
	if a.problemsDirty {
		// At most every problemScanGap; a later sync catches up.
		if wait := problemScanGap - time.Since(a.problemsScanned); full || wait <= 0 {
			problems, recheck := a.scanProblems(prog)
			a.reportProblems(problems, res.Warnings)
			a.problemsScanned, a.problemsDirty = time.Now(), false
			if recheck > 0 {
				// A pod of this node without an IP will have lasted
				// long enough to report then, if nothing else scans.
				a.problemsDirty = true
				a.queue.AddAfter(syncKey, recheck)
			}
		} else {
			a.queue.AddAfter(syncKey, wait)
		}
	}
	a.syncs.Add(1)
	a.reportLinks(res)
	if !res.Applied {
		if err == nil {
			err = errors.New("dataplane did not apply the ruleset")
		}
		a.metrics.syncs.WithLabelValues(kind, resultError).Inc()
		if countResync {
			a.metrics.resyncs.WithLabelValues(resync.String(), resultError).Inc()
		}
		if !a.lastFailed.Swap(true) {
			a.status.nodeFailed(err)
		}
		a.metrics.ready.Set(0)
		return fmt.Errorf("program node %s: %w", a.cfg.NodeName, err)
	}
	st := res.Stats
	a.metrics.programmed.WithLabelValues("chains").Set(float64(st.Chains))
	a.metrics.programmed.WithLabelValues("rules").Set(float64(st.Rules))
	a.metrics.programmed.WithLabelValues("sets").Set(float64(st.Sets))
	a.metrics.programmed.WithLabelValues("set_elements").Set(float64(st.Elements))
	a.metrics.conntrack.Add(float64(res.ConntrackDeleted))
	a.metrics.lastSuccess.SetToCurrentTime()
	result := resultSuccess
	if err != nil {
		// The rules are in; only cutting denied established connections
		// failed. The dataplane keeps the cut pending, and the error
		// returned below (errCutPending) has processNext queue the sync
		// that tries it again.
		result = resultConntrackError
		a.log.Error(err, "Rules applied but removing denied established connections failed; retrying")
	}
	a.metrics.syncs.WithLabelValues(kind, result).Inc()
	if countResync {
		outcome := resyncUnchanged
		if res.Full {
			outcome = resyncReplaced
		}
		a.metrics.resyncs.WithLabelValues(resync.String(), outcome).Inc()
		if res.Check != nil && res.Full {
			a.log.V(2).Info("Checked resync replaced the table", "reason", res.Check.Reason())
		} else if res.Check != nil {
			a.log.V(2).Info("Checked resync patched the table: nftables unchanged since the agent's last commit", "generation", res.Check.Found, "operations", res.Operations)
		}
	}
	if a.lastFailed.Swap(false) {
		a.log.Info("Sync recovered")
	}
	if !a.programmed.Swap(true) {
		a.log.Info("First sync programmed: ready", "duration", done.Sub(start), "rules", st.Rules, "elements", st.Elements)
	}
	// Only a full replace is known to have put the table back: a sync
	// that reused the last ruleset did not ask the kernel.
	if res.Full && a.tableMissing.Swap(false) {
		a.log.Info("Table inet moat programmed again", "rules", st.Rules, "elements", st.Elements, "connectionsCut", res.ConntrackDeleted)
	}
	if res.Full && a.tableChanged.Swap(false) {
		a.log.Info("Table inet moat replaced after another program's edit", "rules", st.Rules, "elements", st.Elements, "connectionsCut", res.ConntrackDeleted)
	}
	if res.CutAfterLoss && err == nil {
		a.log.Info("Cut the established connections the restored rules deny, opened while the table was missing or edited", "connections", res.ConntrackDeleted)
	}
	if !a.tableMissing.Load() && !a.tableChanged.Load() {
		a.metrics.ready.Set(1)
	}
	a.drops.poke()
	if result == resultConntrackError {
		return fmt.Errorf("%w: %w", errCutPending, err)
	}
	a.log.V(4).Info("Synced", "kind", kind, "fullCompile", full, "changed", changed, "operations", res.Operations, "compile", compiled.Sub(start), "program", done.Sub(compiled),
		"reused", res.Reused, "build", res.Build, "diff", res.Diff, "nft", res.Transaction)
	return nil
}

// errCutPending marks a sync whose rules are in force but whose cut of
// the established connections they deny failed (--cut-denied-established):
// the dataplane keeps the cut pending and the next sync tries it again,
// so processNext queues one with backoff instead of waiting for a change.
var errCutPending = errors.New("cutting denied established connections is pending")

// nodeNotFound handles a sync that finds no Node named cfg.NodeName: a
// typo of --node-name, or a node name that is not the Node's (hostname
// against FQDN). Programming then would judge no pod of this node: it
// would replace a correct table with one that polices nothing and report
// ready. So the sync programs nothing (whatever table the node has stays),
// the agent is not ready, and the problem is logged once and counted; the
// Node's appearing queues a sync (its informer's change handler) that
// programs.
func (a *Agent) nodeNotFound() {
	if !a.nodeMissing.Swap(true) {
		a.log.Error(nil, "No Node of this name in the cluster: not programming the node until it appears (check --node-name); its current table stays as it is", "node", a.cfg.NodeName)
	}
	a.metrics.problems.WithLabelValues(problemNodeNotFound).Set(1)
	a.metrics.ready.Set(0)
	// When the Node appears, the next sync scans again and clears it.
	a.problemsDirty = true
}

// TableRestorer is the optional part of a Dataplane that programs the
// ruleset it last applied again, as a full replace; *nft.Syncer has it
// (nft.Syncer.Restore).
type TableRestorer interface {
	Restore(ctx context.Context) (nft.Result, error)
}

// restoreTable repairs a table found missing or edited (tablewatch.go)
// while no Node is named cfg.NodeName: with no Node there is nothing to
// compile, and nodeNotFound's rule (the table in place stays) would
// leave the node enforcing nothing until the Node comes back, which for a
// deleted Node may be never. So the dataplane programs again what was in
// force before the loss (the last ruleset compiled while the Node
// existed): the node fails closed, as it was. The agent stays not ready
// (the Node is missing). A failure is returned, so the sync is retried
// with backoff. Nothing is restored when nothing was programmed (an agent
// that started without its Node never read the table) or the dataplane
// cannot (no TableRestorer).
func (a *Agent) restoreTable(ctx context.Context) error {
	if !a.tableMissing.Load() && !a.tableChanged.Load() {
		return nil
	}
	r, ok := a.dp.(TableRestorer)
	if !ok {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, a.cfg.SyncTimeout)
	res, err := r.Restore(sctx)
	cancel()
	if errors.Is(err, nft.ErrNothingToRestore) {
		a.log.Error(err, "Table inet moat is missing or edited and no Node is named --node-name: nothing to program it from until the Node appears")
		return nil
	}
	if !res.Applied {
		return fmt.Errorf("restore the last table of node %s, whose Node is missing: %w", a.cfg.NodeName, err)
	}
	a.metrics.conntrack.Add(float64(res.ConntrackDeleted))
	a.tableMissing.Store(false)
	a.tableChanged.Store(false)
	a.log.Info("Table inet moat restored with the last ruleset programmed, since no Node is named --node-name to compile for",
		"rules", res.Stats.Rules, "elements", res.Stats.Elements, "connectionsCut", res.ConntrackDeleted)
	if err != nil {
		// Only the cut failed: the dataplane keeps it pending for its
		// next Sync, once the Node is back.
		a.log.Error(err, "Table restored but removing the established connections it denies failed; retried once the Node is back")
	}
	return nil
}

// countPolicies sets the policy gauges from the compiler's counts (a
// node-scoped Program's Status lists only some of the NetworkPolicies).
func (a *Agent) countPolicies(prog *policy.Program) {
	for kind, c := range map[string]policy.PolicyCount{
		"NetworkPolicy":        prog.Counts.NetworkPolicy,
		"ClusterNetworkPolicy": prog.Counts.ClusterNetworkPolicy,
	} {
		a.metrics.policies.WithLabelValues(kind, "accepted").Set(float64(c.Accepted))
		a.metrics.policies.WithLabelValues(kind, "failed_closed").Set(float64(c.FailedClosed))
	}
}
