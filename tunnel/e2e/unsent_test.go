package e2e

import (
	"net"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/tunnel/grpcbuf"
)

// Both ends of an agent tunnel bound the bytes their socket keeps unsent
// in the kernel (TCP_NOTSENT_LOWAT), so that a new connection's packets do
// not queue behind megabytes of another connection's DATA.
// The daemons run in this process: their sockets are found among its file
// descriptors by the agent port.
func TestAgentHopLimitsUnsent(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{})
	startAgent(t, p, ps.agentAddr, nil)
	eventually(t, "agent tunnel", ps.srv.Ready)
	_, port, _ := net.SplitHostPort(ps.agentAddr)
	agentPort, _ := strconv.Atoi(port)

	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var server, agent int
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_STREAM {
			continue
		}
		local, lerr := unix.Getsockname(fd)
		peer, perr := unix.Getpeername(fd)
		if lerr != nil || perr != nil {
			continue // a listener, or not an inet socket
		}
		lp, pp := inetPort(local), inetPort(peer)
		if lp != agentPort && pp != agentPort {
			continue
		}
		lowat, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT)
		if err != nil {
			t.Fatal(err)
		}
		side := "agent"
		if lp == agentPort {
			side = "server"
			server++
		} else {
			agent++
		}
		if lowat != grpcbuf.UnsentLowat {
			t.Errorf("%s end of the agent tunnel: TCP_NOTSENT_LOWAT %d, want %d", side, lowat, grpcbuf.UnsentLowat)
		}
	}
	if server == 0 || agent == 0 {
		t.Fatalf("agent tunnel sockets not found (server ends %d, agent ends %d)", server, agent)
	}
}

func inetPort(sa unix.Sockaddr) int {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port
	case *unix.SockaddrInet6:
		return a.Port
	}
	return -1
}
