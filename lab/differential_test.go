package lab

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

var (
	rounds    = flag.Int("rounds", 5, "random clusters the differential test measures (raise for a local soak)")
	firstSeed = flag.Int64("seed", 0, "first seed of the differential test (0: derived from the time)")
)

func compileBytes(t testing.TB, y []byte, opts policy.Options) *policy.Program {
	t.Helper()
	res, err := (&manifest.Loader{Stdin: bytes.NewReader(y)}).Load("-")
	if err != nil {
		t.Fatalf("load generated manifests: %v\n%s", err, y)
	}
	return policy.Compile(&res.Cluster, opts)
}

// TestDifferentialRandom builds random clusters with random policies,
// measures every flow with real packets and compares each with the
// evaluator. A disagreement is shrunk to the fewest objects that still
// show it and printed as manifests plus the flow.
func TestDifferentialRandom(t *testing.T) {
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("differential lab test: slow")
	}
	seed := *firstSeed
	if seed == 0 {
		seed = time.Now().UnixNano() % 1_000_000
	}
	cfg := randcluster.Default()
	cfg.SCTP = true
	for r := 0; r < *rounds; r++ {
		s := seed + int64(r)
		// Every other cluster has pod CIDRs and a peer inside node-0's
		// that no pod owns: node-0 drops its connections as forged, and
		// the evaluator must say so.
		cfg.PodCIDRs = s%2 == 1
		sc := randcluster.Generate(s, cfg)
		opts := policy.Options{DenyNodeLocal: s%3 == 0, IngressNetworksAndNodes: s%4 != 0}
		bad, err := measureScenario(t, sc, opts, nil)
		if err != nil {
			t.Fatalf("seed %d: %v", s, err)
		}
		if len(bad) == 0 {
			continue
		}
		f := bad[0]
		t.Errorf("seed %d: %d flows disagree, first: %s", s, len(bad), describe(f))
		min := shrink(t, sc, opts, f)
		y, _ := min.Manifests()
		t.Fatalf("minimal reproduction (DenyNodeLocal=%v) for %s -> %s %d/%s:\n%s\nrun: moat lab run -f repro.yaml --port %d/%s %s",
			opts.DenyNodeLocal, f.From, f.To, f.Port, f.Protocol, y, f.Port, f.Protocol, peerFlags(min))
	}
	t.Logf("seeds %d..%d agree", seed, seed+int64(*rounds)-1)
}

func peerFlags(sc *randcluster.Scenario) string {
	var out []string
	for _, p := range sc.Peers {
		out = append(out, "--peer "+p.String())
	}
	return strings.Join(out, " ")
}

func describe(f Flow) string {
	return fmt.Sprintf("%s -> %s %d/%s (%s -> %s): kernel %v (%s%s), evaluator %v (egress: %s; ingress: %s)",
		f.From, f.To, f.Port, f.Protocol, f.SrcIP, f.DstIP, f.Allowed, f.Outcome, f.Reason, f.Predicted, f.Egress.Reason, f.Ingress.Reason)
}

// measureScenario runs one lab; only is an optional single flow to keep
// (from, to, port, protocol) so shrinking stays quick.
func measureScenario(t *testing.T, sc *randcluster.Scenario, opts policy.Options, only *Flow) ([]Flow, error) {
	t.Helper()
	y, err := sc.Manifests()
	if err != nil {
		return nil, err
	}
	prog := compileBytes(t, y, opts)
	prefix, err := newName()
	if err != nil {
		return nil, err
	}
	defer leftovers(t, prefix)
	rep, err := Run(context.Background(), prog, Options{Name: prefix, Peers: sc.Peers}, ProbeOptions{Parallel: 64, Timeout: 500 * time.Millisecond})
	if err != nil {
		return nil, fmt.Errorf("%w\nmanifests:\n%s", err, y)
	}
	var bad []Flow
	for _, f := range rep.Disagreements() {
		if only == nil || (f.From == only.From && f.To == only.To && f.Port == only.Port && f.Protocol == only.Protocol) {
			bad = append(bad, f)
		}
	}
	return bad, nil
}

// shrink removes objects one at a time while the flow still disagrees.
func shrink(t *testing.T, sc *randcluster.Scenario, opts policy.Options, f Flow) *randcluster.Scenario {
	t.Helper()
	cur := sc
	for changed := true; changed; {
		changed = false
		for i := len(cur.Docs) - 1; i >= 0; i-- {
			d := cur.Docs[i]
			if d.Kind == "Node" || d.Kind == "Namespace" || d.Name == f.From || d.Name == f.To {
				continue
			}
			cand := cur.Without(i)
			bad, err := measureScenario(t, cand, opts, &f)
			if err == nil && len(bad) > 0 {
				cur, changed = cand, true
			}
		}
	}
	return cur
}
