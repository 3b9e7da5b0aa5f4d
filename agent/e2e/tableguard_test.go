package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/agent"
	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/internal/netns"
)

// xOnlyY isolates x: only y may reach it.
const xOnlyY = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-only-y, namespace: a}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: "y"}}}]
`

// TestTableEditsAreRepaired: edits of table inet moat that keep its drop
// counters open the node's denied flows; the agent's table
// check notices each and replaces the table, with --resync=0, so nothing
// else would repair it, and reports it as a NodeTableEdited Event. A
// second agent started for the node exits (F5).
func TestTableEditsAreRepaired(t *testing.T) {
	requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	agentBinary(t)
	env := kubetest.Start(ctx, t, kubetest.WithCRDs(kubetest.CRDWithNewerFields(t)))
	c := newCluster(ctx, t, env, testNamespaces, testNodes, testPods)
	c.startAgent("n1", "--resync=0")
	c.startAgent("n2")
	c.waitReady("n1", "n2")
	fixture.MustPolicy(ctx, t, env, xOnlyY)
	isolated := map[flow]bool{{y, x, 80}: true, {w, x, 80}: false, {z, x, 80}: false}
	c.expect(ctx, "x isolated", isolated)

	for _, edit := range [][]string{
		{"flush", "chain", "inet", "moat", "forward"},
		{"delete", "chain", "inet", "moat", "forward"},
		{"insert", "rule", "inet", "moat", "forward", "accept"},
		{"flush", "table", "inet", "moat"},
		{"add", "table", "inet", "moat", "{ flags dormant ; }"},
		// x's ingress map element: x meets no ingress chain. Seen by
		// the kernel's use count of x's chain (nft.ChainShape.Use).
		{"delete", "element", "inet", "moat", "ingress4", "{ " + c.podAddr(t, x) + " }"},
	} {
		t.Run(strings.Join(edit, " "), func(t *testing.T) {
			c.nft(ctx, t, "n1", edit...)
			// The edit lets denied flows through until the agent
			// notices (every 5 s) and replaces the table.
			c.expect(ctx, "x isolated again after nft "+strings.Join(edit, " "), isolated)
			c.waitReady("n1")
		})
	}
	// A second agent for n1 exits at once: the first one
	// holds the node's lock.
	// A minute bounds the wait for its exit: one that runs instead
	// (before the lock) is killed then, and the test fails.
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	second := exec.CommandContext(sctx, agentBinary(t), "--node-name=n1", "--kubeconfig="+c.kubeconfig, "--netns="+c.nodeNS(t, "n1"),
		"--metrics-bind-address=", "--health-bind-address=")
	out, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "holds the lock") {
		t.Errorf("a second agent for n1: %v, want it to exit naming the lock; output:\n%s", err, out)
	}
	if ok, why := c.agents["n1"].ready(); !ok {
		t.Errorf("the first agent after the second one's attempt: %s", why)
	}
	fixture.Eventually(t, 30*time.Second, "a NodeTableEdited Event on n1", func() (bool, string) {
		evs, err := env.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=n1,reason=" + agent.EventNodeTableEdited})
		if err != nil {
			return false, err.Error()
		}
		return len(evs.Items) > 0, fmt.Sprintf("%d Events", len(evs.Items))
	})
}

// TestTableRestoredWhileNodeDeleted: n1's Node is deleted while its
// agent runs (--resync=0): the agent turns not ready and keeps the table.
// Then the table is deleted by hand: with no Node to compile for, the
// agent programs the last ruleset again, so x stays isolated; once the
// Node is back, it is ready again.
func TestTableRestoredWhileNodeDeleted(t *testing.T) {
	requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	agentBinary(t)
	env := kubetest.Start(ctx, t, kubetest.WithCRDs(kubetest.CRDWithNewerFields(t)))
	c := newCluster(ctx, t, env, testNamespaces, testNodes, testPods)
	c.startAgent("n1", "--resync=0")
	c.startAgent("n2")
	c.waitReady("n1", "n2")
	fixture.MustPolicy(ctx, t, env, xOnlyY)
	isolated := map[flow]bool{{y, x, 80}: true, {w, x, 80}: false, {z, x, 80}: false}
	c.expect(ctx, "x isolated", isolated)

	if err := env.Client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fixture.Eventually(t, 30*time.Second, "moat-agent n1 not ready without its Node", func() (bool, string) {
		ok, why := c.agents["n1"].ready()
		return !ok, why
	})
	c.expect(ctx, "x isolated by the table kept", isolated)
	c.nft(ctx, t, "n1", "delete", "table", "inet", "moat")
	// Open until the agent notices (every 5 s) and restores the table.
	c.expect(ctx, "x isolated again by the restored table", isolated)

	fixture.CreateNode(ctx, t, env, fixture.Node("n1", nil, "192.168.50.1"))
	c.waitReady("n1")
	c.expect(ctx, "x isolated with the Node back", isolated)
}

// TestDeniedConnectionsOfTheGapAreCut: a connection a policy denies,
// opened while the node had no table, is cut when the
// table is programmed again, without --cut-denied-established: after a
// table the agent finds deleted, after one it finds edited, and at the
// first sync of an agent that finds none (a rebooted node).
func TestDeniedConnectionsOfTheGapAreCut(t *testing.T) {
	requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	agentBinary(t)
	env := kubetest.Start(ctx, t, kubetest.WithCRDs(kubetest.CRDWithNewerFields(t)))
	c := newCluster(ctx, t, env, testNamespaces, testNodes, testPods)
	c.startAgent("n1")
	c.startAgent("n2")
	c.waitReady("n1", "n2")
	fixture.MustPolicy(ctx, t, env, xOnlyY)
	isolated := map[flow]bool{{y, x, 80}: true, {w, x, 80}: false, {z, x, 80}: false}
	c.expect(ctx, "x isolated", isolated)

	xNS := c.openPodNS(t, x)
	wNS := c.openPodNS(t, w)
	// An echo server on x:7000, where no policy lets w connect.
	xAddr := c.podAddr(t, x) + ":7000"
	var ln net.Listener
	if err := xNS.Do(func() (err error) { ln, err = net.Listen("tcp4", xAddr); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer conn.Close(); _, _ = io.Copy(conn, conn) }()
		}
	}()
	dial := func() (net.Conn, error) {
		var conn net.Conn
		err := wNS.Do(func() (err error) {
			d := net.Dialer{Timeout: 700 * time.Millisecond}
			conn, err = d.Dial("tcp4", xAddr)
			return err
		})
		return conn, err
	}
	echo := func(conn net.Conn, msg string) error {
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write([]byte(msg)); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		_, err := io.ReadFull(conn, buf)
		return err
	}
	if conn, err := dial(); err == nil {
		conn.Close()
		t.Fatal("w reached x:7000 with the table in place")
	}
	// Another nftables user on the node that tracks connections, as
	// kube-proxy, firewalld or any NAT rule does: conntrack stays on in
	// n1's namespace while Moat's table is gone.
	c.nft(ctx, t, "n1", "add", "table", "inet", "keepct")
	c.nft(ctx, t, "n1", "add", "chain", "inet", "keepct", "pre", "{ type filter hook prerouting priority -300 ; }")
	c.nft(ctx, t, "n1", "add", "rule", "inet", "keepct", "pre", "ct", "state", "new", "counter")
	defer exec.Command("ip", "netns", "exec", c.nodeNS(t, "n1"), "nft", "delete", "table", "inet", "keepct").Run()

	// gap opens a gap with open, connects w to x:7000 in it, has close
	// end it, and checks that the connection no longer carries data.
	gap := func(t *testing.T, open, close func()) {
		open()
		var conn net.Conn
		fixture.Eventually(t, 10*time.Second, "w connects to x:7000 while the table does not judge it", func() (bool, string) {
			var err error
			conn, err = dial()
			return err == nil, fmt.Sprint(err)
		})
		defer conn.Close()
		if err := echo(conn, "hello\n"); err != nil {
			t.Fatalf("echo over the gap's connection before the repair: %v", err)
		}
		close()
		c.expect(ctx, "table programmed again", isolated)
		c.waitReady("n1")
		if conn2, err := dial(); err == nil {
			conn2.Close()
			t.Fatal("a new connection w -> x:7000 is allowed after the repair")
		}
		fixture.Eventually(t, 10*time.Second, "the gap's connection cut", func() (bool, string) {
			err := echo(conn, "still there?\n")
			return err != nil, "the connection opened in the gap still carries data"
		})
	}
	t.Run("table deleted", func(t *testing.T) {
		gap(t, func() { c.nft(ctx, t, "n1", "delete", "table", "inet", "moat") }, func() {})
	})
	t.Run("forward flushed", func(t *testing.T) {
		gap(t, func() { c.nft(ctx, t, "n1", "flush", "chain", "inet", "moat", "forward") }, func() {})
	})
	t.Run("first sync finds no table", func(t *testing.T) {
		gap(t, func() {
			// A rebooted node: no agent and no table until the agent's
			// first sync.
			c.agents["n1"].stop(syscall.SIGTERM)
			c.nft(ctx, t, "n1", "delete", "table", "inet", "moat")
		}, func() {
			c.startAgent("n1")
		})
	})
}

// openPodNS opens the namespace of a pod ("namespace/name") of the lab:
// the one of the lab's namespaces that holds its address.
func (c *cluster) openPodNS(t *testing.T, pod string) *netns.NS {
	t.Helper()
	addr := c.podAddr(t, pod)
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if !strings.HasPrefix(name, c.lab.Name()) {
			continue
		}
		if a, err := exec.Command("ip", "-n", name, "-br", "addr").Output(); err != nil || !strings.Contains(string(a), " "+addr+"/") {
			continue
		}
		ns, err := netns.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Close() })
		return ns
	}
	t.Fatalf("no namespace of lab %s holds %s", c.lab.Name(), addr)
	return nil
}

// podAddr is a test pod's address.
func (c *cluster) podAddr(t *testing.T, pod string) string {
	t.Helper()
	for _, p := range testPods {
		if p.ns+"/"+p.name == pod {
			return p.ip
		}
	}
	t.Fatalf("no test pod %s", pod)
	return ""
}

// nodeNS is the name of a lab node's namespace.
func (c *cluster) nodeNS(t *testing.T, node string) string {
	t.Helper()
	ns, err := c.lab.NodeNetns(node)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}
