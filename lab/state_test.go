package lab

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/netns"
	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// TestMain lets the test binary stand in for the moat binary in child
// processes: "lab-test-serve" is the hidden `moat lab serve` that Up
// starts for a lab that outlives its command; the others are commands that
// die at a chosen moment (see child).
func TestMain(m *testing.M) {
	netnstest.Main()
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "lab-test-") {
		if err := child(os.Args[1], os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serverArgv is the responder command line labs made by tests use.
func serverArgv() []string { return []string{"lab-test-serve"} }

// child runs one of the child processes:
//
//	lab-test-serve --lab NAME         answer on a detached lab's ports
//	lab-test-up NAME                  moat lab up (killed by the test)
//	lab-test-run NAME                 a lab run that dies once the lab is up
//	lab-test-apply NAME STAGE EXTRA   moat lab apply of behaviour.yaml+EXTRA
//	                                  (a constant's name), dying at STAGE
func child(mode string, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	die := func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} }
	prog := func(extra string) (*policy.Program, error) {
		y, err := os.ReadFile("testdata/behaviour.yaml")
		if err != nil {
			return nil, err
		}
		if extra != "" {
			y = append(y, []byte("\n---\n"+extra)...)
		}
		return compileYAML(y, policy.Options{})
	}
	switch mode {
	case "lab-test-serve":
		l, err := Open(ctx, args[len(args)-1])
		if err != nil {
			return err
		}
		defer l.Close()
		return l.Serve(ctx, os.Stdout)
	case "lab-test-up", "lab-test-run":
		p, err := prog("")
		if err != nil {
			return err
		}
		opts := Options{Name: args[0]}
		if mode == "lab-test-up" {
			opts.Server, opts.Snapshot = serverArgv(), writeManifests("")
		}
		if _, err := Up(ctx, p, opts); err != nil {
			return err
		}
		if mode == "lab-test-run" {
			die()
		}
		return nil
	case "lab-test-apply":
		extra := map[string]string{"isolateServer": isolateServer, "": ""}[args[2]]
		p, err := prog(extra)
		if err != nil {
			return err
		}
		l, err := Open(ctx, args[0])
		if err != nil {
			return err
		}
		l.hook = func(stage string) {
			if stage == args[1] {
				die()
			}
		}
		_, err = l.Apply(ctx, p, writeManifests(extra))
		return err
	}
	return fmt.Errorf("unknown child mode %s", mode)
}

// compileYAML compiles manifests outside a test (in a child process).
func compileYAML(y []byte, opts policy.Options) (*policy.Program, error) {
	res, err := (&manifest.Loader{Stdin: bytes.NewReader(y)}).Load("-")
	if err != nil {
		return nil, err
	}
	return policy.Compile(&res.Cluster, opts), nil
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

// runChild runs the test binary as a child process and returns how it
// ended.
func runChild(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// agreeing fails the test for every flow of rep that disagrees and
// returns how many measured flows were denied.
func agreeing(t *testing.T, rep *Report) (denied int) {
	t.Helper()
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

func TestUpApplyMeasureDown(t *testing.T) {
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("lab lifecycle: slow")
	}
	ctx := context.Background()
	prog := behaviour(t, "", policy.Options{})
	up, err := Up(ctx, prog, Options{Peers: addrs("203.0.113.9"), CutDenied: true, Server: serverArgv(), Snapshot: writeManifests("")})
	if err != nil {
		t.Fatal(err)
	}
	name := up.Name()
	defer leftovers(t, name)
	defer func() {
		if _, err := os.Stat(filepath.Join(stateRoot, name)); err == nil {
			_, _ = Clean(name, true)
		}
	}()
	if err := up.Close(); err != nil {
		t.Fatal(err)
	}
	if names, _ := netns.List(name + "-"); len(names) != len(up.st.Topology.Namespaces()) {
		t.Fatalf("closing the lab up made in this process removed namespaces: %v", names)
	}
	l, err := Open(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	server := l.st.Server
	if !server.alive() || l.st.Owner != server {
		t.Fatalf("responder process %+v not running or not the owner (%+v)", server, l.st.Owner)
	}
	measure := func() int {
		t.Helper()
		rep, err := l.Measure(ctx, ProbeOptions{Timeout: 600 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return agreeing(t, rep)
	}
	if d := measure(); d != 0 {
		t.Errorf("no policy, yet %d flows denied", d)
	}
	if _, err := l.Apply(ctx, behaviour(t, isolateServer, policy.Options{}), writeManifests(isolateServer)); err != nil {
		t.Fatal(err)
	}
	if d := measure(); d == 0 {
		t.Error("isolating the server denied nothing")
	}
	snap, err := os.ReadFile(filepath.Join(l.dir, l.st.Manifests, "all.yaml"))
	if err != nil || !strings.Contains(string(snap), "server-from-other") {
		t.Errorf("applied manifests not recorded: %v", err)
	}
	if dirs, _ := filepath.Glob(filepath.Join(l.dir, "manifests-*")); len(dirs) != 1 {
		t.Errorf("copies of manifests kept: %v", dirs)
	}
	moved := behaviour(t, "", policy.Options{})
	moved.Pods[0].IPs[0] = netip.MustParseAddr("10.50.9.9")
	if _, err := l.Apply(ctx, moved, writeManifests("")); err == nil || !strings.Contains(err.Error(), "pods, nodes or addresses") {
		t.Errorf("apply with a changed topology: %v", err)
	}
	if err := l.Down(); err != nil {
		t.Fatal(err)
	}
	if server.alive() {
		t.Errorf("responder process %d still running", server.PID)
	}
	if _, err := os.Stat(l.dir); !os.IsNotExist(err) {
		t.Errorf("state left behind: %v", err)
	}
}

func TestBuildFailureLeavesOthersAlone(t *testing.T) {
	testenv.RequirePrivileged(t)
	prefix, err := newName()
	if err != nil {
		t.Fatal(err)
	}
	defer leftovers(t, prefix)
	topo, err := planTopology(prefix, behaviour(t, "", policy.Options{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Another lab already owns one of the names.
	clash := topo.Nodes[1].NS
	h, err := netns.Create(clash)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	_, err = Up(context.Background(), behaviour(t, "", policy.Options{}), Options{Name: prefix})
	if err == nil || !strings.Contains(err.Error(), clash) {
		t.Fatalf("build over an existing namespace: %v", err)
	}
	names, _ := netns.List(prefix + "-")
	if len(names) != 1 || names[0] != clash {
		t.Errorf("after the failed build: %v, want only the other lab's %s", names, clash)
	}
	_ = netns.Delete(clash)
}
