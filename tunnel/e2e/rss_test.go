package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/testenv"
)

// rssKB reads VmRSS of pid from /proc.
func rssKB(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

// BenchmarkIdleRSS runs moat-proxy-server and moat-proxy-agent as separate
// processes, opens MOAT_TUNNEL_RSS_CONNS (default 10,000) idle tunneled
// connections through the frontend on the Unix socket (HTTP CONNECT, or gRPC
// with konnectivity-client's single-use tunnels as kube-apiserver does), and
// reports the resident memory of the two processes.
func BenchmarkIdleRSS(b *testing.B) {
	for _, mode := range []string{"http-connect", "grpc"} {
		b.Run(mode, func(b *testing.B) { idleRSS(b, mode) })
	}
}

func idleRSS(b *testing.B, mode string) {
	n := 10000
	if v := os.Getenv("MOAT_TUNNEL_RSS_CONNS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	dir := buildBinariesB(b)
	p := newPKI(b)
	uds := filepath.Join(b.TempDir(), "s.sock")
	agentPort, healthPort := testenv.FreePort(b), testenv.FreePort(b)
	start := func(name string, args ...string) *exec.Cmd {
		c := exec.Command(filepath.Join(dir, name), args...)
		c.Stderr = os.Stderr
		if os.Getenv("MOAT_TUNNEL_TEST_LOG") == "" {
			c.Stderr = nil
		}
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	srv := start("moat-proxy-server", "--mode="+mode, "--uds-name="+uds, "--server-port=0",
		"--agent-bind-address=127.0.0.1", "--agent-port="+strconv.Itoa(agentPort),
		"--cluster-cert="+p.server.CertFile, "--cluster-key="+p.server.KeyFile, "--cluster-ca-cert="+p.ca.CertFile,
		"--health-bind-address=127.0.0.1", "--health-port="+strconv.Itoa(healthPort), "--admin-port=0")
	ag := start("moat-proxy-agent", "--proxy-server-host=127.0.0.1", "--proxy-server-port="+strconv.Itoa(agentPort),
		"--ca-cert="+p.ca.CertFile, "--agent-cert="+p.agent.CertFile, "--agent-key="+p.agent.KeyFile,
		"--health-server-port=0", "--admin-server-port=0", "--sync-interval=100ms")
	// The backend runs in a child process: this process holds the clients'
	// descriptors and the file limit (here 20,000) would not fit both.
	beAddr := startBackendProc(b)
	var conns []net.Conn
	eventually(b, "tunnel", func() bool {
		c, err := dialUDS(b, p, mode, uds, beAddr)
		if err == nil {
			conns = append(conns, c)
		}
		return err == nil
	})
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var firstErr error
	for range n - 1 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := dialUDS(b, p, mode, uds, beAddr)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			conns = append(conns, c)
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	time.Sleep(time.Second)
	s, err := rssKB(srv.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	a, err := rssKB(ag.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	// The server's own view: goroutines, heap and stacks (Go collector).
	if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", healthPort)); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			for name, unit := range map[string]string{"go_goroutines ": "server-goroutines", "go_memstats_heap_inuse_bytes ": "server-heap-MB", "go_memstats_stack_inuse_bytes ": "server-stack-MB"} {
				if v, ok := strings.CutPrefix(line, name); ok {
					f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
					if strings.HasSuffix(unit, "MB") {
						f /= 1 << 20
					}
					b.ReportMetric(f, unit)
				}
			}
		}
	}
	b.ReportMetric(float64(len(conns)), "conns")
	b.ReportMetric(float64(s)/1024, "server-MB")
	b.ReportMetric(float64(a)/1024, "agent-MB")
	b.ReportMetric(float64(s+a)/1024, "total-MB")
	for _, c := range conns {
		c.Close()
	}
}

// backendHelper serves the test backend protocol and writes its address
// (newline-terminated) to file.
func backendHelper(file string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(1)
	}
	if err := os.WriteFile(file, []byte(ln.Addr().String()+"\n"), 0o600); err != nil {
		os.Exit(1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(0)
		}
		go serveBackend(c)
	}
}

func dialUDS(b testing.TB, p *pki, mode, uds, addr string) (net.Conn, error) {
	if mode == "grpc" {
		return grpcDial(context.Background(), b, p, uds, addr)
	}
	return udsConnect(uds, addr)
}
