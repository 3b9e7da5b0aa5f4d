package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/internal/cputime"
	"github.com/moat-net/moat/tunnel/tlsconfig"
)

// benchStack is a server, an agent and a backend on loopback; dial reaches
// the backend directly or through one of the frontends.
type benchStack struct {
	backend string
	dial    func(ctx context.Context) (net.Conn, error)
}

// Modes compared by every benchmark: direct loopback TCP; direct-tls, the
// same backend behind one mTLS hop with the agent hop's certificates (the
// upper bound for any path that crosses the TLS agent hop); the HTTP CONNECT
// frontend over mTLS TCP (the anchor's measured path) and over the Unix
// socket (no frontend TLS: kube-apiserver's usual deployment); the gRPC
// frontend, driven by the real konnectivity-client library, over mTLS TCP
// and over the Unix socket. relay and relay-tls are the ceiling of any
// design with the tunnel's three socket hops (backend -> agent -> server ->
// client): two minimal user-space relays copying with 256 KiB buffers,
// without and with TLS on the middle (agent) hop.
var benchModes = []string{"direct", "direct-tls", "relay", "relay-tls", "http-connect", "http-connect-uds", "grpc", "grpc-uds"}

func newBenchStack(b *testing.B, mode string) *benchStack {
	p := newPKI(b)
	be := startBackend(b, "tcp", "127.0.0.1:0")
	addr := be.Addr().String()
	if mode == "direct" {
		return &benchStack{backend: addr, dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}}
	}
	if mode == "direct-tls" {
		return tlsBenchStack(b, p)
	}
	if mode == "relay" || mode == "relay-tls" {
		return relayBenchStack(b, p, addr, mode == "relay-tls")
	}
	m := options.ModeGRPC
	if strings.HasPrefix(mode, "http-connect") {
		m = options.ModeHTTPConnect
	}
	ps := startServer(b, p, serverOpts{mode: m})
	startAgent(b, p, ps.agentAddr, nil)
	eventually(b, "agent tunnel", ps.srv.Ready)
	d := dialer(b, p, m, ps)
	switch mode {
	case "http-connect-uds":
		d = func(_ context.Context, addr string) (net.Conn, error) { return udsConnect(ps.udsPath, addr) }
	case "grpc-uds":
		d = func(ctx context.Context, addr string) (net.Conn, error) { return grpcDial(ctx, b, p, ps.udsPath, addr) }
	}
	return &benchStack{backend: addr, dial: func(ctx context.Context) (net.Conn, error) { return d(ctx, addr) }}
}

// tlsBenchStack serves the benchmark backend behind one mTLS listener built
// exactly as the server's agent port (tlsconfig.Server with the cluster
// certificates) and dials it as the agent does: its throughput is what one
// TLS hop on loopback can carry on this machine.
func tlsBenchStack(b *testing.B, p *pki) *benchStack {
	srvTLS, err := tlsconfig.Server(p.server.CertFile, p.server.KeyFile, p.ca.CertFile, "cluster")
	if err != nil {
		b.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ln := tls.NewListener(inner, srvTLS)
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveBackend(c)
		}
	}()
	addr := inner.Addr().String()
	return &benchStack{backend: addr, dial: func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{Config: clientTLS(b, p)}
		return d.DialContext(ctx, "tcp", addr)
	}}
}

// relayBenchStack chains two relays in front of the backend: the client
// dials relay 1 over plain TCP, relay 1 dials relay 2 (over mTLS with the
// cluster certificates when useTLS), relay 2 dials the backend.
func relayBenchStack(b *testing.B, p *pki, backend string, useTLS bool) *benchStack {
	var serverTLS, dialTLS *tls.Config
	if useTLS {
		var err error
		if serverTLS, err = tlsconfig.Server(p.server.CertFile, p.server.KeyFile, p.ca.CertFile, "cluster"); err != nil {
			b.Fatal(err)
		}
		dialTLS = clientTLS(b, p)
	}
	second := startRelay(b, backend, serverTLS, nil)
	first := startRelay(b, second, nil, dialTLS)
	return &benchStack{backend: backend, dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", first)
	}}
}

// startRelay listens on loopback (TLS with lnTLS) and relays each
// connection to next (TLS with dialTLS), copying in user space as the
// tunnel must; it returns the listening address.
func startRelay(b *testing.B, next string, lnTLS, dialTLS *tls.Config) string {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var ln net.Listener = inner
	if lnTLS != nil {
		ln = tls.NewListener(inner, lnTLS)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				var out net.Conn
				var err error
				if dialTLS != nil {
					out, err = (&tls.Dialer{Config: dialTLS}).DialContext(context.Background(), "tcp", next)
				} else {
					out, err = net.Dial("tcp", next)
				}
				if err != nil {
					return
				}
				defer out.Close()
				go copyUser(out, in)
				copyUser(in, out)
			}()
		}
	}()
	return inner.Addr().String()
}

// copyUser copies through a user-space buffer (no splice/sendfile), then
// closes dst so that the other direction ends too.
func copyUser(dst, src net.Conn) {
	buf := make([]byte, 256<<10)
	io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
	dst.Close()
}

// BenchmarkThroughput downloads zeros over 1 and 8 parallel streams.
func BenchmarkThroughput(b *testing.B) {
	for _, mode := range benchModes {
		for _, streams := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/streams=%d", mode, streams), func(b *testing.B) {
				st := newBenchStack(b, mode)
				const chunk = 1 << 20
				b.SetBytes(chunk)
				conns := make([]net.Conn, streams)
				for i := range conns {
					c, err := st.dial(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					conns[i] = c
				}
				per := int64(b.N) * chunk / int64(streams)
				b.ResetTimer()
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
			})
		}
	}
}

// BenchmarkLatency measures a 64-byte request/response round trip on an
// open connection and reports p50 and p99.
func BenchmarkLatency(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode, func(b *testing.B) {
			st := newBenchStack(b, mode)
			c, err := st.dial(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			c.Write(header('E', 0, 0))
			msg := make([]byte, 64)
			got := make([]byte, 64)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, got); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkConnect opens a connection, does one echo and closes it.
func BenchmarkConnect(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode, func(b *testing.B) {
			st := newBenchStack(b, mode)
			one := make([]byte, 1)
			start, c0 := time.Now(), cputime.Process()
			b.ResetTimer()
			for range b.N {
				c, err := st.dial(context.Background())
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
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "conns/s")
			b.ReportMetric(float64((cputime.Process()-c0).Microseconds())/float64(b.N), "cpu-µs/conn")
		})
	}
}

func heapAndStacks() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

// BenchmarkIdleMemory holds 2,000 idle connections open and reports the Go
// heap and stacks per connection (client, server, agent and backend all live
// in this process; the direct mode is the baseline to subtract).
func BenchmarkIdleMemory(b *testing.B) {
	const n = 2000
	for _, mode := range []string{"direct", "http-connect"} {
		b.Run(mode, func(b *testing.B) {
			st := newBenchStack(b, mode)
			for range b.N {
				before := heapAndStacks()
				conns := make([]net.Conn, 0, n)
				for range n {
					c, err := st.dial(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					c.Write(header('E', 0, 0))
					conns = append(conns, c)
				}
				time.Sleep(200 * time.Millisecond)
				after := heapAndStacks()
				b.ReportMetric(float64(after-before)/n, "bytes/conn")
				for _, c := range conns {
					c.Close()
				}
			}
		})
	}
}

// smallGet sends one small HTTP/1.1 request on c and reads the response.
func smallGet(c net.Conn) error {
	if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: backend\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if string(body) != "hello /x" {
		return fmt.Errorf("body %q", body)
	}
	return nil
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)*p/100]
}

// BenchmarkFreshTunnel measures what kube-apiserver pays per connection: a
// new single-use konnectivity-client tunnel over the Unix socket (a new gRPC
// connection, a Proxy stream, DIAL_REQ to the agent, the agent's dial,
// DIAL_RSP), one small HTTP request through it, close. Each iteration also
// makes the same request directly (new TCP connection), interleaved, so the
// overhead is measured in the same run under the same load.
func BenchmarkFreshTunnel(b *testing.B) {
	p := newPKI(b)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	}))
	b.Cleanup(hs.Close)
	addr := hs.Listener.Addr().String()
	ps := startServer(b, p, serverOpts{})
	startAgent(b, p, ps.agentAddr, nil)
	eventually(b, "agent tunnel", ps.srv.Ready)
	direct := make([]time.Duration, 0, b.N)
	tunnel := make([]time.Duration, 0, b.N)
	ctx := context.Background()
	created := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(created)
	g0 := created[0].Value.Uint64()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		if err := smallGet(c); err != nil {
			b.Fatal(err)
		}
		c.Close()
		t1 := time.Now()
		c, err = grpcDial(ctx, b, p, ps.udsPath, addr)
		if err != nil {
			b.Fatal(err)
		}
		if err := smallGet(c); err != nil {
			b.Fatal(err)
		}
		c.Close()
		direct = append(direct, t1.Sub(t0))
		tunnel = append(tunnel, time.Since(t1))
	}
	b.StopTimer()
	d50, t50 := percentile(direct, 50), percentile(tunnel, 50)
	b.ReportMetric(float64(d50.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(t50.Microseconds()), "tunnel-p50-µs")
	b.ReportMetric(float64((t50 - d50).Microseconds()), "overhead-p50-µs")
	b.ReportMetric(float64((percentile(tunnel, 90) - percentile(direct, 90)).Microseconds()), "overhead-p90-µs")
	// Goroutines started per iteration (a direct and a tunneled request, the
	// client's side included): what changes in it between two builds is the
	// server's and agent's, and unlike the timings it does not depend on
	// other load.
	metrics.Read(created)
	b.ReportMetric(float64(created[0].Value.Uint64()-g0)/float64(b.N), "goroutines/iter")
}

// BenchmarkCeiling compares single-stream throughput of the tunnel's Unix
// socket frontends with the relay-tls ceiling (two user-space relays with
// TLS on the middle hop: the least any proxy of the tunnel's shape must
// do), in alternating rounds of 64 MiB so that load on the machine hits
// all alike; it reports each mode's rate and its ratio to the ceiling.
func BenchmarkCeiling(b *testing.B) {
	modes := []string{"relay-tls", "http-connect-uds", "grpc-uds"}
	stacks := map[string]*benchStack{}
	for _, m := range modes {
		stacks[m] = newBenchStack(b, m)
	}
	const size = 64 << 20
	took, cpu := map[string]time.Duration{}, map[string]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for j := range modes {
			m := modes[(i+j)%len(modes)]
			c, err := stacks[m].dial(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			t0, c0 := time.Now(), cputime.Process()
			c.Write(header('Z', size, 0))
			if _, err := io.CopyN(io.Discard, c, size); err != nil {
				b.Fatal(err)
			}
			took[m] += time.Since(t0)
			cpu[m] += cputime.Process() - c0
			c.Close()
		}
	}
	b.StopTimer()
	rate := func(m string) float64 { return float64(b.N) * size / took[m].Seconds() / 1e6 }
	for _, m := range modes {
		b.ReportMetric(rate(m), m+"-MB/s")
		// CPU per byte of the whole process (client, proxies, backend):
		// what the path costs, less at the mercy of other load than MB/s.
		b.ReportMetric(float64(cpu[m].Nanoseconds())/float64(b.N)/size, m+"-cpu-ns/B")
	}
	b.ReportMetric(rate("http-connect-uds")/rate("relay-tls"), "http-connect-uds/ceiling")
	b.ReportMetric(rate("grpc-uds")/rate("relay-tls"), "grpc-uds/ceiling")
}
