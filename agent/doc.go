// Package agent keeps one node's nftables table "inet moat" in step with the
// cluster's NetworkPolicies and ClusterNetworkPolicies.
//
// Informers with stripped caches feed one rate-limited workqueue; each sync
// compiles the caches (incrementally when the change allows it) with the
// policy package and hands the Program to a Dataplane (nft.Syncer), which
// applies the difference in one transaction. One agent at a time, elected
// through a Lease, writes ClusterNetworkPolicy status and policy Events.
//
// The package parses no flags and serves no HTTP: cmd/moat-agent/app builds
// the Config from its options and serves Healthy, Ready and Metrics.
// Behaviour, metrics and failure handling are described in docs/agent.md.
package agent
