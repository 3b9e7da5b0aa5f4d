package mux

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-net/moat/tunnel/grpcbuf"
	"github.com/moat-net/moat/tunnel/proto"
)

// countingPool counts buffers out of the pool, so that a test can check
// every buffer handed between socket, mux and transport came back.
type countingPool struct {
	*grpcbuf.Pool
	out atomic.Int64
}

func (p *countingPool) Get(n int) *[]byte { p.out.Add(1); return p.Pool.Get(n) }
func (p *countingPool) Put(b *[]byte)     { p.out.Add(-1); p.Pool.Put(b) }

// Data read from sockets travels in pooled buffers that change hands
// (reader -> transport, transport -> queue -> writer) without copies; the
// bytes arrive intact and every buffer is returned once written.
func TestBuffersComeBack(t *testing.T) {
	pool := &countingPool{Pool: grpcbuf.New()}
	a, b := pair()
	req := New(a, Config{LocalOrigin: proto.OriginControlPlane, Credit: true, Window: 256 << 10, PeerWindow: 256 << 10, Pool: pool})
	dia := New(b, Config{LocalOrigin: proto.OriginNode, Credit: true, Window: 256 << 10, PeerWindow: 256 << 10, Pool: pool, Dial: tcpDial})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { req.Run(ctx); done <- struct{}{} }()
	go func() { dia.Run(ctx); done <- struct{}{} }()
	addr := echo(t)
	want := make([]byte, 3<<20+12345)
	rand.Read(want)
	for range 3 {
		c, err := req.Dial(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c.Write(want) // copied into pooled buffers, then handed over
		}()
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("echo through the tunnel changed the bytes (%v)", err)
		}
		c.Close()
	}
	for i := 0; req.Active()+dia.Active() > 0; i++ {
		if i > 1000 {
			t.Fatalf("connections still open: %d requester, %d dialer", req.Active(), dia.Active())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	a.close()
	<-done
	<-done
	if n := pool.out.Load(); n != 0 {
		t.Fatalf("%d pooled buffers never returned", n)
	}
}
