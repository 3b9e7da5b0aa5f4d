package policy_test

import (
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/policy"
)

// TestCompilerNeverChangesItsInput: a Compiler keeps the pods and
// NetworkPolicies it is given (the agent's caches share theirs with it),
// so it must never write to them, not even where it cleans what it was
// given (IPv4-mapped and repeated addresses).
func TestCompilerNeverChangesItsInput(t *testing.T) {
	c := clustergen.Generate(clustergen.Config{Nodes: 3, Namespaces: 6, Pods: 60, NetworkPolicies: 42, ClusterPolicies: 6, Seed: 5, Workloads: true}).ToCluster()
	first := c.Pods[0]
	v4 := first.IPs[0]
	first.IPs = []netip.Addr{netip.AddrFrom16(v4.As16()), v4} // mapped, then the same again
	type podCopy struct {
		p      *policy.Pod
		before policy.Pod
	}
	var pods []podCopy
	deep := func(p *policy.Pod) policy.Pod {
		cp := *p
		cp.Labels, cp.IPs, cp.Ports = maps.Clone(p.Labels), slices.Clone(p.IPs), slices.Clone(p.Ports)
		return cp
	}
	keep := func(p *policy.Pod) *policy.Pod {
		pods = append(pods, podCopy{p, deep(p)})
		return p
	}
	for _, p := range c.Pods {
		keep(p)
	}
	type npCopy struct {
		np     *policy.NetworkPolicy
		before policy.NetworkPolicy
	}
	var nps []npCopy
	for _, np := range c.NetworkPolicies {
		cp := *np
		cp.Spec = *np.Spec.DeepCopy()
		nps = append(nps, npCopy{np, cp})
	}

	for _, opts := range []policy.Options{{}, {Node: first.NodeName}} {
		comp := policy.NewCompiler(c, opts)
		prog := comp.Program()
		if _, ok := prog.PodByIP(v4); !ok && opts.Node == "" {
			t.Errorf("%+v: the pod with a mapped address is not found by its address", opts)
		}
		moved := deep(c.Pods[1])
		moved.IPs = []netip.Addr{netip.MustParseAddr("::ffff:10.250.0.1"), netip.MustParseAddr("::ffff:10.250.0.1")}
		comp.UpsertPod(keep(&moved))
		if _, ok := comp.RelabelPod(c.Pods[2].Key(), map[string]string{"app": "other"}); !ok {
			t.Fatal("RelabelPod: pod unknown")
		}
		comp.DeletePod(c.Pods[3].Key())
		np := *c.NetworkPolicies[0]
		np.Name = "another"
		comp.UpsertNetworkPolicy(&np)
		comp.DeleteNetworkPolicy(c.NetworkPolicies[1].Namespace, c.NetworkPolicies[1].Name)
		comp.Program()
	}
	for _, p := range pods {
		if !reflect.DeepEqual(*p.p, p.before) {
			t.Errorf("pod %s changed:\n%+v\nwas\n%+v", p.before.Key(), *p.p, p.before)
		}
	}
	for _, np := range nps {
		if !reflect.DeepEqual(*np.np, np.before) {
			t.Errorf("NetworkPolicy %s/%s changed", np.before.Namespace, np.before.Name)
		}
	}
}
