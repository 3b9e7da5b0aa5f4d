package nft

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// hookGen reads the generation and, once armed, runs after's edit right
// after the reading (between the Syncer's reading before a commit and
// the commit).
type hookGen struct {
	after func()
}

func (h *hookGen) ReadGeneration(ctx context.Context) (uint32, error) {
	g, err := NetlinkGeneration{}.ReadGeneration(ctx)
	if f := h.after; f != nil {
		h.after = nil
		f()
	}
	return g, err
}

// TestKernelPatchAfterAnotherWriterMadeItsChanges: another writer commits between the
// Syncer's reading before a patch and the patch; its transaction already
// holds the patch's additions (so the patch changes nothing in the kernel
// and would raise no generation) and also accepts everything in Moat's
// chains. Without markCommit the Syncer took the other writer's
// generation for its own, and the next checked resync kept the intruder's
// rules.
func TestKernelPatchAfterAnotherWriterMadeItsChanges(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		iface, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		h := &hookGen{}
		s := New(iface, Options{Node: "n1", Generation: h})
		if _, err := s.Sync(ctx, compileYAML(t, counterPods)); err != nil {
			t.Fatal(err)
		}
		prog2 := compileYAML(t, counterPodsMore)
		tx := knftables.NewFake(knftables.InetFamily, Table).NewTransaction()
		diffTransaction(tx, s.Applied(), Build(prog2, "n1"))
		text := tx.String()
		if strings.Contains(text, "delete") {
			t.Fatalf("patch deletes:\n%s", text)
		}
		for name := range s.Applied().chains {
			text += "insert rule inet " + Table + " " + name + " accept comment \"intruder\"\n"
		}
		t.Logf("intruder:\n%s", text)
		h.after = func() {
			cmd := exec.Command("nft", "-f", "-")
			cmd.Stdin = strings.NewReader(text)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("intruder: %v: %s", err, out)
			}
		}
		res, err := s.Sync(ctx, prog2)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("patch: %+v left=%d", res, s.left)
		s.InvalidateIfChanged()
		res, err = s.Sync(ctx, prog2)
		if err != nil {
			t.Fatal(err)
		}
		if listed := nftList(t); strings.Contains(listed, "intruder") {
			t.Errorf("checked resync (full=%v, check %+v) kept the intruder's accept rules:\n%s", res.Full, res.Check, listed)
		}
	})
}
