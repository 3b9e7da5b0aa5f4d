package lab

import (
	"context"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// TestMain lets the test binary double as the responder process that
// Create starts (the moat binary's hidden `lab serve`).
func TestMain(m *testing.M) {
	if os.Getenv("MOAT_LAB_TEST_SERVE") != "" {
		os.Exit(serveForTest(os.Args[len(os.Args)-1]))
	}
	os.Exit(m.Run())
}

func serveForTest(prefix string) int {
	st, err := LoadState(prefix)
	if err != nil {
		os.Stderr.WriteString(err.Error())
		return 1
	}
	res, err := (&manifest.Loader{}).Load(st.ManifestsDir())
	if err != nil {
		os.Stderr.WriteString(err.Error())
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := Serve(ctx, st, policy.Compile(&res.Cluster, st.Policy), os.Stdout); err != nil {
		os.Stderr.WriteString(err.Error())
		return 1
	}
	return 0
}

func writeManifests(extra string) func(dir string) error {
	return func(dir string) error {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		y, err := os.ReadFile("testdata/behaviour.yaml")
		if err != nil {
			return err
		}
		if extra != "" {
			y = append(y, []byte("\n---\n"+extra)...)
		}
		return os.WriteFile(filepath.Join(dir, "all.yaml"), y, 0o600)
	}
}

func TestCreateApplyMeasureDestroy(t *testing.T) {
	requireKernel(t)
	if testing.Short() {
		t.Skip("lab lifecycle: slow")
	}
	t.Setenv("MOAT_LAB_TEST_SERVE", "1")
	ctx := context.Background()
	prog := behaviour(t, "", policy.Options{})
	st, err := Create(ctx, prog, CreateOptions{
		Options:  Options{Peers: addrs("203.0.113.9"), CutDenied: true},
		Snapshot: writeManifests(""),
		Server:   []string{os.Args[0]},
	})
	if err != nil {
		t.Fatal(err)
	}
	prefix := st.Topology.Prefix
	defer leftovers(t, prefix)
	defer func() {
		if _, err := os.Stat(st.Dir()); err == nil {
			_ = Destroy(st)
		}
	}()
	again, err := LoadState(prefix)
	if err != nil || again.ServerPID != st.ServerPID || again.ServerPID <= 0 {
		t.Fatalf("state after create: %+v, %v", again, err)
	}
	measure := func(p *policy.Program) (denied int) {
		t.Helper()
		rep, err := again.Measure(ctx, p, ProbeOptions{Timeout: 600 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range rep.Flows {
			if !f.Agree {
				t.Errorf("disagreement: %s", describe(f))
			}
			if f.Measured && !f.Allowed {
				denied++
			}
		}
		return denied
	}
	if d := measure(prog); d != 0 {
		t.Errorf("no policy, yet %d flows denied", d)
	}
	prog2 := behaviour(t, isolateServer, policy.Options{})
	if _, err := again.Apply(ctx, prog2, writeManifests(isolateServer)); err != nil {
		t.Fatal(err)
	}
	if d := measure(prog2); d == 0 {
		t.Error("isolating the server denied nothing")
	}
	snap, err := os.ReadFile(filepath.Join(again.ManifestsDir(), "all.yaml"))
	if err != nil || !strings.Contains(string(snap), "server-from-other") {
		t.Errorf("applied manifests not recorded: %v", err)
	}
	moved := behaviour(t, "", policy.Options{})
	moved.Pods[0].IPs[0] = netip.MustParseAddr("10.50.9.9")
	if _, err := again.Apply(ctx, moved, nil); err == nil || !strings.Contains(err.Error(), "pods, nodes or addresses") {
		t.Errorf("apply with a changed topology: %v", err)
	}
	if err := Destroy(again); err != nil {
		t.Fatal(err)
	}
	if Alive(st.ServerPID) {
		t.Errorf("responder process %d still running", st.ServerPID)
	}
	if _, err := os.Stat(st.Dir()); !os.IsNotExist(err) {
		t.Errorf("state left behind: %v", err)
	}
}

func TestCleanRemovesLeftovers(t *testing.T) {
	requireKernel(t)
	prefix, err := NewPrefix()
	if err != nil {
		t.Fatal(err)
	}
	defer leftovers(t, prefix)
	topo, err := Plan(prefix, behaviour(t, "", policy.Options{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := topo.Build()
	if err != nil {
		t.Fatal(err)
	}
	ns.Close() // a crashed run: namespaces stay, nobody holds them
	if names, _ := namedWithPrefix(prefix); len(names) != len(topo.Namespaces()) {
		t.Fatalf("built %d namespaces, want %d", len(names), len(topo.Namespaces()))
	}
	removed, err := Clean(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != len(topo.Namespaces()) {
		t.Errorf("removed %v", removed)
	}
	if _, err := Clean("other"); err == nil {
		t.Error("Clean accepted a prefix that is not a lab's")
	}
}

func TestBuildFailureLeavesOthersAlone(t *testing.T) {
	requireKernel(t)
	prefix, err := NewPrefix()
	if err != nil {
		t.Fatal(err)
	}
	defer leftovers(t, prefix)
	topo, err := Plan(prefix, behaviour(t, "", policy.Options{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Another lab already owns one of the names.
	clash := topo.Nodes[1].NS
	h, err := createNamed(clash)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	_, err = topo.Build()
	if err == nil || !strings.Contains(err.Error(), clash) {
		t.Fatalf("build over an existing namespace: %v", err)
	}
	names, _ := namedWithPrefix(prefix)
	if len(names) != 1 || names[0] != clash {
		t.Errorf("after the failed build: %v, want only the other lab's %s", names, clash)
	}
	_ = deleteNamed(clash)
}
