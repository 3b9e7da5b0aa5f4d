package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app"
	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	testpki "github.com/moat-net/moat/internal/testenv/pki"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/server"
	"github.com/moat-net/moat/tunnel/tlsconfig"
)

// testLog is the servers' and agents' logger: discarded unless
// MOAT_TUNNEL_TEST_LOG is set (then verbosity 4 on stderr).
func testLog(t testing.TB) klog.Logger {
	if os.Getenv("MOAT_TUNNEL_TEST_LOG") != "" {
		return textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(4), textlogger.Output(os.Stderr)))
	}
	return klog.Logger{}
}

type pki struct {
	dir                string
	ca                 *testpki.CA
	server, agent, kas *testpki.Leaf
	otherCA            *testpki.CA
	otherAgent         *testpki.Leaf
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	dir := t.TempDir()
	p := &pki{dir: dir}
	var err error
	must := func(e error) {
		if e != nil {
			t.Fatal(e)
		}
	}
	p.ca, err = testpki.NewCA(dir, "cluster")
	must(err)
	p.server, err = p.ca.Issue("proxy-server", "localhost", "127.0.0.1", "::1", "192.168.251.1")
	must(err)
	p.agent, err = p.ca.Issue("proxy-agent")
	must(err)
	p.kas, err = p.ca.Issue("kube-apiserver", "kubernetes", "10.0.0.1", "10.0.0.2", "127.0.0.1", "fd00::10")
	must(err)
	p.otherCA, err = testpki.NewCA(dir, "other")
	must(err)
	p.otherAgent, err = p.otherCA.Issue("rogue-agent")
	must(err)
	return p
}

// proxyServer is one running moat-proxy-server (in process).
type proxyServer struct {
	srv       *server.Server
	frontAddr string
	udsPath   string
	agentAddr string
	cancel    context.CancelFunc
	done      chan error
}

type serverOpts struct {
	mode      string
	agentAddr string // reuse a port (restart)
	cfg       server.Config
}

func startServer(t testing.TB, p *pki, o serverOpts) *proxyServer {
	t.Helper()
	if o.mode == "" {
		o.mode = options.ModeGRPC
	}
	if o.agentAddr == "" {
		o.agentAddr = "127.0.0.1:0"
	}
	o.cfg.Log = testLog(t).WithValues("component", "server")
	if o.cfg.ServerID == "" {
		o.cfg.ServerID = fmt.Sprintf("server-%d", rand.Uint32())
	}
	srv := server.New(o.cfg)
	frontTLS, err := tlsconfig.Server(p.server.CertFile, p.server.KeyFile, p.ca.CertFile, "server")
	if err != nil {
		t.Fatal(err)
	}
	agentTLS, err := tlsconfig.Server(p.server.CertFile, p.server.KeyFile, p.ca.CertFile, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	var lc net.ListenConfig
	var agentLn net.Listener
	for i := 0; ; i++ { // a restarted server re-binds the same port
		agentLn, err = lc.Listen(context.Background(), "tcp", o.agentAddr)
		if err == nil || i > 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	frontLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	uds := filepath.Join(t.TempDir(), "konnectivity.sock")
	udsLn, err := net.Listen("unix", uds)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ps := &proxyServer{srv: srv, frontAddr: frontLn.Addr().String(), udsPath: uds, agentAddr: agentLn.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() {
		ps.done <- app.Serve(klog.NewContext(ctx, o.cfg.Log), srv, app.Listeners{Mode: o.mode, FrontendUDS: udsLn, FrontendTCP: frontLn, FrontendTLS: frontTLS,
			Agent: agentLn, AgentTLS: agentTLS, ShutdownGrace: time.Second})
	}()
	t.Cleanup(ps.stop)
	return ps
}

func (ps *proxyServer) stop() {
	if ps.cancel == nil {
		return
	}
	ps.cancel()
	<-ps.done
	ps.cancel = nil
}

type proxyAgent struct {
	a      *agent.Agent
	cancel context.CancelFunc
	done   chan error
}

func agentCreds(t testing.TB, p *pki, leaf *testpki.Leaf) credentials.TransportCredentials {
	t.Helper()
	cfg, err := tlsconfig.Client(p.ca.CertFile, leaf.CertFile, leaf.KeyFile, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(cfg)
}

func startAgent(t testing.TB, p *pki, serverAddr string, mod func(*agent.Config)) *proxyAgent {
	t.Helper()
	cfg := agent.Config{
		Server:       serverAddr,
		Creds:        agentCreds(t, p, p.agent),
		AgentID:      fmt.Sprintf("agent-%d", rand.Uint32()),
		SyncInterval: 100 * time.Millisecond,
		MaxBackoff:   time.Second,
		DialTimeout:  5 * time.Second,
		Log:          testLog(t).WithValues("component", "agent"),
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pa := &proxyAgent{a: a, cancel: cancel, done: make(chan error, 1)}
	go func() { pa.done <- a.Run(ctx) }()
	t.Cleanup(pa.stop)
	return pa
}

func (pa *proxyAgent) stop() {
	if pa.cancel == nil {
		return
	}
	pa.cancel()
	<-pa.done
	pa.cancel = nil
}

// eventually polls cond (bounded) and fails with msg if it never holds.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 300; i++ {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func clientTLS(t testing.TB, p *pki) *tls.Config {
	return &tls.Config{RootCAs: p.ca.Pool, Certificates: []tls.Certificate{p.kas.TLS}, ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

// grpcDial dials address through the gRPC frontend with the real
// konnectivity-client library, as kube-apiserver does.
func grpcDial(ctx context.Context, t testing.TB, p *pki, front, address string) (net.Conn, error) {
	var opts []grpc.DialOption
	target := front
	if strings.HasPrefix(front, "/") {
		target = "unix://" + front
		opts = append(opts, grpc.WithTransportCredentials(insecureCreds()))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(t, p))))
	}
	tun, err := kclient.CreateSingleUseGrpcTunnelWithContext(ctx, context.Background(), target, opts...)
	if err != nil {
		return nil, fmt.Errorf("create tunnel: %w", err)
	}
	c, err := tun.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("dial through tunnel: %w", err)
	}
	return c, nil
}

// connectDial dials address through the HTTP CONNECT frontend over mTLS.
func connectDial(ctx context.Context, t testing.TB, p *pki, front, address string) (net.Conn, *http.Response, error) {
	d := tls.Dialer{Config: clientTLS(t, p)}
	nc, err := d.DialContext(ctx, "tcp", front)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(nc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", address, address)
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		nc.Close()
		return nil, resp, fmt.Errorf("CONNECT %s: %s", address, resp.Status)
	}
	return &bufConn{Conn: nc, r: br}, resp, nil
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// --- backends ---

// payload writes n deterministic bytes for seed to w and returns their SHA-256.
func payload(w io.Writer, seed uint64, n int64) ([32]byte, error) {
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), 7})
	buf := make([]byte, 64<<10)
	for n > 0 {
		k := int64(len(buf))
		if k > n {
			k = n
		}
		_, _ = rng.Read(buf[:k])
		h.Write(buf[:k])
		if w != nil {
			if _, err := w.Write(buf[:k]); err != nil {
				return [32]byte{}, err
			}
		}
		n -= k
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s, nil
}

// startBackend runs a TCP server on addr speaking a tiny protocol: the client
// sends op (1 byte), n (8 bytes), seed (8 bytes). op 'U' (upload): the client
// then sends n bytes and the server answers their SHA-256. op 'D'
// (download): the server sends n deterministic bytes for seed. op 'E': echo
// until EOF.
func startBackend(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	return serveTCP(t, network, addr, serveBackend)
}

// serveTCP listens on addr and runs serve on each connection it accepts
// (serve closes it), until the test ends.
func serveTCP(t testing.TB, network, addr string, serve func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln
}

func serveBackend(c net.Conn) {
	defer c.Close()
	var hdr [17]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	n := int64(binary.BigEndian.Uint64(hdr[1:9]))
	seed := binary.BigEndian.Uint64(hdr[9:17])
	switch hdr[0] {
	case 'U':
		h := sha256.New()
		if _, err := io.CopyN(h, c, n); err != nil {
			return
		}
		c.Write(h.Sum(nil))
	case 'D':
		bw := bufio.NewWriterSize(c, 64<<10)
		if _, err := payload(bw, seed, n); err == nil {
			bw.Flush()
		}
		// Wait for the client to close, so that the close is the client's.
		io.Copy(io.Discard, c)
	case 'E':
		io.Copy(c, c)
	case 'Z': // n zero bytes, as fast as possible (benchmarks)
		buf := make([]byte, 256<<10)
		for n > 0 {
			k := min(int64(len(buf)), n)
			if _, err := c.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
		io.Copy(io.Discard, c)
	}
}

func header(op byte, n int64, seed uint64) []byte {
	var hdr [17]byte
	hdr[0] = op
	binary.BigEndian.PutUint64(hdr[1:9], uint64(n))
	binary.BigEndian.PutUint64(hdr[9:17], seed)
	return hdr[:]
}

// upload sends n bytes and checks the backend's hash.
func upload(c net.Conn, n int64, seed uint64) error {
	if _, err := c.Write(header('U', n, seed)); err != nil {
		return err
	}
	want, err := payload(c, seed, n)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	var got [32]byte
	if _, err := io.ReadFull(c, got[:]); err != nil {
		return fmt.Errorf("read hash: %w", err)
	}
	if got != want {
		return errors.New("upload: SHA-256 mismatch")
	}
	return nil
}

// download receives n bytes and checks their hash.
func download(c net.Conn, n int64, seed uint64) error {
	if _, err := c.Write(header('D', n, seed)); err != nil {
		return err
	}
	h := sha256.New()
	if _, err := io.CopyN(h, c, n); err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	want, _ := payload(nil, seed, n)
	if [32]byte(h.Sum(nil)) != want {
		return errors.New("download: SHA-256 mismatch")
	}
	return nil
}

func insecureCreds() credentials.TransportCredentials { return insecure.NewCredentials() }

func newBufReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }

func credentialsTLS(t testing.TB, p *pki) credentials.TransportCredentials {
	return credentials.NewTLS(clientTLS(t, p))
}

func tlsconfigServer(p *pki) (credentials.TransportCredentials, error) {
	cfg, err := tlsconfig.Server(p.server.CertFile, p.server.KeyFile, p.ca.CertFile, "cluster")
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}
