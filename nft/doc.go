// Package nft turns a compiled policy.Program into the nftables ruleset of
// one node (table "inet moat") and keeps the kernel in step with it: a full
// replace or a diff, each in one transaction, and removal of established
// flows the new rules deny. What the table guarantees is in
// docs/semantics.md ("Dataplane guarantees").
//
// The table: base chains accept established flows and send every new
// connection to a dispatch chain, whose verdict maps jump to the source
// pod's egress chain and the destination pod's ingress chain. Only the
// output hook (packets the node sends) lets the node's addresses past
// dispatch as node-local; forward and input judge a packet carrying one
// like any other, because from outside it is forged. forward and input
// drop a new connection whose source is in the node's pod CIDRs but is no
// known pod's address (forged: it would miss the egress chain that
// dispatch finds by source), and forward one whose destination is such
// an address (a pod the agent has not learnt yet, which would meet no
// ingress chain). A pod's packet to its own address is judged like any
// other (in the node's hooks it is the Service hairpin, subject to
// ClusterNetworkPolicy); NetworkPolicy chains accept it first, as a pod
// cannot block access to itself. forward also drops what routing never
// forwards (link-local, broadcast, multicast, router messages): on a bridge
// CNI that is pod-to-pod traffic no ingress map can judge. A pod's
// chains hold its tiers in order (the Admin tier's chain reaches the
// tiers after it through a second, per-pod verdict map, so that it can be
// shared by pods whose other tiers differ); a rule matches the remote address in a
// set shared by every rule with the same peer, with its ports beside it.
// Every drop counts into a named counter object per policy rule
// (Syncer.Counters reads them back), which patches never touch and a full
// replace carries over.
//
// Consecutive rules of a tier with one outcome form a run, which a chain
// matches either by one lookup per distinct peer (shared sets) or, past
// 32 of them, by a union: sets of the run's own that match its address x
// port boxes in one lookup per kind. A union over its element budget is
// split by port list: peers on equal ports merge into one lookup of their
// addresses' union (the run's rules share a verdict, comment and counter,
// so the merge decides every packet as the lookups did); the fat groups
// take such lookups, and the rest a union, or every group a lookup when
// even that is over budget. A short run merges the same way the peers
// that no other run matches; peers other runs match keep their shared
// sets, which are not copied. A chain's length, which every new
// connection walks, grows with a run's port lists, not with its policies.
// See docs/architecture.md ("The nftables backend").
//
// Build computes a Ruleset, a small intermediate form that can be diffed
// against what is programmed, rendered into knftables operations and
// interpreted in Go (to pick the conntrack entries to remove, and to test
// the translation without a kernel). Syncer applies it; it builds only
// when the Program changed something the node's ruleset is built from
// (buildInputs), and its build cache keeps what each DirPolicy planned and
// built while the DirPolicy lives (buildCache, chainMemo).
package nft
