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
}

// frontendChunk keeps each message to kube-apiserver within grpc-go's 32 KiB
// buffer tier: its default pool rounds anything larger up to 1 MiB and
// zeroes all of it for every message.
const frontendChunk = 32<<10 - 64

func (w frontendWriter) Write(b []byte) (int, error) {
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
// connection's own backpressure.
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
	ready := make(chan *mux.Conn, 1)
	go s.frontendRecv(ctx, cancel, st, ready, req.Random)

	conn, err := s.dial(ctx, req.Address)
	if err != nil {
		ready <- nil
		if ctx.Err() != nil {
			return nil // DIAL_CLS or the client went away
		}
		s.log.Info("frontend dial failed", "address", req.Address, "err", err)
		return send(proto.DialRsp(proto.OriginControlPlane, req.Random, 0, err.Error()))
	}
	defer conn.Close()
	if err := send(proto.DialRsp(proto.OriginControlPlane, req.Random, conn.ID(), "")); err != nil {
		ready <- nil
		return nil
	}
	ready <- conn
	_, werr := conn.WriteTo(frontendWriter{mu: &sendMu, st: st, connID: conn.ID()})
	msg := ""
	if werr != nil && !errors.Is(werr, mux.ErrClosed) {
		msg = werr.Error()
	}
	conn.Close()
	_ = send(proto.CloseRsp(proto.OriginControlPlane, conn.ID(), msg))
	return nil
}

// frontendRecv reads the client's packets for the whole stream. DATA is
// written into the tunnel (blocking on the connection's credit, which stops
// reading this stream: backpressure); CLOSE_REQ or DIAL_CLS end it.
func (s *Server) frontendRecv(ctx context.Context, cancel context.CancelFunc, st client.ProxyService_ProxyServer, ready <-chan *mux.Conn, random int64) {
	var conn *mux.Conn
	got := false
	wait := func() *mux.Conn {
		if !got {
			select {
			case conn = <-ready:
			case <-ctx.Done():
			}
			got = true
		}
		return conn
	}
	defer func() {
		if c := wait(); c != nil {
			c.Close()
		}
	}()
	for {
		p, err := st.Recv()
		if err != nil {
			cancel()
			return
		}
		if err := proto.Check(p); err != nil {
			s.metrics.BadPacket(proto.Reason(p))
			s.log.Warn("frontend sent bad packet", "err", err)
			continue
		}
		switch p.Type {
		case client.PacketType_DIAL_CLS:
			if p.GetCloseDial().Random == random {
				cancel()
				return
			}
		case client.PacketType_DATA:
			c := wait()
			if c == nil {
				return
			}
			if p.GetData().ConnectID != c.ID() {
				s.metrics.BadPacket("unknown_connection")
				continue
			}
			if _, err := c.Write(p.GetData().Data); err != nil {
				return
			}
		case client.PacketType_CLOSE_REQ:
			if c := wait(); c != nil {
				c.Close()
			}
			return
		default:
			s.metrics.BadPacket("frontend_unexpected_" + p.Type.String())
		}
	}
}
