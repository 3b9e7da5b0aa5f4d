package nft

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// TestVerifyNoticesDeletedTable: after someone deletes the table, Sync
// with unchanged inputs keeps the ruleset without asking the kernel, so
// only Verify can tell; once Invalidate and Sync have programmed the table
// again, Verify is content.
func TestVerifyNoticesDeletedTable(t *testing.T) {
	ctx := context.Background()
	fake := &genFake{Fake: knftables.NewFake(knftables.InetFamily, Table), gen: 1}
	s := New(fake, Options{Node: "node-1", Generation: fake})
	if err := s.Verify(ctx); err != nil {
		t.Fatalf("Verify before any sync: %v", err)
	}
	prog := compileFile(t, "tiers.yaml", policy.Options{IngressNetworksAndNodes: true})
	if _, err := s.Sync(ctx, prog); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(ctx); err != nil {
		t.Fatalf("Verify after the sync: %v", err)
	}
	// Deleted behind the Syncer's back, without the generation moving
	// (which the kernel never does): Verify trusts the generation.
	tx := fake.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := fake.Fake.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(ctx); err != nil {
		t.Fatalf("Verify with the generation its commit left: %v (want nil without reading the counters)", err)
	}
	fake.gen++
	res, err := s.Sync(ctx, prog)
	if err != nil || !res.Reused {
		t.Fatalf("Sync of the same program after the deletion: %+v, %v (want Reused: the kernel is not asked)", res, err)
	}
	err = s.Verify(ctx)
	if !errors.Is(err, ErrTableMissing) {
		t.Fatalf("Verify after the table was deleted: %v, want ErrTableMissing", err)
	}
	t.Logf("Verify: %v", err)
	s.Invalidate()
	if res, err := s.Sync(ctx, prog); err != nil || !res.Full {
		t.Fatalf("Sync after Invalidate: %+v, %v (want a full replace)", res, err)
	}
	if err := s.Verify(ctx); err != nil {
		t.Fatalf("Verify after re-programming: %v", err)
	}
}

// TestKernelVerifyNoticesFlushedRuleset: the same with real nftables in a
// private network namespace, and the usual culprit, `nft flush ruleset`.
// Another writer's commit alone is no loss.
func TestKernelVerifyNoticesFlushedRuleset(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		nft, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		s := New(nft, Options{Node: "node-1"})
		prog := compileFile(t, "tiers.yaml", policy.Options{IngressNetworksAndNodes: true})
		if _, err := s.Sync(ctx, prog); err != nil {
			t.Fatal(err)
		}
		if err := s.Verify(ctx); err != nil {
			t.Fatalf("Verify right after the sync: %v", err)
		}
		nftCmd := func(args ...string) {
			t.Helper()
			if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
				t.Fatalf("nft %v: %v: %s", args, err, out)
			}
		}
		nftCmd("add", "table", "ip", "someone-else")
		if err := s.Verify(ctx); err != nil {
			t.Fatalf("Verify after another writer's commit: %v", err)
		}
		for _, loss := range [][]string{{"flush", "ruleset"}, {"delete", "table", "inet", Table}} {
			nftCmd(loss...)
			if res, err := s.Sync(ctx, prog); err != nil || !res.Reused {
				t.Fatalf("Sync after nft %v: %+v, %v (want Reused)", loss, res, err)
			}
			err := s.Verify(ctx)
			if !errors.Is(err, ErrTableMissing) {
				t.Fatalf("Verify after nft %v: %v, want ErrTableMissing", loss, err)
			}
			s.Invalidate()
			if res, err := s.Sync(ctx, prog); err != nil || !res.Full {
				t.Fatalf("Sync after Invalidate: %+v, %v (want a full replace)", res, err)
			}
			if listed := nftList(t); !strings.Contains(listed, "ip saddr vmap @egress4") {
				t.Fatalf("table not programmed again after nft %v:\n%s", loss, listed)
			}
			if err := s.Verify(ctx); err != nil {
				t.Fatalf("Verify after re-programming: %v", err)
			}
		}
	})
}
