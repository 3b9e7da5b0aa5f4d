package nft

import (
	"context"
	"flag"
	"net/netip"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/policy"
)

var randomRounds = flag.Int("rounds", 100, "random clusters for the rules-vs-evaluator and diff tests")

func randomPorts() []Packet {
	var out []Packet
	for _, p := range []uint16{53, 80, 443, 3868, 5432, 8080, 8125, 9090, 9100, 20000} {
		out = append(out, Packet{Proto: policy.ProtoTCP, Port: p}, Packet{Proto: policy.ProtoUDP, Port: p})
	}
	return append(out, Packet{Proto: policy.ProtoSCTP, Port: 3868}, Packet{Proto: policy.ProtoICMP})
}

// TestRandomRulesAgreeWithEvaluator: for random clusters, what the
// rendered rules of the crossed nodes do equals what the evaluator says,
// for every flow. Every other cluster has pod CIDRs, some pods addresses
// from another node's CIDR, node addresses inside the CIDRs and a forged
// source, which the evaluator and the rules must both drop where the
// destination's node checks it; then the rules are built from node-scoped
// Programs too, as moat-agent builds them. The kernel side of the same
// comparison is lab's differential test.
func TestRandomRulesAgreeWithEvaluator(t *testing.T) {
	cfg := randcluster.Default()
	cfg.SCTP = true
	for seed := int64(1); seed <= int64(*randomRounds); seed++ {
		cfg.PodCIDRs = seed%2 == 1
		sc := randcluster.Generate(seed, cfg)
		y, err := sc.Manifests()
		if err != nil {
			t.Fatal(err)
		}
		for _, opts := range []policy.Options{{IngressNetworksAndNodes: true}, {DenyNodeLocal: seed%2 == 0, IngressNetworksAndNodes: seed%3 == 0}} {
			prog := compileYAMLOpts(t, string(y), opts)
			extra := append([]netip.Addr{}, sc.Peers...)
			extra = append(extra, randcluster.NodeAddr4(1), randcluster.NodeAddr6(1))
			if cfg.PodCIDRs {
				extra = append(extra, randcluster.GatewayAddr4(0))
			}
			failed := t.Failed()
			checkAgainstEvaluator(t, prog, extra, randomPorts())
			if cfg.PodCIDRs {
				scoped := map[string]*Ruleset{}
				for _, n := range prog.Nodes {
					o := opts
					o.Node = n.Name
					scoped[n.Name] = Build(compileYAMLOpts(t, string(y), o), n.Name)
				}
				checkRulesets(t, prog, scoped, extra, randomPorts())
			}
			if !failed && t.Failed() {
				t.Fatalf("seed %d (DenyNodeLocal=%v, PodCIDRs=%v) disagrees; manifests:\n%s", seed, opts.DenyNodeLocal, cfg.PodCIDRs, y)
			}
		}
	}
}

// TestRandomDiffEqualsFull: patching the table from one random cluster to
// the next gives exactly the table a full replace would.
func TestRandomDiffEqualsFull(t *testing.T) {
	cfg := randcluster.Default()
	ctx := context.Background()
	patched := knftables.NewFake(knftables.InetFamily, Table)
	s := New(patched, Options{Node: "node-0"})
	for seed := int64(1); seed <= int64(*randomRounds); seed++ {
		// Pod CIDRs come and go: the anti-spoofing rules and sets are
		// patched in and out.
		cfg.PodCIDRs = seed%3 != 0
		y, err := randcluster.Generate(seed, cfg).Manifests()
		if err != nil {
			t.Fatal(err)
		}
		prog := compileYAMLOpts(t, string(y), policy.Options{IngressNetworksAndNodes: true})
		res, err := s.Sync(ctx, prog)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if seed > 1 && res.Full {
			t.Fatalf("seed %d: sync fell back to a full replace", seed)
		}
		for _, c := range s.Applied().chains {
			if got, want := renderedRules(c), len(renderChainRules(c)); got != want {
				t.Fatalf("seed %d: chain %s counted as %d rules, renders %d", seed, c.Name, got, want)
			}
		}
		fresh := knftables.NewFake(knftables.InetFamily, Table)
		if _, err := New(fresh, Options{Node: "node-0"}).Sync(ctx, prog); err != nil {
			t.Fatal(err)
		}
		// Element order within a set is insertion order in the fake, and
		// irrelevant to nftables: compare sorted lines.
		if got, want := sortedLines(patched.Dump()), sortedLines(fresh.Dump()); got != want {
			t.Fatalf("seed %d: patched table differs from a fresh one:\npatched:\n%s\nfresh:\n%s", seed, got, want)
		}
	}
}

func sortedLines(s string) string {
	lines := strings.Split(s, "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestRandomWriteReplaceIsFirstSync: what WriteReplace prints (moat nft)
// is the transaction a new Syncer runs, byte for byte as knftables
// renders it (the agent's Interface then joins each set's element lines).
func TestRandomWriteReplaceIsFirstSync(t *testing.T) {
	cfg := randcluster.Default()
	for seed := int64(1); seed <= int64(*randomRounds)/5+1; seed++ {
		cfg.PodCIDRs = seed%2 == 1
		y, err := randcluster.Generate(seed, cfg).Manifests()
		if err != nil {
			t.Fatal(err)
		}
		prog := compileYAMLOpts(t, string(y), policy.Options{IngressNetworksAndNodes: true})
		fake := knftables.NewFake(knftables.InetFamily, Table)
		synced, err := New(fake, Options{Node: "node-0"}).Sync(context.Background(), prog)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		res, err := WriteReplace(&b, prog, "node-0")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := b.String(), fake.LastTransaction.String(); got != want {
			t.Fatalf("seed %d: WriteReplace differs from the Syncer's first transaction:\n%s\nSyncer:\n%s", seed, got, want)
		}
		if res.Stats != synced.Stats || res.Operations != synced.Operations || !res.Full {
			t.Errorf("seed %d: result %+v, Syncer's %+v", seed, res, synced)
		}
	}
}
