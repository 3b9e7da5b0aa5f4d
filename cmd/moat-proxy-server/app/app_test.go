package app

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
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

// testOptions are options for a server on loopback with its PKI in dir.
func testOptions(t *testing.T, dir string) *options.Options {
	ca, err := pki.NewCA(dir, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("proxy-server", "localhost", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	o, err := options.New()
	if err != nil {
		t.Fatal(err)
	}
	o.UDSName, o.ServerPort = filepath.Join(dir, "konnectivity.sock"), 0
	o.AgentBindAddress, o.AgentPort = "127.0.0.1", testenv.FreePort(t)
	o.ClusterCert, o.ClusterKey, o.ClusterCACert = leaf.CertFile, leaf.KeyFile, ca.CertFile
	o.HealthBindAddress, o.HealthPort = "127.0.0.1", testenv.FreePort(t)
	o.AdminPort, o.Profiling = testenv.FreePort(t), true
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	return o
}

// Run opens every socket the options name, serves health, readiness,
// metrics and profiles, refuses a port that is taken naming its flag, and
// returns cleanly when its context ends.
func TestRun(t *testing.T) {
	o := testOptions(t, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	health := "http://127.0.0.1:" + strconv.Itoa(o.HealthPort)
	for i := 0; ; i++ {
		if code, _ := get(health + "/healthz"); code == 200 {
			break
		}
		if i > 200 {
			t.Fatal("/healthz never answered")
		}
		time.Sleep(25 * time.Millisecond)
	}
	if code, body := get(health + "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no agent") {
		t.Errorf("/readyz without agents: %d %q", code, body)
	}
	admin := "http://127.0.0.1:" + strconv.Itoa(o.AdminPort)
	if code, body := get(admin + "/metrics"); code != 200 || !strings.Contains(body, "moat_tunnel_backends 0") {
		t.Errorf("admin /metrics: %d", code)
	}
	if code, _ := get(admin + "/debug/pprof/"); code != 200 {
		t.Errorf("/debug/pprof/ with --enable-profiling: %d", code)
	}
	if fi, err := os.Stat(o.UDSName); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("--uds-name: %v %v, want mode 0600", fi, err)
	}
	// A second server on the same agent port is refused with the flag's name.
	o2 := testOptions(t, t.TempDir())
	o2.AgentPort = o.AgentPort
	if err := Run(context.Background(), o2); err == nil || !strings.Contains(err.Error(), "--agent-port") {
		t.Errorf("second server on a taken port: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// A TCP frontend whose client CA (--server-ca-cert) shares a certificate
// with the agents' (--cluster-ca-cert) is refused at start, naming both
// flags: every agent's certificate would open kube-apiserver's frontend.
// A bundle holding the agent CA among others is refused too; a CA of the
// frontend's own starts.
func TestSharedFrontendCARefused(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	front, err := pki.NewCA(dir, "frontend")
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := front.Issue("proxy-server-frontend", "localhost", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	agentCA, err := os.ReadFile(o.ClusterCACert)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := os.ReadFile(other.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle.crt")
	if err := os.WriteFile(bundle, append(otherCA, agentCA...), 0o600); err != nil {
		t.Fatal(err)
	}
	o.ServerCert, o.ServerKey, o.ServerBindAddress = leaf.CertFile, leaf.KeyFile, "127.0.0.1"
	for _, c := range []struct {
		ca      string
		refused bool
	}{{o.ClusterCACert, true}, {bundle, true}, {front.CertFile, false}} {
		o.ServerCACert, o.ServerPort = c.ca, testenv.FreePort(t)
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		_, closeAll, err := listen(o)
		if c.refused {
			if err == nil || !strings.Contains(err.Error(), "--server-ca-cert and --cluster-ca-cert share the CA") {
				t.Errorf("--server-ca-cert %s: %v, want refused", filepath.Base(c.ca), err)
			}
		} else if err != nil {
			t.Errorf("--server-ca-cert of its own: %v", err)
		}
		if err == nil {
			closeAll()
		}
	}
}
