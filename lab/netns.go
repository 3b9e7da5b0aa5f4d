package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
)

// netnsDir is where `ip netns` and netns.NewNamed keep named namespaces;
// naming them lets `ip netns exec` explore a running lab and lets
// `moat lab clean` find what a crashed run left.
const netnsDir = "/var/run/netns"

// createNamed creates a named network namespace and returns a handle to
// it. The calling goroutine's thread is left where it was.
func createNamed(name string) (netns.NsHandle, error) {
	var h netns.NsHandle
	err := onThread(func() error {
		orig, err := netns.Get()
		if err != nil {
			return fmt.Errorf("current network namespace: %w", err)
		}
		defer orig.Close()
		h, err = netns.NewNamed(name)
		if err != nil {
			// NewNamed may have moved the thread before failing.
			if serr := netns.Set(orig); serr != nil {
				return errThreadLost
			}
			return fmt.Errorf("create network namespace %s: %w", name, err)
		}
		if err := netns.Set(orig); err != nil {
			h.Close()
			return errThreadLost
		}
		return nil
	})
	return h, err
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

// inNS runs f on a thread inside the namespace ns. Sockets created and
// processes started by f (nft, via knftables) belong to that namespace.
func inNS(ns netns.NsHandle, f func() error) error {
	return onThread(func() error {
		orig, err := netns.Get()
		if err != nil {
			return fmt.Errorf("current network namespace: %w", err)
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			return errors.Join(ferr, errThreadLost)
		}
		return ferr
	})
}

// deleteNamed removes a named namespace; it disappears once nothing
// (socket, handle, process) refers to it any more.
func deleteNamed(name string) error {
	if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete network namespace %s: %w", name, err)
	}
	return nil
}

// namedWithPrefix lists the named namespaces whose name starts with prefix.
func namedWithPrefix(prefix string) ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", netnsDir, err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// openNamed opens an existing named namespace.
func openNamed(name string) (netns.NsHandle, error) {
	h, err := netns.GetFromPath(filepath.Join(netnsDir, name))
	if err != nil {
		return netns.None(), fmt.Errorf("open network namespace %s: %w", name, err)
	}
	return h, nil
}

// sysctl writes a net.* sysctl of the calling thread's namespace: /proc
// resolves /proc/sys/net through the opening thread's namespace.
func sysctl(key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}
