package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/server"
)

// bannerBackend speaks first, as SSH, SMTP and MySQL do: on accept it
// writes size bytes (a line "220 banner\r\n" when size is 0) before reading
// anything, then waits for the client to close.
func bannerBackend(t *testing.T, size int64) net.Listener {
	t.Helper()
	return serveTCP(t, "tcp", "127.0.0.1:0", func(c net.Conn) {
		defer c.Close()
		if size == 0 {
			io.WriteString(c, "220 banner\r\n")
		} else {
			bw := bufio.NewWriterSize(c, 64<<10)
			if _, err := payload(bw, 77, size); err == nil {
				bw.Flush()
			}
		}
		io.Copy(io.Discard, c)
	})
}

func readBanner(c net.Conn) error {
	// konnectivity-client's connections ignore deadlines: closing the
	// connection is what ends a read that would wait forever.
	timer := time.AfterFunc(20*time.Second, func() { c.Close() })
	defer timer.Stop()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("banner: read %q: %w", line, err)
	}
	if line != "220 banner\r\n" {
		return fmt.Errorf("banner: got %q", line)
	}
	return nil
}

// leakFree waits until neither side holds a tunneled connection and checks
// that no packet was dropped for an unknown connection: with packets of
// one connection in order (DIAL_RSP before its first DATA, DATA before
// CLOSE) neither side ever sees data for a connection it does not know.
func leakFree(t *testing.T, regs map[string]*prometheus.Registry) {
	t.Helper()
	for name, reg := range regs {
		eventually(t, name+": moat_tunnel_open_connections back to 0", func() bool {
			return metricValue(t, reg, "moat_tunnel_open_connections", nil) == 0
		})
		if n := metricValue(t, reg, "moat_tunnel_bad_packets_total", map[string]string{"reason": "unknown_connection"}); n != 0 {
			t.Errorf("%s: %v packets for unknown connections", name, n)
		}
	}
}

// TestServerFirst: backends that write before they read get every byte,
// through the real konnectivity-client (gRPC frontend), through the KEP-2025
// listener, and through HTTP CONNECT with concurrent 1 MB transfers; and
// every open-connection gauge returns to 0 afterwards.
func TestServerFirst(t *testing.T) {
	p := newPKI(t)
	banner := bannerBackend(t, 0)
	bulk := bannerBackend(t, 1<<20)
	allowed, err := dest.NewAllowList([]string{banner.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	n := 200
	if testing.Short() {
		n = 50
	}

	t.Run("grpc", func(t *testing.T) {
		srvReg, agReg := prometheus.NewRegistry(), prometheus.NewRegistry()
		ps := startServer(t, p, serverOpts{cfg: server.Config{Registry: srvReg}})
		startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.Registry = agReg })
		eventually(t, "agent tunnel", ps.srv.Ready)
		failed := 0
		for i := range n {
			c, err := grpcDial(context.Background(), t, p, ps.udsPath, banner.Addr().String())
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			if err := readBanner(c); err != nil {
				failed++
				t.Logf("connection %d: %v", i, err)
			}
			c.Close()
		}
		if failed > 0 {
			t.Errorf("%d of %d connections through konnectivity-client lost the banner", failed, n)
		}
		leakFree(t, map[string]*prometheus.Registry{"server": srvReg, "agent": agReg})
	})

	t.Run("kep2025", func(t *testing.T) {
		srvReg, agReg := prometheus.NewRegistry(), prometheus.NewRegistry()
		ps := startServer(t, p, serverOpts{cfg: server.Config{Registry: srvReg, NodeToControlPlane: true, Allowed: allowed}})
		port := testenv.FreePort(t)
		tg, _ := dest.ParseTarget(fmt.Sprintf("%d:%s", port, banner.Addr().String()))
		startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
			c.Registry = agReg
			c.NodeToControlPlane = true
			c.BindAddress = net.ParseIP("127.0.0.1")
			c.Targets = []dest.Target{tg}
		})
		eventually(t, "agent tunnel", ps.srv.Ready)
		failed := 0
		for i := range n {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatal(err)
			}
			if err := readBanner(c); err != nil {
				failed++
				t.Logf("connection %d: %v", i, err)
			}
			c.Close()
		}
		if failed > 0 {
			t.Errorf("%d of %d connections through the KEP-2025 listener lost the banner", failed, n)
		}
		leakFree(t, map[string]*prometheus.Registry{"server": srvReg, "agent": agReg})
	})

	t.Run("http-connect-1MB", func(t *testing.T) {
		srvReg, agReg := prometheus.NewRegistry(), prometheus.NewRegistry()
		ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect, cfg: server.Config{Registry: srvReg}})
		startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.Registry = agReg })
		eventually(t, "agent tunnel", ps.srv.Ready)
		want, _ := payload(nil, 77, 1<<20)
		const conc = 100
		var wg sync.WaitGroup
		errs := make(chan error, conc)
		for i := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := udsConnect(ps.udsPath, bulk.Addr().String())
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(60 * time.Second))
				h := sha256.New()
				if _, err := io.CopyN(h, c, 1<<20); err != nil {
					errs <- fmt.Errorf("transfer %d: %w", i, err)
					return
				}
				if [32]byte(h.Sum(nil)) != want {
					errs <- fmt.Errorf("transfer %d: SHA-256 mismatch", i)
				}
			}()
		}
		wg.Wait()
		close(errs)
		var msgs []string
		for err := range errs {
			msgs = append(msgs, err.Error())
		}
		if len(msgs) > 0 {
			t.Errorf("%d of %d server-first 1 MB transfers were not byte-exact:\n%s", len(msgs), conc, strings.Join(msgs, "\n"))
		}
		leakFree(t, map[string]*prometheus.Registry{"server": srvReg, "agent": agReg})
	})
}
