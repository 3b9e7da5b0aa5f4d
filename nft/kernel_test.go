package nft

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/policy"
)

// inPrivateNetns runs f on a thread that lives in a new, unnamed network
// namespace. The namespace disappears with its last reference however f
// ends; the thread is only reused if it could be moved back.
func inPrivateNetns(t *testing.T, f func()) {
	t.Helper()
	testenv.RequirePrivileged(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Errorf("current netns: %v", err)
			return
		}
		defer orig.Close()
		ns, err := netns.New()
		if err != nil {
			t.Errorf("new netns: %v", err)
			return
		}
		defer func() {
			ns.Close()
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
		}()
		f()
	}()
	<-done
}

func nftList(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", "inet", Table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	return string(out)
}

func TestKernelSyncFullDiffAndFailure(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		nft, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		s := New(nft, Options{Node: "node-1", CutDenied: true})
		prog := compileFile(t, "tiers.yaml", policy.Options{IngressNetworksAndNodes: true})
		res, err := s.Sync(ctx, prog)
		if err != nil {
			t.Fatalf("first sync: %v", err)
		}
		if !res.Full {
			t.Errorf("first sync was not a full replace: %+v", res)
		}
		listed := nftList(t)
		for _, want := range []string{
			"elements = { 10.0.2.10 . ipv4 }",
			"tcp . 30000-32767",
			"elements = { 203.0.113.0/25 . ipv4 }",
			"saddr . meta nfproto @a-",
			"udp dport 53",
			"tcp . 465-587",
			"ip saddr vmap @egress4",
			"10.0.1.10 : jump in-",
			"type filter hook forward priority filter; policy accept;",
		} {
			if !strings.Contains(listed, want) {
				t.Errorf("kernel table lacks %q:\n%s", want, listed)
			}
		}

		// Same program again: nothing to do.
		res, err = s.Sync(ctx, prog)
		if err != nil || res.Operations != 0 || res.Full {
			t.Errorf("second identical sync: %+v, %v; want no operations", res, err)
		}

		// A pod moves: only elements change, through the kernel too.
		prog2 := compileYAMLOpts(t, strings.Replace(mustRead(t, "testdata/tiers.yaml"), "10.0.2.10", "10.0.2.99", -1), policy.Options{IngressNetworksAndNodes: true})
		tx := nft.NewTransaction()
		diffTransaction(tx, s.Applied(), Build(prog2, "node-1"))
		if strings.Contains(tx.String(), "chain") || strings.Contains(tx.String(), " set ") {
			t.Errorf("pod address change touched chains or sets:\n%s", tx)
		}
		res, err = s.Sync(ctx, prog2)
		if err != nil || res.Full {
			t.Fatalf("patch sync: %+v, %v", res, err)
		}
		listed = nftList(t)
		if !strings.Contains(listed, "elements = { 10.0.2.99 . ipv4 }") || strings.Contains(listed, "10.0.2.10 ") {
			t.Errorf("element update not applied:\n%s", listed)
		}

		// A ruleset nft refuses: overlapping interval elements. The
		// previous table must stay, and the error must be returned.
		bad := Build(prog, "node-1")
		for _, set := range bad.sets {
			if set.Kind == addr4 {
				set.Addrs = []policy.AddrRange{
					policy.PrefixRange(netip.MustParsePrefix("10.9.0.0/24")),
					{From: netip.MustParseAddr("10.9.0.5"), To: netip.MustParseAddr("10.9.1.5")},
				}
				set.hash = "changed"
				break
			}
		}
		before := nftList(t)
		if _, err := s.apply(ctx, bad, nil, nil); err == nil {
			t.Fatal("applying an invalid ruleset succeeded")
		}
		if after := nftList(t); after != before {
			t.Errorf("failed apply changed the table:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if s.Applied() != nil {
			t.Error("after a failure the syncer still trusts its state")
		}
		// And it recovers with a full replace.
		res, err = s.Sync(ctx, prog)
		if err != nil || !res.Full {
			t.Fatalf("recovery sync: %+v, %v", res, err)
		}
		if err := s.Remove(ctx); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("nft", "list", "table", "inet", Table).CombinedOutput(); err == nil {
			t.Errorf("table still there after Remove:\n%s", out)
		}
	})
}

func TestKernelAcceptsFakeDump(t *testing.T) {
	// The golden dumps are valid nft input for this kernel and nft.
	inPrivateNetns(t, func() {
		for _, f := range []string{"testdata/tiers-node-1.golden", "testdata/tiers-node-2.golden"} {
			cmd := exec.Command("nft", "-f", f)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("nft -f %s: %v\n%s", f, err, out)
			}
			if out, err := exec.Command("nft", "delete", "table", "inet", Table).CombinedOutput(); err != nil {
				t.Errorf("delete: %v %s", err, out)
			}
		}
	})
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
