package mux

import "sync"

// sendLock serialises the writers of a session's stream, handing it over
// to waiting small packets before waiting bulk ones. Every
// packet of an agent tunnel leaves in one order; with a plain mutex, which
// hands over in arrival order once contended, a new connection's DIAL_RSP
// or TLS handshake, or a keystroke, waited behind one chunk of every busy
// connection (8 bulk downloads x 128 KiB: 1.7 s per pass at 5 Mbit/s, and
// a TLS GET makes several passes). Handing over is explicit, so the order
// is exactly this: small packets first in arrival order, bulk packets in
// arrival order, and a bulk packet after maxSmallRun small ones in a row
// while it waits, so a stream of small packets cannot starve bulk ones.
//
// A connection's own packets are produced one after another (its reader
// sends its DATA in sequence; DIAL_RSP before the reader starts; FIN and
// close after its last DATA), so this reorders only different
// connections' packets.
type sendLock struct {
	mu          sync.Mutex
	held        bool
	small, bulk []chan struct{}
	// smallRun counts the small packets handed the stream in a row while
	// a bulk one waited.
	smallRun int
}

// maxSmallRun bounds the small packets that pass a waiting bulk packet in
// a row: at most 16 x 16 KiB.
const maxSmallRun = 16

// lock takes the stream; bulk says which waiters it queues among.
func (l *sendLock) lock(bulk bool) {
	l.mu.Lock()
	if !l.held {
		l.held = true
		l.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	if bulk {
		l.bulk = append(l.bulk, ch)
	} else {
		l.small = append(l.small, ch)
	}
	l.mu.Unlock()
	<-ch // handed over by unlock, still held
}

// unlock hands the stream to the next waiter, or frees it.
func (l *sendLock) unlock() {
	l.mu.Lock()
	var next chan struct{}
	switch {
	case len(l.small) > 0 && (len(l.bulk) == 0 || l.smallRun < maxSmallRun):
		next = l.small[0]
		l.small[0] = nil
		l.small = l.small[1:]
		if len(l.bulk) > 0 {
			l.smallRun++
		}
	case len(l.bulk) > 0:
		next = l.bulk[0]
		l.bulk[0] = nil
		l.bulk = l.bulk[1:]
		l.smallRun = 0
	default:
		l.held = false
	}
	l.mu.Unlock()
	if next != nil {
		close(next)
	}
}
