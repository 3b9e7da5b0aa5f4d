package mux

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/mem"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/tunnel/grpcbuf"
	"github.com/moat-net/moat/tunnel/proto"
)

// chanStream is one end of an in-memory Packet stream pair. Messages go
// through the tunnel's codec and arrive in fresh 16 KiB buffers, as HTTP/2
// frames do: what a sender hands over is freed, never seen by the receiver.
type chanStream struct {
	in, out chan mem.BufferSlice
	done    chan struct{}
	once    *sync.Once
}

var testCodec = grpcbuf.Codec{Pool: grpcbuf.New()}

func pair() (*chanStream, *chanStream) {
	a2b, b2a := make(chan mem.BufferSlice, 1024), make(chan mem.BufferSlice, 1024)
	done, once := make(chan struct{}), &sync.Once{}
	return &chanStream{in: b2a, out: a2b, done: done, once: once}, &chanStream{in: a2b, out: b2a, done: done, once: once}
}

func (c *chanStream) SendMsg(m any) error {
	bs, err := testCodec.Marshal(m)
	if err != nil {
		return err
	}
	wire := bs.Materialize()
	bs.Free()
	var frames mem.BufferSlice
	for len(wire) > 0 {
		n := min(len(wire), 16<<10)
		frames = append(frames, mem.Copy(wire[:n], testCodec.Pool))
		wire = wire[n:]
	}
	select {
	case c.out <- frames:
		return nil
	case <-c.done:
		frames.Free()
		return io.EOF
	}
}

func (c *chanStream) RecvMsg(m any) error {
	select {
	case bs := <-c.in:
		defer bs.Free()
		return testCodec.Unmarshal(bs, m)
	case <-c.done:
		return io.EOF
	}
}

// Send and Recv are the Packet view of the stream, for tests that play a peer.
func (c *chanStream) Send(p *client.Packet) error { return c.SendMsg(p) }

func (c *chanStream) Recv() (*client.Packet, error) {
	var f proto.Frame
	if err := c.RecvMsg(&f); err != nil {
		return nil, err
	}
	if f.Packet == nil {
		p := proto.Data(f.Ext.Origin, f.ConnectID, f.Payload.Materialize())
		f.Payload.Free()
		return p, nil
	}
	return f.Packet, nil
}

func (c *chanStream) close() { c.once.Do(func() { close(c.done) }) }

// sessions returns a requester (control-plane side) and a dialer (node side)
// whose dials go to backends listening on loopback.
func sessions(t *testing.T, credit bool) (*Session, *Session) {
	a, b := pair()
	cfg := func(o proto.Origin) Config {
		return Config{LocalOrigin: o, Credit: credit, Window: 256 << 10, PeerWindow: 256 << 10, MaxQueue: 256 << 10,
			Dial: func(ctx context.Context, _ proto.Origin, addr string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			}}
	}
	req, dia := New(a, cfg(proto.OriginControlPlane)), New(b, cfg(proto.OriginNode))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); req.Run(ctx) }()
	go func() { defer wg.Done(); dia.Run(ctx) }()
	t.Cleanup(func() { cancel(); a.close(); wg.Wait() })
	return req, dia
}

// sink accepts connections and never reads from them.
func sink(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// echo echoes every connection.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// With credit, writing into a connection whose destination never reads
// blocks that writer only; another connection keeps working.
func TestCreditBlocksOnlyOneConnection(t *testing.T) {
	req, _ := sessions(t, true)
	ctx := context.Background()
	stuck, err := req.Dial(ctx, sink(t))
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan int64, 1)
	go func() {
		n, _ := stuck.Write(make([]byte, 64<<20))
		wrote <- int64(n)
	}()
	live, err := req.Dial(ctx, echo(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		msg := []byte{byte(i), 1, 2, 3}
		if _, err := live.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(live, got); err != nil || got[0] != byte(i) {
			t.Fatalf("echo %d: %v %v", i, got, err)
		}
	}
	select {
	case n := <-wrote:
		t.Fatalf("a 64 MiB write into a stalled reader completed (%d bytes): no backpressure", n)
	default:
	}
	stuck.Close()
	if n := <-wrote; n >= 64<<20 {
		t.Fatalf("wrote %d", n)
	}
}

// Without credit (a stock peer), a connection whose queue overflows is
// closed; the session and other connections survive.
func TestStockOverflowClosesOnlyThatConnection(t *testing.T) {
	req, dia := sessions(t, false)
	ctx := context.Background()
	c, err := req.Dial(ctx, sink(t))
	if err != nil {
		t.Fatal(err)
	}
	// Bypass Write's pacing: push straight into the dialer's queue as a
	// stock peer would, far beyond MaxQueue, without anyone draining it.
	dc := waitConn(t, dia, c.ID())
	for range 64 {
		dc.push(mem.BufferSlice{mem.SliceBuffer(make([]byte, 64<<10))})
	}
	if _, err := dc.take(); !errors.Is(err, ErrOverflow) && !errors.Is(err, ErrClosed) {
		// take may see data queued before the overflow; drain until the error.
		for err == nil {
			_, err = dc.take()
		}
		if !errors.Is(err, ErrOverflow) {
			t.Fatalf("want overflow, got %v", err)
		}
	}
	live, err := req.Dial(ctx, echo(t))
	if err != nil {
		t.Fatalf("session died with the overflowing connection: %v", err)
	}
	live.Write([]byte("ok"))
	got := make([]byte, 2)
	if _, err := io.ReadFull(live, got); err != nil || string(got) != "ok" {
		t.Fatalf("echo after overflow: %q %v", got, err)
	}
}

func waitConn(t *testing.T, s *Session, id int64) *Conn {
	for range 100 {
		s.mu.Lock()
		c := s.conns[key{proto.OriginControlPlane, id}]
		s.mu.Unlock()
		if c != nil {
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("connection %d never registered", id)
	return nil
}

// A dial for a closed port reports the dial error text to the requester.
func TestDialError(t *testing.T) {
	req, _ := sessions(t, true)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	_, err := req.Dial(context.Background(), addr)
	var de *DialError
	if !errors.As(err, &de) {
		t.Fatalf("want DialError, got %v", err)
	}
}

// TestCloseRspStopsLinger: a connection this side closed is released when
// the peer's CLOSE_RSP comes, not held (with its timer) for closeLinger.
func TestCloseRspStopsLinger(t *testing.T) {
	req, _ := sessions(t, true)
	c, err := req.Dial(context.Background(), echo(t))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		acked, linger := c.eof, c.linger
		c.mu.Unlock()
		if acked {
			if linger != nil && linger.Stop() {
				t.Fatal("closeLinger timer still pending after CLOSE_RSP")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no CLOSE_RSP")
		}
	}
	req.mu.Lock()
	_, held := req.conns[c.key]
	req.mu.Unlock()
	if held {
		t.Error("connection still registered after CLOSE_RSP")
	}
}
