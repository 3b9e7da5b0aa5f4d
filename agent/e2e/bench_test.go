package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/deploy"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/internal/testenv"
)

// scaleCases are the clusters BenchmarkAgentScale loads, in issue 8's
// workload shape (clustergen.Config.Workloads: teams' namespaces running
// Deployments and StatefulSets, NetworkPolicies per app, ClusterNetwork-
// Policies by team and app). Each has about 100 pods per node, as real
// nodes do.
var scaleCases = []struct {
	name string
	cfg  clustergen.Config
}{
	// The first-sync goal: a node with 100 local pods in a 10,000-pod
	// cluster (7,000 NetworkPolicies, 500 ClusterNetworkPolicies).
	{"pods=10000", clustergen.Scale10k},
	// The memory and latency goals: 30,000 pods on 300 nodes in 3,000
	// namespaces, 20,000 policies (19,000 NetworkPolicies, 1,000
	// ClusterNetworkPolicies).
	{"pods=30000", clustergen.Config{Nodes: 300, Namespaces: 3000, Pods: 30000, NetworkPolicies: 19000, ClusterPolicies: 1000, Seed: 1, Workloads: true}},
	// How memory grows with pods alone: 100,000 pods on 1,000 nodes, the
	// same 20,000 policies.
	{"pods=100000", clustergen.Config{Nodes: 1000, Namespaces: 3000, Pods: 100000, NetworkPolicies: 19000, ClusterPolicies: 1000, Seed: 1, Workloads: true}},
}

// BenchmarkAgentScale loads a real kube-apiserver (internal/kubetest) with
// a generated cluster, every object created through the API (pods get
// status.podIPs through the status subresource, as from a kubelet), runs
// the real moat-agent binary for node-000 with real nftables in a network
// namespace of its own, talking to the API server through a byte-counting
// TCP proxy, and reports per size:
//
//   - ms-to-ready: process start to /readyz 200 (lists, first compile, first
//     full transaction); list-MB: bytes the API server sent until then;
//
//   - first-sync-ms: the first sync from complete caches to the kernel
//     (first-compile-ms: snapshot and compilation; first-program-ms: ruleset
//     build and the one nftables transaction);
//
//   - p50-ms, p99-ms: from sending a pod-label update to the API server to
//     the first change `nft monitor` reports in the node's namespace
//     (labelUpdates updates, each flipping whether a pod on node-000 is
//     selected by a NetworkPolicy, so each changes the node's table);
//     relabel-compile-ms, relabel-program-ms: mean compile and program
//     phases of their syncs;
//
//   - events/s, cpu-us/event, bytes/event: a burst of churnUpdates label
//     updates of random pods across the cluster (a remote pod's change
//     reaches every agent, because any pod may be any policy's peer), on a
//     label no selector reads: watch events the agent received per second
//     until it had them all and was idle again, its CPU time per event (the
//     nft processes it ran included), and API server bytes per event;
//     read-events/s, read-cpu-us/event: the same with changes of the app
//     label, which the generated policies select on, so each may move the
//     pod in or out of selections and is compiled;
//
//   - rss-MB, hwm-MB, heap-MB: the agent's resident and peak memory and Go
//     heap in use at the end; rss-file-MB: the part of rss-MB that maps
//     files (the binary), the rest being the agent's own memory;
//
//   - checked-resync-ms, checked-resync-hwm-MB: right after the first
//     sync, a checked resync (as each --resync period; SIGUSR1 in the
//     benchmark's build): compile from scratch, and since nothing else
//     has committed to nftables in the node's namespace yet, no replace of
//     the table; its sync's duration, the agent's resident memory when it
//     started (checked-resync-rss-MB) and its peak during it (the peak is
//     reset before it). Later the monitor below commits probes there, as
//     another nftables writer would;
//
//   - resync-ms, resync-rss-MB, resync-hwm-MB: then a forced resync
//     (SIGHUP: compile from scratch, replace the whole table): the same,
//     after the bursts; checked-after-ms, checked-after-rss-MB,
//     checked-after-hwm-MB: a checked resync right after it (which
//     recorded the generation), in the same state.
//
//     go test -run '^$' -bench 'BenchmarkAgentScale/pods=30000' -benchtime 1x -timeout 90m ./agent/e2e
//
// With MOAT_BENCH_PROFILES=DIR the agent's CPU profile of the burst, its
// heap profile at the end and as the GC last marked it 20 s into the
// second burst (burst.heap.pprof), its log at -v=4 (every sync with its
// compile and program times) and the label updates' times (labels.txt)
// are saved there; MOAT_BENCH_AGENT_ENV adds
// variables to the agent's environment (GOMEMLIMIT=150MiB, GOGC=50).
func BenchmarkAgentScale(b *testing.B) {
	for _, sc := range scaleCases {
		b.Run(sc.name, func(b *testing.B) { benchScale(b, sc.cfg) })
	}
}

const (
	// labelUpdates is how many label toggles each iteration times.
	labelUpdates = 100
	// churnUpdates is the size of the event burst.
	churnUpdates = 5000
	// loadConcurrency bounds the loader's requests in flight.
	loadConcurrency = 64
)

func benchScale(b *testing.B, cfg clustergen.Config) {
	testenv.RequirePrivileged(b)
	bins := kubetest.RequireBinaries(b)
	ctx, cancel := context.WithTimeout(context.Background(), 85*time.Minute)
	defer cancel()
	crds, err := deploy.CRDs(deploy.Experimental)
	if err != nil {
		b.Fatal(err)
	}
	// The loader creates tens of thousands of objects; the default
	// in-flight limits (and priority and fairness) would throttle it.
	env, err := kubetest.Launch(ctx, bins, kubetest.WithCRDs(crds), kubetest.WithAPIServerArgs(
		"--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000", "--enable-priority-and-fairness=false"))
	if err != nil {
		b.Fatal(err)
	}
	defer env.Stop()

	gen := clustergen.Generate(cfg)
	const node = "node-000"
	// The pod whose label the benchmark toggles, and a NetworkPolicy that
	// selects it only while it carries bench=on, with a rule of its own so
	// that every toggle changes the node's ruleset.
	var target *corev1.Pod
	local := 0
	for i := range gen.Pods {
		if gen.Pods[i].Spec.NodeName == node {
			local++
			if target == nil {
				target = &gen.Pods[i]
			}
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
	counts, err := kubetest.Load(ctx, env, gen, kubetest.LoadOptions{Concurrency: loadConcurrency, ExtraNetworkPolicies: []networkingv1.NetworkPolicy{benchNP}})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %s in %s (%.0f objects/s); %d pods on %s", counts, time.Since(start).Round(time.Second), float64(counts.Requests)/time.Since(start).Seconds(), local, node)

	nsName := fmt.Sprintf("moat-bench-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", nsName).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "delete", nsName).Run()
	proxy, err := newCountingProxy(strings.TrimPrefix(env.URL, "https://"))
	if err != nil {
		b.Fatal(err)
	}
	defer proxy.close()
	agentCfg := fixture.AgentConfig(ctx, b, env)
	agentCfg.Host = "https://" + proxy.addr()
	kubeconfig := filepath.Join(b.TempDir(), "agent.kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig, agentCfg); err != nil {
		b.Fatal(err)
	}
	bin := agentBinary(b)
	var others []*corev1.Pod
	for i := range gen.Pods {
		if gen.Pods[i].Spec.NodeName != node {
			others = append(others, &gen.Pods[i])
		}
	}

	var sum scaleResult
	var lat, apiLat []time.Duration
	for b.Loop() {
		r := runScaleIteration(ctx, b, env, proxy, bin, kubeconfig, nsName, node, target, others)
		sum.add(r)
		lat = append(lat, r.latencies...)
		apiLat = append(apiLat, r.apiLatencies...)
	}
	n := float64(b.N)
	slices.Sort(lat)
	b.ReportMetric(sum.ready.Seconds()*1000/n, "ms-to-ready")
	b.ReportMetric(sum.listMB/n, "list-MB")
	b.ReportMetric((sum.firstCompile+sum.firstProgram)/n, "first-sync-ms")
	b.ReportMetric(sum.firstCompile/n, "first-compile-ms")
	b.ReportMetric(sum.firstProgram/n, "first-program-ms")
	b.ReportMetric(pct(lat, 50), "p50-ms")
	b.ReportMetric(pct(lat, 99), "p99-ms")
	b.ReportMetric(sum.compileMS/n, "relabel-compile-ms")
	b.ReportMetric(sum.programMS/n, "relabel-program-ms")
	b.ReportMetric(sum.eventsPerSec/n, "events/s")
	b.ReportMetric(sum.cpuPerEvent/n, "cpu-us/event")
	b.ReportMetric(sum.readEventsPerSec/n, "read-events/s")
	b.ReportMetric(sum.readCPUPerEvent/n, "read-cpu-us/event")
	b.ReportMetric(sum.bytesPerEvent/n, "bytes/event")
	b.ReportMetric(sum.rss/n, "rss-MB")
	b.ReportMetric(sum.hwm/n, "hwm-MB")
	b.ReportMetric(sum.rssFile/n, "rss-file-MB")
	b.ReportMetric(sum.heap/n, "heap-MB")
	b.ReportMetric(sum.checkedResync.ms/n, "checked-resync-ms")
	b.ReportMetric(sum.checkedResync.rss/n, "checked-resync-rss-MB")
	b.ReportMetric(sum.checkedResync.hwm/n, "checked-resync-hwm-MB")
	b.ReportMetric(sum.resync.ms/n, "resync-ms")
	b.ReportMetric(sum.resync.rss/n, "resync-rss-MB")
	b.ReportMetric(sum.resync.hwm/n, "resync-hwm-MB")
	b.ReportMetric(sum.checkedAfter.ms/n, "checked-after-ms")
	b.ReportMetric(sum.checkedAfter.rss/n, "checked-after-rss-MB")
	b.ReportMetric(sum.checkedAfter.hwm/n, "checked-after-hwm-MB")
	b.Logf("%d label updates: min %.1f ms, p50 %.1f ms, p99 %.1f ms, max %.1f ms", len(lat), pct(lat, 0), pct(lat, 50), pct(lat, 99), pct(lat, 100))
	slices.Sort(apiLat)
	b.Logf("of which the API server's accepting the update: p50 %.1f ms, p99 %.1f ms, max %.1f ms", pct(apiLat, 50), pct(apiLat, 99), pct(apiLat, 100))
	if out, err := exec.Command("uptime").Output(); err == nil {
		b.Logf("load: %s", strings.TrimSpace(string(out)))
	}
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
	listMB                     float64
	firstCompile, firstProgram float64
	compileMS, programMS       float64
	eventsPerSec, cpuPerEvent  float64
	readEventsPerSec           float64
	readCPUPerEvent            float64
	bytesPerEvent              float64
	rss, hwm, heap             float64
	rssFile                    float64 // of rss: file-backed (the binary)
	checkedResync, resync      resyncCost
	checkedAfter               resyncCost
	latencies                  []time.Duration
	// apiLatencies: how long each label update took the API server to
	// accept (part of latencies; the agent is not involved).
	apiLatencies []time.Duration
}

func (s *scaleResult) add(r scaleResult) {
	s.ready += r.ready
	s.listMB += r.listMB
	s.firstCompile += r.firstCompile
	s.firstProgram += r.firstProgram
	s.compileMS += r.compileMS
	s.programMS += r.programMS
	s.eventsPerSec += r.eventsPerSec
	s.readEventsPerSec += r.readEventsPerSec
	s.readCPUPerEvent += r.readCPUPerEvent
	s.cpuPerEvent += r.cpuPerEvent
	s.bytesPerEvent += r.bytesPerEvent
	s.rss += r.rss
	s.hwm += r.hwm
	s.rssFile += r.rssFile
	s.heap += r.heap
	s.checkedResync.add(r.checkedResync)
	s.resync.add(r.resync)
	s.checkedAfter.add(r.checkedAfter)
}

func runScaleIteration(ctx context.Context, b *testing.B, env *kubetest.Env, proxy *countingProxy, bin, kubeconfig, netns, node string, target *corev1.Pod, others []*corev1.Pod) scaleResult {
	health := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(b))
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", testenv.FreePort(b))
	logPath := filepath.Join(b.TempDir(), "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	// With MOAT_BENCH_PROFILES the agent logs every sync with its timings
	// (-v=4), and its log is kept there with the label updates' times.
	profiles := os.Getenv("MOAT_BENCH_PROFILES")
	verbosity := "--v=2"
	if profiles != "" {
		verbosity = "--v=4"
		defer func() {
			if log, err := os.ReadFile(logPath); err == nil {
				_ = os.WriteFile(filepath.Join(profiles, "agent.log"), log, 0o644)
			}
		}()
	}
	cmd := exec.Command(bin, "--node-name="+node, "--kubeconfig="+kubeconfig, "--netns="+netns,
		"--health-bind-address="+health, "--metrics-bind-address="+strings.TrimSuffix(strings.TrimPrefix(metricsURL, "http://"), "/metrics"),
		"--feature-gates=IngressNetworksAndNodes=true", "--leader-elect=false", verbosity, "--profiling",
		// Plain HTTP on loopback: the benchmark scrapes without a token.
		"--metrics-secure=false")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// MOAT_BENCH_AGENT_ENV adds variables to the agent's environment, for
	// example the Go runtime's GOMEMLIMIT or GOGC.
	cmd.Env = append(os.Environ(), strings.Fields(os.Getenv("MOAT_BENCH_AGENT_ENV"))...)
	fail := func(format string, args ...any) {
		tail, _ := os.ReadFile(logPath)
		b.Fatalf(format+"\nagent log tail:\n%s", append(args, tail[max(0, len(tail)-4000):])...)
	}
	bytesBefore := proxy.received()
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
		if time.Since(start) > 20*time.Minute {
			fail("agent not ready after 20 minutes")
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
	res.listMB = float64(proxy.received()-bytesBefore) / 1e6
	// What the first sync cost (the cluster is still, so it is the only
	// sync so far).
	m := scrape(b, metricsURL)
	if n := m.get(`moat_agent_sync_duration_seconds_count{phase="compile"}`); n != 1 {
		b.Logf("%v syncs before the first reading; first-sync figures are their sum", n)
	}
	res.firstCompile = m.get(`moat_agent_sync_duration_seconds_sum{phase="compile"}`) * 1000
	res.firstProgram = m.get(`moat_agent_sync_duration_seconds_sum{phase="program"}`) * 1000

	// A checked resync, what every --resync period does, now: the agent
	// alone has committed in the node's namespace so far, so it must not
	// replace. (Later the monitor's probes commit there: another writer,
	// after which a checked resync replaces until the agent has replaced
	// once; the forced resync is measured at the end.)
	// It resets the peak: hwm-MB is the greater of the peak until then
	// (the first sync's) and the one after the bursts.
	_, firstHWM, _ := procMemMB(b, cmd.Process.Pid)
	res.checkedResync = resync(b, cmd.Process, metricsURL, fail, syscall.SIGUSR1, "checked", "unchanged")
	// The relabels' phases are what the syncs after it add.
	m = scrape(b, metricsURL)
	baseSyncs := m.get(`moat_agent_sync_duration_seconds_count{phase="compile"}`)
	baseCompile := m.get(`moat_agent_sync_duration_seconds_sum{phase="compile"}`) * 1000
	baseProgram := m.get(`moat_agent_sync_duration_seconds_sum{phase="program"}`) * 1000

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
	var labelLog []byte
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
		stored := time.Now()
		at, ok := mon.next(10 * time.Second)
		if !ok {
			fail("update %d: no nftables change within 10 s", i)
		}
		res.latencies = append(res.latencies, at.Sub(sent))
		res.apiLatencies = append(res.apiLatencies, stored.Sub(sent))
		labelLog = fmt.Appendf(labelLog, "%s update %d: accepted after %v, in nftables after %v\n", sent.Format(time.RFC3339Nano), i, stored.Sub(sent), at.Sub(sent))
	}
	if profiles != "" {
		_ = os.WriteFile(filepath.Join(profiles, "labels.txt"), labelLog, 0o644)
	}
	m = scrape(b, metricsURL)
	if count := m.get(`moat_agent_sync_duration_seconds_count{phase="compile"}`); count > baseSyncs {
		res.compileMS = (m.get(`moat_agent_sync_duration_seconds_sum{phase="compile"}`)*1000 - baseCompile) / (count - baseSyncs)
		res.programMS = (m.get(`moat_agent_sync_duration_seconds_sum{phase="program"}`)*1000 - baseProgram) / (count - baseSyncs)
	}

	var cpuProfile chan error
	if profiles != "" {
		cpuProfile = make(chan error, 1)
		go func() {
			cpuProfile <- fetch(strings.TrimSuffix(metricsURL, "/metrics")+"/debug/pprof/profile?seconds=20", filepath.Join(profiles, "churn.cpu.pprof"))
		}()
	}
	// Each burst patches churnUpdates distinct remote pods, so that every
	// patch changes a pod and is one watch event.
	r := rand.New(rand.NewPCG(2, 3))
	picks := r.Perm(len(others))[:min(churnUpdates, len(others))]
	res.eventsPerSec, res.cpuPerEvent, res.bytesPerEvent = churn(ctx, b, env, proxy, cmd.Process.Pid, metricsURL, fail, len(picks),
		func(i int) (*corev1.Pod, string) {
			return others[picks[i]], fmt.Sprintf(`{"metadata":{"labels":{"churn":"c%d"}}}`, i)
		})
	// The heap as the GC last marked it, 20 s into the burst of relabels
	// that move pods between peers (without gc=1: what a burst keeps live,
	// which sets the GC's target and so the resident memory).
	var burstHeap chan error
	if profiles != "" {
		burstHeap = make(chan error, 1)
		go func() {
			time.Sleep(20 * time.Second)
			burstHeap <- fetch(strings.TrimSuffix(metricsURL, "/metrics")+"/debug/pprof/heap", filepath.Join(profiles, "burst.heap.pprof"))
		}()
	}
	res.readEventsPerSec, res.readCPUPerEvent, _ = churn(ctx, b, env, proxy, cmd.Process.Pid, metricsURL, fail, len(picks),
		func(i int) (*corev1.Pod, string) {
			// An app of the generated set (app-00 .. app-19) other than
			// the pod's own.
			p := others[picks[i]]
			app := fmt.Sprintf("app-%02d", i%20)
			if app == p.Labels["app"] {
				app = fmt.Sprintf("app-%02d", (i+1)%20)
			}
			return p, fmt.Sprintf(`{"metadata":{"labels":{"app":%q}}}`, app)
		})
	if cpuProfile != nil {
		if err := <-cpuProfile; err != nil {
			b.Error(err)
		}
		if err := <-burstHeap; err != nil {
			b.Error(err)
		}
		if err := fetch(strings.TrimSuffix(metricsURL, "/metrics")+"/debug/pprof/heap?gc=1", filepath.Join(profiles, "heap.pprof")); err != nil {
			b.Error(err)
		}
	}

	res.rss, res.hwm, res.rssFile = procMemMB(b, cmd.Process.Pid)
	res.hwm = max(res.hwm, firstHWM)
	res.heap = scrape(b, metricsURL).get("go_memstats_heap_inuse_bytes") / (1 << 20)
	res.resync = resync(b, cmd.Process, metricsURL, fail, syscall.SIGHUP, "forced", "replaced")
	// The forced replace recorded the generation it left: a checked
	// resync in the same state as it, after the bursts.
	res.checkedAfter = resync(b, cmd.Process, metricsURL, fail, syscall.SIGUSR1, "checked", "unchanged")
	return res
}

// resyncCost is what one resync took: its sync's duration, the agent's
// resident memory when it started and its peak during it.
type resyncCost struct{ ms, rss, hwm float64 }

func (c *resyncCost) add(o resyncCost) { c.ms += o.ms; c.rss += o.rss; c.hwm += o.hwm }

// resync has the agent resync (sig: SIGUSR1 for a checked resync, as
// every --resync period does; SIGHUP for a forced one), waits for it to
// end with result, and returns its cost. The peak is reset first: what
// the resync adds to the resident memory it starts from is what a memory
// limit must allow for.
func resync(b *testing.B, p *os.Process, metricsURL string, fail func(string, ...any), sig syscall.Signal, kind, result string) resyncCost {
	series := func(result string) string {
		return `moat_agent_resyncs_total{kind="` + kind + `",result="` + result + `"}`
	}
	const total = `moat_agent_sync_duration_seconds_sum{phase="total"}`
	// Writing 5 to clear_refs resets the process's peak resident set
	// (VmHWM) to its current one.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.Pid), []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
	var c resyncCost
	c.rss, _, _ = procMemMB(b, p.Pid)
	before := scrape(b, metricsURL)
	if err := p.Signal(sig); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for {
		if time.Since(start) > 5*time.Minute {
			fail("no %s resync within 5 minutes of %v", kind, sig)
		}
		time.Sleep(100 * time.Millisecond)
		m := scrape(b, metricsURL)
		done := false
		for _, r := range []string{"replaced", "unchanged", "error"} {
			if m.get(series(r)) > before.get(series(r)) {
				if r != result {
					fail("%s resync: %s, want %s", kind, r, result)
				}
				done = true
			}
		}
		if done {
			// The cluster is still: the resync is the only sync since.
			_, c.hwm, _ = procMemMB(b, p.Pid)
			c.ms = (m.get(total) - before.get(total)) * 1000
			return c
		}
	}
}

// churn sends n pod patches (patch(i) names the pod and the merge patch)
// at the loader's concurrency and measures how fast the agent takes the
// events in: events per second from the first patch until it has received
// them all and gone idle, its CPU time per event and the API server's
// bytes per event.
func churn(ctx context.Context, b *testing.B, env *kubetest.Env, proxy *countingProxy, pid int, metricsURL string, fail func(string, ...any), n int, patch func(i int) (*corev1.Pod, string)) (perSec, cpuUS, bytes float64) {
	eventsBefore := scrape(b, metricsURL).get(`moat_agent_watch_events_total{resource="pods"}`)
	cpuBefore := procCPU(b, pid)
	bytesBefore := proxy.received()
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		errc <- kubetest.Parallel(ctx, loadConcurrency, n, func(i int) error {
			p, body := patch(i)
			_, err := env.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, "application/merge-patch+json", []byte(body), metav1.PatchOptions{})
			return err
		})
	}()
	// Every update is one event to this agent; it is done when it has them
	// all and its sync count has not moved for a second.
	var received, lastSyncs float64
	var done time.Time
	stillSince := time.Time{}
	for {
		if time.Since(start) > 10*time.Minute {
			fail("churn: %v of %d events after 10 minutes", received, n)
		}
		// Not too often: a scrape costs the agent ~10 ms of CPU at 30,000
		// pods (the drop counters' series), which counts as the events'.
		// Prometheus scrapes every 15-60 s; at 4 per second the scrapes
		// took 29% of the agent's CPU in a burst (its CPU profile).
		time.Sleep(500 * time.Millisecond)
		m := scrape(b, metricsURL)
		received = m.get(`moat_agent_watch_events_total{resource="pods"}`) - eventsBefore
		if received < float64(n) {
			continue
		}
		if done.IsZero() {
			done = time.Now()
		}
		syncs := m.get(`moat_agent_sync_duration_seconds_count{phase="total"}`)
		if syncs != lastSyncs {
			lastSyncs, stillSince = syncs, time.Now()
			continue
		}
		if time.Since(stillSince) >= time.Second {
			break
		}
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	// CPU until idle, minus the idle second (and the scrapes, which are
	// cheap), per event.
	cpu := procCPU(b, pid) - cpuBefore
	_, first := patch(0)
	b.Logf("churn %s: %v events in %s (%s until idle), agent CPU %s", first, received, done.Sub(start).Round(time.Millisecond), time.Since(start).Round(time.Millisecond), cpu)
	return received / done.Sub(start).Seconds(), float64(cpu.Microseconds()) / received, float64(proxy.received()-bytesBefore) / received
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
	// seconds with a large table: wait until it reports a change of its own.
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

// procMemMB reads VmRSS, VmHWM and RssFile (the part of VmRSS that maps
// files: the binary's pages, not the agent's data) from /proc.
func procMemMB(b *testing.B, pid int) (rss, hwm, file float64) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		for key, dst := range map[string]*float64{"VmRSS:": &rss, "VmHWM:": &hwm, "RssFile:": &file} {
			if v, ok := strings.CutPrefix(line, key); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				*dst = kb / 1024
			}
		}
	}
	return rss, hwm, file
}

// fetch saves a URL's body to a file.
func fetch(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// procCPU reads a process's user and system CPU time, and that of its
// children it has waited for (the nft processes), from /proc (clock ticks
// of 10 ms, the kernel's USER_HZ on Linux).
func procCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14, stime 15, cutime 16, cstime 17.
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// metricsPage is one scrape of /metrics: series (name and labels as
// printed) to value.
type metricsPage map[string]float64

func scrape(b *testing.B, url string) metricsPage {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	// Uncompressed: the page is read over loopback, and compressing it
	// would cost the agent more CPU than the events being measured.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := metricsPage{}
	for line := range strings.SplitSeq(string(body), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				m[line[:i]] = v
			}
		}
	}
	return m
}

func (m metricsPage) get(series string) float64 { return m[series] }
