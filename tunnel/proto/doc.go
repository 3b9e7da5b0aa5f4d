// Package proto holds Moat's view of the konnectivity wire protocol: the
// locally registered AgentService (the konnectivity-client module only ships
// ProxyService), validation of received packets, and Moat's protocol
// extension carried in unknown fields of Packet (field 9: origin of the
// connection, field 10: flow-control credit, field 11: half-close). The message types themselves are
// the generated ones of sigs.k8s.io/apiserver-network-proxy/konnectivity-client,
// never a copy, so a binary registers the package-less names only once.
package proto
