package app

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moat-net/moat/cmd/moat-agent/app/options"
)

// TestSecondAgentFails: while one agent holds the node's lock, a second
// moat-agent exits with an error naming the lock and the holder's pid
// before it touches nftables (two agents patched against
// each other's table). The kubeconfig names a server nobody listens on:
// nothing before the lock contacts it.
func TestSecondAgentFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run", "agent.lock")
	release, err := lockNode(path)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--node-name=n1", "--kubeconfig=" + kubeconfig, "--metrics-bind-address=", "--health-bind-address=", "--lock-file=" + path}
	_, err = execute(t, args...)
	if err == nil || !strings.Contains(err.Error(), "holds the lock "+path) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second agent: error = %v, want one naming the lock %s and the holder's pid %d", err, path, os.Getpid())
	}
	t.Logf("second agent: %v", err)
	release()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("lock file after release: %v, want it removed", err)
	}
	// Released, the lock can be taken again.
	again, err := lockNode(path)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again()
}

// TestLockPathPerNetns: with --netns and the default --lock-file each
// namespace has its own lock file, named after the namespace itself (two
// names of one namespace share it); an explicit --lock-file wins.
func TestLockPathPerNetns(t *testing.T) {
	o, err := options.New()
	if err != nil {
		t.Fatal(err)
	}
	if p, err := lockPath(o); err != nil || p != options.DefaultLockFile {
		t.Errorf("lock path without --netns = %q, %v, want %s", p, err, options.DefaultLockFile)
	}
	o.NetNS = "/proc/self/ns/net"
	self, err := lockPath(o)
	if err != nil {
		t.Fatal(err)
	}
	o.NetNS = "/proc/" + strconv.Itoa(os.Getpid()) + "/ns/net"
	if p, err := lockPath(o); err != nil || p != self || filepath.Dir(p) != filepath.Dir(options.DefaultLockFile) || p == options.DefaultLockFile {
		t.Errorf("lock path of two names of one namespace: %q and %q (%v), want one file beside %s", self, p, err, options.DefaultLockFile)
	}
	o.LockFile = "/tmp/explicit.lock"
	if p, err := lockPath(o); err != nil || p != "/tmp/explicit.lock" {
		t.Errorf("explicit --lock-file with --netns: %q, %v", p, err)
	}
}
