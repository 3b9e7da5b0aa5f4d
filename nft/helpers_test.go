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

// endpointNode says which node's rules a packet from or to e crosses.
func endpointNode(prog *policy.Program, e policy.Endpoint) string {
	if e.Pod >= 0 {
		return prog.Pods[e.Pod].NodeName
	}
	if n, ok := prog.NodeByIP(e.Addr); ok {
		return prog.Nodes[n].Name
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
// (built from a node-scoped Program, as moat-agent builds them). A new
// connection from inside a crossed node's pod CIDRs that is no pod's is
// expected dropped whatever the evaluator says: the anti-spoofing rules of
// docs/agent.md, which judge the packet's source rather than policy.
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
					if src.Pod >= 0 && src.Pod == dst.Pod {
						sn, dn = "", ""
					}
					forged := src.Pod < 0 && (inPodCIDRs(prog, sn, sa) || inPodCIDRs(prog, dn, sa))
					for _, pp := range ports {
						v := prog.Evaluate(policy.Flow{Src: src, Dst: dst, Proto: pp.Proto, Port: pp.Port})
						var crossed []*Ruleset
						if sn != "" {
							crossed = append(crossed, rulesets[sn])
						}
						if dn != "" && dn != sn {
							crossed = append(crossed, rulesets[dn])
						}
						got := PathAllows(Packet{Src: sa, Dst: da, Proto: pp.Proto, Port: pp.Port}, crossed...)
						n++
						if want := v.Allowed && !forged; got != want {
							t.Errorf("%s (%s) -> %s (%s) %s/%d: rules say %v, want %v (evaluator %v, forged source %v; egress: %s; ingress: %s)",
								s.label, sa, d.label, da, pp.Proto, pp.Port, got, want, v.Allowed, forged, v.Egress.Reason, v.Ingress.Reason)
						}
					}
				}
			}
		}
	}
	return n
}

// inPodCIDRs reports whether a is inside node's pod CIDRs ("" for no node).
func inPodCIDRs(prog *policy.Program, node string, a netip.Addr) bool {
	if node == "" {
		return false
	}
	for _, c := range prog.PodCIDRs(node) {
		if c.Contains(a) {
			return true
		}
	}
	return false
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
