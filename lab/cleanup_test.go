package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/internal/netns"
	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/policy"
)

// The tests here call Clean without a name or stack mounts on /run/netns,
// which on a shared machine would reach other people's labs: they run
// isolated (netnstest), with a /run of their own.

func ipNetns(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"netns"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip netns %v: %v\n%s", args, err, out)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// slowIsolated skips the slow test with -short, and is false in the
// process that only isolates the test (netnstest.Isolate): what says what
// is slow.
func slowIsolated(t *testing.T, what string) bool {
	t.Helper()
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip(what + ": slow")
	}
	return netnstest.Isolate(t)
}

// upIsolated brings up the behaviour lab with its server isolated.
func upIsolated(ctx context.Context, t *testing.T) *Lab {
	t.Helper()
	l, err := Up(ctx, behaviour(t, isolateServer, policy.Options{}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// mustMeasure probes every flow of l once.
func mustMeasure(ctx context.Context, t *testing.T, l *Lab) *Report {
	t.Helper()
	rep, err := l.Measure(ctx, ProbeOptions{Timeout: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestCleanKeepsLiveLabs: clean without a name removes a lab whose
// process died, and keeps a running lab run, a running lab up and a
// namespace no lab made, however it is named. --force removes the labs
// but still not the other namespace.
func TestCleanKeepsLiveLabs(t *testing.T) {
	if !slowIsolated(t, "lab cleanup") {
		return
	}
	ctx := context.Background()
	prog := behaviour(t, "", policy.Options{})
	running, err := Up(ctx, prog, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	up, err := Up(ctx, prog, Options{Server: serverArgv(), Snapshot: writeManifests("")})
	if err != nil {
		t.Fatal(err)
	}
	up.Close()
	foreign := fmt.Sprintf("%sforeign-%d", namePrefix, os.Getpid())
	ipNetns(t, "add", foreign)
	defer ipNetns(t, "delete", foreign)
	dead, _ := newName()
	if out, err := runChild(t, "lab-test-run", dead); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("lab run child: %v\n%s", err, out)
	}
	if names, _ := netns.List(dead + "-"); len(names) == 0 {
		t.Fatal("the killed run left no namespaces: nothing to test")
	}

	msgs, err := Clean("", false)
	t.Logf("clean: %s", strings.Join(msgs, "; "))
	if err != nil {
		t.Fatal(err)
	}
	if names, _ := netns.List(dead + "-"); len(names) > 0 || exists(filepath.Join(stateRoot, dead)) {
		t.Errorf("the dead run's lab survived: %v", names)
	}
	for _, l := range []*Lab{running, up} {
		if names, _ := netns.List(l.Name() + "-"); len(names) != len(l.st.Topology.Namespaces()) || !exists(l.dir) {
			t.Errorf("live lab %s lost namespaces or state: %v", l.Name(), names)
		}
	}
	if !exists(filepath.Join(netns.Dir, foreign)) {
		t.Errorf("clean removed %s, which no lab made", foreign)
	}
	// The live labs still work: responders answer, rules hold.
	agreeing(t, mustMeasure(ctx, t, running))
	opened, err := Open(ctx, up.Name())
	if err != nil {
		t.Fatal(err)
	}
	agreeing(t, mustMeasure(ctx, t, opened))
	opened.Close()

	server := up.st.Server
	msgs, err = Clean("", true)
	t.Logf("clean --force: %s", strings.Join(msgs, "; "))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Lab{running, up} {
		if names, _ := netns.List(l.Name() + "-"); len(names) > 0 || exists(l.dir) {
			t.Errorf("clean --force kept lab %s: %v", l.Name(), names)
		}
	}
	if server.alive() {
		t.Errorf("clean --force left the responder process %d running", server.PID)
	}
	if !exists(filepath.Join(netns.Dir, foreign)) {
		t.Errorf("clean --force removed %s, which no lab made", foreign)
	}
	if err := running.Close(); err != nil {
		t.Errorf("closing a lab that clean --force removed: %v", err)
	}
}

// TestTeardownAfterIPNetnsAdd: another tool's `ip netns add` while a lab
// runs (iproute2 then bind-mounts /run/netns over itself unless it is a
// mount point already) must not keep the lab from removing its
// namespaces.
func TestTeardownAfterIPNetnsAdd(t *testing.T) {
	if !slowIsolated(t, "lab teardown") {
		return
	}
	ctx := context.Background()
	l := upIsolated(ctx, t)
	other := fmt.Sprintf("labtest-%d", os.Getpid())
	ipNetns(t, "add", other)
	defer ipNetns(t, "delete", other)
	rep, err := l.Measure(ctx, ProbeOptions{Timeout: 600 * time.Millisecond})
	rep, err = finish(l, rep, err)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Warnings) > 0 {
		t.Errorf("teardown warnings: %v", rep.Warnings)
	}
	if agreeing(t, rep) == 0 {
		t.Error("nothing denied")
	}
	if names, _ := netns.List(l.Name() + "-"); len(names) > 0 {
		t.Errorf("namespaces left: %v", names)
	}
	if exists(l.dir) {
		t.Error("state left")
	}
}

// TestTeardownProblemIsAWarning: when namespaces cannot be removed (here
// /run/netns is made read-only), the measured flows stay, the run does
// not fail, and the problem is a warning; the lab's state stays for a
// later clean.
func TestTeardownProblemIsAWarning(t *testing.T) {
	if !slowIsolated(t, "lab teardown") {
		return
	}
	ctx := context.Background()
	l := upIsolated(ctx, t)
	if err := unix.Mount("", netns.Dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	rep := mustMeasure(ctx, t, l)
	want := len(rep.Flows)
	rep, err := finish(l, rep, nil)
	if err != nil {
		t.Fatalf("a teardown problem failed the run: %v", err)
	}
	if rep == nil || len(rep.Flows) != want {
		t.Fatalf("measured flows lost: %v", rep)
	}
	if len(rep.Warnings) == 0 || !strings.Contains(rep.Warnings[0], "read-only file system") {
		t.Errorf("warnings: %q", rep.Warnings)
	}
	agreeing(t, rep)
	if !exists(l.dir) {
		t.Error("the state of a lab that could not be removed is gone: clean cannot retry")
	}
	// Writable again, clean can finish the job (forced: the owner, this
	// process, still runs).
	if err := unix.Mount("", netns.Dir, "", unix.MS_REMOUNT|unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if msgs, _ := Clean(l.Name(), false); len(msgs) != 1 || !strings.HasPrefix(msgs[0], "kept") {
		t.Errorf("clean of a lab whose process runs: %q", msgs)
	}
	if _, err := Clean(l.Name(), true); err != nil {
		t.Fatal(err)
	}
	if names, _ := netns.List(l.Name() + "-"); len(names) > 0 || exists(l.dir) {
		t.Errorf("left after clean: %v", names)
	}
}

// TestUpKilledEarlyIsCleanable: moat lab up killed as soon as its first
// namespace exists has already recorded the lab, so clean without a name
// finds and removes everything.
func TestUpKilledEarlyIsCleanable(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	name, _ := newName()
	cmd := exec.Command(os.Args[0], "lab-test-up", name)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if names, _ := netns.List(name + "-"); len(names) > 0 {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("lab up made no namespace in 30s")
		}
		time.Sleep(200 * time.Microsecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if _, err := load(name); err != nil {
		t.Errorf("lab up killed after making a namespace left no state: %v", err)
	}
	msgs, err := Clean("", false)
	t.Logf("clean: %s", strings.Join(msgs, "; "))
	if err != nil {
		t.Fatal(err)
	}
	if names, _ := netns.List(name + "-"); len(names) > 0 || exists(filepath.Join(stateRoot, name)) {
		t.Errorf("left after clean: %v", names)
	}
}

// TestApplyKilledMidwayStaysConsistent: moat lab apply killed at any
// point leaves a lab whose next command sees rules and manifests in step
// (no false disagreement), and whose manifests are the ones before or
// after the apply.
func TestApplyKilledMidwayStaysConsistent(t *testing.T) {
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("lab apply: slow")
	}
	ctx := context.Background()
	up, err := Up(ctx, behaviour(t, "", policy.Options{}), Options{Server: serverArgv(), Snapshot: writeManifests("")})
	if err != nil {
		t.Fatal(err)
	}
	name := up.Name()
	up.Close()
	defer leftovers(t, name)
	defer func() { _, _ = Clean(name, true) }()
	extra := ""
	for _, stage := range []string{"pending", "node 0 programmed", "node 1 programmed", "programmed"} {
		// Each apply flips the server between open and isolated.
		if extra == "" {
			extra = "isolateServer"
		} else {
			extra = ""
		}
		out, err := runChild(t, "lab-test-apply", name, stage, extra)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("apply killed at %q: %v\n%s", stage, err, out)
		}
		l, err := Open(ctx, name)
		if err != nil {
			t.Fatalf("after apply killed at %q: %v", stage, err)
		}
		if l.st.Pending != nil {
			t.Errorf("after apply killed at %q: still pending", stage)
		}
		rep := mustMeasure(ctx, t, l)
		denied := agreeing(t, rep)
		isolated := strings.Contains(mustReadDir(t, filepath.Join(l.dir, l.st.Manifests)), "server-from-other")
		t.Logf("killed at %q: manifests isolate the server: %v, %d flows denied, warnings %q", stage, isolated, denied, rep.Warnings)
		if isolated != (denied > 0) {
			t.Errorf("killed at %q: manifests isolate=%v but %d flows denied", stage, isolated, denied)
		}
		if stage == "pending" && len(rep.Warnings) == 0 {
			t.Errorf("killed at %q: finishing the apply was not reported", stage)
		}
		l.Close()
		if t.Failed() {
			return
		}
	}
}

func mustReadDir(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range files {
		b.WriteString(mustRead(t, f))
	}
	return b.String()
}
