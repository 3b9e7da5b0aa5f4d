package e2e

import (
	"context"
	"net"
	"testing"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
)

// TestDrain: after an agent sends DRAIN, new dials go to the other agent.
func TestDrain(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect})
	a := startAgent(t, p, ps.agentAddr, nil)
	b := startAgent(t, p, ps.agentAddr, nil)
	eventually(t, "two agents", func() bool { return ps.srv.Backends() == 2 })
	a.a.Drain()
	eventually(t, "DRAIN received", func() bool { return ps.srv.DrainingBackends() == 1 })
	be := startBackend(t, "tcp", "127.0.0.1:0")
	var conns []net.Conn
	for range 20 {
		c, _, err := connectDial(context.Background(), t, p, ps.frontAddr, be.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	eventually(t, "connections on the non-draining agent", func() bool { return b.a.Active() == 20 })
	if n := a.a.Active(); n != 0 {
		t.Fatalf("draining agent got %d new connections", n)
	}
	for _, c := range conns {
		c.Close()
	}
}
