package mux

import (
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/mem"

	"github.com/moat-net/moat/tunnel/proto"
)

// ErrOverflow closes a connection whose peer sent more than its queue holds.
var ErrOverflow = errors.New("receive queue overflow: reader stalled or peer ignored the window")

// ErrClosed is returned by a connection after Close.
var ErrClosed = errors.New("connection closed")

// closeLinger is how long a closed requester connection keeps its ID
// reserved while it waits for the peer's CLOSE_RSP.
const closeLinger = 30 * time.Second

// deadliner is a local writer whose writes can be bounded (a socket).
type deadliner interface{ SetWriteDeadline(time.Time) error }

// flushBound bounds a write of a peer-closed connection's remaining data to
// the local side: a reader that takes nothing for Config.CloseLinger is
// given up on, as the kernel gives up on an orphaned socket, instead of
// holding the connection, its queue and the socket forever.
func (c *Conn) flushBound(w io.Writer) {
	if d, ok := w.(deadliner); ok {
		_ = d.SetWriteDeadline(time.Now().Add(c.s.cfg.CloseLinger))
	}
}

// Conn is one tunneled connection. Read/WriteTo/StartDrain deliver the
// peer's data in order, Write/WriteBuffer/ReadFrom send data within the
// connection's credit. The peer's data stays in the buffers it was received
// into until it is written out, and data read from a socket goes to the
// transport in the buffer it was read into: the mux copies no payload.
type Conn struct {
	s         *Session
	key       key
	requester bool // this side sent the DIAL_REQ

	mu       sync.Mutex
	cond     sync.Cond
	queue    []mem.Buffer // owned; queue[0] has head bytes delivered already
	head     int
	queued   int
	eof      bool  // peer closed: deliver the queue, then io.EOF
	err      error // fatal: session gone or overflow
	closed   bool  // Close was called
	consumed int   // bytes read since the last credit update
	credit   int64 // bytes we may still send

	// Half-close (Config.HalfClose): finRecv is set when the peer's FIN
	// arrives (it sends nothing more), finDelivered once everything before
	// it has been written out and the local socket's write side shut down,
	// finSent when this side's FIN is queued (its local reader hit EOF).
	// The connection is finished when both directions are.
	finRecv, finDelivered, finSent bool

	// closeQueued is set, with c.mu held, when CLOSE_REQ or CLOSE_RSP is
	// queued; DATA is never sent after it (Session.sendData).
	closeQueued atomic.Bool

	// Event-driven delivery (StartDrain): a goroutine exists only while
	// there is something to deliver.
	drainW    io.Writer
	drainDone func(error)
	running   bool // a drain goroutine is active
	drainEnd  bool // drainDone was called

	// linger keeps a closed requester connection's ID reserved until the
	// peer's CLOSE_RSP; stopped when it comes, so that a closed connection
	// is not held for closeLinger.
	linger *time.Timer
}

func (s *Session) newConn(k key, requester bool) *Conn {
	c := &Conn{s: s, key: k, requester: requester, credit: math.MaxInt64}
	if s.cfg.Credit {
		c.credit = int64(s.cfg.PeerWindow)
	}
	c.cond.L = &c.mu
	s.active.Add(1)
	s.cfg.Metrics.open(k.origin, 1)
	return c
}

// ID is the connectID on the tunnel.
func (c *Conn) ID() int64 { return c.key.id }

// Origin is the side that requested the connection.
func (c *Conn) Origin() proto.Origin { return c.key.origin }

func (c *Conn) limit() int {
	if c.s.cfg.Credit {
		return c.s.cfg.Window
	}
	return c.s.cfg.MaxQueue
}

// push is called by the read loop with a payload it hands over; it never
// blocks.
func (c *Conn) push(bs mem.BufferSlice) {
	c.mu.Lock()
	if c.closed || c.err != nil || c.eof || c.finRecv {
		c.mu.Unlock()
		bs.Free()
		return
	}
	n := bs.Len()
	if c.queued+n > c.limit() {
		c.mu.Unlock()
		bs.Free()
		c.s.cfg.Metrics.badPacket("queue_overflow")
		c.s.cfg.Log.Info("Closing connection: receive queue overflow", "origin", c.key.origin.String(), "connectID", c.key.id, "limit", c.limit())
		c.abort(ErrOverflow)
		return
	}
	c.queue = append(c.queue, bs...)
	c.queued += n
	start := c.kickLocked()
	c.mu.Unlock()
	c.cond.Broadcast()
	if start {
		go c.drainLoop()
	}
}

// takeLocked removes and returns the whole queue.
func (c *Conn) takeLocked() mem.BufferSlice {
	q := mem.BufferSlice(c.queue)
	if c.head > 0 {
		rest := q[0].Slice(c.head, q[0].Len())
		q[0].Free()
		q[0] = rest
	}
	c.queue, c.head, c.queued = nil, 0, 0
	return q
}

// freeQueueLocked drops everything queued.
func (c *Conn) freeQueueLocked() {
	mem.BufferSlice(c.queue).Free()
	c.queue, c.head, c.queued = nil, 0, 0
}

// BuffersWriter is a destination that takes buffers over instead of
// copying them (the gRPC frontend sends them on as they are).
type BuffersWriter interface {
	// WriteBuffers writes bs and frees it, whatever happens; it returns
	// the bytes written.
	WriteBuffers(bs mem.BufferSlice) (int, error)
}

// writeBuffers writes bs to w and frees it: handed over to a
// BuffersWriter, otherwise gathered into one writev where w is a socket.
func writeBuffers(w io.Writer, bs mem.BufferSlice) (int, error) {
	if bw, ok := w.(BuffersWriter); ok {
		return bw.WriteBuffers(bs)
	}
	defer bs.Free()
	if len(bs) == 1 {
		return w.Write(bs[0].ReadOnlyData())
	}
	nb := make(net.Buffers, len(bs))
	for i, b := range bs {
		nb[i] = b.ReadOnlyData()
	}
	n, err := nb.WriteTo(w)
	return int(n), err
}

// kickLocked reports whether a drain goroutine must be started (and marks
// it running). Called with c.mu held whenever the state changes.
func (c *Conn) kickLocked() bool {
	if c.drainW == nil || c.running || c.drainEnd {
		return false
	}
	c.running = true
	return true
}

// StartDrain delivers the peer's data to w from a goroutine that runs only
// while data is queued, instead of a goroutine parked in WriteTo for the
// connection's whole life. done is called once: nil when the peer closed and
// everything was written, otherwise the error (ErrClosed after Close).
func (c *Conn) StartDrain(w io.Writer, done func(error)) {
	c.mu.Lock()
	c.drainW, c.drainDone = w, done
	start := c.kickLocked()
	c.mu.Unlock()
	if start {
		go c.drainLoop()
	}
}

// closeWriter is a local writer that can shut down its write side alone
// (*net.TCPConn, *net.UnixConn, *tls.Conn).
type closeWriter interface{ CloseWrite() error }

func (c *Conn) drainLoop() {
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			var err error
			switch {
			case c.err != nil:
				err = c.err
			case c.closed:
				err = ErrClosed
			case c.eof:
				err = io.EOF
			case c.finRecv && !c.finDelivered:
				c.finDelivered = true
				cw, ok := c.drainW.(closeWriter)
				if !ok {
					// A writer that cannot half-close (a gRPC
					// frontend stream) ends with the peer's
					// direction, as on CLOSE.
					err = io.EOF
					break
				}
				both := c.finSent
				c.mu.Unlock()
				err = cw.CloseWrite()
				if err == nil && !both {
					continue // our direction goes on; idle until it ends
				}
				c.mu.Lock()
			default:
				c.running = false // idle: the next push starts a new goroutine
				c.mu.Unlock()
				return
			}
			c.running, c.drainEnd = false, true
			done := c.drainDone
			c.mu.Unlock()
			if errors.Is(err, io.EOF) {
				err = nil
			}
			done(err)
			return
		}
		q := c.takeLocked()
		w, peerClosed := c.drainW, c.eof || c.finRecv
		c.mu.Unlock()
		if peerClosed {
			c.flushBound(w)
		}
		n, werr := writeBuffers(w, q)
		c.consume(n)
		if werr != nil {
			c.mu.Lock()
			c.running, c.drainEnd = false, true
			done := c.drainDone
			c.mu.Unlock()
			done(werr)
			return
		}
	}
}

func (c *Conn) addCredit(n uint64) {
	c.mu.Lock()
	if n > math.MaxInt64-uint64(c.credit) {
		c.credit = math.MaxInt64
	} else {
		c.credit += int64(n)
	}
	c.mu.Unlock()
	c.cond.Broadcast()
}

// remoteClose marks the peer's end closed: queued data is still delivered,
// within the close linger (flushBound), which also bounds a write already
// in progress.
func (c *Conn) remoteClose() {
	c.mu.Lock()
	c.eof = true
	if c.linger != nil {
		c.linger.Stop()
	}
	if c.running && c.drainW != nil {
		c.flushBound(c.drainW)
	}
	start := c.kickLocked()
	c.mu.Unlock()
	c.cond.Broadcast()
	if start {
		go c.drainLoop()
	}
}

// remoteFin marks the peer's direction finished (half-close): queued data
// is still delivered, within the close linger as after a close, then the
// local socket's write side is shut down (drainLoop).
func (c *Conn) remoteFin() {
	c.mu.Lock()
	if c.finRecv || c.eof || c.closed {
		c.mu.Unlock()
		return
	}
	c.finRecv = true
	if c.running && c.drainW != nil {
		c.flushBound(c.drainW)
	}
	start := c.kickLocked()
	c.mu.Unlock()
	c.cond.Broadcast()
	if start {
		go c.drainLoop()
	}
}

// sendFin queues this side's FIN after the DATA already sent, when the
// session negotiated half-close and the connection is open. sent reports
// whether it did; both, that the peer's direction had been delivered in
// full already, so the connection is finished and the caller closes it.
func (c *Conn) sendFin() (sent, both bool) {
	if !c.s.cfg.HalfClose {
		return false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.err != nil || c.eof || c.finSent {
		return false, false
	}
	c.finSent = true
	if c.finDelivered {
		// Both directions are finished: the caller's close follows at
		// once, and a close tells the peer as much as a FIN would.
		return true, true
	}
	// Queued with c.mu held, as credit and CLOSE are: it follows every
	// DATA sent before and precedes the close.
	c.s.queue(proto.Fin(c.key.origin, c.key.id))
	return true, false
}

// fail ends the connection without sending anything (the session is gone).
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	was := c.closed
	c.closed = true
	c.freeQueueLocked()
	start := c.kickLocked()
	c.mu.Unlock()
	c.cond.Broadcast()
	if start {
		go c.drainLoop()
	}
	if !was {
		c.released()
	}
}

// abort closes the connection locally with err and tells the peer.
func (c *Conn) abort(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.Close()
}

func (c *Conn) released() {
	c.s.active.Add(-1)
	c.s.cfg.Metrics.open(c.key.origin, -1)
}

// take waits for queued data; it returns the whole queue, or an error.
func (c *Conn) take() (mem.BufferSlice, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.queue) == 0 {
		if c.err != nil {
			return nil, c.err
		}
		if c.closed {
			return nil, ErrClosed
		}
		if c.eof || c.finRecv {
			return nil, io.EOF
		}
		c.cond.Wait()
	}
	return c.takeLocked(), nil
}

// consume returns credit for n delivered bytes once enough has accumulated.
func (c *Conn) consume(n int) {
	if !c.s.cfg.Credit {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.consumed += n
	if c.consumed >= c.s.cfg.Window/4 && !c.closed && !c.eof && !c.finRecv {
		// Queued with c.mu held, so that it cannot follow the close.
		c.s.queue(proto.Credit(c.key.origin, c.key.id, uint64(c.consumed)))
		c.consumed = 0
	}
}

// WriteTo writes the peer's data to w until the peer closes (nil) or an error.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		q, err := c.take()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return total, nil
			}
			return total, err
		}
		n, werr := writeBuffers(w, q)
		total += int64(n)
		c.consume(n)
		if werr != nil {
			return total, werr
		}
	}
}

// Read implements io.Reader over the peer's data.
func (c *Conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	for len(c.queue) == 0 {
		if c.err != nil {
			c.mu.Unlock()
			return 0, c.err
		}
		if c.closed {
			c.mu.Unlock()
			return 0, ErrClosed
		}
		if c.eof || c.finRecv {
			c.mu.Unlock()
			return 0, io.EOF
		}
		c.cond.Wait()
	}
	n := 0
	for n < len(p) && len(c.queue) > 0 {
		d := c.queue[0].ReadOnlyData()[c.head:]
		k := copy(p[n:], d)
		n += k
		if k < len(d) {
			c.head += k
			break
		}
		c.queue[0].Free()
		c.queue[0] = nil
		c.queue, c.head = c.queue[1:], 0
	}
	c.queued -= n
	c.mu.Unlock()
	c.consume(n)
	return n, nil
}

// reserve waits for credit and returns how many bytes (<= want) may be sent.
func (c *Conn) reserve(want int) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.err != nil {
			return 0, c.err
		}
		if c.closed || c.eof || c.finSent {
			return 0, ErrClosed
		}
		if c.credit > 0 {
			n := int64(want)
			if n > c.credit {
				n = c.credit
			}
			c.credit -= n
			return int(n), nil
		}
		c.cond.Wait()
	}
}

// Write sends a copy of p as DATA packets within the connection's credit.
// It blocks while the window is spent, which stops the caller reading its
// socket: that is the backpressure.
func (c *Conn) Write(p []byte) (int, error) {
	sent := 0
	for sent < len(p) {
		n := min(len(p)-sent, c.s.cfg.MaxChunk)
		if err := c.WriteBuffer(mem.Copy(p[sent:sent+n], c.s.cfg.Pool)); err != nil {
			return sent, err
		}
		sent += n
	}
	return sent, nil
}

// WriteBuffer sends b as DATA packets within the connection's credit and
// takes b over: it goes to the transport without a copy, which frees it
// once written.
func (c *Conn) WriteBuffer(b mem.Buffer) error {
	for b.Len() > 0 {
		n, err := c.reserve(min(b.Len(), c.s.cfg.MaxChunk))
		if err != nil {
			b.Free()
			return err
		}
		part := b
		if n < b.Len() {
			part = b.Slice(0, n)
			rest := b.Slice(n, b.Len())
			b.Free()
			b = rest
		} else {
			b = nil
		}
		if err := c.s.sendData(c, &proto.OutData{Origin: c.key.origin, ConnectID: c.key.id, Payload: mem.BufferSlice{part}}); err != nil {
			if b != nil {
				b.Free()
			}
			return err
		}
		c.s.cfg.Metrics.bytes(c.key.origin, "sent", n)
		if b == nil {
			return nil
		}
	}
	b.Free()
	return nil
}

// WriteBuffers is WriteBuffer for each of bs.
func (c *Conn) WriteBuffers(bs mem.BufferSlice) error {
	for i, b := range bs {
		if err := c.WriteBuffer(b); err != nil {
			mem.BufferSlice(bs[i+1:]).Free()
			return err
		}
	}
	return nil
}

// ReadFrom sends everything read from r until EOF or an error.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	return readChunks(r, c.s.cfg.MaxChunk, c.s.cfg.Pool, c.WriteBuffer)
}

// Close releases the connection and tells the peer: CLOSE_REQ if this side
// requested it, CLOSE_RSP if this side dialed it. It is idempotent.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	peerClosed := c.eof
	c.freeQueueLocked()
	start := c.kickLocked()
	// The close is queued with c.mu held: a credit update (queued under
	// c.mu too) cannot follow it, and sendData drops DATA after it.
	switch {
	case c.requester && !peerClosed:
		c.closeQueued.Store(true)
		c.s.queue(proto.CloseReq(c.key.origin, c.key.id))
	case !c.requester:
		c.closeQueued.Store(true)
		c.s.queue(proto.CloseRsp(c.key.origin, c.key.id, ""))
	}
	c.mu.Unlock()
	c.cond.Broadcast()
	if start {
		go c.drainLoop()
	}
	c.released()
	if c.requester && !peerClosed {
		// Keep the ID reserved until CLOSE_RSP (handleCloseRsp removes it),
		// unless it has come already.
		c.mu.Lock()
		if !c.eof {
			c.linger = time.AfterFunc(closeLinger, func() { c.s.remove(c) })
		}
		c.mu.Unlock()
		return nil
	}
	c.s.remove(c)
	return nil
}

// Pipe copies between a real TCP connection and a tunneled one until either
// side ends, then closes both. With half-close (Config.HalfClose) an end
// that only finishes sending is passed on as such (FIN, CloseWrite) and
// the other direction goes on; both are closed when both have finished.
func Pipe(nc net.Conn, c *Conn) { PipeReader(nc, nc, c) }

// PipeReader is Pipe where the bytes from the local side come from r (for
// example a hijacked HTTP connection with bytes already buffered).
//
// The calling goroutine reads the local side; the peer's data is written by
// a goroutine that exists only while data is queued, so an idle connection
// costs one goroutine.
func PipeReader(r io.Reader, nc net.Conn, c *Conn) {
	c.StartDrain(nc, func(error) {
		nc.Close()
		c.Close()
	})
	if _, err := c.ReadFrom(r); err == nil {
		if sent, both := c.sendFin(); sent && !both {
			// The peer's direction goes on: the drain closes both
			// ends once it has delivered the peer's FIN, or when the
			// connection ends otherwise.
			return
		}
	}
	c.Close()
	nc.Close()
}
