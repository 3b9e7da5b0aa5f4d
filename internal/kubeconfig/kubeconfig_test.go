package kubeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const twoContexts = `apiVersion: v1
kind: Config
clusters:
- name: a
  cluster: {server: "https://127.0.0.1:6443"}
- name: b
  cluster: {server: "https://127.0.0.2:7443"}
users:
- name: u
  user: {token: secret}
contexts:
- name: ctx-a
  context: {cluster: a, user: u}
- name: ctx-b
  context: {cluster: b, user: u}
current-context: ctx-a
`

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config")
	if err := os.WriteFile(path, []byte(twoContexts), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		context, host string
	}{{"", "https://127.0.0.1:6443"}, {"ctx-b", "https://127.0.0.2:7443"}} {
		cfg, err := Load(path, tc.context, "moat-test")
		if err != nil {
			t.Fatalf("context %q: %v", tc.context, err)
		}
		if cfg.Host != tc.host {
			t.Errorf("context %q: host %s, want %s", tc.context, cfg.Host, tc.host)
		}
		if !strings.HasPrefix(cfg.UserAgent, "moat-test ") {
			t.Errorf("user agent %q does not name the binary", cfg.UserAgent)
		}
	}
	// $KUBECONFIG is honoured when no path is given.
	t.Setenv("KUBECONFIG", path)
	if cfg, err := Load("", "ctx-b", ""); err != nil || cfg.Host != "https://127.0.0.2:7443" {
		t.Errorf("via $KUBECONFIG: %v, %v", cfg, err)
	}
	if _, err := Load(path, "no-such-context", ""); err == nil {
		t.Error("an unknown context was accepted")
	}
	if _, err := Load(filepath.Join(dir, "missing"), "", ""); err == nil {
		t.Error("a missing file was accepted")
	}
}

// Contexts reads the file Load reads: the explicit path, else $KUBECONFIG.
func TestContexts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(path, []byte(twoContexts), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := Contexts(path); err != nil || strings.Join(got, ",") != "ctx-a,ctx-b" {
		t.Errorf("Contexts(%s) = %v, %v", path, got, err)
	}
	t.Setenv("KUBECONFIG", path)
	if got, err := Contexts(""); err != nil || strings.Join(got, ",") != "ctx-a,ctx-b" {
		t.Errorf("via $KUBECONFIG: %v, %v", got, err)
	}
}
