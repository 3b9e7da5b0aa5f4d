package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

const tiersYAML = "../../nft/testdata/tiers.yaml"

// agentTable is the transaction an agent's Syncer runs on its first
// sync of node: the agent compiles with policy.NewCompiler, with its
// default feature gates.
func agentTable(t *testing.T, file, node string, opts policy.Options) string {
	t.Helper()
	gates, err := features.New()
	if err != nil {
		t.Fatal(err)
	}
	opts = gateOptions(gates, opts)
	res, err := (&manifest.Loader{}).Load(file)
	if err != nil {
		t.Fatal(err)
	}
	table := knftables.NewFake(knftables.InetFamily, nft.Table)
	prog := policy.NewCompiler(&res.Cluster, opts).Program()
	if _, err := nft.New(table, nft.Options{Node: node}).Sync(context.Background(), prog); err != nil {
		t.Fatal(err)
	}
	return table.LastTransaction.String()
}

func TestNftPrintsTheAgentsTable(t *testing.T) {
	for _, node := range []string{"node-1", "node-2"} {
		out, errOut, code := run(t, "", "nft", "--node", node, "-f", tiersYAML)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", node, code, errOut)
		}
		body, ok := strings.CutPrefix(out, "# table inet moat as moat-agent programs it on node "+node+" (its first sync: the whole table replaced)\n")
		if !ok || !strings.HasPrefix(body, "add table inet moat {") || !strings.Contains(body, "\ndelete table inet moat\n") {
			t.Fatalf("%s: output does not start with the header and the replace preamble:\n%s", node, out)
		}
		if want := agentTable(t, tiersYAML, node, policy.Options{}); body != want {
			t.Errorf("%s: moat nft differs from the agent's table:\n%s\nagent:\n%s", node, body, want)
		}
		if !strings.Contains(errOut, "node "+node+": ") || !strings.Contains(errOut, " rules, ") {
			t.Errorf("%s: stderr lacks the counts: %s", node, errOut)
		}
	}
	// node-1's web pod reaches 10.0.2.10 (client) on its ingress rules;
	// node-2 polices client, whose egress nothing restricts but the
	// Admin tier.
	out, _, _ := run(t, "", "nft", "--node", "node-1", "-f", tiersYAML)
	for _, want := range []string{"add element inet moat ingress4 { 10.0.1.10 : jump in-", "{ 10.0.2.10 . ipv4 }", "udp dport 53 return", "add rule inet moat dispatch ip saddr vmap @egress4"} {
		if !strings.Contains(out, want) {
			t.Errorf("node-1 ruleset lacks %q", want)
		}
	}
}

func TestNftFlags(t *testing.T) {
	// The compiler options of the shared input flags reach the ruleset.
	out, _, _ := run(t, "", "nft", "--node", "node-1", "-f", tiersYAML)
	if !strings.Contains(out, "nodelocal4 { 192.168.0.1 }") {
		t.Errorf("default ruleset does not allow node-local traffic:\n%s", out)
	}
	out, _, code := run(t, "", "nft", "--node", "node-1", "--allow-node-local=false", "-f", tiersYAML)
	if code != 0 || strings.Contains(out, "nodelocal4 { 192.168.0.1 }") {
		t.Errorf("--allow-node-local=false: exit %d, node address still allowed", code)
	}
	if body := out[strings.Index(out, "\n")+1:]; body != agentTable(t, tiersYAML, "node-1", policy.Options{DenyNodeLocal: true}) {
		t.Error("--allow-node-local=false differs from the agent's table with node-local traffic policed")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nft", "-f", tiersYAML}, "--node is required"},
		{[]string{"nft", "--node", "node-9", "-f", tiersYAML}, `node "node-9": no Node object and no pod scheduled on it (known: node-1, node-2)`},
	} {
		out, errOut, code := run(t, "", tc.args...)
		if code != 1 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// TestNftOutputLoads: nft accepts what moat nft prints, for every node of
// every example and of the dataplane's test cluster: "nft -c -f" checks it
// and "nft -f" loads it (twice: the output replaces the table it made),
// inside a network namespace of the test's own.
func TestNftOutputLoads(t *testing.T) {
	testenv.RequirePrivileged(t)
	ns := fmt.Sprintf("moat-nftcli-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	inputs := []string{tiersYAML}
	dirs, err := filepath.Glob("../../examples/*/cluster.yaml")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, c := range dirs {
		inputs = append(inputs, filepath.Dir(c))
	}
	checked := 0
	for _, in := range inputs {
		res, err := (&manifest.Loader{}).Load(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, node := range nodesOf(policy.Compile(&res.Cluster, policy.Options{})) {
			out, errOut, code := run(t, "", "nft", "--node", node, "-f", in)
			if code != 0 {
				t.Errorf("%s %s: exit %d: %s", in, node, code, errOut)
				continue
			}
			file := filepath.Join(t.TempDir(), "ruleset.nft")
			if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"-c", "-f", file}, {"-f", file}, {"-f", file}} {
				cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...)
				if msg, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("%s %s: nft %s: %v\n%s", in, node, strings.Join(args, " "), err, msg)
				}
			}
			listed, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "chain", "inet", nft.Table, "dispatch").CombinedOutput()
			if err != nil || strings.Count(string(listed), "vmap @egress4") != 1 {
				t.Errorf("%s %s: after loading twice, dispatch is not the one chain it should be (%v):\n%s", in, node, err, listed)
			}
			checked++
		}
	}
	if checked < 10 {
		t.Errorf("only %d rulesets checked", checked)
	}
}

// nodesOf lists the nodes a Program mentions: Node objects and pods'
// nodeName.
func nodesOf(prog *policy.Program) []string {
	seen := map[string]bool{}
	for _, n := range prog.Nodes {
		seen[n.Name] = true
	}
	for _, p := range prog.Pods {
		if p.NodeName != "" {
			seen[p.NodeName] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// benchSizes are the clusters the moat nft benchmarks program node-000 of:
// clustergen.Scale and the large cluster.
var benchSizes = []struct {
	name string
	cfg  clustergen.Config
}{
	{"pods=10k", clustergen.Scale},
	{"pods=100k", clustergen.Config{Nodes: 1000, Namespaces: 10000, Pods: 100000, NetworkPolicies: 70000, ClusterPolicies: 5000, Seed: 1}},
}

// BenchmarkNftNode is moat nft's own part: building node-000's ruleset
// and printing the agent's full-replace transaction. The cluster is
// compiled as moat nft does before the clock starts;
// decoding and compiling are measured by their packages.
func BenchmarkNftNode(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			prog := policy.Compile(clustergen.Generate(size.cfg).ToCluster(), policy.Options{})
			cmd := newNftCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetContext(context.Background())
			for b.Loop() {
				if err := printNodeRuleset(cmd, prog, "node-000"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNftCommand runs the moat binary, as a user would, on a
// kubectl-style JSON dump of each cluster: decode, compile, build and
// print node-000's ruleset. It reports the process's peak resident
// memory. The dumps are written once to the temporary directory.
func BenchmarkNftCommand(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "moat")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			c := size.cfg
			path := filepath.Join(os.TempDir(), fmt.Sprintf("moat-nft-bench-%d-%d-%d-%d-%d-%d.json", c.Nodes, c.Namespaces, c.Pods, c.NetworkPolicies, c.ClusterPolicies, c.Seed))
			if _, err := os.Stat(path); err != nil {
				writeDump(b, c, path)
			}
			var rss int64
			for b.Loop() {
				cmd := exec.Command(bin, "nft", "--node", "node-000", "-f", path)
				var stderr strings.Builder
				cmd.Stderr = &stderr
				if err := cmd.Run(); err != nil {
					b.Fatalf("moat nft: %v\n%s", err, stderr.String())
				}
				if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
					rss = max(rss, ru.Maxrss)
				}
			}
			b.ReportMetric(float64(rss)/1024, "peak-rss-MiB")
		})
	}
}

func writeDump(b *testing.B, c clustergen.Config, path string) {
	b.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		b.Fatal(err)
	}
	if err := clustergen.Generate(c).WriteJSON(tmp, clustergen.Kubectl); err != nil {
		b.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		b.Fatal(err)
	}
}
