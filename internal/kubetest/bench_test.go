package kubetest

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-net/moat/deploy"
)

// BenchmarkLaunch measures what every integration test pays: etcd and
// kube-apiserver from nothing to /readyz, the experimental CRD Established,
// and the resident memory of both servers once ready.
//
//	go test -run '^$' -bench BenchmarkLaunch -benchtime 3x ./internal/kubetest
func BenchmarkLaunch(b *testing.B) {
	bins := RequireBinaries(b)
	crds, err := deploy.CRDs(deploy.Experimental)
	if err != nil {
		b.Fatal(err)
	}
	var readyTotal, crdTotal time.Duration
	var apiRSS, etcdRSS float64
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		start := time.Now()
		env, err := Launch(ctx, bins)
		if err != nil {
			cancel()
			b.Fatal(err)
		}
		ready := time.Now()
		if err := env.InstallCRDs(ctx, crds); err != nil {
			cancel()
			_ = env.Stop()
			b.Fatal(err)
		}
		readyTotal += ready.Sub(start)
		crdTotal += time.Since(ready)
		apiRSS += rssMB(b, env.apiServer.proc.cmd.Process.Pid)
		etcdRSS += rssMB(b, env.etcd.proc.cmd.Process.Pid)
		if err := env.Stop(); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
	n := float64(b.N)
	b.ReportMetric(readyTotal.Seconds()*1000/n, "ms-to-ready")
	b.ReportMetric(crdTotal.Seconds()*1000/n, "ms-crd-established")
	b.ReportMetric(apiRSS/n, "apiserver-MB")
	b.ReportMetric(etcdRSS/n, "etcd-MB")
}

// rssMB reads a process's resident set size from /proc.
func rssMB(b *testing.B, pid int) float64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				b.Fatalf("parse VmRSS %q: %v", v, err)
			}
			return kb / 1024
		}
	}
	b.Fatalf("no VmRSS for pid %d", pid)
	return 0
}
