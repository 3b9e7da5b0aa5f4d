package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/deploy"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/internal/testenv"
)

// BenchmarkAgentScale loads the scale cluster (clustergen.Scale:
// 10,000 pods on 100 Node objects in 1,000 namespaces, 2,000
// NetworkPolicies, 200 ClusterNetworkPolicies) into a real API server,
// runs the real moat-agent binary for node-000 with real nftables in a
// network namespace of its own and reports:
//
//   - ms-to-ready: process start to /readyz 200 (lists, first compile, first
//     full transaction);
//
//   - rss-MB, hwm-MB: the agent's resident and peak memory after the label
//     updates;
//
//   - p50-ms, p99-ms: from sending a pod-label update to the API server to
//     the first change `nft monitor` reports in the node's namespace;
//
//   - first-compile-ms, first-program-ms: the first sync's phases (snapshot
//     and full compilation; ruleset build and the one transaction);
//
//   - relabel-compile-ms: mean compile phase of the label updates' syncs
//     (incremental).
//
//     go test -run '^$' -bench BenchmarkAgentScale -benchtime 1x -timeout 30m ./agent/e2e
func BenchmarkAgentScale(b *testing.B) {
	testenv.RequirePrivileged(b)
	bins := kubetest.RequireBinaries(b)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	crds, err := deploy.CRDs(deploy.Experimental)
	if err != nil {
		b.Fatal(err)
	}
	env, err := kubetest.Launch(ctx, bins, kubetest.WithCRDs(crds))
	if err != nil {
		b.Fatal(err)
	}
	defer env.Stop()

	gen := clustergen.Generate(clustergen.Scale)
	const node = "node-000"
	// The pod whose label the benchmark toggles, and a NetworkPolicy that
	// selects it only while it carries bench=on, with a rule of its own so
	// that every toggle changes the node's ruleset.
	var target *corev1.Pod
	for i := range gen.Pods {
		if gen.Pods[i].Spec.NodeName == node {
			target = &gen.Pods[i]
			break
		}
	}
	if target == nil {
		b.Fatalf("no pod on %s", node)
	}
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(7777)
	benchNP := networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-toggle", Namespace: target.Namespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"bench": "on"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "198.51.100.7/32"}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}
	start := time.Now()
	populate(ctx, b, env, gen, benchNP)
	b.Logf("populated the API server in %s", time.Since(start).Round(time.Second))

	nsName := fmt.Sprintf("moat-bench-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", nsName).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "delete", nsName).Run()
	kubeconfig := filepath.Join(b.TempDir(), "agent.kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig, fixture.AgentConfig(ctx, b, env)); err != nil {
		b.Fatal(err)
	}
	bin := agentBinary(b)

	var readyTotal, rssTotal, hwmTotal, compileTotal, firstCompile, firstProgram float64
	var lat []time.Duration
	for b.Loop() {
		r := runScaleIteration(ctx, b, env, bin, kubeconfig, nsName, node, target)
		readyTotal += r.ready.Seconds() * 1000
		rssTotal += r.rss
		hwmTotal += r.hwm
		compileTotal += r.compileMS
		firstCompile += r.firstCompile
		firstProgram += r.firstProgram
		lat = append(lat, r.latencies...)
	}
	n := float64(b.N)
	slices.Sort(lat)
	b.ReportMetric(readyTotal/n, "ms-to-ready")
	b.ReportMetric(rssTotal/n, "rss-MB")
	b.ReportMetric(hwmTotal/n, "hwm-MB")
	b.ReportMetric(compileTotal/n, "relabel-compile-ms")
	b.ReportMetric(firstCompile/n, "first-compile-ms")
	b.ReportMetric(firstProgram/n, "first-program-ms")
	b.ReportMetric(pct(lat, 50), "p50-ms")
	b.ReportMetric(pct(lat, 99), "p99-ms")
	b.Logf("%d label updates: min %.1f ms, p50 %.1f ms, p99 %.1f ms, max %.1f ms", len(lat), pct(lat, 0), pct(lat, 50), pct(lat, 99), pct(lat, 100))
}

func pct(d []time.Duration, p int) float64 {
	if len(d) == 0 {
		return 0
	}
	i := (len(d) - 1) * p / 100
	return d[i].Seconds() * 1000
}

type scaleResult struct {
	ready                      time.Duration
	firstCompile, firstProgram float64
	rss, hwm                   float64
	compileMS                  float64
	latencies                  []time.Duration
}

// labelUpdates is how many label toggles each iteration measures.
const labelUpdates = 60

func runScaleIteration(ctx context.Context, b *testing.B, env *kubetest.Env, bin, kubeconfig, netns, node string, target *corev1.Pod) scaleResult {
	health := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	logPath := filepath.Join(b.TempDir(), "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--node-name="+node, "--kubeconfig="+kubeconfig, "--netns="+netns,
		"--health-bind-address="+health, "--metrics-bind-address="+metrics,
		"--feature-gates=IngressNetworksAndNodes=true", "--leader-elect=false", "--v=2")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_, _ = cmd.Process.Wait()
	}()
	var res scaleResult
	client := http.Client{Timeout: 2 * time.Second}
	for {
		if time.Since(start) > 10*time.Minute {
			tail, _ := os.ReadFile(logPath)
			b.Fatalf("agent not ready after 10 minutes:\n%s", tail)
		}
		resp, err := client.Get("http://" + health + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	res.ready = time.Since(start)
	// What the first sync cost, before any other sync (compile: snapshot and
	// full compilation; program: ruleset build and the transaction).
	res.firstCompile = sumMetric(b, "http://"+metrics+"/metrics", `moat_agent_sync_duration_seconds`, `phase="compile"`) * 1000
	res.firstProgram = sumMetric(b, "http://"+metrics+"/metrics", `moat_agent_sync_duration_seconds`, `phase="program"`) * 1000

	mon := startMonitor(b, netns)
	defer mon.stop()
	pods := env.Client.CoreV1().Pods(target.Namespace)
	labels := func(on bool) map[string]string {
		l := map[string]string{}
		for k, v := range target.Labels {
			l[k] = v
		}
		if on {
			l["bench"] = "on"
		}
		return l
	}
	for i := range labelUpdates {
		time.Sleep(150 * time.Millisecond) // let the previous change settle
		mon.drain()
		p, err := pods.Get(ctx, target.Name, metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		p.Labels = labels(i%2 == 0)
		sent := time.Now()
		if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		at, ok := mon.next(10 * time.Second)
		if !ok {
			tail, _ := os.ReadFile(logPath)
			b.Fatalf("update %d: no nftables change within 10 s\n%s", i, tail[max(0, len(tail)-4000):])
		}
		res.latencies = append(res.latencies, at.Sub(sent))
	}
	res.rss, res.hwm = procMemMB(b, cmd.Process.Pid)
	count := countMetric(b, "http://"+metrics+"/metrics", `moat_agent_sync_duration_seconds`, `phase="compile"`)
	sum := sumMetric(b, "http://"+metrics+"/metrics", `moat_agent_sync_duration_seconds`, `phase="compile"`) * 1000
	if count > 1 {
		// The label updates' syncs only.
		res.compileMS = (sum - res.firstCompile) / (count - 1)
	}
	return res
}

// monitor follows `nft monitor` in a namespace: each line is a change the
// kernel made to the ruleset, reported by the kernel's nftables netlink
// notifications.
type monitor struct {
	cmd   *exec.Cmd
	lines chan time.Time
}

func startMonitor(b testing.TB, netns string) *monitor {
	// nft writes to a pipe through stdio's block buffer: stdbuf makes it
	// flush every line, so a small transaction is seen when it happens.
	// -t (terse) keeps set contents out of the cache nft loads first.
	cmd := exec.Command("ip", "netns", "exec", netns, "stdbuf", "-oL", "nft", "-t", "monitor", "ruleset")
	errLog := filepath.Join(b.TempDir(), "nft-monitor.err")
	ef, err := os.Create(errLog)
	if err != nil {
		b.Fatal(err)
	}
	defer ef.Close()
	cmd.Stderr = ef
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	m := &monitor{cmd: cmd, lines: make(chan time.Time, 1<<16)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			select {
			case m.lines <- time.Now():
			default:
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	// nft reads the whole ruleset before it reports anything, which takes
	// seconds with this table: wait until it reports a change of its own.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if out, err := exec.Command("ip", "netns", "exec", netns, "nft", "add table inet moat-bench-probe; delete table inet moat-bench-probe").CombinedOutput(); err != nil {
			b.Fatalf("probe table: %v %s", err, out)
		}
		if _, ok := m.next(time.Second); ok {
			break
		}
		if time.Now().After(deadline) {
			msg, _ := os.ReadFile(errLog)
			b.Fatalf("nft monitor reported nothing for 2 minutes (process state %v): %s", cmd.ProcessState, msg)
		}
	}
	return m
}

func (m *monitor) drain() {
	for {
		select {
		case <-m.lines:
		default:
			return
		}
	}
}

func (m *monitor) next(timeout time.Duration) (time.Time, bool) {
	select {
	case t := <-m.lines:
		return t, true
	case <-time.After(timeout):
		return time.Time{}, false
	}
}

func (m *monitor) stop() {
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
}

// populate writes the generated cluster (and the benchmark's policy) with
// 32 parallel clients, playing the kubelet for node addresses and pod IPs.
func populate(ctx context.Context, b *testing.B, env *kubetest.Env, gen *clustergen.Cluster, extra networkingv1.NetworkPolicy) {
	c := env.Client
	run := func(what string, n int, f func(i int) error) {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		sem := make(chan struct{}, 32)
		for i := range n {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := f(i); err != nil {
					errs <- fmt.Errorf("%s %d: %w", what, i, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	run("namespace", len(gen.Namespaces), func(i int) error {
		_, err := c.CoreV1().Namespaces().Create(ctx, &gen.Namespaces[i], metav1.CreateOptions{})
		return err
	})
	run("node", len(gen.Nodes), func(i int) error {
		n := gen.Nodes[i].DeepCopy()
		st := n.Status
		n.Status = corev1.NodeStatus{}
		got, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		got.Status = st
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
	run("pod", len(gen.Pods), func(i int) error {
		p := gen.Pods[i].DeepCopy()
		for j := range p.Spec.Containers {
			p.Spec.Containers[j].Image = "registry.k8s.io/pause:3.10"
		}
		ip := p.Status.PodIP
		p.Status = corev1.PodStatus{}
		got, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		got.Status.Phase = corev1.PodRunning
		got.Status.PodIP = ip
		got.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		_, err = c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
	nps := append(slices.Clone(gen.NetworkPolicies), extra)
	run("networkpolicy", len(nps), func(i int) error {
		_, err := c.NetworkingV1().NetworkPolicies(nps[i].Namespace).Create(ctx, &nps[i], metav1.CreateOptions{})
		return err
	})
	run("clusternetworkpolicy", len(gen.ClusterNetworkPolicies), func(i int) error {
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&gen.ClusterNetworkPolicies[i])
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{Object: obj}
		u.SetAPIVersion("policy.networking.k8s.io/v1alpha2")
		u.SetKind("ClusterNetworkPolicy")
		return fixture.Policy(ctx, env, u)
	})
}

// procMemMB reads VmRSS and VmHWM from /proc.
func procMemMB(b *testing.B, pid int) (rss, hwm float64) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		for key, dst := range map[string]*float64{"VmRSS:": &rss, "VmHWM:": &hwm} {
			if v, ok := strings.CutPrefix(line, key); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				*dst = kb / 1024
			}
		}
	}
	return rss, hwm
}

// sumMetric and countMetric read a histogram's _sum and _count for the
// series with labels.
func sumMetric(b *testing.B, url, name, labels string) float64 {
	return metricValue(b, url, name+"_sum", labels)
}

func countMetric(b *testing.B, url, name, labels string) float64 {
	return metricValue(b, url, name+"_count", labels)
}

func metricValue(b *testing.B, url, series, labels string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.HasPrefix(f[0], series+"{") && strings.Contains(f[0], labels) {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}
