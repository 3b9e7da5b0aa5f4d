package nft

import (
	"context"
	"errors"
	"net/netip"
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
		ctx, s, prog := syncTiers(t)
		if err := s.Verify(ctx); err != nil {
			t.Fatalf("Verify right after the sync: %v", err)
		}
		verifyAfterOtherWriter(ctx, t, s)
		for _, loss := range [][]string{{"flush", "ruleset"}, {"delete", "table", "inet", Table}} {
			runNft(t, loss...)
			if res, err := s.Sync(ctx, prog); err != nil || !res.Reused {
				t.Fatalf("Sync after nft %v: %+v, %v (want Reused)", loss, res, err)
			}
			err := s.Verify(ctx)
			if !errors.Is(err, ErrTableMissing) {
				t.Fatalf("Verify after nft %v: %v, want ErrTableMissing", loss, err)
			}
			replaceAfterInvalidate(ctx, t, s, prog)
			if listed := nftList(t); !strings.Contains(listed, "ip saddr vmap @egress4") {
				t.Fatalf("table not programmed again after nft %v:\n%s", loss, listed)
			}
			if err := s.Verify(ctx); err != nil {
				t.Fatalf("Verify after re-programming: %v", err)
			}
		}
	})
}

// TestKernelVerifyNoticesEdits: edits of the table that keep its drop
// counters (a chain flushed or deleted, an accept inserted,
// the table flushed or made dormant) leave the node unpoliced; Verify
// reports each as ErrTableEdited, and a replace repairs it. Each edit is
// another writer's commit, as an operator's nft command is.
func TestKernelVerifyNoticesEdits(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx, s, prog := syncTiers(t)
		var policyChain string
		for name, c := range s.Applied().chains {
			if len(c.Rules) > 0 {
				policyChain = name
				break
			}
		}
		if policyChain == "" {
			t.Fatal("the ruleset has no policy chain with rules")
		}
		// Another writer's commit that leaves the table alone is no edit.
		verifyAfterOtherWriter(ctx, t, s)
		for _, edit := range [][]string{
			{"flush", "chain", "inet", Table, "forward"},
			{"delete", "chain", "inet", Table, "forward"},
			{"insert", "rule", "inet", Table, "forward", "accept"},
			{"add", "rule", "inet", Table, "input", "accept"},
			{"flush", "chain", "inet", Table, dispatchChain},
			// Policy chains: TestKernelVerifyNoticesPolicyChainEdits.
			{"flush", "table", "inet", Table},
			{"add", "table", "inet", Table, "{ flags dormant ; }"},
			{"add", "chain", "inet", Table, "extra", "{ type filter hook prerouting priority -300 ; }"},
		} {
			runNft(t, edit...)
			err := s.Verify(ctx)
			if !errors.Is(err, ErrTableEdited) {
				t.Fatalf("Verify after nft %s: %v, want ErrTableEdited", strings.Join(edit, " "), err)
			}
			t.Logf("nft %s: %v", strings.Join(edit, " "), err)
			replaceAfterInvalidate(ctx, t, s, prog)
			if err := s.Verify(ctx); err != nil {
				t.Fatalf("Verify after the replace that followed nft %s: %v", strings.Join(edit, " "), err)
			}
			runNft(t, "add", "table", "ip", "someone-else") // no change: the generation stays
			runNft(t, "delete", "table", "ip", "someone-else")
			if err := s.Verify(ctx); err != nil {
				t.Fatalf("Verify of the repaired table after another writer's commits: %v", err)
			}
		}
	})
}

// TestKernelVerifyNoticesPolicyChainEdits: edits inside the policy chains
// and of the verdict maps that send each pod to its chains keep the fixed
// chains as programmed, yet leave a pod unpoliced (its egress element
// deleted, its chain flushed) or judged by other rules (an accept
// inserted, its element pointing at another chain). The kernel counts each
// chain's use (its rules and the rules and map elements that jump or go
// to it) and reports it with the chains Verify reads already: Verify
// reports each such edit as ErrTableEdited, as it does for the fixed
// chains, and a replace repairs it.
func TestKernelVerifyNoticesPolicyChainEdits(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx, s, prog := syncTiers(t)
		rs := s.Applied()
		var policyChain string
		for _, name := range sortedKeys(rs.chains) {
			if len(rs.chains[name].Rules) > 0 {
				policyChain = name
				break
			}
		}
		var pod netip.Addr
		var podChain string
		for _, a := range sortedAddrs(rs.egress) {
			if a.Is4() && rs.egress[a] != conflictChain {
				pod, podChain = a, rs.egress[a]
				break
			}
		}
		var otherChain string
		for _, name := range sortedKeys(rs.chains) {
			if name != podChain {
				otherChain = name
				break
			}
		}
		if policyChain == "" || !pod.IsValid() || otherChain == "" {
			t.Fatalf("the ruleset lacks a policy chain with rules (%q), an IPv4 pod in egress4 (%v) or a second chain (%q)", policyChain, pod, otherChain)
		}
		// Another writer's commit makes Verify read the table: the use
		// counts of the chains as programmed are no edit.
		verifyAfterOtherWriter(ctx, t, s)
		for _, edit := range []string{
			"insert rule inet " + Table + " " + policyChain + " accept",
			"add rule inet " + Table + " " + policyChain + " accept",
			"flush chain inet " + Table + " " + policyChain,
			"delete element inet " + Table + " egress4 { " + pod.String() + " }",
			// One commit: the pod keeps an element, pointing elsewhere.
			"delete element inet " + Table + " egress4 { " + pod.String() + " }; add element inet " + Table + " egress4 { " + pod.String() + " : jump " + otherChain + " }",
		} {
			runNft(t, edit)
			err := s.Verify(ctx)
			if !errors.Is(err, ErrTableEdited) {
				t.Fatalf("Verify after nft %s: %v, want ErrTableEdited", edit, err)
			}
			t.Logf("nft %s: %v", edit, err)
			replaceAfterInvalidate(ctx, t, s, prog)
			runNft(t, "add", "table", "ip", "someone-else") // no change: the generation stays
			runNft(t, "delete", "table", "ip", "someone-else")
			if err := s.Verify(ctx); err != nil {
				t.Fatalf("Verify of the table repaired after nft %s, after another writer's commits: %v", edit, err)
			}
		}
	})
}

// TestKernelRestore: Restore puts back, as a full replace, the ruleset
// last applied after `nft flush ruleset` (moat-agent's repair while its
// Node is missing and there is nothing new to compile), and Verify is
// content after it. A Syncer that programmed nothing has nothing to
// restore.
func TestKernelRestore(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		nft, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		s := New(nft, Options{Node: "node-1"})
		if _, err := s.Restore(ctx); !errors.Is(err, ErrNothingToRestore) {
			t.Fatalf("Restore before any sync: %v, want ErrNothingToRestore", err)
		}
		prog := compileFile(t, "tiers.yaml", policy.Options{IngressNetworksAndNodes: true})
		if _, err := s.Sync(ctx, prog); err != nil {
			t.Fatal(err)
		}
		want := nftList(t)
		if out, err := exec.Command("nft", "flush", "ruleset").CombinedOutput(); err != nil {
			t.Fatalf("nft flush ruleset: %v: %s", err, out)
		}
		if err := s.Verify(ctx); !errors.Is(err, ErrTableMissing) {
			t.Fatalf("Verify after nft flush ruleset: %v, want ErrTableMissing", err)
		}
		res, err := s.Restore(ctx)
		if err != nil || !res.Applied || !res.Full {
			t.Fatalf("Restore: %+v, %v (want a full replace applied)", res, err)
		}
		if got := nftList(t); got != want {
			t.Fatalf("table after Restore differs from the one programmed:\n%s\nwant:\n%s", got, want)
		}
		if err := s.Verify(ctx); err != nil {
			t.Fatalf("Verify after Restore: %v", err)
		}
		if res, err := s.Sync(ctx, prog); err != nil || !res.Reused {
			t.Fatalf("Sync of the same program after Restore: %+v, %v (want Reused)", res, err)
		}
	})
}

// syncTiers programs tiers.yaml for node-1 with real nftables, in the
// calling thread's network namespace (inPrivateNetns's), for the kernel
// tests of Verify.
func syncTiers(t *testing.T) (context.Context, *Syncer, *policy.Program) {
	t.Helper()
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
	return ctx, s, prog
}

// runNft runs the nft command with args, as an operator's edit would,
// and fails the test if nft refuses it.
func runNft(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// verifyAfterOtherWriter commits a table of another writer: Verify reads
// the table then (the generation moved) and must find nothing wrong.
func verifyAfterOtherWriter(ctx context.Context, t *testing.T, s *Syncer) {
	t.Helper()
	runNft(t, "add", "table", "ip", "someone-else")
	if err := s.Verify(ctx); err != nil {
		t.Fatalf("Verify after another writer's commit: %v", err)
	}
}

// replaceAfterInvalidate is the agent's repair after Verify found the
// table lost or edited: Invalidate, then a Sync that replaces the table.
func replaceAfterInvalidate(ctx context.Context, t *testing.T, s *Syncer, prog *policy.Program) {
	t.Helper()
	s.Invalidate()
	if res, err := s.Sync(ctx, prog); err != nil || !res.Full {
		t.Fatalf("Sync after Invalidate: %+v, %v (want a full replace)", res, err)
	}
}
