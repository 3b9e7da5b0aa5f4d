package app

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/cmd/moat-agent/app/options"
	"github.com/moat-net/moat/internal/netns"
)

// lockPath is the lock file of the options: --lock-file, except that
// with --netns and --lock-file at its default each network namespace has
// its own (named by the namespace's inode, which every name and path of
// it shares), so that the agents of a lab's nodes, one namespace each, do
// not exclude each other. "" means no lock.
func lockPath(o *options.Options) (string, error) {
	if o.NetNS == "" || o.LockFile != options.DefaultLockFile {
		return o.LockFile, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(netns.Path(o.NetNS), &st); err != nil {
		return "", fmt.Errorf("--netns %s: %w", o.NetNS, err)
	}
	return filepath.Join(filepath.Dir(options.DefaultLockFile), fmt.Sprintf("netns-%d.lock", st.Ino)), nil
}

// lockNode takes the exclusive lock that makes one agent at a time
// program a node: two agents (a DaemonSet given maxSurge, an agent run by
// hand to debug) would each patch the table against what it last
// programmed, see the other's commits as a foreign writer's and replace
// the table with its own ruleset, back and forth. The lock is flock(2) on
// path, so the kernel releases it when the process ends, however it ends:
// no stale lock survives a crash. The file holds the holder's pid, for
// the error the next agent reports. release removes the file and lets go
// of the lock.
func lockNode(path string) (release func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock file %s: %w", path, err)
	}
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("lock file %s: %w", path, err)
		}
		fd := int(f.Fd())
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			pid, _ := os.ReadFile(path)
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				holder := "another moat-agent"
				if p := strings.TrimSpace(string(pid)); p != "" {
					holder += " (pid " + p + ")"
				}
				return nil, fmt.Errorf("%s holds the lock %s: it programs this node's table inet moat, and two agents would undo each other's rules; stop it first (a DaemonSet must not update with maxSurge; --lock-file)", holder, path)
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		// The holder before us removes the file when it ends: if it did
		// between our open and our lock, we hold a lock on a file
		// nobody else will open. Start again with the path's file.
		var held, named unix.Stat_t
		if err := unix.Fstat(fd, &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if err := unix.Stat(path, &named); err != nil || named.Ino != held.Ino || named.Dev != held.Dev {
			f.Close()
			continue
		}
		if err := f.Truncate(0); err == nil {
			_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
		return func() {
			// Removed while still locked: whoever opens the path next
			// creates a new file (see above).
			os.Remove(path)
			f.Close()
		}, nil
	}
}
