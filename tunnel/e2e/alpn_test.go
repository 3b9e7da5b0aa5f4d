package e2e

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net/http"
	"testing"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
)

// The http-connect frontend offers only HTTP/1.1 in ALPN: CONNECT hands the
// socket over, which HTTP/2 cannot, so a client offering h2 first still
// gets a working tunnel (it negotiated h2, the agent dialed,
// and the answer was 500 "cannot be hijacked").
func TestHTTPConnectOffersOnlyHTTP1(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{mode: options.ModeHTTPConnect})
	startAgent(t, p, ps.agentAddr, nil)
	eventually(t, "agent tunnel", ps.srv.Ready)
	be := startBackend(t, "tcp", "127.0.0.1:0")
	cfg := clientTLS(t, p)
	cfg.NextProtos = []string{"h2", "http/1.1"}
	nc, err := tls.Dial("tcp", ps.frontAddr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.ConnectionState().NegotiatedProtocol; got != "http/1.1" {
		t.Fatalf("ALPN negotiated %q, want http/1.1", got)
	}
	fmt.Fprintf(nc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", be.Addr(), be.Addr())
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	if err := download(&bufConn{Conn: nc, r: br}, 1<<20, 7); err != nil {
		t.Fatal(err)
	}
}
