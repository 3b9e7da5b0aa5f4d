package app

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestBridgeNetfilter: a bridge with the sysctls at 0 (or br_netfilter
// absent) is reported; without a bridge nothing is.
func TestBridgeNetfilter(t *testing.T) {
	dir := t.TempDir()
	sys, proc := filepath.Join(dir, "sys"), filepath.Join(dir, "proc")
	if b, off := bridgeNetfilter(sys, proc); b != nil || off != nil {
		t.Errorf("no bridge: %v %v", b, off)
	}
	if err := os.MkdirAll(filepath.Join(sys, "class/net/cni0/bridge"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, off := bridgeNetfilter(sys, proc)
	if !slices.Equal(b, []string{"cni0"}) || len(off) != 2 {
		t.Errorf("bridge without br_netfilter: %v %v", b, off)
	}
	if err := os.MkdirAll(filepath.Join(proc, "sys/net/bridge"), 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"bridge-nf-call-iptables": "1\n", "bridge-nf-call-ip6tables": "0\n"} {
		if err := os.WriteFile(filepath.Join(proc, "sys/net/bridge", k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, off := bridgeNetfilter(sys, proc); !slices.Equal(off, []string{"net.bridge.bridge-nf-call-ip6tables"}) {
		t.Errorf("ip6tables off: %v", off)
	}
}
