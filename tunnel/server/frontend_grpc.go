package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/moat-net/moat/tunnel/mux"
	"github.com/moat-net/moat/tunnel/proto"
)

// frontendWriter turns bytes into DATA packets on a Proxy stream.
type frontendWriter struct {
	mu     *sync.Mutex
	st     client.ProxyService_ProxyServer
	connID int64
	ready  *clientReady
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
	w.ready.wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	sent := 0
	for sent < len(b) {
		n := min(len(b)-sent, frontendChunk)
		if err := w.st.Send(proto.Data(proto.OriginControlPlane, w.connID, b[sent:sent+n])); err != nil {
			return sent, err
		}
		sent += n
	}
	return sent, nil
}

// Proxy serves one kube-apiserver connection: upstream's single-use tunnel
// sends one DIAL_REQ per stream. gRPC flow control on this stream is the
// connection's own backpressure. The handler goroutine reads the client for
// the stream's whole life; the agent's data is written by a goroutine that
// runs only while data is queued, so an idle connection costs no extra
// goroutine here.
func (s *Server) Proxy(st client.ProxyService_ProxyServer) error {
	type recvd struct {
		p   *client.Packet
		err error
	}
	firstc := make(chan recvd, 1)
	go func() {
		p, err := st.Recv()
		firstc <- recvd{p, err}
	}()
	var first *client.Packet
	select {
	case r := <-firstc:
		if r.err != nil {
			return nil
		}
		first = r.p
	case <-time.After(s.cfg.DialTimeout):
		// A client that opens a stream and says nothing is cut off.
		s.metrics.BadPacket("frontend_silent")
		return status.Errorf(codes.DeadlineExceeded, "proxy stream: no DIAL_REQ within %s", s.cfg.DialTimeout)
	}
	if err := proto.Check(first); err != nil || first.Type != client.PacketType_DIAL_REQ {
		s.metrics.BadPacket("frontend_first_packet")
		if err == nil {
			err = errors.New("first packet must be DIAL_REQ, got " + first.Type.String())
		}
		return status.Errorf(codes.InvalidArgument, "proxy stream: %v", err)
	}
	req := first.GetDialRequest()
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()

	var sendMu sync.Mutex
	send := func(p *client.Packet) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(p)
	}
	ready := make(chan *mux.Conn, 1) // nil when the dial failed
	finished := make(chan struct{})  // closed once CLOSE_RSP went to the client
	registered := newClientReady()
	defer registered.open()
	go func() {
		conn, err := s.dial(ctx, req.Address)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Info("frontend dial failed", "address", req.Address, "err", err)
				_ = send(proto.DialRsp(proto.OriginControlPlane, req.Random, 0, err.Error()))
			}
			ready <- nil
			return
		}
		if err := send(proto.DialRsp(proto.OriginControlPlane, req.Random, conn.ID(), "")); err != nil {
			conn.Close()
			ready <- nil
			return
		}
		time.AfterFunc(clientHold, registered.open)
		conn.StartDrain(frontendWriter{mu: &sendMu, st: st, connID: conn.ID(), ready: registered}, func(werr error) {
			msg := ""
			if werr != nil && !errors.Is(werr, mux.ErrClosed) {
				msg = werr.Error()
			}
			conn.Close()
			registered.wait()
			_ = send(proto.CloseRsp(proto.OriginControlPlane, conn.ID(), msg))
			close(finished)
		})
		ready <- conn
	}()

	var conn *mux.Conn
	got := false
	wait := func() *mux.Conn {
		if !got {
			conn, got = <-ready, true
		}
		return conn
	}
	for {
		p, err := st.Recv()
		if err != nil {
			cancel()
			if c := wait(); c != nil {
				c.Close()
			}
			return nil
		}
		if err := proto.Check(p); err != nil {
			s.metrics.BadPacket(proto.Reason(p))
			s.log.Warn("frontend sent bad packet", "err", err)
			continue
		}
		switch p.Type {
		case client.PacketType_DIAL_CLS:
			if p.GetCloseDial().Random == req.Random {
				cancel()
				if c := wait(); c != nil {
					c.Close()
					<-finished
				}
				return nil
			}
		case client.PacketType_DATA:
			registered.open() // the client sends data only on a connection it holds
			c := wait()
			if c == nil {
				return nil
			}
			if p.GetData().ConnectID != c.ID() {
				s.metrics.BadPacket("unknown_connection")
				continue
			}
			if _, err := c.Write(p.GetData().Data); err != nil {
				<-finished
				return nil
			}
		case client.PacketType_CLOSE_REQ:
			registered.open()
			if c := wait(); c != nil {
				c.Close()
				<-finished
			}
			return nil
		default:
			s.metrics.BadPacket("frontend_unexpected_" + p.Type.String())
		}
	}
}
