package mux

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/tunnel/proto"
)

// halfCloseSessions returns a requester and a dialer session over one
// stream, with the half-close extension on both or on neither.
func halfCloseSessions(t *testing.T, halfClose bool) (*Session, *Session) {
	a, b := pair()
	cfg := func(o proto.Origin) Config {
		return Config{LocalOrigin: o, Credit: true, HalfClose: halfClose, Dial: tcpDial}
	}
	req, dia := New(a, cfg(proto.OriginControlPlane)), New(b, cfg(proto.OriginNode))
	run(t, a, req)
	run(t, b, dia)
	return req, dia
}

// answerAtEOF is a destination that reads its client to EOF and only then
// answers how many bytes it got, then closes: the shape of a request that
// the client ends with shutdown(SHUT_WR) (nc -N, HTTP/1.0-style clients,
// tar streams).
func answerAtEOF(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				fmt.Fprintf(c, "got %d bytes", len(b))
			}()
		}
	}()
	return ln.Addr().String()
}

// local returns both ends of a loopback TCP connection.
func local(t *testing.T) (client, server *net.TCPConn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv := <-accepted
	if srv == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { cl.Close(); srv.Close() })
	return cl.(*net.TCPConn), srv.(*net.TCPConn)
}

// released waits (bounded) until neither session holds a connection.
func released(t *testing.T, ss ...*Session) {
	t.Helper()
	for i := 0; ; i++ {
		open := int64(0)
		for _, s := range ss {
			open += s.Active()
		}
		if open == 0 {
			return
		}
		if i > 1000 {
			t.Fatalf("%d connections still open", open)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A client that sends its request and half-closes gets the answer when both
// sides speak half-close: its EOF travels as FIN and reaches the destination
// as a shutdown of the write side, not a close. Without the extension (a
// stock peer) the EOF closes the connection, as upstream does, and the
// answer is lost; either way both sessions release the connection.
func TestHalfCloseRequesterSide(t *testing.T) {
	for _, hc := range []bool{true, false} {
		t.Run(fmt.Sprintf("halfclose=%v", hc), func(t *testing.T) {
			req, dia := halfCloseSessions(t, hc)
			c, err := req.Dial(context.Background(), answerAtEOF(t))
			if err != nil {
				t.Fatal(err)
			}
			cl, srv := local(t)
			go Pipe(srv, c)
			if _, err := io.WriteString(cl, "hello"); err != nil {
				t.Fatal(err)
			}
			if err := cl.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			cl.SetReadDeadline(time.Now().Add(30 * time.Second)) // hang guard
			got, err := io.ReadAll(cl)
			if err != nil {
				t.Fatalf("read: %v (got %q)", err, got)
			}
			want := "got 5 bytes"
			if !hc {
				want = ""
			}
			if string(got) != want {
				t.Fatalf("answer %q, want %q", got, want)
			}
			released(t, req, dia)
		})
	}
}

// The other way round: the destination finishes sending first
// (shutdown(SHUT_WR) after a greeting) and keeps reading; what the client
// sends after seeing EOF still reaches it.
func TestHalfCloseDialerSide(t *testing.T) {
	req, dia := halfCloseSessions(t, true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gotByDest := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "greeting")
		c.(*net.TCPConn).CloseWrite()
		b, _ := io.ReadAll(c)
		gotByDest <- string(b)
	}()
	c, err := req.Dial(context.Background(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cl, srv := local(t)
	go Pipe(srv, c)
	cl.SetDeadline(time.Now().Add(30 * time.Second)) // hang guard
	greeting, err := io.ReadAll(cl)
	if err != nil || string(greeting) != "greeting" {
		t.Fatalf("greeting %q, %v", greeting, err)
	}
	if _, err := io.WriteString(cl, "after your EOF"); err != nil {
		t.Fatalf("write after the destination's half-close: %v", err)
	}
	cl.CloseWrite()
	if got := <-gotByDest; got != "after your EOF" {
		t.Fatalf("destination got %q", got)
	}
	released(t, req, dia)
}

// Many half-closed exchanges at once on one stream, with payloads larger
// than a window: every answer arrives and is exact, and nothing is left
// open (FIN follows the connection's last DATA, never overtakes it).
func TestHalfCloseConcurrent(t *testing.T) {
	req, dia := halfCloseSessions(t, true)
	addr := answerAtEOF(t)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		cl, srv := local(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := req.Dial(context.Background(), addr)
			if err != nil {
				srv.Close()
				errs <- err
				return
			}
			go Pipe(srv, c)
			n := (i + 1) * 200 << 10
			cl.SetDeadline(time.Now().Add(60 * time.Second)) // hang guard
			if _, err := cl.Write(make([]byte, n)); err != nil {
				errs <- err
				return
			}
			cl.CloseWrite()
			got, err := io.ReadAll(cl)
			if want := fmt.Sprintf("got %d bytes", n); err != nil || string(got) != want {
				errs <- fmt.Errorf("connection %d: %q %v, want %q", i, got, err, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	released(t, req, dia)
}

// A DIAL_REQ the dialer cannot act on (no address, a protocol other than
// tcp) is answered with a DIAL_RSP error carrying its random, so the
// requester fails at once instead of waiting out its dial timeout.
func TestMalformedDialReqAnswered(t *testing.T) {
	a, peer := pair()
	dia := New(a, Config{LocalOrigin: proto.OriginNode, Dial: tcpDial})
	run(t, a, dia)
	reqs := map[int64]*client.DialRequest{
		7: {Protocol: "udp", Address: "192.0.2.1:53", Random: 7},
		8: {Protocol: "tcp", Address: "", Random: 8},
		9: {Protocol: "", Address: "192.0.2.1:22", Random: 9},
	}
	for _, r := range reqs {
		if err := peer.Send(&client.Packet{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{DialRequest: r}}); err != nil {
			t.Fatal(err)
		}
	}
	guard := time.AfterFunc(30*time.Second, peer.close) // hang guard
	defer guard.Stop()
	for len(reqs) > 0 {
		p, err := peer.Recv()
		if err != nil {
			t.Fatalf("no DIAL_RSP for %d malformed DIAL_REQ: %v", len(reqs), err)
		}
		r := p.GetDialResponse()
		if p.Type != client.PacketType_DIAL_RSP || reqs[r.Random] == nil {
			t.Fatalf("unexpected %v", p)
		}
		if r.Error == "" || r.ConnectID != 0 {
			t.Errorf("DIAL_REQ %v answered %v, want an error", reqs[r.Random], r)
		}
		if e, err := proto.GetExt(p); err != nil || e.Origin != proto.OriginControlPlane {
			t.Errorf("DIAL_RSP origin %v %v, want the request's", e.Origin, err)
		}
		delete(reqs, r.Random)
	}
}
