package mux

import (
	"runtime"
	"sync"
	"testing"

	"google.golang.org/grpc/mem"

	"github.com/moat-net/moat/tunnel/proto"
)

// gateStream lets the test release one SendMsg at a time, and reports the
// payload size of each DATA packet as its SendMsg starts.
type gateStream struct {
	entered chan int
	release chan struct{}
}

func (g *gateStream) SendMsg(m any) error {
	g.entered <- m.(*proto.OutData).Payload.Len()
	<-g.release
	return nil
}

func (g *gateStream) RecvMsg(any) error { select {} }

// waiters is the number of senders queued for l (a state the tests poll).
func (l *sendLock) waiters() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.small) + len(l.bulk)
}

func waitForWaiters(l *sendLock, n int) {
	for l.waiters() < n {
		runtime.Gosched()
	}
}

// A small packet waits only for the packet being sent, not behind a chunk
// of every busy connection: with one bulk packet on the
// stream and seven more, of seven other connections, waiting, a small
// DATA packet that arrived after them is the next one sent, and the bulk
// packets follow in their order.
func TestSmallPacketsPassWaitingBulk(t *testing.T) {
	g := &gateStream{entered: make(chan int), release: make(chan struct{})}
	s := New(g, Config{LocalOrigin: proto.OriginControlPlane})
	const bulk, small = 128 << 10, 100
	var wg sync.WaitGroup
	send := func(n int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.sendData(&Conn{}, &proto.OutData{ConnectID: 1, Payload: mem.BufferSlice{mem.SliceBuffer(make([]byte, n))}}); err != nil {
				t.Error(err)
			}
		}()
	}
	send(bulk)
	<-g.entered // the first bulk packet is on the stream
	for i := range 7 {
		send(bulk + i) // told apart by size
		waitForWaiters(&s.sendMu, i+1)
	}
	send(small)
	waitForWaiters(&s.sendMu, 8)
	var order []int
	for range 8 {
		g.release <- struct{}{}
		order = append(order, <-g.entered)
	}
	g.release <- struct{}{}
	wg.Wait()
	want := []int{small, bulk, bulk + 1, bulk + 2, bulk + 3, bulk + 4, bulk + 5, bulk + 6}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("sizes sent after the first bulk packet: %v, want %v", order, want)
		}
	}
}

// Small packets pass a waiting bulk one at most maxSmallRun in a row, so a
// stream of them cannot starve bulk transfers.
func TestSendLockBulkNotStarved(t *testing.T) {
	var l sendLock
	l.lock(false)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	take := func(bulk bool, name string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.lock(bulk)
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			l.unlock()
		}()
	}
	take(true, "bulk")
	waitForWaiters(&l, 1)
	const smalls = 40
	for i := range smalls {
		take(false, "small")
		waitForWaiters(&l, i+2)
	}
	l.unlock()
	wg.Wait()
	pos := -1
	for i, n := range order {
		if n == "bulk" {
			pos = i
		}
	}
	if pos != maxSmallRun {
		t.Fatalf("the bulk packet went out at position %d of %d, want %d (after maxSmallRun small ones)", pos, len(order), maxSmallRun)
	}
}
