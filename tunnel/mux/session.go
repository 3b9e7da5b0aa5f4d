package mux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/mem"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/tunnel/grpcbuf"
	"github.com/moat-net/moat/tunnel/proto"
)

// Stream is one bidirectional Packet stream (an AgentService/Connect call),
// with a codec that understands proto.OutData and proto.Frame
// (grpcbuf.Codec): SendMsg takes a *client.Packet or a *proto.OutData,
// RecvMsg fills a *proto.Frame.
type Stream interface {
	SendMsg(m any) error
	RecvMsg(m any) error
}

// DialFunc makes the real TCP dial for a DIAL_REQ received from the peer.
// It must honour ctx (timeout, DIAL_CLS). A returned error's text goes back
// to the peer in DIAL_RSP.
type DialFunc func(ctx context.Context, origin proto.Origin, address string) (net.Conn, error)

// Config tunes a Session.
type Config struct {
	// LocalOrigin is the origin of dials this side requests: the server
	// requests control-plane connections, the agent node connections.
	LocalOrigin proto.Origin
	// Credit enables the credit extension; set only when the peer announced it.
	Credit bool
	// Window is this side's per-connection receive window with credit
	// (default proto.DefaultWindow); it is announced to the peer.
	Window int
	// HalfClose enables the half-close extension; set only when the peer
	// announced it. Pipe then answers a local EOF with FIN instead of
	// closing, and a FIN from the peer shuts down the write side of the
	// local socket (CloseWrite) instead of closing it; the connection ends
	// when both directions have finished, or on CLOSE as without it.
	HalfClose bool
	// PeerWindow is the peer's announced receive window: each connection's
	// send credit starts there (default proto.DefaultWindow, what a peer
	// that announces none uses). Assuming the peer's window equals ours
	// would overrun a peer with a smaller one, which then closes the
	// connection (queue_overflow).
	PeerWindow int
	// MaxQueue bounds a connection's receive queue without credit (default 8 MiB).
	MaxQueue int
	// MaxChunk bounds the payload of one DATA packet (default 128 KiB).
	MaxChunk int
	// MaxPendingDials bounds dials requested by the peer and not yet answered (default 1024).
	MaxPendingDials int
	// DialTimeout bounds a dial made for the peer (default 10s).
	DialTimeout time.Duration
	// CloseLinger bounds each write of a peer-closed connection's remaining
	// data to a local socket (default 30s): a local reader that takes nothing
	// for that long loses the rest, so a destination or client that never
	// reads cannot hold a connection open after the other end left.
	CloseLinger time.Duration
	// Dial handles DIAL_REQ from the peer; nil refuses every such dial.
	Dial DialFunc
	// OnDrain is called when the peer sends DRAIN.
	OnDrain func()
	// Pool provides the buffers sockets are read into (default: a
	// grpcbuf.Pool); it should be the stream's transport pool.
	Pool mem.BufferPool
	// Metrics may be nil.
	Metrics *Metrics
	// Log may be nil.
	Log klog.Logger
}

func (c *Config) defaults() {
	if c.Window <= 0 {
		c.Window = proto.DefaultWindow
	}
	if c.PeerWindow <= 0 {
		c.PeerWindow = proto.DefaultWindow
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = 8 << 20
	}
	if c.MaxChunk <= 0 {
		c.MaxChunk = 128 << 10
	}
	if c.MaxPendingDials <= 0 {
		c.MaxPendingDials = 1024
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.CloseLinger <= 0 {
		c.CloseLinger = closeLinger
	}
	if c.Pool == nil {
		c.Pool = grpcbuf.New()
	}
}

// ErrSessionClosed is returned by connections of a session whose stream ended.
var ErrSessionClosed = errors.New("tunnel closed")

type key struct {
	origin proto.Origin
	id     int64
}

// dialResult answers one of our dials: the connection, registered by the
// read loop when DIAL_RSP arrived, or the error. Handing over the
// connection itself (not its ID to look up) means a connection the peer
// closes right after DIAL_RSP is still released by its requester.
type dialResult struct {
	conn *Conn
	err  error
}

// Session multiplexes connections over one Stream. Create it with New, run
// it with Run, and use Dial for connections this side requests.
type Session struct {
	cfg Config
	st  Stream

	// sendMu is held while writing to the stream; small packets get it
	// before bulk DATA (see sendLock).
	sendMu sendLock

	ctrlMu  sync.Mutex
	ctrl    []*client.Packet
	ctrlSig chan struct{}

	mu       sync.Mutex
	conns    map[key]*Conn
	pending  map[int64]chan dialResult    // our dials, by random
	incoming map[int64]context.CancelFunc // peer's dials being made, by random
	nextID   int64
	closed   bool
	closeErr error

	done     chan struct{}
	draining atomic.Bool
	active   atomic.Int64
	wg       sync.WaitGroup
}

// New returns a session over st; call Run to start it.
func New(st Stream, cfg Config) *Session {
	cfg.defaults()
	return &Session{
		cfg:      cfg,
		st:       st,
		ctrlSig:  make(chan struct{}, 1),
		conns:    make(map[key]*Conn),
		pending:  make(map[int64]chan dialResult),
		incoming: make(map[int64]context.CancelFunc),
		done:     make(chan struct{}),
	}
}

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} { return s.done }

// Draining reports whether the peer announced DRAIN.
func (s *Session) Draining() bool { return s.draining.Load() }

// Active is the number of open connections.
func (s *Session) Active() int64 { return s.active.Load() }

// Run serves the stream until it fails or ctx ends, then closes every
// connection. It returns the stream's error (nil on clean EOF or ctx end).
func (s *Session) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.shutdown(ctx.Err()) })
	defer stop()
	s.wg.Add(1)
	go s.writeLoop()
	err := s.readLoop()
	s.shutdown(err)
	s.wg.Wait()
	if errors.Is(err, io.EOF) || ctx.Err() != nil {
		return nil
	}
	return err
}

// Close ends the session.
func (s *Session) Close() { s.shutdown(ErrSessionClosed) }

func (s *Session) shutdown(err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.closeErr = err
	conns := s.conns
	s.conns = map[key]*Conn{}
	pending := s.pending
	s.pending = map[int64]chan dialResult{}
	for _, cancel := range s.incoming {
		cancel()
	}
	s.mu.Unlock()
	close(s.done)
	for _, c := range conns {
		c.fail(ErrSessionClosed)
	}
	for _, ch := range pending {
		select {
		case ch <- dialResult{err: ErrSessionClosed}:
		default:
		}
	}
}

// send writes p on the stream after every packet queued before it, so that
// the packets of one connection leave in the order they were produced
// (DIAL_RSP before the connection's first DATA, DATA before CLOSE).
// Callers other than the read loop may block here.
func (s *Session) send(p *client.Packet) error {
	s.sendMu.lock(false)
	defer s.sendMu.unlock()
	if err := s.flushLocked(); err != nil {
		return err
	}
	return s.sendLocked(p)
}

// sendData sends a DATA packet of c unless c's close has been queued
// already: nothing of a connection may follow its CLOSE_REQ or CLOSE_RSP.
// The payload is handed over (freed here if it is not sent). A payload of
// bulkMin or more waits for the stream behind every small packet waiting
// (see sendLock).
func (s *Session) sendData(c *Conn, d *proto.OutData) error {
	s.sendMu.lock(d.Payload.Len() >= bulkMin)
	defer s.sendMu.unlock()
	err := s.flushLocked()
	if err == nil && c.closeQueued.Load() {
		err = ErrClosed
	}
	if err == nil {
		err = s.sendMsg(d, "DATA")
	}
	d.Payload.Free() // nil once the codec took it
	return err
}

// bulkMin is the payload from which a DATA packet is bulk for sendLock: a
// read that returned a full TLS record or more, which a bulk transfer's
// reads do and handshakes and interactive traffic rarely do.
const bulkMin = 16 << 10

func (s *Session) sendLocked(p *client.Packet) error { return s.sendMsg(p, p.Type.String()) }

func (s *Session) sendMsg(m any, what string) error {
	select {
	case <-s.done:
		return ErrSessionClosed
	default:
	}
	if err := s.st.SendMsg(m); err != nil {
		return fmt.Errorf("send %s: %w", what, err)
	}
	return nil
}

// flushLocked sends everything queued; s.sendMu must be held. Taking the
// batch and sending it under one hold of sendMu is what keeps queued
// packets ahead of any packet sent directly after them.
func (s *Session) flushLocked() error {
	s.ctrlMu.Lock()
	batch := s.ctrl
	s.ctrl = nil
	s.ctrlMu.Unlock()
	for i, p := range batch {
		if err := s.sendLocked(p); err != nil {
			clear(batch[i:])
			return err
		}
	}
	return nil
}

// queue hands p to the writer without blocking; the read loop uses it so that
// it can never wait for the peer (which could be waiting for us).
func (s *Session) queue(p *client.Packet) {
	s.ctrlMu.Lock()
	s.ctrl = append(s.ctrl, p)
	n := len(s.ctrl)
	s.ctrlMu.Unlock()
	if n > 1<<16 {
		// A peer that provokes this many replies without reading is abusive.
		s.cfg.Log.Info("Control queue overflow, closing tunnel", "queued", n)
		go s.shutdown(errors.New("control queue overflow"))
		return
	}
	select {
	case s.ctrlSig <- struct{}{}:
	default:
	}
}

func (s *Session) writeLoop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case <-s.ctrlSig:
		}
		s.sendMu.lock(false)
		err := s.flushLocked()
		s.sendMu.unlock()
		if err != nil {
			s.shutdown(err)
			return
		}
	}
}

func (s *Session) readLoop() error {
	for {
		var f proto.Frame
		if err := s.st.RecvMsg(&f); err != nil {
			return err
		}
		if f.Err != nil {
			s.cfg.Metrics.badPacket("undecodable")
			s.cfg.Log.Info("Ending the tunnel: the peer sent a message that is not a packet", "err", f.Err)
			return f.Err
		}
		if f.Packet == nil { // a DATA packet that kept its buffers
			s.handleData(f.ConnectID, f.Ext, f.Payload)
			continue
		}
		s.handle(f.Packet)
	}
}

func (s *Session) bad(reason string, p *client.Packet, err error) {
	s.cfg.Metrics.badPacket(reason)
	s.cfg.Log.Info("Dropped packet", "reason", reason, "type", p.GetType().String(), "err", err)
}

func (s *Session) handle(p *client.Packet) {
	if err := proto.Check(p); err != nil {
		s.bad(proto.Reason(p), p, err)
		s.refuseMalformedDial(p, err)
		return
	}
	ext, err := proto.GetExt(p)
	if err != nil {
		s.bad("bad_extension", p, err)
		return
	}
	peer := s.peerOrigin()
	switch p.Type {
	case client.PacketType_DIAL_REQ:
		s.handleDialReq(p.GetDialRequest(), ext, peer)
	case client.PacketType_DIAL_RSP:
		s.handleDialRsp(p.GetDialResponse(), ext)
	case client.PacketType_DIAL_CLS:
		s.handleDialCls(p.GetCloseDial(), ext)
	case client.PacketType_DATA:
		var payload mem.BufferSlice
		if d := p.GetData().Data; len(d) > 0 {
			payload = mem.BufferSlice{mem.SliceBuffer(d)} // decoded into its own slice
		}
		s.handleData(p.GetData().ConnectID, ext, payload)
	case client.PacketType_CLOSE_REQ:
		s.handleCloseReq(p.GetCloseRequest(), ext)
	case client.PacketType_CLOSE_RSP:
		s.handleCloseRsp(p.GetCloseResponse(), ext)
	case client.PacketType_DRAIN:
		s.draining.Store(true)
		if s.cfg.OnDrain != nil {
			s.cfg.OnDrain()
		}
	}
}

// refuseMalformedDial answers a DIAL_REQ that failed Check (no address,
// a protocol other than tcp) with a DIAL_RSP error when it names its
// random: dropped silently, its requester would wait out its whole dial
// timeout for an answer that never comes.
func (s *Session) refuseMalformedDial(p *client.Packet, reason error) {
	r := p.GetDialRequest()
	if p.GetType() != client.PacketType_DIAL_REQ || r == nil || r.Random == 0 {
		return
	}
	ext, err := proto.GetExt(p)
	if err != nil {
		return // no origin to answer with
	}
	s.queue(proto.DialRsp(ext.Origin, r.Random, 0, "dial refused: "+reason.Error()))
}

func (s *Session) peerOrigin() proto.Origin {
	if s.cfg.LocalOrigin == proto.OriginNode {
		return proto.OriginControlPlane
	}
	return proto.OriginNode
}

// lookupOrClosed is lookup that also reports whether k is a connection
// this side dialed and has closed since: this side numbers those from 1
// without reuse, so an ID it has handed out and no longer holds is closed.
func (s *Session) lookupOrClosed(k key) (*Conn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.conns[k]; c != nil {
		return c, false
	}
	return nil, k.origin != s.cfg.LocalOrigin && k.id > 0 && k.id <= s.nextID
}

func (s *Session) handleDialReq(r *client.DialRequest, ext proto.Ext, peer proto.Origin) {
	if ext.Origin != peer {
		s.bad("dial_wrong_origin", &client.Packet{Type: client.PacketType_DIAL_REQ}, nil)
		s.queue(proto.DialRsp(ext.Origin, r.Random, 0,
			fmt.Sprintf("dial request with origin %s refused: this side only accepts %s-originated dials", ext.Origin, peer)))
		return
	}
	if s.cfg.Dial == nil {
		s.queue(proto.DialRsp(peer, r.Random, 0, "dial refused: this side accepts no dial requests"))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DialTimeout)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return
	}
	if _, dup := s.incoming[r.Random]; dup {
		s.mu.Unlock()
		cancel()
		s.bad("duplicate_dial", &client.Packet{Type: client.PacketType_DIAL_REQ}, nil)
		return
	}
	if len(s.incoming) >= s.cfg.MaxPendingDials {
		s.mu.Unlock()
		cancel()
		s.cfg.Metrics.dial(peer, "too_many_pending", 0)
		s.queue(proto.DialRsp(peer, r.Random, 0, fmt.Sprintf("dial %s refused: %d dials already pending", r.Address, s.cfg.MaxPendingDials)))
		return
	}
	s.incoming[r.Random] = cancel
	s.mu.Unlock()
	s.cfg.Metrics.pendingDials(1)
	s.wg.Add(1)
	go s.dialFor(ctx, cancel, peer, r.Random, r.Address)
}

func (s *Session) dialFor(ctx context.Context, cancel context.CancelFunc, peer proto.Origin, random int64, address string) {
	defer s.wg.Done()
	defer cancel()
	start := time.Now()
	nc, err := s.cfg.Dial(ctx, peer, address)
	s.cfg.Metrics.pendingDials(-1)
	s.mu.Lock()
	_, stillPending := s.incoming[random]
	delete(s.incoming, random)
	if err == nil && (!stillPending || s.closed) {
		s.mu.Unlock()
		nc.Close()
		s.cfg.Metrics.dial(peer, "cancelled", time.Since(start))
		return
	}
	if err != nil {
		s.mu.Unlock()
		s.cfg.Metrics.dial(peer, "error", time.Since(start))
		s.cfg.Log.V(2).Info("Dial failed", "origin", peer.String(), "address", address, "err", err)
		if stillPending {
			s.queue(proto.DialRsp(peer, random, 0, err.Error()))
		}
		return
	}
	s.nextID++
	c := s.newConn(key{peer, s.nextID}, false)
	s.conns[c.key] = c
	s.mu.Unlock()
	s.cfg.Metrics.dial(peer, "ok", time.Since(start))
	// Sent from here rather than queued for the writer: one goroutine
	// handoff less on every new connection's critical path.
	if err := s.send(proto.DialRsp(peer, random, c.key.id, "")); err != nil {
		c.fail(err)
		nc.Close()
		return
	}
	go Pipe(nc, c)
}

// Dial asks the peer to open a TCP connection to address and returns it once
// DIAL_RSP arrives. On ctx end it sends DIAL_CLS.
func (s *Session) Dial(ctx context.Context, address string) (*Conn, error) {
	o := s.cfg.LocalOrigin
	ch := make(chan dialResult, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrSessionClosed
	}
	var random int64
	for {
		random = rand.Int64N(math.MaxInt64-1) + 1
		if _, dup := s.pending[random]; !dup {
			break
		}
	}
	s.pending[random] = ch
	s.mu.Unlock()
	start := time.Now()
	if err := s.send(proto.DialReq(o, address, random)); err != nil {
		s.mu.Lock()
		delete(s.pending, random)
		s.mu.Unlock()
		return nil, err
	}
	select {
	case r := <-ch:
		if r.err != nil {
			s.cfg.Metrics.requested(o, "error", time.Since(start))
			return nil, r.err
		}
		s.cfg.Metrics.requested(o, "ok", time.Since(start))
		return r.conn, nil
	case <-ctx.Done():
		s.mu.Lock()
		_, still := s.pending[random]
		delete(s.pending, random)
		s.mu.Unlock()
		if still {
			s.queue(proto.DialCls(o, random))
		} else {
			// The response raced with ctx; it registered a connection we drop.
			if r := <-ch; r.conn != nil {
				r.conn.Close()
			}
		}
		s.cfg.Metrics.requested(o, "timeout", time.Since(start))
		return nil, fmt.Errorf("dial %s: no DIAL_RSP: %w", address, ctx.Err())
	}
}

func (s *Session) handleDialRsp(r *client.DialResponse, ext proto.Ext) {
	o := s.cfg.LocalOrigin
	if ext.Origin != o {
		s.bad("dial_rsp_wrong_origin", &client.Packet{Type: client.PacketType_DIAL_RSP}, nil)
		return
	}
	s.mu.Lock()
	ch, ok := s.pending[r.Random]
	delete(s.pending, r.Random)
	if !ok {
		s.mu.Unlock()
		if r.Error == "" && r.ConnectID != 0 {
			// Our dial was given up; tell the peer to close what it opened.
			s.queue(proto.CloseReq(o, r.ConnectID))
		}
		s.bad("dial_rsp_unknown", &client.Packet{Type: client.PacketType_DIAL_RSP}, nil)
		return
	}
	if r.Error != "" {
		s.mu.Unlock()
		ch <- dialResult{err: &DialError{Msg: r.Error}}
		return
	}
	if r.ConnectID == 0 {
		s.mu.Unlock()
		ch <- dialResult{err: &DialError{Msg: "DIAL_RSP without connectID"}}
		return
	}
	k := key{o, r.ConnectID}
	if _, dup := s.conns[k]; dup {
		s.mu.Unlock()
		ch <- dialResult{err: &DialError{Msg: fmt.Sprintf("DIAL_RSP reuses open connectID %d", r.ConnectID)}}
		return
	}
	c := s.newConn(k, true)
	s.conns[k] = c
	s.mu.Unlock()
	ch <- dialResult{conn: c}
}

func (s *Session) handleDialCls(r *client.CloseDial, ext proto.Ext) {
	s.mu.Lock()
	if ext.Origin == s.cfg.LocalOrigin {
		// The peer gave up our dial (e.g. its backend went away).
		ch, ok := s.pending[r.Random]
		delete(s.pending, r.Random)
		s.mu.Unlock()
		if ok {
			ch <- dialResult{err: &DialError{Msg: "dial closed by peer"}}
		}
		return
	}
	cancel, ok := s.incoming[r.Random]
	delete(s.incoming, r.Random)
	s.mu.Unlock()
	if ok {
		cancel()
	}
}

// handleData delivers a DATA packet's payload, which it takes over.
func (s *Session) handleData(id int64, ext proto.Ext, payload mem.BufferSlice) {
	k := key{ext.Origin, id}
	c, closed := s.lookupOrClosed(k)
	if c == nil {
		payload.Free()
		if closed {
			// In flight when this side closed it: the peer has our
			// CLOSE_RSP on its way and releases its end on it.
			return
		}
		s.cfg.Metrics.badPacket("unknown_connection")
		if ext.Credit == 0 {
			s.replyUnknown(k)
		}
		return
	}
	if ext.Credit != 0 || ext.Fin {
		payload.Free()
		if ext.Credit != 0 {
			c.addCredit(ext.Credit)
		}
		if ext.Fin {
			c.remoteFin()
		}
		return
	}
	n := payload.Len()
	if n == 0 {
		return
	}
	s.cfg.Metrics.bytes(ext.Origin, "received", n)
	c.push(payload)
}

// replyUnknown answers a packet for a connection this side does not know, so
// that the peer releases its end.
func (s *Session) replyUnknown(k key) {
	if k.origin == s.cfg.LocalOrigin {
		s.queue(proto.CloseReq(k.origin, k.id))
	} else {
		s.queue(proto.CloseRsp(k.origin, k.id, "unknown connectID"))
	}
}

func (s *Session) handleCloseReq(r *client.CloseRequest, ext proto.Ext) {
	k := key{ext.Origin, r.ConnectID}
	if k.origin == s.cfg.LocalOrigin {
		s.bad("close_req_wrong_origin", &client.Packet{Type: client.PacketType_CLOSE_REQ}, nil)
		return
	}
	c, closed := s.lookupOrClosed(k)
	if c == nil {
		if !closed { // a closed one has had its CLOSE_RSP already
			s.queue(proto.CloseRsp(k.origin, k.id, "unknown connectID"))
		}
		return
	}
	c.remoteClose()
}

func (s *Session) handleCloseRsp(r *client.CloseResponse, ext proto.Ext) {
	k := key{ext.Origin, r.ConnectID}
	if k.origin != s.cfg.LocalOrigin {
		s.bad("close_rsp_wrong_origin", &client.Packet{Type: client.PacketType_CLOSE_RSP}, nil)
		return
	}
	s.mu.Lock()
	c := s.conns[k]
	delete(s.conns, k)
	s.mu.Unlock()
	if c == nil {
		return
	}
	c.remoteClose()
}

func (s *Session) remove(c *Conn) {
	s.mu.Lock()
	if s.conns[c.key] == c {
		delete(s.conns, c.key)
	}
	s.mu.Unlock()
}

// DialError is a dial refused or failed by the peer; Msg is its DIAL_RSP text.
type DialError struct{ Msg string }

func (e *DialError) Error() string { return e.Msg }

// SendDrain tells the peer this side is about to terminate.
func (s *Session) SendDrain() error { return s.send(proto.Drain()) }
