package e2e

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startBackendProc runs the test backend in a child process (this test
// binary, re-executed) and returns its TCP address.
func startBackendProc(b testing.TB) string {
	addrFile := filepath.Join(b.TempDir(), "backend-addr")
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), "MOAT_TUNNEL_BACKEND_HELPER="+addrFile)
	if err := helper.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	var addr string
	eventually(b, "backend helper", func() bool {
		a, err := os.ReadFile(addrFile)
		addr = strings.TrimSpace(string(a))
		return err == nil && strings.HasSuffix(string(a), "\n")
	})
	return addr
}

// BenchmarkWakeup measures the floor under every cross-process hop of a
// tunnel on this machine: a 1-byte ping-pong over loopback TCP with a Go
// echo server in another process (each round trip wakes that process and
// then this one) and, for comparison, in this process. It reports the p50
// round trip, i.e. two hops; a fresh tunnel's setup is a chain of such hops
// between the client, the server and the agent.
//
//	go test -run XXX -bench Wakeup -benchtime 20000x ./tunnel/e2e
func BenchmarkWakeup(b *testing.B) {
	for _, m := range []struct {
		name string
		addr func() string
	}{
		{"other-process", func() string { return startBackendProc(b) }},
		{"same-process", func() string { return startBackend(b, "tcp", "127.0.0.1:0").Addr().String() }},
	} {
		b.Run(m.name, func(b *testing.B) {
			c, err := net.Dial("tcp", m.addr())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			c.Write(header('E', 0, 0))
			one := make([]byte, 1)
			lat := make([]time.Duration, b.N)
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				c.Write(one)
				if _, err := io.ReadFull(c, one); err != nil {
					b.Fatal(err)
				}
				lat[i] = time.Since(t0)
			}
			b.StopTimer()
			b.ReportMetric(float64(percentile(lat, 50).Nanoseconds())/1e3, "rtt-p50-µs")
			b.ReportMetric(float64(percentile(lat, 90).Nanoseconds())/1e3, "rtt-p90-µs")
		})
	}
}
