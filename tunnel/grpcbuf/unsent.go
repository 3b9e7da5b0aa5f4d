package grpcbuf

import (
	"context"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
)

// UnsentLowat bounds the bytes an agent-hop socket holds in the kernel not
// yet sent (TCP_NOTSENT_LOWAT). One agent stream carries every connection
// of an agent in one FIFO: without a bound the kernel's autotuned send
// buffer fills with megabytes of bulk DATA, and every packet queued after
// it (a new connection's DIAL_RSP, its TLS handshake, credit) waits for
// all of that to cross the link (10 s at 5 Mbit/s). With it
// the socket reports writable only below the mark, so gRPC's writer, and
// behind it the connections' senders, wait in the process, where queued
// control packets overtake DATA (mux flushes them before each DATA). Bytes
// in flight on the network are still the congestion window's.
const UnsentLowat = 128 << 10

// LimitUnsent sets TCP_NOTSENT_LOWAT to UnsentLowat on rc's socket.
func LimitUnsent(rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, UnsentLowat)
	}); err != nil {
		return err
	}
	return serr
}

// LimitUnsentCreds wraps an agent hop's transport credentials so that every
// connection's TCP socket gets LimitUnsent before the TLS handshake, on the
// server's accepted connections and the agent's dialed ones alike (also
// through an HTTPS proxy: the socket is then the one to the proxy).
func LimitUnsentCreds(c credentials.TransportCredentials) credentials.TransportCredentials {
	return unsentCreds{c}
}

type unsentCreds struct {
	credentials.TransportCredentials
}

func limit(c net.Conn) {
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			_ = LimitUnsent(rc) // best effort: not a TCP socket (tests' pipes), or an old kernel
		}
	}
}

func (u unsentCreds) ClientHandshake(ctx context.Context, authority string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	limit(c)
	return u.TransportCredentials.ClientHandshake(ctx, authority, c)
}

func (u unsentCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	limit(c)
	return u.TransportCredentials.ServerHandshake(c)
}

func (u unsentCreds) Clone() credentials.TransportCredentials {
	return unsentCreds{u.TransportCredentials.Clone()}
}
