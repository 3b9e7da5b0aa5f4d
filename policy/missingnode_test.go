package policy_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// TestMissingNodeWarning: pods on a node the input has no Node object for
// get a warning (the node-local exemption and `nodes` peers cannot see its
// addresses), in a full compile and after incremental changes.
func TestMissingNodeWarning(t *testing.T) {
	pod := func(name, node string) *policy.Pod {
		return &policy.Pod{Namespace: "n", Name: name, NodeName: node, IPs: []netip.Addr{netip.MustParseAddr("10.0.0." + name[1:])}}
	}
	warnings := func(p *policy.Program) []string {
		var out []string
		for _, d := range p.Diagnostics {
			if strings.HasPrefix(d.Object, "Node") && strings.Contains(d.Message, "no Node object") {
				out = append(out, d.Object)
			}
		}
		return out
	}
	node := func(name string) policy.Node {
		return policy.Node{Name: name, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	}
	c := &policy.Cluster{Namespaces: []policy.Namespace{{Name: "n"}}, Pods: []*policy.Pod{pod("p1", "a"), pod("p2", "b"), pod("p3", "")}}
	if got := warnings(policy.Compile(c, policy.Options{})); len(got) != 1 || got[0] != "Node" {
		t.Fatalf("no Node objects at all: warnings %q, want one summary", got)
	}
	c.Nodes = []policy.Node{node("a")}
	comp := policy.NewCompiler(c, policy.Options{})
	if got := warnings(comp.Program()); len(got) != 1 || got[0] != "Node b" {
		t.Fatalf("node b missing: warnings %q", got)
	}
	comp.UpsertPod(pod("p4", "c"))
	if got := warnings(comp.Program()); len(got) != 2 || got[1] != "Node c" {
		t.Fatalf("after a pod on node c: warnings %q", got)
	}
	comp.DeletePod("n/p4")
	comp.UpsertNode(node("b"))
	if got := warnings(comp.Program()); len(got) != 0 {
		t.Fatalf("after node b appeared and the pod on c left: warnings %q", got)
	}
	comp.DeleteNode("a")
	if got := warnings(comp.Program()); len(got) != 1 || got[0] != "Node a" {
		t.Fatalf("after node a was deleted: warnings %q", got)
	}
}
