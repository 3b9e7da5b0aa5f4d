package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/moat-net/moat/internal/testenv"
)

// netLab is a control-plane namespace and a node namespace joined by a veth
// pair: the node can reach the control plane only at 192.168.251.1.
type netLab struct {
	t        testing.TB
	cp, node string
	bin      string // directory with the built binaries
}

const (
	cpIP   = "192.168.251.1"
	nodeIP = "192.168.251.2"
)

func run(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

var buildOnce sync.Once
var buildDir, buildErr = "", error(nil)

// buildBinariesB compiles both commands once per test process.
func buildBinariesB(t testing.TB) string {
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "moat-tunnel-bin-")
		if buildErr != nil {
			return
		}
		for _, c := range []string{"moat-proxy-server", "moat-proxy-agent"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(buildDir, c), "github.com/moat-net/moat/cmd/"+c).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build %s: %v: %s", c, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func newNetLab(t testing.TB) *netLab {
	testenv.RequirePrivileged(t)
	prefix := fmt.Sprintf("mt%06x", rand.Uint32()&0xffffff)
	l := &netLab{t: t, cp: prefix + "-cp", node: prefix + "-nd", bin: buildBinariesB(t)}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", l.cp).Run()
		exec.Command("ip", "netns", "del", l.node).Run()
	})
	run(t, "ip", "netns", "add", l.cp)
	run(t, "ip", "netns", "add", l.node)
	run(t, "ip", "link", "add", prefix+"c", "netns", l.cp, "type", "veth", "peer", "name", prefix+"n", "netns", l.node)
	for _, c := range [][]string{
		{l.cp, "addr", "add", cpIP + "/24", "dev", prefix + "c"},
		{l.cp, "link", "set", prefix + "c", "up"},
		{l.cp, "link", "set", "lo", "up"},
		{l.node, "addr", "add", nodeIP + "/24", "dev", prefix + "n"},
		{l.node, "link", "set", prefix + "n", "up"},
		{l.node, "link", "set", "lo", "up"},
	} {
		run(t, append([]string{"ip", "-n"}, c...)...)
	}
	return l
}

// in runs f on a thread inside namespace ns; sockets f creates stay there.
func (l *netLab) in(ns string, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	h, err := netns.GetFromName(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return err
	}
	defer netns.Set(orig)
	return f()
}

func (l *netLab) dial(ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := l.in(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	return c, err
}

func (l *netLab) listen(ns, addr string) net.Listener {
	var ln net.Listener
	if err := l.in(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { ln.Close() })
	return ln
}

// get does one HTTP(S) GET over a connection dialed inside ns.
func (l *netLab) get(ns, addr, url string, tlsCfg *tls.Config) (int, string, error) {
	c, err := l.dial(ns, addr)
	if err != nil {
		return 0, "", err
	}
	tr := &http.Transport{DisableKeepAlives: true}
	used := false
	dial := func(context.Context, string, string) (net.Conn, error) {
		if used {
			return nil, errors.New("one connection only")
		}
		used = true
		return c, nil
	}
	if tlsCfg != nil {
		tr.DialTLSContext = func(ctx context.Context, n, a string) (net.Conn, error) {
			nc, err := dial(ctx, n, a)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(nc, tlsCfg)
			return tc, tc.HandshakeContext(ctx)
		}
	} else {
		tr.DialContext = dial
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 15 * time.Second}).Get(url)
	if err != nil {
		c.Close()
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

type proc struct {
	cmd *exec.Cmd
	out *bytes.Buffer
	mu  sync.Mutex
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// start runs a binary inside ns; cleanup sends SIGTERM, then SIGKILL.
func (l *netLab) start(ns, bin string, args ...string) *proc {
	p := &proc{out: &bytes.Buffer{}}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", ns, filepath.Join(l.bin, bin)}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() {
		p.stop()
		if l.t.Failed() {
			l.t.Logf("%s output:\n%s", bin, p.output())
		}
	})
	return p
}

// kill ends the process with SIGKILL: it gets no chance to clean up.
func (p *proc) kill() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// stop sends SIGTERM and waits (bounded); it returns the exit error.
func (p *proc) stop() error {
	if p.cmd.ProcessState != nil {
		return nil
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-done
		return errors.New("did not exit within 15s of SIGTERM")
	}
}

func (l *netLab) waitReady(ns, healthAddr string) {
	l.t.Helper()
	eventually(l.t, "readyz on "+healthAddr+" in "+ns, func() bool {
		code, _, err := l.get(ns, healthAddr, "http://"+healthAddr+"/readyz", nil)
		return err == nil && code == 200
	})
}

func (l *netLab) addrs(ns string) []string {
	h, err := netns.GetFromName(ns)
	if err != nil {
		l.t.Fatal(err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		l.t.Fatal(err)
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err != nil {
		l.t.Fatal(err)
	}
	as, err := nh.AddrList(lo, netlink.FAMILY_ALL)
	if err != nil {
		l.t.Fatal(err)
	}
	var out []string
	for _, a := range as {
		out = append(out, fmt.Sprintf("%s scope %d", a.IPNet, a.Scope))
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (l *netLab) startServer(p *pki, extra ...string) *proc {
	args := []string{
		"--uds-name", filepath.Join(l.t.TempDir(), "konnectivity.sock"), "--server-port", "0",
		"--agent-bind-address", cpIP, "--agent-port", "8091",
		"--cluster-cert", p.server.CertFile, "--cluster-key", p.server.KeyFile, "--cluster-ca-cert", p.ca.CertFile,
		"--health-bind-address", "127.0.0.1", "--health-port", "8092", "--admin-port", "0",
	}
	return l.start(l.cp, "moat-proxy-server", append(args, extra...)...)
}

func (l *netLab) startAgent(p *pki, extra ...string) *proc {
	args := []string{
		"--proxy-server-host", cpIP, "--proxy-server-port", "8091",
		"--ca-cert", p.ca.CertFile, "--agent-cert", p.agent.CertFile, "--agent-key", p.agent.KeyFile,
		"--health-server-host", "127.0.0.1", "--health-server-port", "8093", "--admin-server-port", "0",
		"--sync-interval", "100ms", "--dial-timeout", "3s", "--drain-timeout", "2s",
	}
	return l.start(l.node, "moat-proxy-agent", append(args, extra...)...)
}

// kas stands for kube-apiserver: HTTPS on the control plane's loopback,
// unreachable from the node network.
func (l *netLab) kas(p *pki, addr, name string) {
	ln := l.listen(l.cp, addr)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{p.kas.TLS}}}
	go hs.ServeTLS(ln, "", "")
	l.t.Cleanup(func() { hs.Close() })
}

// TestKEP2025 runs both binaries in network namespaces: a node client
// reaches the API server through the agent's bind address, a destination
// not allowed is refused, and the bind address is cleaned up.
func TestKEP2025(t *testing.T) {
	l := newNetLab(t)
	p := newPKI(t)
	l.kas(p, "127.0.0.1:6443", "kube-apiserver")
	l.kas(p, "127.0.0.1:7443", "forbidden")
	l.startServer(p, "--feature-gates", "EnableClusterToMasterTraffic=true", "--allowed-destination", "localhost:6443")
	ag := l.startAgent(p, "--feature-gates", "EnableClusterToMasterTraffic=true", "--bind-address", "10.0.0.1",
		"--target", "6443:LOCALHOST.:06443", "--target", "7443:127.0.0.1:7443")
	l.waitReady(l.cp, "127.0.0.1:8092")
	l.waitReady(l.node, "127.0.0.1:8093")

	if a := l.addrs(l.node); !contains(a, "10.0.0.1/32 scope 254") {
		t.Fatalf("bind address not on lo with host scope: %v", a)
	}
	// The node cannot reach the API server directly.
	if c, err := l.dial(l.node, cpIP+":6443"); err == nil {
		c.Close()
		t.Fatal("node namespace reached the API server port directly")
	}
	roots := &tls.Config{RootCAs: p.ca.Pool, ServerName: "10.0.0.1"}
	code, body, err := l.get(l.node, "10.0.0.1:6443", "https://10.0.0.1:6443/version", roots)
	if err != nil || code != 200 || body != "kube-apiserver /version" {
		t.Fatalf("through the tunnel: %d %q %v", code, body, err)
	}
	// Not in --allowed-destination: the agent accepts, the server refuses,
	// the client sees the connection closed without data.
	c, err := l.dial(l.node, "10.0.0.1:7443")
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	n, rerr := c.Read(make([]byte, 1))
	c.Close()
	if n != 0 || rerr == nil || errors.Is(rerr, os.ErrDeadlineExceeded) {
		t.Fatalf("forbidden destination: read %d bytes, err %v; want a close", n, rerr)
	}
	_, metrics, err := l.get(l.cp, "127.0.0.1:8092", "http://127.0.0.1:8092/metrics", nil)
	if err != nil || !strings.Contains(metrics, "moat_tunnel_refused_destinations_total 1") {
		t.Fatalf("refusal not counted: %v\n%s", err, grep(metrics, "refused"))
	}
	if err := ag.stop(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v\n%s", err, ag.output())
	}
	if a := l.addrs(l.node); contains(a, "10.0.0.1/32 scope 254") {
		t.Fatalf("bind address left behind: %v", a)
	}
}

// TestKEP2025GateOff: without the feature gate the agent opens no listener
// and adds no address; the server refuses node dials.
func TestKEP2025GateOff(t *testing.T) {
	l := newNetLab(t)
	p := newPKI(t)
	l.kas(p, "127.0.0.1:6443", "kube-apiserver")
	l.startServer(p, "--allowed-destination", "localhost:6443")
	l.startAgent(p, "--bind-address", "10.0.0.1", "--target", "6443:localhost:6443")
	l.waitReady(l.node, "127.0.0.1:8093")
	if a := l.addrs(l.node); contains(a, "10.0.0.1/32 scope 254") {
		t.Fatalf("gate off but bind address added: %v", a)
	}
	// Also no listener on an address that exists (the 127/8 route).
	l2 := l.startAgent(p, "--bind-address", "127.0.0.5", "--target", "6443:localhost:6443", "--health-server-port", "8094")
	l.waitReady(l.node, "127.0.0.1:8094")
	if c, err := l.dial(l.node, "127.0.0.5:6443"); err == nil {
		c.Close()
		t.Fatal("gate off but the agent listens")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("want connection refused, got %v", err)
	}
	_ = l2
}

// TestKEP2025ExistingAddress: an address already present is used and left
// in place when the agent exits.
func TestKEP2025ExistingAddress(t *testing.T) {
	l := newNetLab(t)
	p := newPKI(t)
	run(t, "ip", "-n", l.node, "addr", "add", "10.0.0.2/32", "dev", "lo")
	l.kas(p, "127.0.0.1:6443", "kube-apiserver")
	l.startServer(p, "--feature-gates", "EnableClusterToMasterTraffic=true", "--allowed-destination", "127.0.0.1:6443")
	ag := l.startAgent(p, "--feature-gates", "EnableClusterToMasterTraffic=true", "--bind-address", "10.0.0.2", "--target", "6443:127.0.0.1:6443")
	l.waitReady(l.node, "127.0.0.1:8093")
	eventually(t, "listener on 10.0.0.2:6443", func() bool {
		c, err := l.dial(l.node, "10.0.0.2:6443")
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	code, body, err := l.get(l.node, "10.0.0.2:6443", "https://10.0.0.2:6443/readyz", &tls.Config{RootCAs: p.ca.Pool, ServerName: "10.0.0.2"})
	if err != nil || code != 200 || body != "kube-apiserver /readyz" {
		t.Fatalf("through the tunnel: %d %q %v", code, body, err)
	}
	if err := ag.stop(); err != nil {
		t.Fatalf("agent exit: %v", err)
	}
	if a := l.addrs(l.node); !contains(a, "10.0.0.2/32 scope 0") {
		t.Fatalf("pre-existing address was removed: %v", a)
	}
}

func grep(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestKEP2025IPv6: an IPv6 bind address and IPv6 destinations in brackets,
// spelled differently on the agent and in the allow list.
func TestKEP2025IPv6(t *testing.T) {
	l := newNetLab(t)
	p := newPKI(t)
	l.kas(p, "[::1]:6443", "kube-apiserver")
	l.startServer(p, "--feature-gates", "EnableClusterToMasterTraffic=true", "--allowed-destination", "[0:0:0:0:0:0:0:1]:6443")
	ag := l.startAgent(p, "--feature-gates", "EnableClusterToMasterTraffic=true", "--bind-address", "fd00::10",
		"--target", "6443:[::1]:6443")
	l.waitReady(l.node, "127.0.0.1:8093")
	eventually(t, "listener on [fd00::10]:6443", func() bool {
		c, err := l.dial(l.node, "[fd00::10]:6443")
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	code, body, err := l.get(l.node, "[fd00::10]:6443", "https://[fd00::10]:6443/api", &tls.Config{RootCAs: p.ca.Pool, ServerName: "fd00::10"})
	if err != nil || code != 200 || body != "kube-apiserver /api" {
		t.Fatalf("through the tunnel: %d %q %v", code, body, err)
	}
	if err := ag.stop(); err != nil {
		t.Fatalf("agent exit: %v", err)
	}
	for _, a := range l.addrs(l.node) {
		if strings.HasPrefix(a, "fd00::10/") {
			t.Fatalf("IPv6 bind address left behind: %v", a)
		}
	}
}

// TestKEP2025AgentKilled: an agent killed with SIGKILL cannot remove its bind
// address; the agent that replaces it takes the address back as its own, so
// that its clean exit removes it.
func TestKEP2025AgentKilled(t *testing.T) {
	l := newNetLab(t)
	p := newPKI(t)
	l.kas(p, "127.0.0.1:6443", "kube-apiserver")
	l.startServer(p, "--feature-gates", "EnableClusterToMasterTraffic=true", "--allowed-destination", "localhost:6443")
	args := []string{"--feature-gates", "EnableClusterToMasterTraffic=true", "--bind-address", "10.0.0.1", "--target", "6443:localhost:6443"}
	first := l.startAgent(p, args...)
	l.waitReady(l.node, "127.0.0.1:8093")
	if a := l.addrs(l.node); !contains(a, "10.0.0.1/32 scope 254") {
		t.Fatalf("bind address not on lo: %v", a)
	}
	first.kill()
	if a := l.addrs(l.node); !contains(a, "10.0.0.1/32 scope 254") {
		t.Fatalf("bind address gone after SIGKILL (nothing could have removed it): %v", a)
	}
	second := l.startAgent(p, args...)
	l.waitReady(l.node, "127.0.0.1:8093")
	roots := &tls.Config{RootCAs: p.ca.Pool, ServerName: "10.0.0.1"}
	eventually(t, "the restarted agent serves the bind address", func() bool {
		code, body, err := l.get(l.node, "10.0.0.1:6443", "https://10.0.0.1:6443/livez", roots)
		return err == nil && code == 200 && body == "kube-apiserver /livez"
	})
	if err := second.stop(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v\n%s", err, second.output())
	}
	if a := l.addrs(l.node); contains(a, "10.0.0.1/32 scope 254") {
		t.Fatalf("the restarted agent left the bind address a killed agent had added: %v\n%s", a, second.output())
	}
}
