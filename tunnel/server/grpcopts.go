package server

import (
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"

	"github.com/moat-net/moat/tunnel/grpcbuf"
	"github.com/moat-net/moat/tunnel/proto"
)

// WindowSize is the HTTP/2 stream and connection window on the agent hop:
// one agent stream carries many connections, so it needs more than gRPC's
// default to keep a fast link full.
const WindowSize = 8 << 20

// MaxFrame bounds one received gRPC message; larger frames end the stream
// with ResourceExhausted.
const MaxFrame = 4 << 20

// AgentServerOptions are the gRPC server options for the agent port (creds
// is its TLS): large windows, the tunnel's buffer pool and codec (payloads
// move between this hop and the frontends without copies), keepalive, a
// bound on unsent bytes in the kernel (grpcbuf.UnsentLowat).
func (s *Server) AgentServerOptions(creds credentials.TransportCredentials) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.Creds(grpcbuf.LimitUnsentCreds(creds)),
		grpc.ConnectionTimeout(10 * time.Second), experimental.BufferPool(s.pool), grpc.ForceServerCodecV2(grpcbuf.Codec{Pool: s.pool}),
		grpc.InitialWindowSize(WindowSize), grpc.InitialConnWindowSize(WindowSize),
		grpc.ReadBufferSize(256 << 10), grpc.WriteBufferSize(256 << 10),
		grpc.MaxRecvMsgSize(MaxFrame),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second})}
}

// FrontendWindow is the HTTP/2 window of a frontend connection, which
// carries one tunneled connection. Setting it also turns off grpc-go's
// bandwidth-delay estimation, whose PING on the first DATA frame of every
// new connection would cost each fresh tunnel a round trip of wakeups.
const FrontendWindow = 1 << 20

// FrontendServerOptions are the gRPC server options for kube-apiserver's
// frontend (creds nil on the Unix socket). kube-apiserver opens one gRPC
// connection per tunneled connection: idle ones are kept cheap (small read
// buffers; grpc-go returns write buffers to a pool after each flush).
func (s *Server) FrontendServerOptions(creds credentials.TransportCredentials) []grpc.ServerOption {
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxFrame), grpc.ConnectionTimeout(10 * time.Second),
		grpc.InitialWindowSize(FrontendWindow), grpc.InitialConnWindowSize(FrontendWindow),
		grpc.ReadBufferSize(16 << 10), experimental.BufferPool(s.pool), grpc.ForceServerCodecV2(grpcbuf.Codec{Pool: s.pool}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true})}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	return opts
}

// RefuseNodeClients is the TCP frontend's tls.Config.VerifyConnection: a
// client certificate whose subject CN is a node's (system:node:<name>: an
// agent's certificate, a kubelet's client certificate) is refused. The
// frontend is kube-apiserver's alone, and its client CA
// (--server-ca-cert) verifies only the chain: where that CA also signs
// agent or kubelet certificates (the agent CA or the cluster CA), any
// node's root could otherwise open tunnels through every node's agent.
func RefuseNodeClients(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return nil // no client certificate: ClientAuth refuses it where required
	}
	if cn := cs.PeerCertificates[0].Subject.CommonName; strings.HasPrefix(cn, proto.NodeCertPrefix) {
		return fmt.Errorf("client certificate CN %q is a node's: the kube-apiserver frontend serves kube-apiserver only (--server-ca-cert must not sign node or agent certificates)", cn)
	}
	return nil
}
