package agent

import (
	"context"
	"errors"
	"fmt"
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
}

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

	// fullResync asks the next sync to replace the whole table.
	fullResync atomic.Bool
	// programmed: the first sync has been applied. lastFailed: the last
	// sync attempt failed (the previous rules are still in force).
	programmed, lastFailed atomic.Bool
	// syncStarted holds the start time (UnixNano) of the sync in progress,
	// 0 when none runs; /healthz fails when one hangs.
	syncStarted atomic.Int64
	// syncs counts completed syncs that reached the dataplane.
	syncs atomic.Int64

	// reported: see reportProblems; used by the sync worker only.
	reported map[string]string
	// pending: changes since the last sync. compiler and snap are the
	// worker's incremental state: the compiler of the last full snapshot
	// and that snapshot.
	pending  pending
	compiler *policy.Compiler
	snap     *snapshot
	// cost is what compilations took lately, for choosing between
	// incremental and full (sync worker only).
	cost compileCost
	// selectorKeys are the label keys some policy's selector reads;
	// keyMemo keeps them per decoded policy (see labelkeys.go).
	selectorKeys atomic.Pointer[keySet]
	keyMemo      map[any][]string

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
		cfg:       cfg,
		clients:   clients,
		dp:        dp,
		log:       klog.Background().WithName("moat-agent").WithValues("node", cfg.NodeName),
		metrics:   newMetrics(),
		reported:  map[string]string{},
		keyMemo:   map[any][]string{},
		labelSets: newLabelSets(),
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
	for _, inf := range a.inf.all() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inf.RunWithContext(ctx)
		}()
	}
	a.log.Info("Waiting for caches to sync")
	if !cache.WaitForCacheSync(ctx.Done(), a.inf.pods.HasSynced, a.inf.namespaces.HasSynced, a.inf.nodes.HasSynced, a.inf.nps.HasSynced, a.inf.cnps.HasSynced) {
		// Stopped before the caches synced: nothing was programmed, the
		// node keeps whatever table it had.
		return nil
	}
	a.log.Info("Caches synced: programming the node")
	// The first sync replaces whatever table a previous agent left, in one
	// transaction.
	a.fullResync.Store(true)
	a.queue.Add(syncKey)
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
					a.fullResync.Store(true)
					a.queue.Add(syncKey)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.drops.run(ctx)
	}()
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

// pending collects what changed since the last sync: pods whose labels
// alone changed can be recompiled incrementally; anything else needs a
// full compilation.
type pending struct {
	mu        sync.Mutex
	full      bool
	relabeled map[string]bool
}

// enqueue records a change and queues a sync. relabeled names a pod
// ("namespace/name") whose labels alone changed; "" means any other change.
func (a *Agent) enqueue(relabeled string) {
	p := &a.pending
	p.mu.Lock()
	if relabeled == "" {
		p.full = true
	} else {
		if p.relabeled == nil {
			p.relabeled = map[string]bool{}
		}
		p.relabeled[relabeled] = true
	}
	p.mu.Unlock()
	a.queue.Add(syncKey)
}

// takePending returns and clears the recorded changes.
func (a *Agent) takePending() (full bool, relabeled []string) {
	p := &a.pending
	p.mu.Lock()
	defer p.mu.Unlock()
	full = p.full
	for k := range p.relabeled {
		relabeled = append(relabeled, k)
	}
	p.full, p.relabeled = false, nil
	return full, relabeled
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
	start := time.Now()
	a.syncStarted.Store(start.UnixNano())
	defer a.syncStarted.Store(0)

	prog, snap, full := a.compile()
	compiled := time.Now()
	a.metrics.syncDuration.WithLabelValues("compile").Observe(compiled.Sub(start).Seconds())
	a.status.publish(snap, prog)
	if full {
		a.countPolicies(prog)
		a.metrics.outOfScope.Set(float64(snap.outOfScope))
	}

	if a.fullResync.Swap(false) {
		a.dp.Invalidate()
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
	if full {
		a.reportProblems(snap, res.Warnings)
	}
	a.syncs.Add(1)
	if !res.Applied {
		if err == nil {
			err = errors.New("dataplane did not apply the ruleset")
		}
		a.metrics.syncs.WithLabelValues(kind, resultError).Inc()
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
		// failed. Retrying would not help the rules; the next change
		// tries the cut again.
		result = resultConntrackError
		a.log.Error(err, "Rules applied but removing denied established connections failed")
	}
	a.metrics.syncs.WithLabelValues(kind, result).Inc()
	if a.lastFailed.Swap(false) {
		a.log.Info("Sync recovered")
	}
	if !a.programmed.Swap(true) {
		a.log.Info("First sync programmed: ready", "duration", done.Sub(start), "rules", st.Rules, "elements", st.Elements)
	}
	a.metrics.ready.Set(1)
	a.drops.poke()
	a.log.V(4).Info("Synced", "kind", kind, "fullCompile", full, "operations", res.Operations, "compile", compiled.Sub(start), "program", done.Sub(compiled))
	return nil
}

// compile brings the program up to date with the caches: incrementally
// when only pod labels changed since the last sync, in full otherwise (and
// on every full resync, which also guards against any drift of the
// incremental path).
func (a *Agent) compile() (*policy.Program, *snapshot, bool) {
	full, relabeled := a.takePending()
	if a.fullResync.Load() || a.compiler == nil {
		full = true
	}
	// A burst of relabels (a rollout, a tool relabelling a namespace's
	// pods) is cheaper to compile in full than one by one, each of which
	// costs in proportion to the cluster: pick what the last ones cost.
	if !full && a.cost.preferFull(len(relabeled)) {
		full = true
	}
	if !full && len(relabeled) > 0 {
		start := time.Now()
		for _, key := range relabeled {
			labels, ok := a.podLabels(key)
			if !ok {
				full = true
				break
			}
			if _, ok := a.compiler.RelabelPod(key, labels); !ok {
				full = true
				break
			}
		}
		if !full {
			a.cost.relabel = ewma(a.cost.relabel, time.Since(start)/time.Duration(len(relabeled)))
		}
	}
	if full {
		start := time.Now()
		// Before the caches are read: see labelkeys.go.
		a.updateSelectorKeys()
		a.snap = a.takeSnapshot()
		a.compiler = policy.NewCompiler(&a.snap.cluster, a.policyOptions())
		a.cost.full = ewma(a.cost.full, time.Since(start))
		a.metrics.compiles.WithLabelValues("full").Inc()
	} else if len(relabeled) > 0 {
		a.metrics.compiles.WithLabelValues("relabel").Inc()
	}
	return a.compiler.Program(), a.snap, full
}

// podLabels reads a pod's current labels from the cache; false when the
// pod is gone or finished (a full compilation then sorts it out).
func (a *Agent) podLabels(key string) (map[string]string, bool) {
	o, exists, err := a.inf.pods.GetStore().GetByKey(key)
	if err != nil || !exists {
		return nil, false
	}
	p, ok := o.(*cachedPod)
	if !ok || p.finished {
		return nil, false
	}
	return p.Labels, true
}

func (a *Agent) countPolicies(prog *policy.Program) {
	counts := map[[2]string]int{}
	for _, k := range []string{"NetworkPolicy", "ClusterNetworkPolicy"} {
		counts[[2]string{k, "accepted"}] = 0
		counts[[2]string{k, "failed_closed"}] = 0
	}
	for _, s := range prog.Status {
		state := "accepted"
		if !s.Accepted {
			state = "failed_closed"
		}
		counts[[2]string{s.Policy.Kind, state}]++
	}
	for k, n := range counts {
		a.metrics.policies.WithLabelValues(k[0], k[1]).Set(float64(n))
	}
}

// compileCost is what a full compilation and one incremental relabel
// took lately.
type compileCost struct{ full, relabel time.Duration }

// preferFull reports whether n relabels would take longer than compiling
// in full (false until both have been measured).
func (c compileCost) preferFull(n int) bool {
	return c.full > 0 && c.relabel > 0 && time.Duration(n)*c.relabel > c.full
}

// ewma folds a new measurement into a running estimate (weight 1/4; the
// first measurement is taken as is).
func ewma(old, cur time.Duration) time.Duration {
	if old == 0 {
		return cur
	}
	return old + (cur-old)/4
}
