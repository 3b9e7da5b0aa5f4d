package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/server"
)

// answerAtEOF is a backend that reads its client to EOF, then answers how
// many bytes it got and closes.
func answerAtEOF(t *testing.T) net.Listener {
	return serveTCP(t, "tcp", "127.0.0.1:0", func(c net.Conn) {
		defer c.Close()
		b, _ := io.ReadAll(c)
		fmt.Fprintf(c, "got %d bytes", len(b))
	})
}

// halfCloseExchange sends msg, shuts down c's write side and returns
// everything read until EOF.
func halfCloseExchange(t *testing.T, c net.Conn, cw interface{ CloseWrite() error }, msg string) string {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second)) // hang guard
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read after half-close: %v (got %q)", err, b)
	}
	return string(b)
}

// A client that sends its request and half-closes gets the answer through
// a Moat server and a Moat agent, on both paths: kube-apiserver's CONNECT
// (over mTLS, so its half-close is TLS close_notify) to a node backend, and
// a node client through the KEP-2025 listener to a control-plane backend
// (both lost the answer).
func TestHalfClose(t *testing.T) {
	p := newPKI(t)
	be := answerAtEOF(t)
	allowed, err := dest.NewAllowList([]string{be.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	sreg := prometheus.NewRegistry()
	ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect, cfg: server.Config{NodeToControlPlane: true, Allowed: allowed, Registry: sreg}})
	port := testenv.FreePort(t)
	tg, err := dest.ParseTarget(fmt.Sprintf("%d:%s", port, be.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	pa := startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
		c.NodeToControlPlane = true
		c.BindAddress = net.ParseIP("127.0.0.1")
		c.Targets = []dest.Target{tg}
	})
	eventually(t, "agent tunnel", ps.srv.Ready)

	c, _, err := connectDial(context.Background(), t, p, ps.frontAddr, be.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := c.(*bufConn).Conn.(interface{ CloseWrite() error })
	if got := halfCloseExchange(t, c, tc, "hello"); got != "got 5 bytes" {
		t.Errorf("control plane -> node: answer %q after the client's half-close", got)
	}
	c.Close()

	var nc net.Conn
	eventually(t, "KEP-2025 listener", func() bool {
		nc, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		return err == nil
	})
	if got := halfCloseExchange(t, nc, nc.(*net.TCPConn), "hello node"); got != "got 10 bytes" {
		t.Errorf("node -> control plane: answer %q after the client's half-close", got)
	}
	nc.Close()
	eventually(t, "both daemons release the connections", func() bool {
		return pa.a.Active() == 0 && metricValue(t, sreg, "moat_tunnel_open_connections", nil) == 0
	})
}

// With an agent that announces no extension (a stock agent), half-close is
// not negotiated: the client's EOF closes the connection as upstream does.
// The answer is lost, but the client is not left hanging.
func TestHalfCloseStockAgent(t *testing.T) {
	p := newPKI(t)
	be := answerAtEOF(t)
	ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect})
	startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.NoExtensions = true })
	eventually(t, "agent tunnel", ps.srv.Ready)
	c, _, err := connectDial(context.Background(), t, p, ps.frontAddr, be.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := halfCloseExchange(t, c, c.(*bufConn).Conn.(interface{ CloseWrite() error }), "hello"); got != "" {
		t.Errorf("answer %q through a stock agent: half-close was used without being negotiated", got)
	}
}
