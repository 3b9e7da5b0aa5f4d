package netns

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// pendingPolicy isolates namespace a's pods for ingress but for TCP 80
// from the outside host C.
const pendingPolicy = `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-c, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: 192.168.1.2/32}}]
    ports: [{protocol: TCP, port: 80}]
`

// pendingPod is pod p as the API has it before kubelet writes its
// address: scheduled to n1, its containers may already run.
const pendingPod = `---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {app: p}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {phase: Pending}
`

// TestPendingPodUnreachableUntilKnown: a pod whose
// container listens before its address reaches the agent is not
// reachable through the node meanwhile: the outside host's TCP SYN to it
// is dropped as an unknown destination (before, it met no ingress chain
// and the base chain accepted it, so the default-deny namespace's pod
// was open). The node's own connection (kubelet's probe) still gets
// through. Once the agent knows the address, the policy judges it and
// the allowed connection is made.
func TestPendingPodUnreachableUntilKnown(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-pnd-")
	dp := program(t, l.r, spoofNode+namespaceA+pendingPod+pendingPolicy, policy.Options{})
	ln := listenTCP(t, l.p, "tcp4", net.TCPAddr{Port: 80})
	marker := listen(t, l.r, "udp", 9998)[0]

	// The outside host's SYN, then a datagram to the node on the same
	// path: when the datagram arrives, the SYN has been judged.
	fd := startConnect(t, l.c, [4]byte{10, 244, 0, 5}, 80)
	send(t, l.c, ap("192.168.1.2:40000"), ap("192.168.1.1:9998"), "marker")
	receiveUntil(t, marker)
	unix.Close(fd)
	if n := dropped(t, dp, nft.ReasonUnknownDestination); n == 0 {
		t.Error("no packet dropped as an unknown destination: the pending pod was reachable")
	}
	if c, ok := acceptNow(t, ln); ok {
		c.Close()
		t.Error("the pending pod accepted a connection from outside although its namespace isolates it")
	}

	// The node's own connection (a probe) is node-local.
	dial(t, l.r, "10.244.0.5:80").Close()
	if c, ok := acceptNow(t, ln); ok {
		c.Close()
	}

	// The agent learns the address: the policy allows C.
	if _, err := dp.Sync(context.Background(), compile(t, spoofNode+namespaceA+podPV4+pendingPolicy, policy.Options{})); err != nil {
		t.Fatal(err)
	}
	dial(t, l.c, "10.244.0.5:80").Close()
}

// startConnect starts a TCP connection from ns to addr:port without
// waiting for it, and returns the socket.
func startConnect(t *testing.T, ns *NS, addr [4]byte, port int) int {
	t.Helper()
	fd := -1
	err := ns.Do(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err = unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: addr}); !errors.Is(err, unix.EINPROGRESS) {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// dial opens a TCP connection from ns; the timeout only keeps a broken
// test from hanging.
func dial(t *testing.T, ns *NS, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	if err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 30*time.Second)
		return err
	}); err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	return c
}

// acceptNow takes a connection the listener has queued, without waiting.
func acceptNow(t *testing.T, ln *net.TCPListener) (net.Conn, bool) {
	t.Helper()
	if err := ln.SetDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	defer ln.SetDeadline(time.Time{})
	c, err := ln.Accept()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return c, true
}
