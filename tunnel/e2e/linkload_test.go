package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkLinkUnderLoad measures how long a fresh node client (a TLS GET
// through the KEP-2025 listener, as a kubelet makes) takes while 8 bulk
// downloads share the agent tunnel, on a link shaped to MOAT_TUNNEL_RATE
// (tc tbf, default 5mbit) both ways between two network namespaces
// (every packet of the tunnel leaves in one order, so the new
// connection's DIAL_RSP, handshake and answer queue behind the downloads'
// DATA). Rounds (MOAT_TUNNEL_ROUNDS, default 3) rotate this build and the
// builds MOAT_TUNNEL_ALT names (comma-separated directories with
// moat-proxy-server and moat-proxy-agent, reported as alt1, alt2...). Each
// round logs the idle GET, three loaded GETs and the downloads' goodput;
// the medians over rounds are reported by the last sub-benchmark,
// median. Needs root, ip and tc.
//
//	MOAT_TUNNEL_ALT=/path/to/before go test -run XXX -bench LinkUnderLoad -benchtime 1x -timeout 30m ./tunnel/e2e
func BenchmarkLinkUnderLoad(b *testing.B) {
	rate := os.Getenv("MOAT_TUNNEL_RATE")
	if rate == "" {
		rate = "5mbit"
	}
	rounds := 3
	if v := os.Getenv("MOAT_TUNNEL_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	impls := []struct{ name, dir string }{{"moat", ""}}
	if alt := os.Getenv("MOAT_TUNNEL_ALT"); alt != "" {
		for i, a := range strings.Split(alt, ",") {
			impls = append(impls, struct{ name, dir string }{"alt" + strconv.Itoa(i+1), a})
		}
	}
	loaded, goodput := map[string][]float64{}, map[string][]float64{}
	for r := range rounds {
		for j := range impls {
			im := impls[(r+j)%len(impls)]
			b.Run(fmt.Sprintf("round%d/%s", r, im.name), func(b *testing.B) {
				l, g := linkUnderLoad(b, im.dir, rate, im.name)
				loaded[im.name] = append(loaded[im.name], l)
				goodput[im.name] = append(goodput[im.name], g)
			})
		}
	}
	// A parent of sub-benchmarks reports nothing itself: the medians are
	// a last sub-benchmark's.
	b.Run("median", func(b *testing.B) {
		for _, im := range impls {
			b.Logf("%s at %s: loaded GET median %.2f s (per round %v), downloads %.2f Mbit/s", im.name, rate,
				median(loaded[im.name]), loaded[im.name], median(goodput[im.name]))
			b.ReportMetric(median(loaded[im.name]), im.name+"-loaded-GET-s")
			b.ReportMetric(median(goodput[im.name]), im.name+"-bulk-Mbit/s")
		}
	})
}

// linkUnderLoad runs one measurement with the binaries in dir (this
// build's when empty) and returns the median loaded GET in seconds and
// the downloads' goodput in Mbit/s.
func linkUnderLoad(b *testing.B, dir, rate, name string) (float64, float64) {
	l := newNetLab(b)
	if dir != "" {
		l.bin = dir
	}
	for _, bin := range []string{"moat-proxy-server", "moat-proxy-agent"} {
		if _, err := os.Stat(filepath.Join(l.bin, bin)); err != nil {
			b.Fatal(err)
		}
	}
	p := newPKI(b)
	prefix := strings.TrimSuffix(l.cp, "-cp")
	for _, e := range [][2]string{{l.cp, prefix + "c"}, {l.node, prefix + "n"}} {
		run(b, "ip", "netns", "exec", e[0], "tc", "qdisc", "add", "dev", e[1], "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "200ms")
	}
	l.kas(p, "127.0.0.1:6443", "kube-apiserver")
	bulk := l.listen(l.cp, "127.0.0.1:9000")
	go func() {
		for {
			c, err := bulk.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	gate := "EnableClusterToMasterTraffic=true"
	l.startServer(p, "--feature-gates", gate, "--allowed-destination", "localhost:6443", "--allowed-destination", "localhost:9000")
	l.startAgent(p, "--feature-gates", gate, "--bind-address", "10.0.0.1",
		"--target", "6443:localhost:6443", "--target", "9000:localhost:9000", "--dial-timeout", "30s")
	l.waitReady(l.cp, "127.0.0.1:8092")
	l.waitReady(l.node, "127.0.0.1:8093")
	roots := &tls.Config{RootCAs: p.ca.Pool, ServerName: "10.0.0.1"}
	get := func(what string) float64 {
		start := time.Now()
		code, _, err := l.get(l.node, "10.0.0.1:6443", "https://10.0.0.1:6443/version", roots)
		d := time.Since(start)
		if err != nil || code != 200 {
			b.Fatalf("%s, %s GET: %d %v", name, what, code, err)
		}
		b.Logf("%s at %s, %s GET: %v", name, rate, what, d.Round(time.Millisecond))
		return d.Seconds()
	}
	get("idle")
	var received atomic.Int64
	var conns []net.Conn
	start := time.Now()
	for range 8 {
		c, err := l.dial(l.node, "10.0.0.1:9000")
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
		go func() {
			n, _ := io.Copy(io.Discard, c)
			received.Add(n)
		}()
	}
	time.Sleep(5 * time.Second) // the downloads fill every queue on the way
	var ds []float64
	for i := range 3 {
		ds = append(ds, get(fmt.Sprintf("loaded #%d", i)))
	}
	for _, c := range conns {
		c.SetReadDeadline(time.Now()) // ends the copies; their counts are in
	}
	elapsed := time.Since(start)
	time.Sleep(100 * time.Millisecond)
	for _, c := range conns {
		c.Close()
	}
	mbit := float64(received.Load()) * 8 / elapsed.Seconds() / 1e6
	b.Logf("%s at %s, 8 downloads: %.2f Mbit/s", name, rate, mbit)
	return median(ds), mbit
}
