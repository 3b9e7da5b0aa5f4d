package bindaddr

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/internal/testenv"
)

// inNewNS runs f on a thread inside a fresh network namespace (lo up) that
// the test creates and deletes: the host's own lo is never touched.
func inNewNS(t *testing.T, f func()) {
	testenv.RequirePrivileged(t)
	name := fmt.Sprintf("mtb%06x", rand.Uint32()&0xffffff)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v %s", name, err, out)
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

// An agent killed with SIGKILL leaves its address behind; the next agent
// must take it back as its own (its mark says Moat added it) so that its
// clean exit removes it. An operator's address stays whatever happens.
func TestAdoptAfterCrash(t *testing.T) {
	inNewNS(t, func() {
		for _, s := range []string{"10.0.0.1", "fd00::1"} {
			ip := net.ParseIP(s)
			first, err := Ensure(ip, "lo")
			if err != nil || !first.Added || first.Adopted {
				t.Fatalf("%s: first Ensure added=%v adopted=%v err=%v", s, first != nil && first.Added, first != nil && first.Adopted, err)
			}
			lo, _ := netlink.LinkByName("lo")
			if _, proto, err := find(lo, ip); err != nil || proto != Proto {
				t.Fatalf("%s: address protocol %#x (%v), want Moat's %#x", s, proto, err, Proto)
			}
			// The agent dies here without Release; a new one starts.
			second, err := Ensure(ip, "lo")
			if err != nil || !second.Added || !second.Adopted {
				t.Fatalf("%s: after a crash: added=%v adopted=%v err=%v, want the address taken back", s, second != nil && second.Added, second != nil && second.Adopted, err)
			}
			if err := second.Release(); err != nil || present(t, ip) {
				t.Fatalf("%s: the restarted agent's clean exit left the address (%v)", s, err)
			}
		}
		// An operator's address (no mark) is used and never removed.
		for _, s := range []string{"10.0.0.7/32", "fd00::7/128"} {
			if out, err := exec.Command("ip", "addr", "add", s, "dev", "lo").CombinedOutput(); err != nil {
				t.Fatalf("ip addr add %s: %v %s", s, err, out)
			}
			ip, _, _ := net.ParseCIDR(s)
			l, err := Ensure(ip, "lo")
			if err != nil || l.Added || l.Adopted {
				t.Fatalf("%s: operator's address: added=%v adopted=%v err=%v", s, l != nil && l.Added, l != nil && l.Adopted, err)
			}
			if err := l.Release(); err != nil || !present(t, ip) {
				t.Fatalf("%s: operator's address removed (%v)", s, err)
			}
		}
	})
}
