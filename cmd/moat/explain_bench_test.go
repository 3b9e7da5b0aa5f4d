package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/clustergen"
)

// BenchmarkExplainCommand runs the moat binary as a user would on a
// kubectl-style JSON dump of issue 8's workload clusters: decode, compile,
// judge one flow and explain it. It reports the process's peak resident
// memory and CPU time. The dumps are written once to the temporary
// directory.
func BenchmarkExplainCommand(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "moat")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	for _, c := range []clustergen.Config{clustergen.Scale10k, clustergen.Scale100k} {
		b.Run(fmt.Sprintf("pods=%d", c.Pods), func(b *testing.B) {
			path := filepath.Join(os.TempDir(), fmt.Sprintf("moat-explain-bench-%d-%d-%d-%d-%d-%d-w.json", c.Nodes, c.Namespaces, c.Pods, c.NetworkPolicies, c.ClusterPolicies, c.Seed))
			if _, err := os.Stat(path); err != nil {
				writeDump(b, c, path)
			}
			var rss int64
			var cpu time.Duration
			for b.Loop() {
				cmd := exec.Command(bin, "explain", "-f", path, "--from", "ns-0002/pod-000002", "--to", "ns-0001/pod-000001", "--port", "8080")
				var stdout, stderr strings.Builder
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Run(); err != nil && cmd.ProcessState.ExitCode() > 1 {
					b.Fatalf("moat explain: %v\n%s", err, stderr.String())
				}
				if !strings.Contains(stdout.String(), "ingress") {
					b.Fatalf("moat explain printed no explanation:\n%s%s", stdout.String(), stderr.String())
				}
				if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
					rss = max(rss, ru.Maxrss)
				}
				cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			}
			b.ReportMetric(float64(rss)/1024, "peak-rss-MiB")
			b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
		})
	}
}
