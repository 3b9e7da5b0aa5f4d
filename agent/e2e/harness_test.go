// Package e2e runs real moat-agent processes, one per lab node, against a
// real kube-apiserver and checks connectivity with real packets between
// network namespaces (see agent_test.go for the scenarios).
package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/lab"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// requireHost ends the test without root, nft or ip, by the one CI rule
// (internal/testenv): a loud skip on a developer machine, a failure in CI.
func requireHost(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test with network namespaces and a real kube-apiserver; runs without -short")
	}
	testenv.RequirePrivileged(t)
}

// buildAgent compiles cmd/moat-agent once per test binary, with -tags
// moatbench (SIGUSR1 asks for a checked resync, for BenchmarkAgentScale);
// TestMain removes it.
var buildOnce struct {
	sync.Once
	dir, path string
	err       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildOnce.dir != "" {
		os.RemoveAll(buildOnce.dir)
	}
	os.Exit(code)
}

func agentBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := kubetest.RepoRoot()
		if err != nil {
			buildOnce.err = err
			return
		}
		dir, err := os.MkdirTemp("", "moat-agent-e2e-")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.dir, buildOnce.path = dir, filepath.Join(dir, "moat-agent")
		cmd := exec.Command("go", "build", "-tags", "moatbench", "-o", buildOnce.path, "./cmd/moat-agent")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildOnce.err = fmt.Errorf("go build ./cmd/moat-agent: %v\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.path
}

// cluster is a lab (one namespace per node and pod) mirrored by objects in
// a real API server, with one moat-agent process per node.
type cluster struct {
	t          *testing.T
	env        *kubetest.Env
	lab        *lab.Lab
	kubeconfig string
	agents     map[string]*agentProc
}

// podSpec describes a pod of the test cluster.
type podSpec struct {
	ns, name, node string
	labels         map[string]string
	ip             string
}

// nodeSpec describes a node.
type nodeSpec struct {
	name, addr string
}

// ports every pod answers on (TCP).
var ports = []uint16{80, 8080, 9090}

// newCluster builds the lab, creates the same objects in the API server and
// starts responders. Everything is removed when the test ends, also on
// failure.
func newCluster(ctx context.Context, t *testing.T, env *kubetest.Env, namespaces map[string]map[string]string, nodes []nodeSpec, pods []podSpec) *cluster {
	t.Helper()
	// The lab is planned from the same cluster the API server will hold.
	var pc policy.Cluster
	for _, n := range nodes {
		pc.Nodes = append(pc.Nodes, policy.Node{Name: n.name, Addrs: []netip.Addr{netip.MustParseAddr(n.addr)}})
	}
	for _, p := range pods {
		pc.Pods = append(pc.Pods, &policy.Pod{Namespace: p.ns, Name: p.name, NodeName: p.node, Labels: p.labels, IPs: []netip.Addr{netip.MustParseAddr(p.ip)}})
	}
	// Agents program the nodes; the lab answers on every pod's ports.
	var pp []matrix.PortProto
	for _, port := range ports {
		pp = append(pp, matrix.PortProto{Port: port, Protocol: policy.ProtoTCP})
	}
	l, err := lab.Up(ctx, policy.Compile(&pc, policy.Options{}), lab.Options{Ports: pp, Unenforced: true})
	if err != nil {
		t.Fatalf("build lab: %v", err)
	}
	c := &cluster{t: t, env: env, lab: l, agents: map[string]*agentProc{}}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("tear down lab %s: %v", l.Name(), err)
		}
	})

	for name, labels := range namespaces {
		fixture.CreateNamespace(ctx, t, env, fixture.Namespace(name, labels))
	}
	for _, n := range nodes {
		fixture.CreateNode(ctx, t, env, fixture.Node(n.name, nil, n.addr))
	}
	for _, p := range pods {
		fixture.CreatePod(ctx, t, env, fixture.Pod(p.ns, p.name, p.node, p.labels, nil), p.ip)
	}
	c.kubeconfig = filepath.Join(t.TempDir(), "agent.kubeconfig")
	if err := env.WriteKubeconfig(c.kubeconfig, fixture.AgentConfig(ctx, t, env)); err != nil {
		t.Fatal(err)
	}
	return c
}

// agentProc is one moat-agent process.
type agentProc struct {
	node   string
	cmd    *exec.Cmd
	health string
	log    string
	done   chan error
}

// startAgent runs moat-agent for a node, programming the node's namespace.
func (c *cluster) startAgent(node string, extra ...string) *agentProc {
	t := c.t
	t.Helper()
	netns, err := c.lab.NodeNetns(node)
	if err != nil {
		t.Fatal(err)
	}
	p := &agentProc{node: node, health: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), done: make(chan error, 1)}
	p.log = filepath.Join(t.TempDir(), "moat-agent-"+node+".log")
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--node-name=" + node,
		"--kubeconfig=" + c.kubeconfig,
		"--netns=" + netns,
		"--metrics-bind-address=127.0.0.1:0",
		"--health-bind-address=" + p.health,
		"--v=2",
	}, extra...)
	p.cmd = exec.Command(agentBinary(t), args...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	// If the test binary dies (a timeout), the agent dies with it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.done <- p.cmd.Wait()
		logf.Close()
	}()
	c.agents[node] = p
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM)
		if t.Failed() {
			if b, err := os.ReadFile(p.log); err == nil {
				if len(b) > 6000 {
					b = b[len(b)-6000:]
				}
				t.Logf("moat-agent %s log tail:\n%s", node, b)
			}
		}
	})
	return p
}

// stop signals the process and waits for it (SIGKILL after 10 s).
func (p *agentProc) stop(sig syscall.Signal) {
	if p.cmd.ProcessState != nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *agentProc) ready() (bool, string) {
	select {
	case err := <-p.done:
		p.done <- err
		return false, fmt.Sprintf("moat-agent %s exited: %v", p.node, err)
	default:
	}
	client := http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + p.health + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, resp.Status
}

// nft runs nft with args inside node's namespace, as an administrator
// on the node would (flushing what the agent programmed).
func (c *cluster) nft(ctx context.Context, t *testing.T, node string, args ...string) {
	t.Helper()
	ns, err := c.lab.NodeNetns(node)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("nft %v on %s: %v\n%s", args, node, err, out)
	}
}

func (c *cluster) waitReady(nodes ...string) {
	c.t.Helper()
	for _, n := range nodes {
		fixture.Eventually(c.t, 60*time.Second, "moat-agent "+n+" ready", c.agents[n].ready)
	}
}

// flow is one TCP connection attempt between two pods.
type flow struct {
	src, dst string // namespace/name
	port     uint16
}

func (f flow) String() string { return fmt.Sprintf("%s -> %s:%d", f.src, f.dst, f.port) }

const probeTimeout = 600 * time.Millisecond

// probe opens the connections and reports which got through.
func (c *cluster) probe(ctx context.Context, flows ...flow) []bool {
	c.t.Helper()
	index := map[flow]int{}
	for i, f := range flows {
		index[f] = i
	}
	rep, err := c.lab.Measure(ctx, lab.ProbeOptions{Timeout: probeTimeout, Only: func(m matrix.Flow) bool {
		_, ok := index[flow{src: m.From, dst: m.To, port: m.Port}]
		return ok
	}})
	if err != nil {
		c.t.Fatalf("probe %v: %v", flows, err)
	}
	out := make([]bool, len(flows))
	seen := 0
	for _, m := range rep.Flows {
		if i, ok := index[flow{src: m.From, dst: m.To, port: m.Port}]; ok && m.Measured {
			out[i] = m.Allowed
			seen++
		}
	}
	if seen != len(flows) {
		c.t.Fatalf("probe %v: %d of %d flows measured (unknown pods?)", flows, seen, len(flows))
	}
	return out
}

// expect waits until every flow's reachability is as wanted (rules take a
// moment to arrive) and fails the test if it never is.
func (c *cluster) expect(ctx context.Context, what string, want map[flow]bool) {
	c.t.Helper()
	flows := make([]flow, 0, len(want))
	for f := range want {
		flows = append(flows, f)
	}
	fixture.Eventually(c.t, 20*time.Second, what, func() (bool, string) {
		got := c.probe(ctx, flows...)
		var wrong []string
		for i, f := range flows {
			if got[i] != want[f] {
				wrong = append(wrong, fmt.Sprintf("%s reached=%v want %v", f, got[i], want[f]))
			}
		}
		return len(wrong) == 0, fmt.Sprint(wrong)
	})
}
