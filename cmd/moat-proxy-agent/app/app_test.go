package app

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-net/moat/cmd/moat-proxy-agent/app/options"
	srvapp "github.com/moat-net/moat/cmd/moat-proxy-server/app"
	srvoptions "github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/internal/testenv/pki"
)

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i > 400 {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// agentOptions starts a moat-proxy-server on loopback, its PKI in a fresh
// directory and its options adjusted by serverOpts, stopped when the test
// ends; it returns options for an agent that reaches it with a
// certificate for agentCN, health served on loopback and a quick sync.
func agentOptions(t *testing.T, agentCN string, serverOpts func(*srvoptions.Options)) *options.Options {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA(dir, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	srvLeaf, err := ca.Issue("proxy-server", "localhost", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	agLeaf, err := ca.Issue(agentCN)
	if err != nil {
		t.Fatal(err)
	}
	so, err := srvoptions.New()
	if err != nil {
		t.Fatal(err)
	}
	so.UDSName, so.ServerPort = filepath.Join(dir, "s.sock"), 0
	so.AgentBindAddress, so.AgentPort = "127.0.0.1", testenv.FreePort(t)
	so.ClusterCert, so.ClusterKey, so.ClusterCACert = srvLeaf.CertFile, srvLeaf.KeyFile, ca.CertFile
	so.HealthPort, so.AdminPort = 0, 0
	serverOpts(so)
	sctx, scancel := context.WithCancel(context.Background())
	sdone := make(chan error, 1)
	go func() { sdone <- srvapp.Run(sctx, so) }()
	t.Cleanup(func() { scancel(); <-sdone })

	o, err := options.New()
	if err != nil {
		t.Fatal(err)
	}
	o.ProxyServerHost, o.ProxyServerPort = "127.0.0.1", so.AgentPort
	o.CACert, o.AgentCert, o.AgentKey = ca.CertFile, agLeaf.CertFile, agLeaf.KeyFile
	o.HealthServerHost, o.HealthServerPort = "127.0.0.1", testenv.FreePort(t)
	o.SyncInterval = 50 * time.Millisecond
	return o
}

// The agent connects to a real moat-proxy-server, reports ready, and on the
// first signal drains and returns; its endpoints follow the options.
func TestRunDrainsOnSignal(t *testing.T) {
	o := agentOptions(t, "proxy-agent", func(*srvoptions.Options) {})
	o.AdminServerPort, o.Profiling = testenv.FreePort(t), true
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	sigs := make(chan os.Signal, 2)
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), o, sigs) }()
	health := "http://127.0.0.1:" + strconv.Itoa(o.HealthServerPort)
	waitFor(t, "/readyz", func() bool { code, _ := get(health + "/readyz"); return code == 200 })
	admin := "http://127.0.0.1:" + strconv.Itoa(o.AdminServerPort)
	if code, body := get(admin + "/metrics"); code != 200 || !strings.Contains(body, "moat_tunnel_backends 1") {
		t.Errorf("admin /metrics: %d", code)
	}
	if code, _ := get(admin + "/debug/pprof/"); code != 200 {
		t.Errorf("/debug/pprof/ with --enable-profiling: %d", code)
	}
	sigs <- syscall.SIGTERM
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not stop after draining")
	}
	if code, _ := get(health + "/healthz"); code != 0 {
		t.Errorf("health endpoint still served after exit: %d", code)
	}
}

// An agent whose certificate names its node (CN system:node:<node>) and
// that has no --agent-id announces the node's name, so a server that
// requires bound identities gives it a tunnel (it refuses any other ID).
func TestRunAgentIDFromNodeCertificate(t *testing.T) {
	o := agentOptions(t, "system:node:node-a", func(so *srvoptions.Options) { so.AgentIdentityBinding = "required" })
	o.AdminServerPort = 0
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o, make(chan os.Signal)) }()
	health := "http://127.0.0.1:" + strconv.Itoa(o.HealthServerPort)
	waitFor(t, "/readyz (a tunnel accepted as node-a)", func() bool { code, _ := get(health + "/readyz"); return code == 200 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
