package netns

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// reuseIngress isolates namespace a's pods for ingress but for UDP 9998
// from the outside host C; their egress is open.
const reuseIngress = `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-c-9998, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: 192.168.1.2/32}}, {ipBlock: {cidr: "fd00:1::2/128"}}]
    ports: [{protocol: UDP, port: 9998}]
`

// reusePod is pod name of n1 at spoofLab's pod addresses (p's).
func reusePod(name string) string {
	return strings.NewReplacer("name: p,", "name: "+name+",", "app: p", "app: "+name).Replace(podPDual)
}

// TestReusedAddressLosesOldFlows: the conntrack entries of a pod's
// address go with the pod, without --cut-denied-established. Pod p,
// ingress-isolated, has UDP flows it opened with the outside host C
// (both families), whose replies pass as established. A sync that changes
// nothing of p keeps them; a sync where p is gone and pod db holds its
// addresses (same interface, as a CNI reusing them) removes them, so C's
// next datagram of p's flow is a new connection db's ingress denies;
// likewise when the addresses leave the node in one sync and come back
// with db in another. Before, the entries outlived p and C's datagrams
// reached db as replies.
func TestReusedAddressLosesOldFlows(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-reu-")
	dp, err := l.r.Dataplane(nft.Options{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sync := func(pods string) nft.Result {
		t.Helper()
		res, err := dp.Sync(ctx, compile(t, spoofNode+namespaceA+pods+reuseIngress, policy.Options{}))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// The pod's sockets: 9000 for its flows, 9998 for the marker C may
	// send; C's at 41000.
	socks := listen(t, l.p, "udp", 9000, 9998)
	flow, marker := socks[0], socks[1]
	csock := listen(t, l.c, "udp", 41000)[0]
	pods := []string{"10.244.0.5", "[fd00:244::5]"}
	cs := []string{"192.168.1.2:41000", "[fd00:1::2]:41000"}
	write := func(c *net.UDPConn, to, msg string) {
		t.Helper()
		if _, err := c.WriteToUDPAddrPort([]byte(msg), ap(to)); err != nil {
			t.Fatalf("send %s to %s: %v", msg, to, err)
		}
	}
	// open: the pod opens a flow to C in each family and C answers.
	open := func() {
		t.Helper()
		for i, c := range cs {
			write(flow, c, "open")
			if got, _ := receiveUntil(t, csock); !strings.HasPrefix(got, "open") {
				t.Fatalf("C got %q", got)
			}
			write(csock, pods[i]+":9000", "reply")
		}
		// Both replies came before the marker: none was dropped.
		for range cs {
			if got, _ := receiveUntil(t, flow); !strings.HasPrefix(got, "reply") {
				t.Fatalf("the pod got %q", got)
			}
		}
	}
	// probe: C sends msg over the pod's flows, then the marker; what
	// reached the flow's socket by then.
	probe := func(msg string) []string {
		t.Helper()
		for _, p := range pods {
			write(csock, p+":9000", msg)
		}
		for _, p := range pods {
			write(csock, p+":9998", "marker")
		}
		var got []string
		for range pods {
			_, others := receiveUntil(t, marker, flow)
			got = append(got, others...)
		}
		return got
	}

	sync(reusePod("p"))
	open()
	// Pod q of n1 comes (in the API; nothing of p changes): p's flows
	// stay.
	res := sync(reusePod("p") + strings.ReplaceAll(reusePod("q"), "5", "9"))
	if got := probe("kept"); len(got) != 2 {
		t.Errorf("after an unrelated change the pod got %q, want C's two datagrams over its flows (released %d)", got, res.ConntrackReleased)
	}

	// db gets p's addresses in one sync.
	res = sync(reusePod("db"))
	if res.ConntrackReleased == 0 {
		t.Error("the sync that gave p's addresses to db removed no conntrack entry")
	}
	if got := probe("to-db"); len(got) > 0 {
		t.Errorf("FAIL-OPEN: db, whose ingress denies C on port 9000, got %q over p's flows", got)
	}

	// p again, then its addresses leave the node, then db gets them.
	sync(reusePod("p"))
	open()
	if res := sync(""); res.ConntrackReleased == 0 {
		t.Error("the sync that removed p removed no conntrack entry")
	}
	sync(reusePod("db"))
	if got := probe("to-db-later"); len(got) > 0 {
		t.Errorf("FAIL-OPEN: db got %q over the flows of p, deleted a sync earlier", got)
	}
}
