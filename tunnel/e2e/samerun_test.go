package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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

	"github.com/moat-net/moat/internal/testenv"
)

// tunnelImpl is a pair of server and agent binaries that take upstream's
// flags.
type tunnelImpl struct {
	name, server, agent string
}

// sameRunImpls is Moat's binaries and, when MOAT_TUNNEL_ANCHOR names a
// directory holding an upstream apiserver-network-proxy build (binaries
// proxy-server and proxy-agent), those too; MOAT_TUNNEL_ALT names
// directories (comma-separated) of other Moat builds (moat-proxy-server,
// moat-proxy-agent), reported as alt1, alt2... (before/after comparisons
// in one run).
func sameRunImpls(b *testing.B) []tunnelImpl {
	dir := buildBinariesB(b)
	out := []tunnelImpl{{"moat", filepath.Join(dir, "moat-proxy-server"), filepath.Join(dir, "moat-proxy-agent")}}
	if a := os.Getenv("MOAT_TUNNEL_ANCHOR"); a != "" {
		out = append(out, tunnelImpl{"upstream", filepath.Join(a, "proxy-server"), filepath.Join(a, "proxy-agent")})
	}
	if alt := os.Getenv("MOAT_TUNNEL_ALT"); alt != "" {
		for i, a := range strings.Split(alt, ",") {
			out = append(out, tunnelImpl{"alt" + strconv.Itoa(i+1), filepath.Join(a, "moat-proxy-server"), filepath.Join(a, "moat-proxy-agent")})
		}
	}
	return out
}

// startProcStack runs im's server (frontend mode on a Unix socket, mTLS on
// the agent port) and agent as processes with the same certificates and
// flags, and returns the socket once a tunneled connection to backend works,
// the two processes' IDs and their /metrics addresses (admin ports).
func startProcStack(b *testing.B, p *pki, im tunnelImpl, mode, backend string) (string, []int, []string) {
	uds := filepath.Join(b.TempDir(), "s.sock")
	agentPort := testenv.FreePort(b)
	var pids []int
	start := func(bin string, args ...string) {
		c := exec.Command(bin, args...)
		// Gone with this process even when it is killed.
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if os.Getenv("MOAT_TUNNEL_TEST_LOG") != "" {
			c.Stderr = os.Stderr
		}
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		pids = append(pids, c.Process.Pid)
		b.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	port := func() string { return strconv.Itoa(testenv.FreePort(b)) }
	serverAdmin, agentAdmin := port(), port()
	start(im.server, "--mode="+mode, "--uds-name="+uds, "--delete-existing-uds-file", "--server-port=0",
		"--agent-bind-address=127.0.0.1", "--agent-port="+strconv.Itoa(agentPort),
		"--cluster-cert="+p.server.CertFile, "--cluster-key="+p.server.KeyFile, "--cluster-ca-cert="+p.ca.CertFile,
		"--health-bind-address=127.0.0.1", "--health-port="+port(), "--admin-port="+serverAdmin)
	start(im.agent, "--proxy-server-host=127.0.0.1", "--proxy-server-port="+strconv.Itoa(agentPort),
		"--ca-cert="+p.ca.CertFile, "--agent-cert="+p.agent.CertFile, "--agent-key="+p.agent.KeyFile,
		"--health-server-host=127.0.0.1", "--health-server-port="+port(), "--admin-server-port="+agentAdmin, "--sync-interval=100ms")
	eventually(b, im.name+" "+mode+" tunnel", func() bool {
		c, err := dialUDS(b, p, mode, uds, backend)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return uds, pids, []string{"http://127.0.0.1:" + serverAdmin + "/metrics", "http://127.0.0.1:" + agentAdmin + "/metrics"}
}

// readAllocs sums what the Go runtime reports on the processes' /metrics
// endpoints: bytes allocated and completed GC cycles so far. Unlike CPU
// time these do not depend on other load on the machine. ok is false when
// an endpoint does not report them (other implementations).
func readAllocs(metrics []string) (bytes, gcs float64, ok bool) {
	ok = true
	for _, u := range metrics {
		resp, err := http.Get(u)
		if err != nil {
			return 0, 0, false
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, 0, false
		}
		var seen int
		for _, line := range strings.Split(string(body), "\n") {
			name, v, found := strings.Cut(line, " ")
			if !found || (name != "go_memstats_alloc_bytes_total" && name != "go_gc_duration_seconds_count") {
				continue
			}
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				continue
			}
			seen++
			if name == "go_gc_duration_seconds_count" {
				gcs += f
			} else {
				bytes += f
			}
		}
		ok = ok && seen == 2
	}
	return bytes, gcs, ok
}

// procCost is what processes have used so far: CPU time and context
// switches, summed over their threads (Linux /proc).
type procCost struct {
	cpu      time.Duration
	switches int64
	// voluntary counts only the switches where a thread blocked (futex,
	// epoll, a system call): what the processes' own structure costs, less
	// disturbed by other load than switches, which also counts preemptions.
	voluntary int64
}

func readProcCost(b *testing.B, pids []int) procCost {
	var c procCost
	for _, pid := range pids {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
		if err != nil || len(tasks) == 0 {
			b.Fatalf("threads of %d: %v", pid, err)
		}
		for _, t := range tasks {
			if st, err := os.ReadFile(t + "/schedstat"); err == nil {
				var ns int64
				fmt.Sscan(string(st), &ns)
				c.cpu += time.Duration(ns)
			}
			st, err := os.ReadFile(t + "/status")
			if err != nil {
				continue // the thread exited
			}
			for _, line := range strings.Split(string(st), "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					c.switches += n
					if k == "voluntary_ctxt_switches" {
						c.voluntary += n
					}
				}
			}
		}
	}
	return c
}

type dialFunc func() (net.Conn, error)

// measureThroughput downloads total bytes over streams connections; MB/s.
func measureThroughput(b *testing.B, dial dialFunc, streams int, total int64) float64 {
	conns := make([]net.Conn, streams)
	for i := range conns {
		c, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	per := total / int64(streams)
	t0 := time.Now()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Write(header('Z', per, 0))
			if _, err := io.CopyN(io.Discard, c, per); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	return float64(total) / time.Since(t0).Seconds() / 1e6
}

// measureRTT is the p50 of n 64-byte echoes on one connection, in µs.
func measureRTT(b *testing.B, dial dialFunc, n int) float64 {
	c, err := dial()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.Write(header('E', 0, 0))
	msg, got := make([]byte, 64), make([]byte, 64)
	lat := make([]time.Duration, n)
	for i := range lat {
		t0 := time.Now()
		c.Write(msg)
		if _, err := io.ReadFull(c, got); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	return float64(percentile(lat, 50).Nanoseconds()) / 1e3
}

// measureConnRate opens n connections one after another, each with one
// 1-byte echo, and returns connections per second.
func measureConnRate(b *testing.B, dial dialFunc, n int) float64 {
	one := make([]byte, 1)
	t0 := time.Now()
	for range n {
		c, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		c.Write(header('E', 0, 0))
		c.Write(one)
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	return float64(n) / time.Since(t0).Seconds()
}

// measureFresh makes n small HTTP requests, each directly and through a
// fresh single-use tunnel, interleaved; it returns the tunnel's p50 and the
// p50 overhead over direct, in µs.
func measureFresh(b *testing.B, tunnel dialFunc, httpAddr string, n int) (p50, overhead float64) {
	direct, tun := make([]time.Duration, n), make([]time.Duration, n)
	for i := range n {
		t0 := time.Now()
		c, err := net.Dial("tcp", httpAddr)
		if err != nil {
			b.Fatal(err)
		}
		if err := smallGet(c); err != nil {
			b.Fatal(err)
		}
		c.Close()
		t1 := time.Now()
		c, err = tunnel()
		if err != nil {
			b.Fatal(err)
		}
		if err := smallGet(c); err != nil {
			b.Fatal(err)
		}
		c.Close()
		direct[i], tun[i] = t1.Sub(t0), time.Since(t1)
	}
	t50 := percentile(tun, 50)
	return float64(t50.Microseconds()), float64((t50 - percentile(direct, 50)).Microseconds())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkSameRun compares tunnel implementations as kube-apiserver uses
// them, in one run and one harness: each implementation's server and agent
// run as processes with the same certificates and flags (frontend on a Unix
// socket, mTLS to the agent), the backend and the clients live in this
// process. Rounds (MOAT_TUNNEL_ROUNDS, default 10) rotate which
// implementation goes first. Per round and implementation:
//
//   - HTTP CONNECT frontend: single-stream and 8-stream throughput (256 MiB),
//     64-byte round-trip p50 (1,000 echoes), connection rate (300 sequential
//     connections, one 1-byte echo each);
//   - gRPC frontend with konnectivity-client: a small HTTP request through a
//     fresh single-use tunnel, interleaved with the same request made
//     directly (200 each): the tunnel's p50 and its p50 overhead over direct;
//     and the connection rate through fresh tunnels.
//
// It reports each figure's median over the rounds and, with an anchor, the
// median of the per-round ratios Moat/anchor. Run with -benchtime 1x.
//
//	MOAT_TUNNEL_ANCHOR=/path/to/upstream/bin go test -run XXX -bench SameRun -benchtime 1x -timeout 60m ./tunnel/e2e
func BenchmarkSameRun(b *testing.B) {
	rounds, p, be, httpAddr, impls := sameRunSetup(b, 10)
	type stacks struct{ connect, grpc string }
	st := map[string]stacks{}
	for _, im := range impls {
		connect, _, _ := startProcStack(b, p, im, "http-connect", be)
		grpcSock, _, _ := startProcStack(b, p, im, "grpc", be)
		st[im.name] = stacks{connect, grpcSock}
	}
	figures := []string{"tput1-MB/s", "tput8-MB/s", "rtt64-p50-µs", "connect-conns/s", "fresh-p50-µs", "fresh-overhead-p50-µs", "grpc-conns/s"}
	got := map[string]map[string][]float64{} // impl -> figure -> per round
	for _, im := range impls {
		got[im.name] = map[string][]float64{}
	}
	ctx := context.Background()
	for r := range rounds {
		for j := range impls {
			im := impls[(r+j)%len(impls)]
			s := st[im.name]
			connect := func() (net.Conn, error) { return udsConnect(s.connect, be) }
			grpcTo := func(addr string) dialFunc {
				return func() (net.Conn, error) { return grpcDial(ctx, b, p, s.grpc, addr) }
			}
			g := got[im.name]
			g["tput1-MB/s"] = append(g["tput1-MB/s"], measureThroughput(b, connect, 1, 256<<20))
			g["tput8-MB/s"] = append(g["tput8-MB/s"], measureThroughput(b, connect, 8, 256<<20))
			g["rtt64-p50-µs"] = append(g["rtt64-p50-µs"], measureRTT(b, connect, 1000))
			g["connect-conns/s"] = append(g["connect-conns/s"], measureConnRate(b, connect, 300))
			p50, over := measureFresh(b, grpcTo(httpAddr), httpAddr, 200)
			g["fresh-p50-µs"] = append(g["fresh-p50-µs"], p50)
			g["fresh-overhead-p50-µs"] = append(g["fresh-overhead-p50-µs"], over)
			g["grpc-conns/s"] = append(g["grpc-conns/s"], measureConnRate(b, grpcTo(be), 300))
		}
	}
	for _, im := range impls {
		for _, f := range figures {
			b.ReportMetric(median(got[im.name][f]), im.name+"-"+f)
		}
	}
	for _, im := range impls[1:] {
		for _, f := range figures {
			ratios := make([]float64, rounds)
			for r := range rounds {
				ratios[r] = got["moat"][f][r] / got[im.name][f][r]
			}
			b.ReportMetric(median(ratios), "moat/"+im.name+"-"+f)
		}
	}
}

// BenchmarkFreshTunnelProcs is the fresh-tunnel figures of BenchmarkSameRun
// alone, for quick before/after comparisons: each implementation's server
// and agent run as separate processes (gRPC frontend on a Unix socket, mTLS
// to the agent), and rounds of b.N small HTTP requests through fresh
// single-use tunnels, interleaved with direct ones, rotate between them.
// Each round also measures the null tunnel (nulltunnel_test.go: the same
// cross-process messages and nothing else), the floor of any implementation
// in separate processes on this machine. MOAT_TUNNEL_ANCHOR and
// MOAT_TUNNEL_ALT add implementations as for BenchmarkSameRun. Besides latency and rate it reports what the server and
// agent processes spend per fresh tunnel (CPU time and context switches of
// all their threads, from /proc, and the voluntary switches apart): less at the mercy of other load on the
// machine than wall-clock figures; where their /metrics report them, also
// the bytes they allocate per tunnel and GC cycles per 1,000 tunnels, which
// other load does not change at all. Every round's figures go to stderr
// (the spread between rounds).
//
//	MOAT_TUNNEL_ANCHOR=/path/to/upstream/bin go test -run XXX -bench FreshTunnelProcs -benchtime 300x ./tunnel/e2e
func BenchmarkFreshTunnelProcs(b *testing.B) {
	rounds, p, be, httpAddr, impls := sameRunSetup(b, 6)
	socks, pids, metrics := map[string]string{}, map[string][]int{}, map[string][]string{}
	for _, im := range impls {
		socks[im.name], pids[im.name], metrics[im.name] = startProcStack(b, p, im, "grpc", be)
	}
	null, nullPids := startNullTunnel(b)
	nullFig := map[string][]float64{}
	got := map[string]map[string][]float64{}
	for _, im := range impls {
		got[im.name] = map[string][]float64{}
	}
	ctx := context.Background()
	b.ResetTimer()
	for r := range rounds {
		for j := range impls {
			im := impls[(r+j)%len(impls)]
			grpcTo := func(addr string) dialFunc {
				return func() (net.Conn, error) { return grpcDial(ctx, b, p, socks[im.name], addr) }
			}
			g := got[im.name]
			a0, g0, allocsOK := readAllocs(metrics[im.name])
			c0 := readProcCost(b, pids[im.name])
			p50, over := measureFresh(b, grpcTo(httpAddr), httpAddr, b.N)
			c1 := readProcCost(b, pids[im.name])
			if a1, g1, ok := readAllocs(metrics[im.name]); ok && allocsOK {
				g["alloc-KiB/tunnel"] = append(g["alloc-KiB/tunnel"], (a1-a0)/1024/float64(b.N))
				g["gc/1000tunnels"] = append(g["gc/1000tunnels"], (g1-g0)*1000/float64(b.N))
			}
			g["fresh-p50-µs"] = append(g["fresh-p50-µs"], p50)
			g["fresh-overhead-p50-µs"] = append(g["fresh-overhead-p50-µs"], over)
			g["cpu-µs/tunnel"] = append(g["cpu-µs/tunnel"], float64((c1.cpu-c0.cpu).Microseconds())/float64(b.N))
			g["switches/tunnel"] = append(g["switches/tunnel"], float64(c1.switches-c0.switches)/float64(b.N))
			g["vswitches/tunnel"] = append(g["vswitches/tunnel"], float64(c1.voluntary-c0.voluntary)/float64(b.N))
			g["grpc-conns/s"] = append(g["grpc-conns/s"], measureConnRate(b, grpcTo(be), b.N))
			alloc := "-"
			if len(g["alloc-KiB/tunnel"]) > r {
				alloc = strconv.FormatFloat(g["alloc-KiB/tunnel"][r], 'f', 1, 64)
			}
			// Each round on its own line, for the spread (b.Log truncates).
			fmt.Fprintf(os.Stderr, "round %d %s: overhead-p50-µs %.0f tunnels/s %.0f cpu-µs/tunnel %.0f switches/tunnel %.1f vswitches/tunnel %.1f alloc-KiB/tunnel %s\n",
				r, im.name, over, g["grpc-conns/s"][r], g["cpu-µs/tunnel"][r], g["switches/tunnel"][r], g["vswitches/tunnel"][r], alloc)
		}
		c0 := readProcCost(b, nullPids)
		p50, over := measureFresh(b, nullDialer(null, httpAddr), httpAddr, b.N)
		c1 := readProcCost(b, nullPids)
		nullFig["cpu-µs/tunnel"] = append(nullFig["cpu-µs/tunnel"], float64((c1.cpu-c0.cpu).Microseconds())/float64(b.N))
		nullFig["switches/tunnel"] = append(nullFig["switches/tunnel"], float64(c1.switches-c0.switches)/float64(b.N))
		nullFig["vswitches/tunnel"] = append(nullFig["vswitches/tunnel"], float64(c1.voluntary-c0.voluntary)/float64(b.N))
		fmt.Fprintf(os.Stderr, "round %d null: overhead-p50-µs %.0f tunnels/s 0 cpu-µs/tunnel %.0f switches/tunnel %.1f vswitches/tunnel %.1f\n",
			r, over, nullFig["cpu-µs/tunnel"][r], nullFig["switches/tunnel"][r], nullFig["vswitches/tunnel"][r])
		nullFig["fresh-p50-µs"] = append(nullFig["fresh-p50-µs"], p50)
		nullFig["fresh-overhead-p50-µs"] = append(nullFig["fresh-overhead-p50-µs"], over)
		nullFig["conns/s"] = append(nullFig["conns/s"], measureConnRate(b, nullDialer(null, be), b.N))
	}
	b.StopTimer()
	for f, v := range nullFig {
		b.ReportMetric(median(v), "null-"+f)
	}
	for _, im := range impls {
		for _, f := range []string{"fresh-p50-µs", "fresh-overhead-p50-µs", "grpc-conns/s", "cpu-µs/tunnel", "switches/tunnel", "vswitches/tunnel", "alloc-KiB/tunnel", "gc/1000tunnels"} {
			if len(got[im.name][f]) < rounds {
				continue // not reported by this implementation
			}
			b.ReportMetric(median(got[im.name][f]), im.name+"-"+f)
			if im.name != "moat" && len(got["moat"][f]) == rounds {
				ratios := make([]float64, rounds)
				for r := range rounds {
					ratios[r] = got["moat"][f][r] / got[im.name][f][r]
				}
				b.ReportMetric(median(ratios), "moat/"+im.name+"-"+f)
			}
		}
	}
}

// sameRunSetup is what the same-run benchmarks share: the number of
// rounds (MOAT_TUNNEL_ROUNDS, else rounds), the PKI, an echo backend and
// an HTTP backend's addresses, and the implementations to compare.
func sameRunSetup(b *testing.B, rounds int) (int, *pki, string, string, []tunnelImpl) {
	if v := os.Getenv("MOAT_TUNNEL_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	p := newPKI(b)
	be := startBackend(b, "tcp", "127.0.0.1:0").Addr().String()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	}))
	b.Cleanup(hs.Close)
	return rounds, p, be, hs.Listener.Addr().String(), sameRunImpls(b)
}
