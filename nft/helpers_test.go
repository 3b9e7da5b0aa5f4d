package nft

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// compileFile loads manifests from testdata and compiles them.
func compileFile(t testing.TB, name string, opts policy.Options) *policy.Program {
	t.Helper()
	res, err := (&manifest.Loader{}).Load(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return policy.Compile(&res.Cluster, opts)
}

// compileYAML compiles manifests given as a string.
func compileYAML(t testing.TB, yaml string) *policy.Program {
	t.Helper()
	return compileYAMLOpts(t, yaml, policy.Options{})
}

func compileYAMLOpts(t testing.TB, yaml string, opts policy.Options) *policy.Program {
	t.Helper()
	res, err := (&manifest.Loader{Stdin: strings.NewReader(yaml)}).Load("-")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return policy.Compile(&res.Cluster, opts)
}

// endpointNode says which node's rules a packet from or to e crosses. A
// bare address in a node's pod CIDRs lies behind that node: the pod
// network routes it there (a pod the agent does not know yet).
func endpointNode(prog *policy.Program, e policy.Endpoint) string {
	if e.Pod >= 0 {
		return prog.Pods[e.Pod].NodeName
	}
	if n, ok := prog.NodeByIP(e.Addr); ok {
		return prog.Nodes[n].Name
	}
	for _, n := range prog.Nodes {
		for _, c := range n.PodCIDRs {
			if c.Contains(e.Addr.Unmap()) {
				return n.Name
			}
		}
	}
	return ""
}

// checkAgainstEvaluator compares, for every ordered pair of endpoints
// (pods plus extra addresses), every address-family pairing and every
// port, the evaluator's verdict with what the rulesets of the crossed
// nodes do.
func checkAgainstEvaluator(t *testing.T, prog *policy.Program, extra []netip.Addr, ports []Packet) int {
	t.Helper()
	rulesets := map[string]*Ruleset{}
	for _, n := range prog.Nodes {
		rulesets[n.Name] = Build(prog, n.Name)
	}
	return checkRulesets(t, prog, rulesets, extra, ports)
}

// checkRulesets is checkAgainstEvaluator with each node's rules given
// (built from a node-scoped Program, as moat-agent builds them). An extra
// address that is no pod's and no node's comes from outside the cluster
// and crosses only the destination's node, unless it is inside some
// node's pod CIDRs: then it lies behind that node, which drops its
// connections (as forged, and as an unknown destination), as the
// evaluator models too.
func checkRulesets(t *testing.T, prog *policy.Program, rulesets map[string]*Ruleset, extra []netip.Addr, ports []Packet) int {
	t.Helper()
	type ep struct {
		e     policy.Endpoint
		addrs []netip.Addr
		label string
	}
	var eps []ep
	for i, p := range prog.Pods {
		if len(p.IPs) > 0 {
			eps = append(eps, ep{policy.Endpoint{Pod: i}, p.IPs, p.Key()})
		}
	}
	for _, a := range extra {
		e := policy.Endpoint{Pod: -1, Addr: a}
		if i, ok := prog.PodByIP(a); ok {
			e.Pod = i
		}
		eps = append(eps, ep{e, []netip.Addr{a}, a.String()})
	}
	n := 0
	for _, s := range eps {
		for _, d := range eps {
			for _, sa := range s.addrs {
				for _, da := range d.addrs {
					if sa.Is4() != da.Is4() {
						continue
					}
					src, dst := s.e, d.e
					src.Addr, dst.Addr = sa, da
					sn, dn := endpointNode(prog, src), endpointNode(prog, dst)
					// A pod-network pod's packet to its own address on its
					// node is its Service hairpin (its own connection to
					// the address stays in its namespace): the node's
					// rules judge it as HairpinAllowed does.
					hairpin := src.Pod >= 0 && src.Pod == dst.Pod && sa == da && !prog.Pods[src.Pod].HostNetwork
					if !hairpin && (src.Pod >= 0 && src.Pod == dst.Pod || src.Pod < 0 && sa == da) {
						sn, dn = "", ""
					}
					for _, pp := range ports {
						f := policy.Flow{Src: src, Dst: dst, Proto: pp.Proto, Port: pp.Port}
						v := prog.Evaluate(f)
						if hairpin {
							v = prog.EvaluateHairpin(f)
						}
						var crossed []*Ruleset
						if sn != "" {
							crossed = append(crossed, rulesets[sn])
						}
						if dn != "" && dn != sn {
							crossed = append(crossed, rulesets[dn])
						}
						got := PathAllows(Packet{Src: sa, Dst: da, Proto: pp.Proto, Port: pp.Port}, crossed...)
						n++
						if got != v.Allowed {
							t.Errorf("%s (%s) -> %s (%s) %s/%d: rules say %v, the evaluator %v (egress: %s; ingress: %s)",
								s.label, sa, d.label, da, pp.Proto, pp.Port, got, v.Allowed, v.Egress.Reason, v.Ingress.Reason)
						}
					}
				}
			}
		}
	}
	return n
}

func readGolden(t *testing.T, path, got string) {
	t.Helper()
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the rendered ruleset (UPDATE_GOLDEN=1 rewrites it); got:\n%s", path, got)
	}
}
