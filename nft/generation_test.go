package nft

import (
	"context"
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// genFake is knftables' fake with a generation, as the kernel keeps one:
// each transaction that runs raises it by one, and by others more when
// another writer commits around it.
type genFake struct {
	*knftables.Fake
	gen uint32
	// others is added to gen by the next Run, as if others committed
	// while it ran.
	others uint32
	// err fails readings of the generation, runErr the next Run.
	err, runErr error
}

func (f *genFake) Run(ctx context.Context, tx *knftables.Transaction) error {
	if err := f.runErr; err != nil {
		f.runErr = nil
		return err
	}
	if err := f.Fake.Run(ctx, tx); err != nil {
		return err
	}
	f.gen += 1 + f.others
	f.others = 0
	return nil
}

func (f *genFake) ReadGeneration(context.Context) (uint32, error) { return f.gen, f.err }

func TestInvalidateIfChanged(t *testing.T) {
	ctx := context.Background()
	f := &genFake{Fake: knftables.NewFake(knftables.InetFamily, Table), gen: 1}
	s := New(f, Options{Node: "n1", Generation: f})
	prog := compileYAML(t, counterPods)
	if res, err := s.Sync(ctx, prog); err != nil || !res.Full || res.Check != nil {
		t.Fatalf("first sync: %+v, %v", res, err)
	}
	fresh := f.Dump()
	checked := func(step string, wantFull bool, reason string) {
		t.Helper()
		s.InvalidateIfChanged()
		// The same Program: without the check it would be reused.
		res, err := s.Sync(ctx, prog)
		if err != nil || res.Reused || res.Check == nil || res.Full != wantFull {
			t.Fatalf("%s: %+v (check %+v), %v; want full replace %v", step, res, res.Check, err, wantFull)
		}
		if !wantFull && res.Operations != 0 {
			t.Errorf("%s: %d operations, want none", step, res.Operations)
		}
		if got := res.Check.Reason(); !strings.Contains(got, reason) || (reason == "") != (got == "") {
			t.Errorf("%s: reason %q, want %q", step, got, reason)
		}
		if f.Dump() != fresh {
			t.Errorf("%s: table differs from a fresh sync's", step)
		}
	}
	checked("quiet", false, "")
	f.gen++ // someone else commits
	checked("after another commit", true, "moved from 2 to 3")
	checked("quiet after the replace", false, "")

	// Another commit while the Syncer's patch ran: what the Syncer's
	// left cannot be told from the other's.
	more := compileYAML(t, counterPods+`---
apiVersion: v1
kind: Pod
metadata: {name: b2, namespace: x, labels: {app: b}}
spec: {nodeName: n1}
status: {podIP: 10.0.1.4}
`)
	f.others = 1
	if res, err := s.Sync(ctx, more); err != nil || res.Full || res.Operations == 0 {
		t.Fatalf("patch: %+v, %v", res, err)
	}
	checked("after a commit beside the Syncer's", true, "generation the last commit left is unknown (now 6)")
	checked("quiet after the replace", false, "")

	// Another commit, then a patch of the Syncer's: the patch succeeds
	// on a table that may have been edited.
	f.gen++
	if res, err := s.Sync(ctx, more); err != nil || res.Full || res.Operations == 0 {
		t.Fatalf("patch: %+v, %v", res, err)
	}
	checked("after another commit and a patch", true, "generation the last commit left is unknown (now 9)")
	checked("quiet after the replace", false, "")

	f.err = errors.New("netlink broke")
	checked("unreadable generation", true, "netlink broke")
	f.err = nil
	checked("readable again", true, "unknown") // the replace's readings failed too
	checked("quiet after the replace", false, "")

	// A forced resync wins over a checked one asked for before it.
	s.InvalidateIfChanged()
	s.Invalidate()
	if res, err := s.Sync(ctx, prog); err != nil || !res.Full || res.Check != nil {
		t.Errorf("Invalidate after InvalidateIfChanged: %+v, %v; want an unchecked full replace", res, err)
	}
	// A failed patch falls back to a replace, whose generation the
	// Syncer records.
	s.InvalidateIfChanged()
	f.runErr = errors.New("injected")
	if res, err := s.Sync(ctx, more); err != nil || !res.Full || !res.Check.Unchanged() {
		t.Fatalf("failed patch: %+v, %v; want a checked patch that fails into a replace", res, err)
	}
	if s.left != f.gen {
		t.Errorf("after the replace the Syncer recorded generation %d, want %d", s.left, f.gen)
	}
	// A failed replace leaves it unknown.
	s.Invalidate()
	f.runErr = errors.New("injected")
	if _, err := s.Sync(ctx, prog); err == nil {
		t.Fatal("replace did not fail")
	}
	checked("after a failed replace", true, "unknown")
}

// TestInvalidateIfChangedWithoutGeneration: a Syncer on an Interface
// without a generation (knftables' fake) replaces on every checked resync,
// as it did on every resync before generations.
func TestInvalidateIfChangedWithoutGeneration(t *testing.T) {
	ctx := context.Background()
	s := New(knftables.NewFake(knftables.InetFamily, Table), Options{Node: "n1"})
	prog := compileYAML(t, counterPods)
	for i := range 3 {
		if i > 0 {
			s.InvalidateIfChanged()
		}
		res, err := s.Sync(ctx, prog)
		if err != nil || !res.Full {
			t.Fatalf("sync %d: %+v, %v; want a full replace", i, res, err)
		}
		if i > 0 && res.Check.Reason() != "the dataplane has no nftables generation to check" {
			t.Errorf("sync %d: reason %q", i, res.Check.Reason())
		}
	}
}
