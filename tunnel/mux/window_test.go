package mux

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/moat-net/moat/tunnel/proto"
)

// windowSessions returns a requester with receive window reqWin and a
// dialer with dialWin, each told the other's window as the features
// handshake does; the dialer's dials go to a loopback listener whose
// accepted sockets are returned on the channel.
func windowSessions(t *testing.T, reqWin, dialWin int) (*Session, *Session, string, <-chan net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	a, b := pair()
	dial := func(ctx context.Context, _ proto.Origin, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	req := New(a, Config{LocalOrigin: proto.OriginControlPlane, Credit: true, Window: reqWin, PeerWindow: dialWin, Dial: dial,
		Metrics: NewMetrics(prometheus.NewRegistry())})
	dia := New(b, Config{LocalOrigin: proto.OriginNode, Credit: true, Window: dialWin, PeerWindow: reqWin, Dial: dial,
		Metrics: NewMetrics(prometheus.NewRegistry())})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); req.Run(ctx) }()
	go func() { defer wg.Done(); dia.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		a.close()
		wg.Wait()
		ln.Close()
		for {
			select {
			case c := <-accepted:
				c.Close()
			default:
				return
			}
		}
	})
	return req, dia, ln.Addr().String(), accepted
}

// peerConn is the dialer's end of the requester's connection c.
func peerConn(t *testing.T, s *Session, c *Conn) *Conn {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.conns[c.key]
	if p == nil {
		t.Fatal("dialer has no such connection")
	}
	return p
}

// waitStalled is the late reader's cue: it returns once the sender has
// spent its credit and everything it sent has reached the receiver, once
// the writer finished (socket buffers took the rest), or once the receiver
// failed. Polling is only the wait; the deadline is a hang guard.
func waitStalled(t *testing.T, snd, rcv *Conn, wrote <-chan error) {
	t.Helper()
	guard := time.Now().Add(30 * time.Second)
	dir := Direction(snd.key.origin)
	for {
		snd.mu.Lock()
		spent := snd.credit == 0
		snd.mu.Unlock()
		rcv.mu.Lock()
		failed := rcv.err != nil
		rcv.mu.Unlock()
		sent := counter(t, snd.s.cfg.Metrics.Bytes.WithLabelValues(dir, "sent"))
		arrived := counter(t, rcv.s.cfg.Metrics.Bytes.WithLabelValues(dir, "received"))
		if failed || (spent && sent == arrived) || len(wrote) > 0 {
			return
		}
		if time.Now().After(guard) {
			t.Fatalf("hang guard: sender credit %d, sent %v, arrived %v", snd.credit, sent, arrived)
		}
		time.Sleep(time.Millisecond)
	}
}

// With different receive windows on the two sides (server
// --flow-control-window against the agent's fixed 1 MiB), 4 MiB cross
// intact in both directions to a reader that starts late: each side's
// send credit starts at the peer's window, not its own.
func TestMismatchedWindows(t *testing.T) {
	for _, w := range []struct{ req, dial int }{{64 << 10, 1 << 20}, {4 << 20, 1 << 20}} {
		req, dia, addr, accepted := windowSessions(t, w.req, w.dial)
		data := make([]byte, 4<<20)
		for i := range data {
			data[i] = byte(rand.Uint32())
		}

		// Requester to dialer: the dialer's socket side reads late.
		c, err := req.Dial(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		dst := <-accepted
		werr := make(chan error, 1)
		go func() { _, err := c.Write(data); werr <- err }()
		waitStalled(t, c, peerConn(t, dia, c), werr)
		got := make([]byte, len(data))
		dst.SetReadDeadline(time.Now().Add(30 * time.Second)) // hang guard
		if _, err := io.ReadFull(dst, got); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("windows %d/%d, requester to dialer: %v, intact=%v", w.req, w.dial, err, bytes.Equal(got, data))
		}
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
		c.Close()
		dst.Close()

		// Dialer to requester: the requester reads late.
		c, err = req.Dial(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		src := <-accepted
		go func() { _, err := src.Write(data); werr <- err }()
		waitStalled(t, peerConn(t, dia, c), c, werr)
		guard := time.AfterFunc(30*time.Second, func() { c.Close() }) // hang guard
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("windows %d/%d, dialer to requester: %v, intact=%v", w.req, w.dial, err, bytes.Equal(got, data))
		}
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
		guard.Stop()
		c.Close()
		src.Close()
	}
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
