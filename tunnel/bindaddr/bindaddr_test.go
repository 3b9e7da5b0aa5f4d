package bindaddr

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNewNS runs f on a thread inside a fresh network namespace (lo up).
func inNewNS(t *testing.T, f func()) {
	if os.Geteuid() != 0 {
		t.Skip("bind address test: needs root to create a network namespace (CI runs as root)")
	}
	name := fmt.Sprintf("mtb%06x", rand.Uint32()&0xffffff)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("bind address test: ip netns add failed (needs iproute2): %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		h, err := netns.GetFromName(name)
		if err != nil {
			t.Error(err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			t.Error(err)
			return
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Error(err)
			return
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			t.Error(err)
			return
		}
		f()
	}()
	<-done
}

func present(t *testing.T, ip net.IP) bool {
	lo, _ := netlink.LinkByName("lo")
	as, err := netlink.AddrList(lo, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if a.IP.Equal(ip) {
			return true
		}
	}
	return false
}

func hostScoped(t *testing.T, ip net.IP) bool {
	lo, _ := netlink.LinkByName("lo")
	as, err := netlink.AddrList(lo, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if a.IP.Equal(ip) && a.Scope == unix.RT_SCOPE_HOST {
			return true
		}
	}
	return false
}

func TestEnsureRelease(t *testing.T) {
	inNewNS(t, func() {
		for _, s := range []string{"10.0.0.1", "fd00::1"} {
			ip := net.ParseIP(s)
			l, err := Ensure(ip, "lo")
			if err != nil {
				t.Errorf("%s: %v", s, err)
				continue
			}
			// IPv6 scope is derived from the address by the kernel; only
			// IPv4 can be made host-scoped.
			if !l.Added || !present(t, ip) || (ip.To4() != nil && !hostScoped(t, ip)) {
				t.Errorf("%s: not added (host-scoped for IPv4)", s)
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(s, "0"))
			if err != nil {
				t.Errorf("%s: not bindable: %v", s, err)
			} else {
				ln.Close()
			}
			// A second Ensure sees the address as present and leaves it alone.
			l2, err := Ensure(ip, "lo")
			if err != nil || l2.Added {
				t.Errorf("%s: second Ensure added=%v err=%v", s, l2 != nil && l2.Added, err)
			}
			if err := l2.Release(); err != nil || !present(t, ip) {
				t.Errorf("%s: releasing a lease that added nothing removed the address (%v)", s, err)
			}
			if err := l.Release(); err != nil || present(t, ip) {
				t.Errorf("%s: Release left the address (%v)", s, err)
			}
		}
		// 127.0.0.0/8 is local already: used as is.
		l, err := Ensure(net.ParseIP("127.0.0.9"), "lo")
		if err != nil || l.Added {
			t.Errorf("127.0.0.9: added=%v err=%v", l != nil && l.Added, err)
		}
		if _, err := Ensure(net.ParseIP("10.0.0.3"), "nope0"); err == nil {
			t.Error("missing interface: want an error naming --bind-interface")
		}
	})
}
