package nft

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sync"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// Options configure a Syncer.
type Options struct {
	// Node is the node whose pods the rules judge (Pod.NodeName).
	Node string
	// CutDenied removes, right after each transaction that changed the
	// rules, the established connections the new rules deny.
	CutDenied bool
	// Conntrack is where those connections are found, and those of pod
	// addresses that change owners. nil means, for the Interface
	// NewInterface returns, NetlinkConntrack in the calling thread's
	// network namespace; for any other Interface (knftables' fake) none:
	// nothing is removed, and the calling thread's namespace, which is
	// not the one programmed, is left alone.
	Conntrack Conntrack
	// Counters reads the drop counters, for Syncer.Counters and for
	// carrying them over a full replace. nil means, for the Interface
	// NewInterface returns, NetlinkCounters in the calling thread's
	// network namespace (where that Interface runs nft); for any other
	// Interface (knftables' fake, a wrapper that enters a namespace)
	// NFTCounters through it, which reads what it programs wherever that
	// is, slowly on a large real table.
	Counters CounterReader
	// Generation reads the nftables generation of the namespace the
	// table is in, for InvalidateIfChanged. nil means, for the Interface
	// NewInterface returns, NetlinkGeneration in the calling thread's
	// network namespace; for any other Interface none: every
	// InvalidateIfChanged then replaces the table, as Invalidate does.
	Generation GenerationReader
	// Links finds the interfaces through which the node routes its
	// pods' addresses, for the check of new connections' sources on
	// them (podLinkRules; when Sync asks: see Sync). nil means, for the Interface
	// NewInterface returns, NetlinkLinks in the calling thread's network
	// namespace; for any other Interface none: the link sets stay empty
	// and no interface is checked.
	Links LinkResolver
	// Shape reads the table's chains and rule counts for Verify, which
	// compares them with the ruleset last programmed. nil means, for the
	// Interface NewInterface returns, NetlinkShape in the calling
	// thread's network namespace; for any other Interface none: Verify
	// then checks the drop counters only.
	Shape ShapeReader
}

// Result says what one Sync did.
type Result struct {
	// Applied is true when the kernel now holds the new ruleset.
	Applied bool
	// Full is true when the whole table was replaced rather than patched.
	Full bool
	// Operations is the size of the transaction (0: nothing changed).
	Operations int
	// Stats describe the ruleset now programmed.
	Stats Stats
	// ConntrackDeleted counts established connections removed.
	ConntrackDeleted int
	// ConntrackReleased counts the conntrack entries removed because
	// their pod address left the node or passed to another pod (see
	// Syncer.release), whatever Options.CutDenied says.
	ConntrackReleased int
	// CutAfterLoss is true when the sync cut the established
	// connections its ruleset denies only because the table had been
	// missing or edited (without Options.CutDenied): see Verify.
	CutAfterLoss bool
	// Warnings are the ruleset's warnings (input it failed closed on).
	Warnings []string
	// Reused is true when nothing the node's ruleset is built from
	// changed since the ruleset last programmed: Sync kept that one
	// without building it again (and Operations is 0).
	Reused bool
	// Check is what the generation check of a sync after
	// InvalidateIfChanged found; nil for other syncs.
	Check *GenerationCheck
	// Links counts the pod links programmed (PodLink); LinksErr is why
	// resolving them failed on this sync, when it did: the links of the
	// last sync that resolved them stay in force.
	Links    int
	LinksErr error
	// Build is how long computing the ruleset from the Program took,
	// Diff how long comparing it with the one programmed (the
	// transaction's operations), and Transaction how long the nft
	// transaction ran: the parts of a sync, for logs and benchmarks.
	Build, Diff, Transaction time.Duration
}

// Syncer keeps one node's table in step with successive Programs. It
// remembers what it last programmed so each Sync sends only the
// difference; the first Sync, and any after a failure, replaces the whole
// table. Both kinds are one nft transaction: the kernel holds either the
// old rules or the new ones, never an empty or half-written table.
type Syncer struct {
	nft  knftables.Interface
	opts Options

	mu      sync.Mutex
	applied *Ruleset
	// inputs are what applied was built from; nil when it was not built
	// by Sync.
	inputs *buildInputs
	cache  *buildCache
	// counters describes the drop counters of the last ruleset
	// programmed. Unlike applied it survives a failure: the names it
	// holds mean the same in any table Moat wrote.
	counters map[string]*DropCounter
	// left is the nftables generation the last commit left when nobody
	// else committed around it (nor, before a patch, since the commit
	// before), 0 when not known. While the kernel's generation still
	// equals it, the table holds applied.
	left uint32
	// checkNext: the next apply checks the generation
	// (InvalidateIfChanged).
	checkNext bool
	// verified is the generation at which Verify last found the table
	// whole, 0 when none: while the kernel's generation reads the same,
	// Verify need not look again.
	verified uint32
	// cutPending: cutting the connections applied denies failed (see
	// Options.CutDenied); the next Sync tries again, whatever changed.
	cutPending bool
	// cutOnce: the next apply cuts the established connections its
	// ruleset denies, whatever Options.CutDenied says, because the
	// table was missing or edited (Verify found it so, or the first
	// replace found none): whatever was connected meanwhile was
	// accepted by no policy. It stays set until a cut succeeds.
	cutOnce bool
	// owners are the owners of the node's pod addresses at the last
	// release of those that changed owners (Syncer.release); nil until
	// the first sync that applied its rules.
	owners addrOwners
	// replaced: a full replace has succeeded (the first one checks
	// whether there was a table before it).
	replaced bool
	// links are the pod links last resolved, kept when resolving fails;
	// linkKey is what they were resolved for. linksStale: a resync or
	// RefreshLinks asks for resolving them again.
	links      []PodLink
	linkKey    linkKey
	linksStale bool
	// restorable is the ruleset a failed Restore took from applied, for
	// the next Restore to try again; nil when applied holds it or an
	// apply or Invalidate has superseded it.
	restorable *Ruleset
}

// LinkRefresh is how often moat-agent has the pod links resolved again
// when nothing they depend on changed (RefreshLinks), whether or not
// anything else syncs: routes can change without any object of the API
// (a pod's veth re-created for the same address), and a route lookup per
// pod address costs ~50 us on a loaded node (BenchmarkResolveLinks: 9-15
// ms for 220 addresses), too much for every sync.
const LinkRefresh = 10 * time.Second

// ChecksLinks reports whether the Syncer checks pod sources against the
// node's routes: it has a LinkResolver (Options.Links, or the kernel's
// for NewInterface).
func (s *Syncer) ChecksLinks() bool { return s.linkResolver() != nil }

// RefreshLinks makes the next Sync resolve the node's pod links again,
// also when nothing they depend on changed; that Sync patches the link
// sets alone if only they changed.
func (s *Syncer) RefreshLinks() {
	s.mu.Lock()
	s.linksStale = true
	s.mu.Unlock()
}

// ErrRoutesNotWatched is what WatchRoutes returns when the Syncer's
// LinkResolver cannot watch routes (no RouteWatcher).
var ErrRoutesNotWatched = errors.New("the pod link resolver does not watch routes")

// WatchRoutes has changed called whenever the node's host routes change
// while the node has no pod CIDRs (see RouteWatcher and PodLink.Unknown),
// after making the next Sync resolve the links again (RefreshLinks): a
// new pod's host route then fails it closed at the next sync instead of
// up to LinkRefresh later. With pod CIDRs, their sets already fail new
// pods closed, and nothing is called. It returns ErrRoutesNotWatched at
// once when the LinkResolver cannot watch.
func (s *Syncer) WatchRoutes(ctx context.Context, changed func(), failed func(error)) error {
	s.mu.Lock()
	w, ok := s.linkResolver().(RouteWatcher)
	s.mu.Unlock()
	if !ok {
		return ErrRoutesNotWatched
	}
	return w.WatchRoutes(ctx, func() {
		s.mu.Lock()
		noCIDRs := len(s.linkKey.cidrs) == 0
		if noCIDRs {
			s.linksStale = true
		}
		s.mu.Unlock()
		if noCIDRs {
			changed()
		}
	}, failed)
}

// New returns a Syncer for the table "inet moat" behind nft, which the
// caller creates with knftables.New(knftables.InetFamily, nft.Table) (or
// knftables.NewFake for tests).
func New(nft knftables.Interface, opts Options) *Syncer {
	if opts.Conntrack == nil {
		opts.Conntrack = noConntrack{}
		if _, ok := nft.(kernelNFT); ok {
			opts.Conntrack = NetlinkConntrack{}
		}
	}
	return &Syncer{nft: nft, opts: opts, cache: newBuildCache()}
}

// NewInterface opens the real table "inet moat" in the calling thread's
// network namespace.
func NewInterface() (knftables.Interface, error) {
	nft, err := knftables.New(knftables.InetFamily, Table)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return kernelNFT{nft, path}, nil
}

// kernelNFT is the Interface of NewInterface: knftables for everything
// but Run and Check, which hand nft knftables' text with each set's
// elements joined (run.go). A Syncer on it reads the counters and the
// nftables generation over netlink by default (Options.Counters,
// Options.Generation), knowing that its nft runs in the calling thread's
// namespace as those netlink sockets do.
type kernelNFT struct {
	knftables.Interface
	path string // of the nft binary
}

// Sync programs the node's part of prog. When nothing the node's
// ruleset is built from changed since the last sync that programmed one
// (buildInputs), Sync keeps that ruleset: the kernel holds it already.
//
// The node's pod links (Options.Links) are resolved again, also by a
// sync that keeps the ruleset, when the node's pods changed, on a resync
// and after RefreshLinks: routes may change without the Program (a pod's
// veth re-created). When only they changed, the sync patches the link
// sets alone.
func (s *Syncer) Sync(ctx context.Context, prog *policy.Program) (Result, error) {
	start := time.Now()
	in := readInputs(prog, s.opts.Node)
	owners := localOwners(prog, s.opts.Node, in)
	s.mu.Lock()
	links, linksErr := s.resolveLinks(ctx, prog)
	if s.applied != nil && in.equal(s.inputs) {
		rs := s.applied
		if !slices.Equal(links, rs.links) {
			rs = rs.withLinks(links)
			s.mu.Unlock()
			resolved := time.Since(start)
			res, err := s.apply(ctx, rs, in, owners)
			res.Build, res.Links, res.LinksErr = resolved, len(links), linksErr
			return res, err
		}
		res := Result{Applied: true, Reused: true, Stats: rs.Stats(), Warnings: rs.warnings, Build: time.Since(start), Links: len(links), LinksErr: linksErr}
		err := s.afterApply(ctx, rs, owners, &res, s.cutPending)
		s.mu.Unlock()
		return res, err
	}
	rs := buildCached(prog, s.opts.Node, s.cache, in)
	rs.links = links
	s.mu.Unlock()
	built := time.Since(start)
	res, err := s.apply(ctx, rs, in, owners)
	res.Build, res.Links, res.LinksErr = built, len(links), linksErr
	return res, err
}

// resolveLinks returns the node's pod links, asking the link resolver
// (none without one) when the node's pods, pod CIDRs or addresses changed
// since it last asked, or when a resync or RefreshLinks asked for it
// (Invalidate, InvalidateIfChanged); otherwise, and when resolving
// fails, the links last resolved. s.mu held.
func (s *Syncer) resolveLinks(ctx context.Context, prog *policy.Program) ([]PodLink, error) {
	r := s.linkResolver()
	if r == nil {
		return nil, nil
	}
	q, key := linkQuery(prog, s.opts.Node)
	if !s.linksStale && s.links != nil && key.equal(s.linkKey) {
		return s.links, nil
	}
	links, err := r.ResolveLinks(ctx, q)
	if err != nil {
		s.linksStale = true // the next sync tries again
		return s.links, fmt.Errorf("resolve the interfaces of node %s's pods: %w", s.opts.Node, err)
	}
	s.links, s.linkKey, s.linksStale = normaliseLinks(links), key, false
	return s.links, nil
}

// linkResolver is Options.Links or its default for s.nft (nil: none).
func (s *Syncer) linkResolver() LinkResolver {
	if s.opts.Links != nil {
		return s.opts.Links
	}
	if _, ok := s.nft.(kernelNFT); ok {
		return NetlinkLinks{}
	}
	return nil
}

// apply programs a ruleset built by Build from inputs in (nil: not
// known), for a Program whose node's pod addresses have owners (nil: not
// known, see Syncer.release). On an nft error the previous rules stay in force, the error is
// returned and the next apply replaces the whole table. When rules were
// applied but removing established connections failed, the Result has
// Applied set and the error says so.
func (s *Syncer) apply(ctx context.Context, rs *Ruleset, in *buildInputs, owners addrOwners) (Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restorable = nil
	return s.applyLocked(ctx, rs, in, owners)
}

// applyLocked is apply with s.mu held.
func (s *Syncer) applyLocked(ctx context.Context, rs *Ruleset, in *buildInputs, owners addrOwners) (Result, error) {
	res := Result{Stats: rs.Stats(), Warnings: rs.warnings}
	if s.checkNext {
		s.checkNext = false
		res.Check = s.check(ctx)
		if !res.Check.Unchanged() {
			s.applied, s.inputs = nil, nil
		}
	}
	var incErr error
	if s.applied != nil {
		start := time.Now()
		tx := s.nft.NewTransaction()
		diffTransaction(tx, s.applied, rs)
		res.Operations = tx.NumOperations()
		res.Diff = time.Since(start)
		if res.Operations == 0 {
			s.applied, s.inputs = rs, in
			s.counters = rs.counters
			res.Applied = true
			return res, s.afterApply(ctx, rs, owners, &res, s.cutPending)
		}
		if s.generationReader() != nil {
			markCommit(tx)
		}
		g0 := s.generation(ctx)
		start = time.Now()
		incErr = s.nft.Run(ctx, tx)
		res.Transaction = time.Since(start)
		if incErr == nil {
			// A patch leaves applied only on the table applied was:
			// if anyone committed since the last commit (g0 is not
			// left), they may have edited it.
			if g0 != s.left {
				g0 = 0
			}
			s.left = s.leftAfter(ctx, g0)
			s.applied, s.inputs = rs, in
			s.counters = rs.counters
			res.Applied = true
		}
	}
	if !res.Applied {
		// The kernel may not hold what we think (someone edited the
		// table, or this is the first sync): start from nothing.
		s.applied, s.inputs = nil, nil
		s.left = 0
		// What the old table counted carries over. Reading it is best
		// effort: without it the counters start from zero, which
		// readers of counters must expect after a reboot anyway.
		prev, prevErr := s.counterReader().ReadCounters(ctx)
		if !s.replaced && prevErr == nil && len(prev) == 0 {
			// The first replace finds no table (every table Moat writes
			// has the fixed counters): the node was unpoliced until now,
			// after a reboot or while no agent ran.
			s.cutOnce = true
		}
		start := time.Now()
		tx := s.nft.NewTransaction()
		fullTransaction(tx, rs, prev)
		res.Full = true
		res.Operations = tx.NumOperations()
		res.Diff += time.Since(start)
		g0 := s.generation(ctx)
		start = time.Now()
		err := s.nft.Run(ctx, tx)
		res.Transaction += time.Since(start)
		if err != nil {
			if incErr != nil {
				err = errors.Join(fmt.Errorf("patch: %w", incErr), fmt.Errorf("replace: %w", err))
			}
			return res, fmt.Errorf("program table inet %s on node %s: %w", Table, s.opts.Node, err)
		}
		s.left = s.leftAfter(ctx, g0)
		s.applied, s.inputs = rs, in
		s.counters = rs.counters
		s.replaced = true
		res.Applied = true
	}
	return res, s.afterApply(ctx, rs, owners, &res, true)
}

// cutDenied removes the established connections rs denies when
// Options.CutDenied asks for it, or once after the table was missing or
// edited (cutOnce), after rs was applied; s.mu held. When that fails, the
// cut is pending: the next Sync tries it again (with the rules then in
// force) even if nothing changed, since the connections the new rules
// deny keep flowing until it succeeds.
func (s *Syncer) cutDenied(ctx context.Context, rs *Ruleset, res *Result) error {
	// The cut after a loss waits for the replace that repairs the table
	// (or retries its failed cut): a patch, or a sync keeping the last
	// ruleset, may run on the edited table before that replace, and
	// connections accepted after such a cut would survive the repair.
	once := s.cutOnce && (res.Full || s.cutPending)
	if !s.opts.CutDenied && !once {
		return nil
	}
	res.CutAfterLoss = !s.opts.CutDenied
	n, err := s.opts.Conntrack.Delete(ctx, func(p Packet) bool { return !rs.Allows(p) })
	res.ConntrackDeleted = n
	s.cutPending = err != nil
	if err == nil && once {
		s.cutOnce = false
	}
	if err != nil {
		return fmt.Errorf("rules applied on node %s; removing denied established connections: %w", s.opts.Node, err)
	}
	return nil
}

// counterReader is Options.Counters or its default for s.nft; s.mu held.
func (s *Syncer) counterReader() CounterReader {
	if s.opts.Counters != nil {
		return s.opts.Counters
	}
	if _, ok := s.nft.(kernelNFT); ok {
		return NetlinkCounters{}
	}
	return NFTCounters{NFT: s.nft}
}

// shapeReader is Options.Shape or its default for s.nft (nil: none); s.mu
// held.
func (s *Syncer) shapeReader() ShapeReader {
	if s.opts.Shape != nil {
		return s.opts.Shape
	}
	if _, ok := s.nft.(kernelNFT); ok {
		return NetlinkShape{}
	}
	return nil
}

// generationReader is Options.Generation or its default for s.nft (nil:
// none); s.mu held.
func (s *Syncer) generationReader() GenerationReader {
	if s.opts.Generation != nil {
		return s.opts.Generation
	}
	if _, ok := s.nft.(kernelNFT); ok {
		return NetlinkGeneration{}
	}
	return nil
}

// generation reads the current generation, 0 when there is none or
// reading fails (the caller then knows nothing, which is safe: the next
// check replaces the table).
func (s *Syncer) generation(ctx context.Context) uint32 {
	r := s.generationReader()
	if r == nil {
		return 0
	}
	g, err := r.ReadGeneration(ctx)
	if err != nil {
		return 0
	}
	return g
}

// leftAfter is the generation a successful commit left when g0 was read
// just before it (0: not known): the one after g0 if the generation reads
// so now, else unknown (0), because someone else committed too.
func (s *Syncer) leftAfter(ctx context.Context, g0 uint32) uint32 {
	if g0 == 0 {
		return 0
	}
	if g1 := s.generation(ctx); g1 == nextGeneration(g0) {
		return g1
	}
	return 0
}

// check reads the generation for a sync after InvalidateIfChanged; s.mu
// held.
func (s *Syncer) check(ctx context.Context) *GenerationCheck {
	c := &GenerationCheck{Left: s.left}
	if r := s.generationReader(); r != nil {
		if c.Found, c.Err = r.ReadGeneration(ctx); c.Err != nil {
			c.Found = 0
		}
	}
	return c
}

// ErrNothingToRestore is what Restore returns when the Syncer holds no
// ruleset it programmed: no Sync succeeded yet, or the last one failed.
var ErrNothingToRestore = errors.New("no ruleset programmed to restore")

// Restore programs the ruleset last applied again, replacing the whole
// table in one transaction whatever the kernel holds, and cuts the
// established connections it denies when the table was found missing or
// edited (Verify), as the replace of a Sync does. It is for when nothing
// new can be compiled but the table must not stay lost: moat-agent calls
// it when its Node is gone (nothing to compile for) and Verify finds the
// table deleted or edited. The rules it restores are the ones that were in
// force before the loss: failing closed, not open. When it fails, the
// next Restore tries the same ruleset again.
func (s *Syncer) Restore(ctx context.Context) (Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs, in := s.applied, s.inputs
	if rs == nil {
		rs, in = s.restorable, nil
	}
	if rs == nil {
		return Result{}, fmt.Errorf("restore table inet %s on node %s: %w", Table, s.opts.Node, ErrNothingToRestore)
	}
	// With nothing applied, applyLocked replaces the whole table.
	s.applied, s.inputs = nil, nil
	s.checkNext = false
	// The owners of the pod addresses are those of the last release
	// (nil: nothing to release).
	res, err := s.applyLocked(ctx, rs, in, nil)
	if !res.Applied {
		s.restorable = rs
	} else {
		s.restorable = nil
	}
	return res, err
}

// Applied returns the ruleset last programmed, nil if none (or if the
// last attempt failed).
func (s *Syncer) Applied() *Ruleset {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

// Invalidate makes the next sync replace the whole table, whatever
// nftables' generation says: for the first sync of an agent and for the
// resyncs an operator asks for (moat-agent's SIGHUP). Periodic resyncs
// use InvalidateIfChanged.
//
// It also empties the build cache: callers invalidate when they compile
// from scratch (moat-agent's first sync and resyncs), which makes every
// entry stale (it is keyed by the old compiler's objects), and a full
// Build would otherwise hold the old entries beside the new ones until it
// ends.
func (s *Syncer) Invalidate() {
	s.mu.Lock()
	s.applied, s.inputs = nil, nil
	s.left = 0
	s.checkNext = false
	s.cache = newBuildCache()
	s.linksStale = true
	s.restorable = nil
	s.mu.Unlock()
}

// InvalidateIfChanged makes the next sync replace the whole table only if
// someone committed to nftables since the Syncer's last commit (or that
// cannot be known: see Options.Generation); otherwise it patches the
// table, which still holds what the Syncer last programmed. A periodic
// resync repairs edits made behind Moat's back this way without rewriting
// a table nobody touched: at 30,000 pods that replace is a transaction of
// ~75,000 operations (63,000 set elements), seconds of nft.
//
// The next sync builds the ruleset anew, never reusing the last one
// (Sync's Reused): a resync compiles from scratch to catch any drift of
// the incremental path, and what it compiled must reach the kernel. Like
// Invalidate it empties the build cache. It keeps the last ruleset, to
// patch against.
func (s *Syncer) InvalidateIfChanged() {
	s.mu.Lock()
	s.inputs = nil
	s.checkNext = true
	s.cache = newBuildCache()
	s.linksStale = true
	s.mu.Unlock()
}

// Remove deletes the table: the node stops enforcing. It is not an error
// when the table does not exist. moat-agent --cleanup calls it after the
// agents are gone: a table nobody updates any more would keep dropping
// every pod created afterwards as a forged source (its address is not in
// the pod sets).
func (s *Syncer) Remove(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	tx := s.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	if err := s.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("delete table inet %s on node %s: %w", Table, s.opts.Node, err)
	}
	s.applied, s.inputs = nil, nil
	s.left = 0
	s.counters = nil
	return nil
}

// commitMark is a chain each patch adds and deletes (markCommit).
const commitMark = "commit-mark"

// markCommit makes a patch change the ruleset whatever else it does. The
// kernel raises the generation only for a commit that changes something:
// a patch whose changes another writer made first (between the Syncer's
// reading of the generation and its commit) would raise nothing, and the
// other commit's generation would pass for the patch's, the other
// writer's edits for the Syncer's own.
func markCommit(tx *knftables.Transaction) {
	tx.Add(&knftables.Chain{Name: commitMark})
	tx.Delete(&knftables.Chain{Name: commitMark})
}
