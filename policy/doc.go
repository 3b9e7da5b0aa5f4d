// Package policy is Moat's core: the model of a cluster as policy sees it
// (Cluster: namespaces, pods, nodes, NetworkPolicies and
// ClusterNetworkPolicies), their validation, their compilation into one
// Program, and the evaluation of flows against it. What a verdict must be
// is normative in docs/semantics.md; docs/architecture.md maps how this
// package computes it.
//
// Compile turns a snapshot into a Program; a Compiler keeps what it
// learned so that changes (pods relabelled, added or deleted, policies
// added, replaced or deleted) are applied in time proportional to what
// they change. The Program is immutable and read by the evaluator
// (Program.Evaluate, Program.Allowed) and by the nftables backend: per
// pod, per direction, the ordered Admin rules, the NetworkPolicy tier and
// the Baseline rules that apply to it, each rule's match a union of
// address sets and port sets.
//
// The compiler's cost grows with its input, not with pods times policies:
// selectors are answered from bitmaps of pods by label, every distinct peer
// is resolved once and shared (with its address set) by every rule that
// names it, and each tier is compiled per class of pods its selectors
// cannot tell apart rather than per pod. Objects that do not validate or
// carry fields Moat does not know are compiled fail closed, never wider.
package policy
