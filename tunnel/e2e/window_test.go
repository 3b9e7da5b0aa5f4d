package e2e

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/server"
)

// A server --flow-control-window other than the agent's 1 MiB, smaller or
// larger, carries 4 MiB intact both ways: each daemon announces its window
// in the features handshake and the other starts its send credit there
// (TestMismatchedWindows in tunnel/mux holds the late-reader case exactly).
func TestFlowControlWindowNegotiated(t *testing.T) {
	p := newPKI(t)
	for _, w := range []int{64 << 10, 4 << 20} {
		t.Run(fmt.Sprint(w), func(t *testing.T) {
			sreg, areg := prometheus.NewRegistry(), prometheus.NewRegistry()
			ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect, cfg: server.Config{Window: w, Registry: sreg}})
			startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.Registry = areg })
			eventually(t, "agent tunnel", ps.srv.Ready)
			be := startBackend(t, "tcp", "127.0.0.1:0")
			for i, op := range []func(c net.Conn, n int64, seed uint64) error{upload, download} {
				c, _, err := connectDial(context.Background(), t, p, ps.frontAddr, be.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				if err := op(c, 4<<20, uint64(i)); err != nil {
					t.Errorf("window %d, transfer %d: %v", w, i, err)
				}
				c.Close()
			}
			overflow := map[string]string{"reason": "queue_overflow"}
			if n := metricValue(t, sreg, "moat_tunnel_bad_packets_total", overflow) + metricValue(t, areg, "moat_tunnel_bad_packets_total", overflow); n != 0 {
				t.Errorf("window %d: %v queue overflows", w, n)
			}
		})
	}
}
