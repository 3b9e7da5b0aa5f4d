package e2e

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/moat-net/moat/tunnel/server"
)

// roundRobin is a TCP load balancer in front of several servers.
func roundRobin(t *testing.T, backends ...string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var next atomic.Uint64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backends[next.Add(1)%uint64(len(backends))])
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, b)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(b, c); b.Close() }()
			go func() { defer wg.Done(); io.Copy(c, b); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestServerCount: behind a load balancer the agent keeps connecting until
// it has one tunnel to each of serverCount servers, so every server can
// reach the node.
func TestServerCount(t *testing.T) {
	p := newPKI(t)
	s1 := startServer(t, p, serverOpts{cfg: server.Config{ServerID: "one", ServerCount: 2}})
	s2 := startServer(t, p, serverOpts{cfg: server.Config{ServerID: "two", ServerCount: 2}})
	lb := roundRobin(t, s1.agentAddr, s2.agentAddr)
	pa := startAgent(t, p, lb, nil)
	eventually(t, "a tunnel to each server", func() bool { return s1.srv.Backends() == 1 && s2.srv.Backends() == 1 })
	if n := pa.a.Tunnels(); n != 2 {
		t.Fatalf("agent has %d tunnels, want 2", n)
	}
	hs := httpBackend(t)
	for _, s := range []*proxyServer{s1, s2} {
		if got := httpGetVia(t, func(ctx context.Context, addr string) (net.Conn, error) {
			return grpcDial(ctx, t, p, s.frontAddr, addr)
		}, hs.URL+"/x"); got != "hello /x" {
			t.Fatalf("via %s: %q", s.frontAddr, got)
		}
	}
}
