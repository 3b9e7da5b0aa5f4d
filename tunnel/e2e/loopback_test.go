package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/server"
)

func TestMain(m *testing.M) {
	if f := os.Getenv("MOAT_TUNNEL_BACKEND_HELPER"); f != "" {
		backendHelper(f) // a child process serving as the backend; never returns
	}
	if f := os.Getenv("MOAT_TUNNEL_NULL_SERVER"); f != "" {
		nullServerHelper(f) // the null tunnel's server (nulltunnel_test.go); never returns
	}
	if a := os.Getenv("MOAT_TUNNEL_NULL_AGENT"); a != "" {
		nullAgentHelper(a) // the null tunnel's agent; never returns
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*loggingT).flushDaemon"),
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}

func httpBackend(t *testing.T) *httptest.Server {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	}))
	t.Cleanup(hs.Close)
	return hs
}

func httpGetVia(t *testing.T, dial func(ctx context.Context, addr string) (net.Conn, error), url string) string {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) }, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestKonnectivityClient drives the real konnectivity-client library, as
// kube-apiserver does, through Moat's server and agent to an HTTP server,
// over the mTLS TCP frontend and over the Unix socket.
func TestKonnectivityClient(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{})
	startAgent(t, p, ps.agentAddr, nil)
	eventually(t, "agent tunnel", ps.srv.Ready)
	hs := httpBackend(t)
	for _, front := range []string{ps.frontAddr, ps.udsPath} {
		got := httpGetVia(t, func(ctx context.Context, addr string) (net.Conn, error) {
			return grpcDial(ctx, t, p, front, addr)
		}, hs.URL+"/pods/log")
		if got != "hello /pods/log" {
			t.Fatalf("via %s: got %q", front, got)
		}
	}
}

// TestHTTPConnect does the same through the HTTP CONNECT frontend and checks
// the error statuses.
func TestHTTPConnect(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect})
	ctx := context.Background()

	// No agent yet: 500.
	_, resp, err := connectDial(ctx, t, p, ps.frontAddr, "127.0.0.1:1")
	if err == nil || resp == nil || resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("no agent: want 500, got %v %v", resp, err)
	}

	startAgent(t, p, ps.agentAddr, nil)
	eventually(t, "agent tunnel", ps.srv.Ready)
	hs := httpBackend(t)
	got := httpGetVia(t, func(ctx context.Context, addr string) (net.Conn, error) {
		c, _, err := connectDial(ctx, t, p, ps.frontAddr, addr)
		return c, err
	}, hs.URL+"/x")
	if got != "hello /x" {
		t.Fatalf("got %q", got)
	}

	// Refused destination: 502 with the error text.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().String()
	ln.Close()
	_, resp, err = connectDial(ctx, t, p, ps.frontAddr, closed)
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("refused: want 502, got %v %v", resp, err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "refused") {
		t.Fatalf("502 body %q does not carry the dial error", body)
	}
}

func sizeFor(t *testing.T, full int64) int64 {
	if testing.Short() {
		return full / 16
	}
	return full
}

// TestTransfer100MB moves 100 MB each way through both frontends and checks
// SHA-256 on the far side.
func TestTransfer100MB(t *testing.T) {
	p := newPKI(t)
	for _, mode := range []string{options.ModeGRPC, options.ModeHTTPConnect} {
		t.Run(mode, func(t *testing.T) {
			ps := startServer(t, p, serverOpts{mode: mode})
			startAgent(t, p, ps.agentAddr, nil)
			eventually(t, "agent tunnel", ps.srv.Ready)
			be := startBackend(t, "tcp", "127.0.0.1:0")
			n := sizeFor(t, 100<<20)
			dial := dialer(t, p, mode, ps)
			ctx := context.Background()
			c, err := dial(ctx, be.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			if err := upload(c, n, 1); err != nil {
				t.Fatal(err)
			}
			c.Close()
			c, err = dial(ctx, be.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			if err := download(c, n, 2); err != nil {
				t.Fatal(err)
			}
			c.Close()
		})
	}
}

func dialer(t testing.TB, p *pki, mode string, ps *proxyServer) func(ctx context.Context, addr string) (net.Conn, error) {
	if mode == options.ModeHTTPConnect {
		return func(ctx context.Context, addr string) (net.Conn, error) {
			c, _, err := connectDial(ctx, t, p, ps.frontAddr, addr)
			return c, err
		}
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return grpcDial(ctx, t, p, ps.frontAddr, addr)
	}
}

// TestStalledReader: a client that stops reading must not slow another
// connection on the same agent tunnel. Without per-connection flow control
// the second transfer never finishes.
func TestStalledReader(t *testing.T) {
	p := newPKI(t)
	for _, mode := range []string{options.ModeGRPC, options.ModeHTTPConnect} {
		t.Run(mode, func(t *testing.T) {
			ps := startServer(t, p, serverOpts{mode: mode})
			startAgent(t, p, ps.agentAddr, nil)
			eventually(t, "agent tunnel", ps.srv.Ready)
			be := startBackend(t, "tcp", "127.0.0.1:0")
			dial := dialer(t, p, mode, ps)
			ctx := context.Background()
			stalled, err := dial(ctx, be.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer stalled.Close()
			// Ask for far more than all buffers together, then never read.
			if _, err := stalled.Write(header('D', 1<<30, 9)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for i := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := dial(ctx, be.Addr().String())
					if err != nil {
						errs <- err
						return
					}
					defer c.Close()
					errs <- download(c, 16<<20, uint64(i))
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(90 * time.Second):
				t.Fatal("transfers beside a stalled reader did not finish: head-of-line blocking")
			}
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestUpstreamProtocol runs transfers with an agent that announces no
// extension: the agent stream carries upstream's protocol exactly. Without
// credit a connection whose consumer falls MaxQueue behind is closed (see
// mux's tests); the queues here are large so that CPU contention cannot
// trigger that.
func TestUpstreamProtocol(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect, cfg: server.Config{MaxQueue: 512 << 20}})
	startAgent(t, p, ps.agentAddr, func(c *agent.Config) { c.NoExtensions = true; c.MaxQueue = 512 << 20 })
	eventually(t, "agent tunnel", ps.srv.Ready)
	be := startBackend(t, "tcp", "127.0.0.1:0")
	n := sizeFor(t, 64<<20)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _, err := connectDial(context.Background(), t, p, ps.frontAddr, be.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			if i%2 == 0 {
				errs <- upload(c, n, uint64(i))
			} else {
				errs <- download(c, n, uint64(i))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
