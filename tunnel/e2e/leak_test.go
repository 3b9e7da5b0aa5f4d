package e2e

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"

	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/server"
)

// A kube-apiserver whose tunnel goes away while it writes into a
// destination that never reads leaves no connection behind: the server's
// handler, blocked waiting for credit, notices the stream's end, and the
// agent gives up flushing to the silent destination after the close
// linger (both held the connection forever).
func TestSilentDestinationReleasedWhenClientLeaves(t *testing.T) {
	p := newPKI(t)
	sreg := prometheus.NewRegistry()
	ps := startServer(t, p, serverOpts{cfg: server.Config{Registry: sreg}})
	pa := startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.CloseLinger = 100 * time.Millisecond })
	eventually(t, "agent tunnel", ps.srv.Ready)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c // never read
		}
	}()
	tctx, tcancel := context.WithCancel(context.Background())
	defer tcancel()
	tun, err := kclient.CreateSingleUseGrpcTunnelWithContext(context.Background(), tctx, ps.frontAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(t, p))))
	if err != nil {
		t.Fatal(err)
	}
	c, err := tun.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	dst := <-held
	defer dst.Close()
	go func() {
		buf := make([]byte, 1<<20)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	// Cue (not an assertion): the server's bytes to the agent stop growing,
	// so its handler waits for credit. The fixed code passes whatever the
	// moment; the old one leaked only when cut while waiting.
	sent := func() float64 {
		return metricValue(t, sreg, "moat_tunnel_bytes_total", map[string]string{"way": "sent"})
	}
	guard := time.Now().Add(30 * time.Second)
	for last, still := -1.0, 0; still < 50; {
		if time.Now().After(guard) {
			t.Fatal("hang guard: the writer never stalled")
		}
		time.Sleep(10 * time.Millisecond)
		if n := sent(); n == last && n >= 1<<20 {
			still++
		} else {
			last, still = n, 0
		}
	}
	tcancel() // kube-apiserver's tunnel goes away
	eventually(t, "server and agent release the connection", func() bool {
		return metricValue(t, sreg, "moat_tunnel_open_connections", nil) == 0 && pa.a.Active() == 0
	})
}
