package e2e

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-net/moat/tunnel/agent"
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

// TestDuplicateOnlyRoundsBackOff: with one of serverCount servers down, an
// agent's every attempt reaches a server it already has a tunnel to. Such
// a round counts as a failure, so the agent backs off instead of opening
// several connections (a TLS handshake and a token review each) per sync
// interval for as long as the server is down. Slowness only lowers the
// count, so the bound cannot fail a correct agent on a busy machine.
func TestDuplicateOnlyRoundsBackOff(t *testing.T) {
	p := newPKI(t)
	s := startServer(t, p, serverOpts{cfg: server.Config{ServerID: "one", ServerCount: 2}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			b, err := net.Dial("tcp", s.agentAddr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(b, c); b.Close() }()
			go func() { io.Copy(c, b); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	pa := startAgent(t, p, ln.Addr().String(), func(c *agent.Config) {
		c.SyncInterval = 50 * time.Millisecond
		c.MaxBackoff = time.Hour
	})
	eventually(t, "the tunnel to the one server up", func() bool { return s.srv.Backends() == 1 })
	start := accepted.Load()
	time.Sleep(3 * time.Second)
	// Backing off from 50 ms, the agent makes at most 6 rounds of 6
	// attempts in 3 s; reconnecting every interval it made ~100 or more.
	if n := accepted.Load() - start; n > 60 {
		t.Errorf("%d connections in 3 s to a server already connected: the agent does not back off", n)
	}
	if pa.a.Tunnels() != 1 {
		t.Errorf("agent has %d tunnels, want 1", pa.a.Tunnels())
	}
}
