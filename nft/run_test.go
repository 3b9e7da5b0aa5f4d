package nft

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/policy"
)

func TestJoinElements(t *testing.T) {
	elems := func(set string, from, n int) string {
		var b strings.Builder
		for i := from; i < from+n; i++ {
			fmt.Fprintf(&b, "add element inet moat %s { 10.0.%d.%d }\n", set, i/256, i%256)
		}
		return b.String()
	}
	list := func(set string, from, n int) string {
		var keys []string
		for i := from; i < from+n; i++ {
			keys = append(keys, fmt.Sprintf("10.0.%d.%d", i/256, i%256))
		}
		return "add element inet moat " + set + " { " + strings.Join(keys, ", ") + " }\n"
	}
	for _, tc := range []struct{ name, in, want string }{
		{"nothing", "", ""},
		{"no elements", "add table inet moat\nadd chain inet moat c\n", "add table inet moat\nadd chain inet moat c\n"},
		{"one", "add element inet moat s { 10.0.0.1 }\n", "add element inet moat s { 10.0.0.1 }\n"},
		{"a run", elems("s", 0, 3), list("s", 0, 3)},
		{"two sets", elems("s", 0, 2) + elems("t", 2, 2), list("s", 0, 2) + list("t", 2, 2)},
		{"order kept around other commands",
			"add set inet moat s { type ipv4_addr; }\n" + elems("s", 0, 2) + "add rule inet moat c drop\n" + elems("s", 2, 1),
			"add set inet moat s { type ipv4_addr; }\n" + list("s", 0, 2) + "add rule inet moat c drop\n" + list("s", 2, 1)},
		{"a set again after another", elems("s", 0, 1) + elems("t", 1, 1) + elems("s", 2, 1), list("s", 0, 1) + list("t", 1, 1) + list("s", 2, 1)},
		{"adds and deletes apart",
			"delete element inet moat s { 10.0.0.1 }\ndelete element inet moat s { 10.0.0.2 }\nadd element inet moat s { 10.0.0.3 }\n",
			"delete element inet moat s { 10.0.0.1, 10.0.0.2 }\nadd element inet moat s { 10.0.0.3 }\n"},
		{"map elements and concatenations",
			"add element inet moat m { 10.0.0.1 : jump a }\nadd element inet moat m { 10.0.0.2 : jump b }\nadd element inet moat p { tcp . 80-90 }\nadd element inet moat p { udp . 53 }\n",
			"add element inet moat m { 10.0.0.1 : jump a, 10.0.0.2 : jump b }\nadd element inet moat p { tcp . 80-90, udp . 53 }\n"},
		{"comments stay alone",
			"add element inet moat s { 10.0.0.1 }\nadd element inet moat s { 10.0.0.2 comment \"a, b }\" }\nadd element inet moat s { 10.0.0.3 }\n",
			"add element inet moat s { 10.0.0.1 }\nadd element inet moat s { 10.0.0.2 comment \"a, b }\" }\nadd element inet moat s { 10.0.0.3 }\n"},
		{"at most maxJoined in one command", elems("s", 0, maxJoined+1), list("s", 0, maxJoined) + list("s", maxJoined, 1)},
		{"a last line without newline", "add element inet moat s { 10.0.0.1 }\nadd element inet moat s { 10.0.0.2 }", "add element inet moat s { 10.0.0.1, 10.0.0.2 }\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got bytes.Buffer
			joinElements(&got, tc.in)
			if got.String() != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got.String(), tc.want)
			}
		})
	}
}

// canonicalTable lists table inet moat as sorted JSON objects without
// handles, each set's elements sorted: equal for equal tables whatever
// order their elements were added in.
func canonicalTable(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("nft", "-j", "list", "table", "inet", Table).Output()
	if err != nil {
		t.Fatalf("nft -j list: %v", err)
	}
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("nft -j list: %v", err)
	}
	var objs []string
	for _, o := range doc.Nftables {
		for kind, v := range o {
			delete(v, "handle")
			if elems, ok := v["elem"].([]any); ok {
				var keys []string
				for _, e := range elems {
					b, _ := json.Marshal(e)
					keys = append(keys, string(b))
				}
				slices.Sort(keys)
				v["elem"] = keys
			}
			b, _ := json.Marshal(map[string]any{kind: v})
			objs = append(objs, string(b))
		}
	}
	slices.Sort(objs)
	return objs
}

// TestKernelJoinedElements: a full replace and a patch with thousands of
// element additions and deletions leave the same table whether nft gets
// knftables' text as it is (one command per element) or through
// kernelNFT (runs of elements joined).
func TestKernelJoinedElements(t *testing.T) {
	g := clustergen.Generate(clustergen.Config{Nodes: 10, Namespaces: 100, Pods: 2000, NetworkPolicies: 600, ClusterPolicies: 40, Seed: 1, Workloads: true})
	cluster := g.ToCluster()
	node := cluster.Pods[0].NodeName
	opts := policy.Options{IngressNetworksAndNodes: true, Node: node}
	comp := policy.NewCompiler(cluster, opts)
	rs1 := Build(comp.Program(), node)
	rng := rand.New(rand.NewPCG(1, 2))
	var prog *policy.Program
	for range 600 {
		p := cluster.Pods[rng.IntN(len(cluster.Pods))]
		ls := maps.Clone(p.Labels)
		ls["app"] = fmt.Sprintf("app-%02d", rng.IntN(5))
		prog, _ = comp.RelabelPod(p.Key(), ls)
	}
	rs2 := Build(prog, node)
	full, patch := knftables.NewFake(knftables.InetFamily, Table).NewTransaction(), knftables.NewFake(knftables.InetFamily, Table).NewTransaction()
	fullTransaction(full, rs1, nil)
	diffTransaction(patch, rs1, rs2)
	if n := strings.Count(patch.String(), "delete element"); n < 100 {
		t.Fatalf("the patch deletes %d elements; the test wants many", n)
	}
	var plain [2][]string
	for _, joined := range []bool{false, true} {
		inPrivateNetns(t, func() {
			ctx := context.Background()
			raw, err := knftables.New(knftables.InetFamily, Table)
			if err != nil {
				t.Fatal(err)
			}
			var iface knftables.Interface = raw
			if joined {
				iface = kernelNFT{raw, "nft"}
			}
			for i, tx := range []*knftables.Transaction{full, patch} {
				if err := iface.Run(ctx, tx); err != nil {
					t.Fatalf("joined=%v, transaction %d: %v", joined, i, err)
				}
				got := canonicalTable(t)
				if !joined {
					plain[i] = got
				} else if !slices.Equal(got, plain[i]) {
					t.Errorf("transaction %d: the table differs when elements are joined", i)
				}
			}
		})
	}
}

// TestKernelRunStopsAtInvalidObject: an object knftables rejects makes
// kernelNFT's Run fail without sending the commands before it.
func TestKernelRunStopsAtInvalidObject(t *testing.T) {
	inPrivateNetns(t, func() {
		ctx := context.Background()
		nft, err := NewInterface()
		if err != nil {
			t.Fatal(err)
		}
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Rule{Chain: "missing-rule-text"})
		if err := nft.Run(ctx, tx); err == nil {
			t.Fatal("Run of a transaction with an invalid rule succeeded")
		}
		if out, err := exec.Command("nft", "list", "table", "inet", Table).CombinedOutput(); err == nil {
			t.Errorf("the commands before the invalid object ran:\n%s", out)
		}
	})
}
