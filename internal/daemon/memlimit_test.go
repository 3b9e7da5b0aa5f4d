package daemon

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

const (
	v2Own     = "0::/kubepods/pod1/c1\n"
	v2NS      = "0::/\n"
	v1Own     = "12:pids:/x\n4:memory:/kubepods/pod1/c1\n1:cpu,cpuacct:/x\n"
	v1Unnamed = "4:memory:/\n"
)

func TestCgroupMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cgroup string
		files  map[string]string
		want   int64
		err    bool
	}{
		{"v2, own cgroup", v2Own, map[string]string{"kubepods/pod1/c1/memory.max": "536870912\n", "memory.max": "1"}, 536870912, false},
		{"v2, cgroup namespace", v2NS, map[string]string{"memory.max": "536870912\n"}, 536870912, false},
		{"v2 no limit", v2NS, map[string]string{"memory.max": "max\n"}, 0, false},
		{"v1, own cgroup", v1Own, map[string]string{"memory/kubepods/pod1/c1/memory.limit_in_bytes": "1073741824\n"}, 1073741824, false},
		{"v1 no limit", v1Unnamed, map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0, false},
		{"no cgroup files", v2Own, nil, 0, false},
		{"no /proc/self/cgroup", "", map[string]string{"memory.max": "1000"}, 0, false},
		{"garbage", v2NS, map[string]string{"memory.max": "lots"}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tc.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := cgroupMemoryLimit(root, tc.cgroup)
			if got != tc.want || (err != nil) != tc.err {
				t.Errorf("got %d, %v; want %d, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestApplyMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "memory.max"), []byte("1000000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(t.TempDir(), "cgroup")
	if err := os.WriteFile(self, []byte(v2NS), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Setenv("GOMEMLIMIT", "")
	set, err := applyMemoryLimit(root, self)
	if err != nil || set != 750000000 || debug.SetMemoryLimit(-1) != 750000000 {
		t.Errorf("cgroup limit 1e9: set %d (%v), runtime limit %d; want 750000000", set, err, debug.SetMemoryLimit(-1))
	}

	// GOMEMLIMIT is the operator's: left alone.
	debug.SetMemoryLimit(prev)
	t.Setenv("GOMEMLIMIT", "300MiB")
	if set, err := applyMemoryLimit(root, self); set != 0 || err != nil || debug.SetMemoryLimit(-1) != prev {
		t.Errorf("with GOMEMLIMIT: set %d (%v), runtime limit %d; want nothing set", set, err, debug.SetMemoryLimit(-1))
	}
}

// TestApplyGCPercent: a daemon's garbage-collection target applies unless
// the operator set GOGC, and 0 leaves Go's default.
func TestApplyGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct {
		name    string
		gogc    string
		percent int
		want    int // what applyGCPercent reports
		target  int // the runtime's target afterwards
	}{
		{"daemon's target", "", 50, 50, 50},
		{"GOGC wins", "200", 50, 0, 100},
		{"no target of its own", "", 0, 0, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			t.Setenv("GOGC", tc.gogc)
			if got := applyGCPercent(tc.percent); got != tc.want {
				t.Errorf("applyGCPercent(%d) = %d, want %d", tc.percent, got, tc.want)
			}
			if got := debug.SetGCPercent(100); got != tc.target {
				t.Errorf("GC target %d, want %d", got, tc.target)
			}
		})
	}
}
