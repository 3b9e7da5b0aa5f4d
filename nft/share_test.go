package nft

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// crowdedYAML is a namespace of locals pods on node-1, each selected by
// the policies whose number is not its own modulo locals (one pod: all
// of them), so that each pod has a list of its own. Policy p allows port
// 1000+p from 10.p.0.0/16, less excepts /24s of it when excepts > 0.
func crowdedYAML(locals, policies, excepts int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\nstatus: {addresses: [{type: InternalIP, address: 192.168.0.1}]}\n---\n")
	b.WriteString("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n")
	for i := range locals {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata: {name: l%d, namespace: shop, labels: {skip: s%d}}\nspec: {nodeName: node-1, containers: [{name: c}]}\nstatus: {podIPs: [{ip: 172.16.1.%d}]}\n---\n", i, i, 10+i)
	}
	for p := range policies {
		skip := "none"
		if locals > 1 {
			skip = fmt.Sprintf("s%d", p%locals)
		}
		var except []string
		for e := range excepts {
			except = append(except, fmt.Sprintf("10.%d.%d.0/24", p, 2*e+1))
		}
		fmt.Fprintf(&b, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np%d, namespace: shop}\nspec:\n  podSelector: {matchExpressions: [{key: skip, operator: NotIn, values: [%s]}]}\n  ingress: [{from: [{ipBlock: {cidr: 10.%d.0.0/16, except: [%s]}}], ports: [{port: %d}]}]\n---\n",
			p, skip, p, strings.Join(except, ", "), 1000+p)
	}
	return b.String()
}

func unionSets(rs *Ruleset) int {
	n := 0
	for name := range rs.sets {
		if strings.HasPrefix(name, "s-") {
			n++
		}
	}
	return n
}

// TestShareCrowded: runs longer than maxLookups whose addresses (over
// unionFloor) are mostly in peers that other runs match too take shared
// lookups instead of union sets of their own; a run whose peers are its
// own, and a small one, keep their union sets. Either way the rules judge
// as the policies say.
func TestShareCrowded(t *testing.T) {
	const policies = 2*maxLookups + 6
	for _, tc := range []struct {
		name            string
		locals, excepts int
		union           bool
		maxElems        int
	}{
		// 6 lists of 58-59 peers of 31 ranges each: ~1,800 ranges per
		// list, every peer in five lists.
		{"lists sharing large peers", 6, 30, false, policies*31 + 100},
		// The same peers in one list: nothing to share.
		{"one list", 1, 30, true, 2 * policies * 31},
		// Lists sharing peers of one range each: under unionFloor.
		{"lists sharing small peers", 6, 0, true, 6 * policies},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := compileYAML(t, crowdedYAML(tc.locals, policies, tc.excepts))
			rs := Build(prog, "node-1")
			if got := unionSets(rs) > 0; got != tc.union {
				t.Errorf("union sets: %v, want %v", got, tc.union)
			}
			if st := rs.Stats(); st.Elements > tc.maxElems {
				t.Errorf("%d elements, want at most %d", st.Elements, tc.maxElems)
			}
			var extra []netip.Addr
			for p := range policies {
				for _, third := range []int{0, 1, 2, 2*tc.excepts - 1, 2 * tc.excepts, 255} {
					if third >= 0 {
						extra = append(extra, netip.MustParseAddr(fmt.Sprintf("10.%d.%d.7", p, third)))
					}
				}
			}
			var ports []Packet
			for _, p := range []int{80, 1000, 1001, 1000 + policies - 1, 1000 + policies} {
				ports = append(ports, Packet{Proto: 6, Port: uint16(p)})
			}
			if n := checkAgainstEvaluator(t, prog, extra, ports); n == 0 {
				t.Fatal("no flows checked")
			}
		})
	}
}

// BenchmarkCrowdedLists builds the node of crowdedYAML with 110 local
// pods, 80 NetworkPolicies and 30 excepts each: 110 lists of 79-80
// peers of 31 address ranges, every peer in most lists. It reports the
// node's rules and set elements and the build's time.
func BenchmarkCrowdedLists(b *testing.B) {
	prog := compileYAML(b, crowdedYAML(110, 80, 30))
	var rs *Ruleset
	for b.Loop() {
		rs = Build(prog, "node-1")
	}
	st := rs.Stats()
	b.ReportMetric(float64(st.Rules), "rules")
	b.ReportMetric(float64(st.Elements), "elements")
	b.ReportMetric(float64(unionSets(rs)), "union-sets")
}
