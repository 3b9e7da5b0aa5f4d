package nft

import (
	"bufio"
	"context"
	"errors"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/moat-net/moat/internal/testenv"
)

// generationMonitor follows `nft monitor` in the calling thread's
// namespace: each value is a generation it reported ("# new generation
// N by process ...").
type generationMonitor struct {
	cmd  *exec.Cmd
	gens chan uint32
	// exit is how nft monitor ended, set before exited is closed.
	exit   error
	exited chan struct{}
}

var newGenerationLine = regexp.MustCompile(`^# new generation (\d+)`)

// startGenerationMonitor starts nft monitor and waits until it reports:
// until then it commits a probe, over and over, for the monitor may not
// have subscribed yet. It returns the generation of the last probe.
func startGenerationMonitor(t *testing.T) (*generationMonitor, uint32) {
	t.Helper()
	// stdbuf: nft buffers its output to a pipe.
	cmd := exec.Command("stdbuf", "-oL", "nft", "monitor")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("nft monitor: %v", err)
	}
	m := &generationMonitor{cmd: cmd, gens: make(chan uint32, 100), exited: make(chan struct{})}
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-m.exited })
	go func() {
		defer close(m.exited)
		defer func() { m.exit = cmd.Wait() }()
		defer close(m.gens)
		sc := bufio.NewScanner(out)
		// A set's elements are one line.
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			if g := newGenerationLine.FindStringSubmatch(sc.Text()); g != nil {
				n, _ := strconv.ParseUint(g[1], 10, 32)
				m.gens <- uint32(n)
			}
		}
	}()
	for range 100 {
		// Adding and deleting a table: a commit that changes something
		// (one that changes nothing raises no generation) and leaves
		// nothing.
		if out, err := exec.Command("nft", "add table inet probe; delete table inet probe").CombinedOutput(); err != nil {
			t.Fatalf("nft probe: %v: %s", err, out)
		}
		select {
		case g, ok := <-m.gens:
			if !ok {
				t.Fatal("nft monitor ended")
			}
			// Probes the monitor saw after the first queue behind it;
			// the last one is the generation now.
			for {
				select {
				case g = <-m.gens:
					continue
				default:
				}
				return m, g
			}
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatal("nft monitor reported no generation for 100 commits")
	return nil, 0
}

// next returns the next generation the monitor reports. ok is false
// when the monitor was killed by a signal: Debian's nft 1.0.6 monitor
// segfaults in about a third of the runs while printing the patch's
// event (one element added to an interval set of concatenations) since
// the forward chain gained the link-scope rules; the commit itself is
// fine, and the generation read over netlink still checks it. Any other
// end fails the test.
func (m *generationMonitor) next(t *testing.T, step string) (g uint32, ok bool) {
	t.Helper()
	select {
	case g, ok := <-m.gens:
		if ok {
			return g, true
		}
		<-m.exited
		var ee *exec.ExitError
		if errors.As(m.exit, &ee) && !ee.Exited() {
			t.Logf("%s: nft monitor died (%v), a crash of nft's own printer; the generation is checked over netlink alone from here", step, m.exit)
			return 0, false
		}
		t.Fatalf("%s: nft monitor ended: %v", step, m.exit)
	case <-time.After(time.Minute):
		t.Fatalf("%s: nft monitor reported no generation within a minute", step)
	}
	return 0, false
}

// readGeneration reads the generation in the calling thread's namespace
// and, from a thread outside it, through the namespace's descriptor; both
// must agree.
func readGeneration(t *testing.T, step string) uint32 {
	t.Helper()
	ctx := context.Background()
	g, err := NetlinkGeneration{}.ReadGeneration(ctx)
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	ns, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	type reading struct {
		g   uint32
		err error
	}
	done := make(chan reading)
	go func() { // an unlocked goroutine: not on this namespace's thread
		g, err := NetlinkGeneration{NetNS: int(ns)}.ReadGeneration(ctx)
		done <- reading{g, err}
	}()
	if r := <-done; r.err != nil || r.g != g {
		t.Errorf("%s: generation through the namespace's descriptor %d, %v; in the namespace %d", step, r.g, r.err, g)
	}
	return g
}

// TestKernelGeneration: the generation read over netlink is the one nft
// monitor reports, and each Syncer commit, full or patch, raises it by
// one, which the Syncer records.
func TestKernelGeneration(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		mon, probe := startGenerationMonitor(t)
		if g := readGeneration(t, "after the probe"); g != probe {
			t.Fatalf("generation read %d; nft monitor reported %d", g, probe)
		}
		iface, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		s := New(iface, Options{Node: "n1"})
		want := probe
		for i, yaml := range []string{counterPods, counterPodsMore} {
			res, err := s.Sync(ctx, compileYAML(t, yaml))
			if err != nil || res.Operations == 0 || res.Full != (i == 0) {
				t.Fatalf("sync %d: %+v, %v; want a full replace, then a patch", i, res, err)
			}
			want = nextGeneration(want)
			step := "after sync " + strconv.Itoa(i)
			if mon != nil {
				if got, ok := mon.next(t, step); !ok {
					mon = nil
				} else if got != want {
					t.Errorf("%s: nft monitor reported generation %d, want %d", step, got, want)
				}
			}
			if g := readGeneration(t, step); g != want {
				t.Errorf("%s: generation read %d, want %d", step, g, want)
			}
			if s.left != want {
				t.Errorf("%s: the Syncer recorded generation %d, want %d", step, s.left, want)
			}
		}
	})
}

// TestKernelCheckedResync: a checked resync patches a table nobody else
// touched, and replaces it after another commit in the namespace, be it to
// another table or an edit or removal of Moat's; the replaced table is
// what a fresh sync programs.
func TestKernelCheckedResync(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		iface, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		s := New(iface, Options{Node: "n1"})
		if res, err := s.Sync(ctx, compileYAML(t, counterPods)); err != nil || !res.Full {
			t.Fatalf("first sync: %+v, %v", res, err)
		}
		fresh := nftList(t)
		checked := func(step string, wantFull bool) Result {
			t.Helper()
			s.InvalidateIfChanged()
			res, err := s.Sync(ctx, compileYAML(t, counterPods))
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			if res.Check == nil || res.Full != wantFull || res.Check.Unchanged() == wantFull {
				t.Fatalf("%s: %+v (check %+v); want full replace %v", step, res, res.Check, wantFull)
			}
			if got := nftList(t); got != fresh {
				t.Errorf("%s: table differs from a fresh sync's:\n%s\nwant\n%s", step, got, fresh)
			}
			if g := readGeneration(t, step); s.left != g {
				t.Errorf("%s: the Syncer recorded generation %d, the kernel is at %d", step, s.left, g)
			}
			return res
		}
		// Nobody else committed: the same program again is an empty patch.
		if res := checked("quiet", false); res.Operations != 0 {
			t.Errorf("quiet checked resync sent %d operations, want 0", res.Operations)
		}
		checked("quiet again", false)

		for _, edit := range [][]string{
			{"add", "table", "inet", "other"},
			{"add", "chain", "inet", Table, "intruder"},
			{"flush", "table", "inet", Table},
			{"delete", "table", "inet", Table},
		} {
			step := "after nft " + strings.Join(edit, " ")
			before := readGeneration(t, step)
			runNft(t, edit...)
			res := checked(step, true)
			if want := "nftables generation moved from " + strconv.FormatUint(uint64(before), 10); !strings.HasPrefix(res.Check.Reason(), want) {
				t.Errorf("%s: reason %q, want %q...", step, res.Check.Reason(), want)
			}
			checked(step+", then quiet", false)
		}
		// An edit, then a patch of the Syncer's own before the resync:
		// the patch must not pass for the state the Syncer knows.
		runNft(t, "add", "chain", "inet", Table, "intruder")
		fix := func(res Result, err error) {
			t.Helper()
			if err != nil || res.Full || res.Operations == 0 {
				t.Fatalf("patch after an edit: %+v, %v", res, err)
			}
		}
		fix(s.Sync(ctx, compileYAML(t, counterPodsMore)))
		fix(s.Sync(ctx, compileYAML(t, counterPods)))
		checked("after an edit and two patches", true)
		// The other table was left alone.
		runNft(t, "list", "table", "inet", "other")
	})
}

// BenchmarkReadGeneration: what each of the two readings around each of
// the Syncer's transactions costs, in the calling thread's namespace and
// through a namespace's descriptor (moat-agent --netns).
func BenchmarkReadGeneration(b *testing.B) {
	testenv.RequirePrivileged(b)
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		b.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // moves this thread into it
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Set(orig); err != nil {
		b.Fatal(err) // the thread stays locked, and dies with the goroutine
	}
	runtime.UnlockOSThread()
	ctx := context.Background()
	b.Run("in-netns", func(b *testing.B) {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			b.Fatal(err)
		}
		defer func() {
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
		}()
		for b.Loop() {
			if _, err := (NetlinkGeneration{}).ReadGeneration(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("netns-fd", func(b *testing.B) {
		for b.Loop() {
			if _, err := (NetlinkGeneration{NetNS: int(ns)}).ReadGeneration(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
