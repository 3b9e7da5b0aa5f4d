package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/tunnel/mux"
	"github.com/moat-net/moat/tunnel/proto"
)

// frontendWriter turns the agent's data into DATA packets on a Proxy
// stream, passing the buffers it was received in on to the transport.
type frontendWriter struct {
	mu     *sync.Mutex
	st     client.ProxyService_ProxyServer
	connID int64
	ready  *clientReady
	pool   mem.BufferPool
}

// clientHold bounds how long the first packet for kube-apiserver after
// DIAL_RSP waits for the client to have registered the connection (see
// clientReady).
const clientHold = 25 * time.Millisecond

// clientReady holds back what the server sends after DIAL_RSP until
// konnectivity-client has certainly registered the connection. Its receive
// loop hands DIAL_RSP to the dialing goroutine and reads the next packet
// without waiting for that goroutine to register the connection ID; a DATA
// or CLOSE_RSP that is already there is dropped as "connection not
// recognized" (a DATA is answered with CLOSE_REQ, a CLOSE_RSP leaves the
// caller's Read waiting forever). Protocols where the destination speaks
// first (SSH, SMTP, MySQL banners) hit this on most connections. Any packet
// from the client proves the registration (it sends only once DialContext
// returned); otherwise the first packet waits clientHold after DIAL_RSP,
// time enough for the client to have parked in its next receive.
type clientReady struct {
	once sync.Once
	ch   chan struct{}
}

func newClientReady() *clientReady { return &clientReady{ch: make(chan struct{})} }

func (r *clientReady) open() { r.once.Do(func() { close(r.ch) }) }

func (r *clientReady) wait() { <-r.ch }

// frontendChunk keeps each message to kube-apiserver within grpc-go's 32 KiB
// buffer tier: its default pool rounds anything larger up to 1 MiB and
// zeroes all of it for every message.
const frontendChunk = 32<<10 - 64

func (w frontendWriter) Write(b []byte) (int, error) {
	return w.WriteBuffers(mem.BufferSlice{mem.Copy(b, w.pool)})
}

// WriteBuffers implements mux.BuffersWriter: bs goes out in messages of at
// most frontendChunk bytes, each a slice of bs's buffers.
func (w frontendWriter) WriteBuffers(bs mem.BufferSlice) (int, error) {
	w.ready.wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	sent := 0
	for len(bs) > 0 {
		var chunk mem.BufferSlice
		n := 0
		for len(bs) > 0 && n < frontendChunk {
			b, room := bs[0], frontendChunk-n
			if b.Len() <= room {
				chunk, n, bs = append(chunk, b), n+b.Len(), bs[1:]
				continue
			}
			chunk = append(chunk, b.Slice(0, room))
			bs[0] = b.Slice(room, b.Len())
			b.Free()
			n += room
		}
		d := &proto.OutData{Origin: proto.OriginControlPlane, ConnectID: w.connID, Payload: chunk}
		err := w.st.SendMsg(d)
		d.Payload.Free() // nil once the codec took it
		if err != nil {
			bs.Free()
			return sent, err
		}
		sent += n
	}
	return sent, nil
}

// Proxy serves one kube-apiserver connection: upstream's single-use tunnel
// sends one DIAL_REQ per stream. gRPC flow control on this stream is the
// connection's own backpressure. The handler dials, then reads the client
// for the stream's whole life; the agent's data is written by a goroutine
// that runs only while data is queued, so an idle connection costs no extra
// goroutine here.
func (s *Server) Proxy(st client.ProxyService_ProxyServer) error {
	req, err := s.firstDialReq(st)
	if req == nil {
		return err
	}
	var sendMu sync.Mutex
	send := func(p *client.Packet) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.SendMsg(p)
	}
	// The dial is made here, not beside a reader: a client that gives up
	// (DIAL_CLS) closes its stream too, which cancels the dial through the
	// stream's context.
	conn, err := s.dial(st.Context(), req.Address)
	if err != nil {
		if st.Context().Err() == nil {
			s.log.V(2).Info("Frontend dial failed", "address", req.Address, "err", err)
			_ = send(proto.DialRsp(proto.OriginControlPlane, req.Random, 0, err.Error()))
		}
		return nil
	}
	// A client that goes away (its tunnel's gRPC connection closed) while
	// this handler is blocked writing to a destination that does not read
	// (conn.WriteBuffers waits for credit) must still release the
	// connection here and on the agent.
	stop := context.AfterFunc(st.Context(), func() { conn.Close() })
	defer stop()
	if err := send(proto.DialRsp(proto.OriginControlPlane, req.Random, conn.ID(), "")); err != nil {
		conn.Close()
		return nil
	}
	registered := newClientReady()
	defer registered.open()
	hold := time.AfterFunc(clientHold, registered.open)
	defer hold.Stop()               // a timer per tunnel firing after it ended costs a wakeup
	finished := make(chan struct{}) // closed once CLOSE_RSP went to the client
	conn.StartDrain(frontendWriter{mu: &sendMu, st: st, connID: conn.ID(), ready: registered, pool: s.pool}, func(werr error) {
		msg := ""
		if werr != nil && !errors.Is(werr, mux.ErrClosed) {
			msg = werr.Error()
		}
		conn.Close()
		registered.wait()
		_ = send(proto.CloseRsp(proto.OriginControlPlane, conn.ID(), msg))
		close(finished)
	})
	for {
		var f proto.Frame
		if err := st.RecvMsg(&f); err != nil || f.Err != nil {
			// Wait for the writer: nothing may touch the stream once the
			// handler has returned.
			registered.open()
			conn.Close()
			<-finished
			if f.Err != nil {
				// One connection per stream: ending it is all a
				// protocol error costs.
				s.metrics.BadPacket("undecodable")
				return status.Errorf(codes.InvalidArgument, "proxy stream: %v", f.Err)
			}
			return nil
		}
		p := f.Packet
		var payload mem.BufferSlice
		if p == nil { // a large DATA packet, still in its receive buffers
			p = &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: f.ConnectID}}}
			payload = f.Payload
		} else if d := p.GetData(); d != nil && len(d.Data) > 0 {
			payload = mem.BufferSlice{mem.SliceBuffer(d.Data)}
		}
		if err := proto.Check(p); err != nil {
			s.metrics.BadPacket(proto.Reason(p))
			s.log.Info("Frontend sent a bad packet", "err", err)
			continue
		}
		switch p.Type {
		case client.PacketType_DATA:
			registered.open() // the client sends data only on a connection it holds
			if p.GetData().ConnectID != conn.ID() {
				payload.Free()
				s.metrics.BadPacket("unknown_connection")
				continue
			}
			if err := conn.WriteBuffers(payload); err != nil {
				<-finished
				return nil
			}
		case client.PacketType_CLOSE_REQ:
			registered.open()
			conn.Close()
			<-finished
			return nil
		case client.PacketType_DIAL_CLS:
			if p.GetCloseDial().Random == req.Random {
				conn.Close()
				<-finished
				return nil
			}
		default:
			s.metrics.BadPacket("frontend_unexpected_" + p.Type.String())
		}
	}
}

// firstDialReq reads the stream's first packet, which must be a DIAL_REQ,
// and gives up on a client that sends nothing within the dial timeout. A
// nil request comes with the error to end the stream with (nil when the
// client went away).
func (s *Server) firstDialReq(st client.ProxyService_ProxyServer) (*client.DialRequest, error) {
	type recvd struct {
		p        *client.Packet
		err, bad error // bad: the message was not a packet
	}
	firstc := make(chan recvd, 1)
	go func() {
		var f proto.Frame
		err := st.RecvMsg(&f)
		if err == nil && f.Err == nil && f.Packet == nil {
			f.Payload.Free()
			f.Packet = &client.Packet{Type: client.PacketType_DATA} // reported below
		}
		firstc <- recvd{f.Packet, err, f.Err}
	}()
	timer := time.NewTimer(s.cfg.DialTimeout)
	defer timer.Stop()
	var first *client.Packet
	select {
	case r := <-firstc:
		if r.err != nil {
			return nil, nil
		}
		if r.bad != nil {
			s.metrics.BadPacket("undecodable")
			return nil, status.Errorf(codes.InvalidArgument, "proxy stream: %v", r.bad)
		}
		first = r.p
	case <-timer.C:
		// A client that opens a stream and says nothing is cut off.
		s.metrics.BadPacket("frontend_silent")
		return nil, status.Errorf(codes.DeadlineExceeded, "proxy stream: no DIAL_REQ within %s", s.cfg.DialTimeout)
	}
	if err := proto.Check(first); err != nil || first.Type != client.PacketType_DIAL_REQ {
		s.metrics.BadPacket("frontend_first_packet")
		if err == nil {
			err = errors.New("first packet must be DIAL_REQ, got " + first.Type.String())
		}
		return nil, status.Errorf(codes.InvalidArgument, "proxy stream: %v", err)
	}
	return first.GetDialRequest(), nil
}
