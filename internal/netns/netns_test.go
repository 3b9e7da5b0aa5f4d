package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
)

func TestMain(m *testing.M) {
	netnstest.Main()
	os.Exit(m.Run())
}

// mounted reports whether path is a mount point in this mount namespace.
func mounted(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// nsInode identifies the network namespace of the calling thread.
func nsInode(t *testing.T) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestDeleteAfterIPNetnsAdd: a namespace created here must stay removable
// after another tool runs `ip netns add`, which bind-mounts the directory
// over itself unless it already is a mount point of its own (the lab's
// teardown failed with EBUSY that way). Runs with an empty /run of its
// own, so the directory starts as a plain directory.
func TestDeleteAfterIPNetnsAdd(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	ours, err := Create("moat-nstest-a")
	if err != nil {
		t.Fatal(err)
	}
	ours.Close()
	theirs := fmt.Sprintf("nstest-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", theirs).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", theirs, err, out)
	}
	defer func() {
		if out, err := exec.Command("ip", "netns", "delete", theirs).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v\n%s", theirs, err, out)
		}
	}()
	if err := Delete("moat-nstest-a"); err != nil {
		t.Fatalf("delete after ip netns add: %v", err)
	}
	path := filepath.Join(Dir, "moat-nstest-a")
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists: %v", path, err)
	}
	if mounted(t, path) {
		t.Errorf("%s is still mounted", path)
	}
	// And the other tool's namespace is untouched.
	if !mounted(t, filepath.Join(Dir, theirs)) {
		t.Errorf("%s lost its mount", theirs)
	}
}

func TestCreateOpenDoDelete(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	host := nsInode(t)
	ns, err := Create("moat-nstest-b")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if nsInode(t) != host {
		t.Fatal("Create moved the calling thread")
	}
	if _, err := Create("moat-nstest-b"); err == nil {
		t.Error("Create accepted an existing name")
	}
	for _, bad := range []string{"", "a/b", "..", "."} {
		if _, err := Create(bad); err == nil {
			t.Errorf("Create(%q) accepted a bad name", bad)
		}
	}
	var inside uint64
	if err := ns.Do(func() error { inside = nsInode(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside == host {
		t.Error("Do ran in the host namespace")
	}
	again, err := Open("moat-nstest-b")
	if err != nil {
		t.Fatal(err)
	}
	var viaOpen uint64
	if err := again.Do(func() error { viaOpen = nsInode(t); return nil }); err != nil {
		t.Fatal(err)
	}
	again.Close()
	if viaOpen != inside {
		t.Errorf("Open by name reached another namespace")
	}
	byPath, err := Open(filepath.Join(Dir, "moat-nstest-b"))
	if err != nil {
		t.Fatal(err)
	}
	byPath.Close()
	if err := ns.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	var fwd []byte
	if err := ns.Do(func() error { fwd, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward"); return err }); err != nil || string(fwd) != "1\n" {
		t.Errorf("sysctl inside: %q, %v", fwd, err)
	}
	nl, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	if links, err := nl.LinkList(); err != nil || len(links) != 1 {
		t.Errorf("a new namespace has only lo: %v, %v", links, err)
	}
	names, err := List("moat-nstest-")
	if err != nil || len(names) != 1 || names[0] != "moat-nstest-b" {
		t.Errorf("List: %v, %v", names, err)
	}
	if err := Delete("moat-nstest-b"); err != nil {
		t.Fatal(err)
	}
	if err := Delete("moat-nstest-b"); err != nil {
		t.Errorf("deleting a missing namespace: %v", err)
	}
	if _, err := Open("moat-nstest-b"); err == nil {
		t.Error("Open found a deleted namespace")
	}
}
