package netns

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Namespace a's pods: ingress-isolated (cutIngressClosed), or isolated
// both ways (cutBothClosed).
const (
	cutIngressClosed = `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: closed, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`
	cutBothClosed = `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: closed, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
`
)

// TestCutUDPJudgedPerDirection pins what --cut-denied-established does to
// a UDP flow, which has no SYN to tell a new connection from the middle
// of one. Outside host C talks to pod p's port 9998, allowed, and p
// answers. Once p's ingress denies C, the cut removes the entry and C's
// datagrams are dropped however often it sends; when p sends to C again
// (its egress is open), that is a connection p opens, as NetworkPolicy
// allows, and C's answers pass as its replies. Once p's egress denies C
// too, the next cut removes that entry and neither end gets through.
func TestCutUDPJudgedPerDirection(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-cuu-")
	dp, err := l.r.Dataplane(nft.Options{Node: "n1", CutDenied: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sync := func(policies string) nft.Result {
		t.Helper()
		res, err := dp.Sync(ctx, compile(t, spoofNode+namespaceA+podPDual+policies, policy.Options{}))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	psock := listen(t, l.p, "udp", 9998)[0]
	csock := listen(t, l.c, "udp", 41000)[0]
	write := func(c *net.UDPConn, to, msg string) {
		t.Helper()
		if _, err := c.WriteToUDPAddrPort([]byte(msg), ap(to)); err != nil {
			t.Fatalf("send %s to %s: %v", msg, to, err)
		}
	}
	// read returns the next datagram within d, "" when none came; d only
	// bounds the wait for one that is not coming.
	read := func(c *net.UDPConn, d time.Duration) string {
		buf := make([]byte, 100)
		_ = c.SetReadDeadline(time.Now().Add(d))
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return ""
		}
		return string(buf[:n])
	}
	fams := []struct{ p, c string }{{"10.244.0.5:9998", "192.168.1.2:41000"}, {"[fd00:244::5]:9998", "[fd00:1::2]:41000"}}

	sync(reuseIngress) // C may send to 9998
	for _, f := range fams {
		write(csock, f.p, "hello")
		if got := read(psock, 5*time.Second); got != "hello" {
			t.Fatalf("%s: p got %q from C before any change", f.p, got)
		}
		write(psock, f.c, "hi")
		if got := read(csock, 5*time.Second); got != "hi" {
			t.Fatalf("%s: C got %q from p before any change", f.c, got)
		}
	}

	if res := sync(cutIngressClosed); res.ConntrackDeleted < 2 {
		t.Errorf("isolating p's ingress cut %d entries, want C's flows of both families", res.ConntrackDeleted)
	}
	for _, f := range fams {
		write(csock, f.p, "denied")
		write(csock, f.p, "denied")
		if got := read(psock, time.Second); got != "" {
			t.Errorf("%s: p got %q from C after the cut, its ingress denies C", f.p, got)
		}
		// p's own new connection, and its replies.
		write(psock, f.c, "again")
		if got := read(csock, 5*time.Second); got != "again" {
			t.Errorf("%s: C got %q; p's egress allows it", f.c, got)
		}
		write(csock, f.p, "answer")
		if got := read(psock, 5*time.Second); got != "answer" {
			t.Errorf("%s: p got %q, want C's reply to the connection p opened", f.p, got)
		}
	}

	if res := sync(cutBothClosed); res.ConntrackDeleted < 2 {
		t.Errorf("isolating p's egress cut %d entries, want p's flows of both families", res.ConntrackDeleted)
	}
	for _, f := range fams {
		write(psock, f.c, "out")
		write(csock, f.p, "in")
		if got := read(csock, time.Second); got != "" {
			t.Errorf("%s: C got %q after the cut, p's egress denies C", f.c, got)
		}
		if got := read(psock, time.Second); got != "" {
			t.Errorf("%s: p got %q after the cut, its ingress denies C", f.p, got)
		}
	}
}
