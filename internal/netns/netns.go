// Package netns creates, opens, enters and deletes Linux network
// namespaces, and programs nftables inside one. It is the one namespace
// helper of the module: `moat-agent --netns` programs a lab node through
// it, and the lab builds every node and pod with it.
//
// Named namespaces live where iproute2 keeps them (Dir), so `ip netns
// exec NAME ...` explores them. Creating one does what `ip netns add`
// does, including making Dir a shared mount point of its own first;
// otherwise a later `ip netns add` by any other tool bind-mounts Dir over
// itself and hides the mounts made before, which then can be neither
// unmounted nor removed (EBUSY) until reboot.
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Dir is where named network namespaces are mounted, as iproute2 does.
const Dir = "/run/netns"

// NS is an open network namespace. Its methods are safe for concurrent
// use.
type NS struct {
	name string
	h    vnetns.NsHandle

	mu sync.Mutex
	nl *netlink.Handle
}

// Name is the name (or path) the namespace was opened by.
func (n *NS) Name() string { return n.name }

// Handle is the namespace's file descriptor, for netlink calls that take
// a target namespace (moving a veth peer into it).
func (n *NS) Handle() vnetns.NsHandle { return n.h }

// Netlink returns a netlink handle inside the namespace, opened on first
// use and closed with the namespace.
func (n *NS) Netlink() (*netlink.Handle, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.nl == nil {
		nl, err := netlink.NewHandleAt(n.h)
		if err != nil {
			return nil, fmt.Errorf("netlink in network namespace %s: %w", n.name, err)
		}
		n.nl = nl
	}
	return n.nl, nil
}

// Close releases the handles; a named namespace stays until Delete.
func (n *NS) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.nl != nil {
		n.nl.Close()
		n.nl = nil
	}
	if n.h.IsOpen() {
		n.h.Close()
	}
}

// Path is the file of a named namespace (a name under Dir) or nameOrPath
// itself when it is a path (anything with a slash, such as
// /proc/PID/ns/net).
func Path(nameOrPath string) string {
	if strings.Contains(nameOrPath, "/") {
		return nameOrPath
	}
	return filepath.Join(Dir, nameOrPath)
}

// Open opens a named namespace or a namespace file (see Path).
func Open(nameOrPath string) (*NS, error) {
	h, err := vnetns.GetFromPath(Path(nameOrPath))
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", nameOrPath, err)
	}
	return &NS{name: nameOrPath, h: h}, nil
}

// Create makes a new named namespace, like `ip netns add`: it fails if
// the name exists. The calling goroutine's thread stays where it was.
func Create(name string) (_ *NS, err error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("network namespace name %q: must be a plain file name", name)
	}
	if err := prepareDir(Dir); err != nil {
		return nil, err
	}
	path := filepath.Join(Dir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create network namespace %s: %w", name, err)
	}
	f.Close()
	defer func() {
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	var h vnetns.NsHandle
	err = onThread(func() error {
		orig, err := vnetns.Get()
		if err != nil {
			return fmt.Errorf("current network namespace: %w", err)
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("create network namespace %s: %w", name, err)
		}
		// The thread is in the new namespace now: whatever happens, it
		// must go back (or die).
		ferr := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		if ferr != nil {
			ferr = fmt.Errorf("create network namespace %s: bind mount: %w", name, ferr)
		} else if h, ferr = vnetns.Get(); ferr != nil {
			_ = unix.Unmount(path, unix.MNT_DETACH)
			ferr = fmt.Errorf("create network namespace %s: %w", name, ferr)
		}
		if err := vnetns.Set(orig); err != nil {
			return errors.Join(ferr, errThreadLost)
		}
		return ferr
	})
	if err != nil {
		if h.IsOpen() {
			h.Close()
			_ = unix.Unmount(path, unix.MNT_DETACH)
		}
		return nil, err
	}
	return &NS{name: name, h: h}, nil
}

// prepareDir makes dir a shared mount point of its own, as iproute2 does
// before it creates a namespace file: then mounts made below dir are never
// hidden by another tool doing the same, and unmounts propagate to peer
// mount namespaces.
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	bound := false
	for {
		err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		// EINVAL: dir is not a mount point yet.
		if !errors.Is(err, unix.EINVAL) || bound {
			return fmt.Errorf("make %s a shared mount: %w", dir, err)
		}
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind mount %s onto itself: %w", dir, err)
		}
		bound = true
	}
}

// Delete removes a named namespace, like `ip netns delete`; the namespace
// itself ends once nothing (socket, handle, process) refers to it. A
// missing name is not an error.
func Delete(name string) error {
	path := filepath.Join(Dir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete network namespace %s: unmount: %w", name, err)
	}
	err := os.Remove(path)
	switch {
	case err == nil, errors.Is(err, os.ErrNotExist):
		return nil
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("delete network namespace %s: %w: the file is still a mount point, perhaps hidden below another mount of %s (see /proc/self/mountinfo); it goes at reboot", name, err, Dir)
	}
	return fmt.Errorf("delete network namespace %s: %w", name, err)
}

// List returns the named namespaces whose name starts with prefix.
func List(prefix string) ([]string, error) {
	entries, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", Dir, err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// errThreadLost means a thread could not be moved back to its namespace;
// onThread then lets the thread die instead of reusing it.
var errThreadLost = errors.New("could not return a thread to its network namespace")

// onThread runs f on a fresh locked OS thread. If f reports
// errThreadLost, the thread is destroyed rather than returned to the Go
// scheduler in a foreign namespace.
func onThread(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := f()
		if !errors.Is(err, errThreadLost) {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Do runs f on a thread inside the namespace. Sockets f creates belong to
// the namespace, and so do processes it starts (knftables runs the nft
// binary); a socket keeps its namespace after f returns.
func (n *NS) Do(f func() error) error {
	return onThread(func() error {
		orig, err := vnetns.Get()
		if err != nil {
			return fmt.Errorf("current network namespace: %w", err)
		}
		defer orig.Close()
		if err := vnetns.Set(n.h); err != nil {
			return fmt.Errorf("enter network namespace %s: %w", n.name, err)
		}
		ferr := f()
		if err := vnetns.Set(orig); err != nil {
			return errors.Join(ferr, errThreadLost)
		}
		return ferr
	})
}

// Sysctl writes a net.* sysctl of the namespace (/proc/sys/net resolves
// through the namespace of the thread that opens it).
func (n *NS) Sysctl(key, value string) error {
	return n.Do(func() error {
		path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, n.name, err)
		}
		return nil
	})
}
