// Package netnstest runs a test in a private mount namespace with an
// empty /run, so the test can create, list and clean named network
// namespaces and lab state as if it had the machine to itself: nothing it
// makes under /run is visible to anyone else, nothing of others' is
// visible to it, and whatever it leaves is gone when it exits.
//
// Tests that need this call Isolate first; the package's TestMain calls
// Main before m.Run.
package netnstest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// env names the test a child process was started to run.
const env = "MOAT_NETNS_ISOLATED_TEST"

// marker is the file that tells processes the isolated test starts in
// turn that /run is the isolated one already.
const marker = "/run/.netnstest"

// Main prepares a child process started by Isolate: it mounts an empty
// tmpfs over /run (the process is already in a mount namespace of its
// own, with every mount private). Elsewhere, and in processes the
// isolated test starts itself, it does nothing.
func Main() {
	if os.Getenv(env) == "" {
		return
	}
	if _, err := os.Stat(marker); err == nil {
		return
	}
	if err := unix.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"); err != nil {
		fmt.Fprintf(os.Stderr, "netnstest: mount an empty /run: %v\n", err)
		os.Exit(2)
	}
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "netnstest: %v\n", err)
		os.Exit(2)
	}
}

// Isolate reports whether the calling test runs isolated. In the test
// process itself it runs the test again in a child process (same binary,
// only this test) inside a new mount namespace, reports the child's output
// and verdict, and returns false: the caller then returns at once. In the
// child it returns true. Only top-level tests can be isolated.
func Isolate(t *testing.T) bool {
	t.Helper()
	if os.Getenv(env) == t.Name() {
		return true
	}
	args := []string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.v=true", "-test.count=1"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), env+"="+t.Name())
	// Pdeathsig fires when the forking thread ends: keep it alive.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	t.Logf("isolated run (private mount namespace, empty /run):\n%s", out)
	if err != nil {
		t.Fatalf("isolated run failed: %v", err)
	}
	if !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
		t.Fatalf("isolated run did not pass %s", t.Name())
	}
	return false
}
