package e2e

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/server"
)

// TestSharedNodeTunnelWarned: a second tunnel bound to a node that already
// has one on the server (here a copy of node-a's certificate) is not
// refused, since a reconnect can come before the server notices the old
// tunnel end, but once it has stayed connected beside the first it is
// logged and counted (moat_tunnel_node_tunnels_shared_total): a copied
// certificate or stolen token would otherwise take a share of the node's
// connections unnoticed. Before, nothing said so.
func TestSharedNodeTunnelWarned(t *testing.T) {
	p := newPKI(t)
	reg := prometheus.NewRegistry()
	ps := startServer(t, p, serverOpts{cfg: server.Config{Registry: reg}})
	nodeA := agentCreds(t, p, issue(t, p, "system:node:node-a"))
	nodeB := agentCreds(t, p, issue(t, p, "system:node:node-b"))
	a := startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.Creds, c.AgentID = nodeA, "node-a" })
	b := startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.Creds, c.AgentID = nodeB, "node-b" })
	eventually(t, "node-a's and node-b's agents", func() bool { return a.a.Ready() && b.a.Ready() })
	copyA := startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.Creds, c.AgentID = nodeA, "node-a" })
	eventually(t, "the copy of node-a's agent", copyA.a.Ready)
	const shared = "moat_tunnel_node_tunnels_shared_total"
	eventually(t, shared, func() bool { return metricValue(t, reg, shared, nil) >= 1 })
	// node-a's two tunnels may both have seen the other within the grace;
	// node-b's, alone on its node, never counts.
	if n := metricValue(t, reg, shared, nil); n > 2 {
		t.Errorf("%s = %v, want 1 or 2 (node-a's tunnels)", shared, n)
	}
	if n := ps.srv.Backends(); n != 3 {
		t.Errorf("backends %d, want 3: the second tunnel of a node is not refused", n)
	}
}
