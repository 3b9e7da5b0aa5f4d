// Package agent keeps one node's nftables table "inet moat" in step with the
// cluster's NetworkPolicies and ClusterNetworkPolicies.
//
// Informers whose caches hold the policy model's form of each object feed
// one rate-limited workqueue; each sync stages the objects that changed in
// a policy.Compiler scoped to this node (a full compilation only on the
// first sync, on --resync, and when selectors come to read a new label
// key) and hands the Program to a Dataplane (nft.Syncer), which applies
// the difference in one transaction. One agent at a time, elected through
// a Lease, writes ClusterNetworkPolicy status and policy Events.
//
// The package parses no flags and serves no HTTP: cmd/moat-agent/app builds
// the Config from its options and serves Healthy, Ready and Metrics.
// Behaviour, metrics and failure handling are described in docs/agent.md.
package agent
