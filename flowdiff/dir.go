package flowdiff

import (
	"maps"
	"slices"

	"github.com/moat-net/moat/policy"
)

// dirDiff is how one direction's compiled policy of a pod differs between
// the states: not at all, only in the addresses some rules match (addrs,
// the symmetric difference: only remotes there can be judged differently),
// or otherwise (all: any remote can).
type dirDiff struct {
	all   bool
	addrs []policy.AddrRange
}

// dirComparer compares DirPolicies, once per pair: pods selected by the
// same policies share one DirPolicy in a Program.
type dirComparer struct {
	memo map[[2]*policy.DirPolicy]dirDiff
}

func (c *dirComparer) compare(b, a *policy.DirPolicy) dirDiff {
	key := [2]*policy.DirPolicy{b, a}
	if d, ok := c.memo[key]; ok {
		return d
	}
	d := compareDir(b, a)
	c.memo[key] = d
	return d
}

// compareDir walks both policies in evaluation order. With the same rules
// in the same order and the same ports, a remote address outside every
// changed address set meets the same first matching rule in both, so its
// verdict and explanation cannot change.
func compareDir(b, a *policy.DirPolicy) dirDiff {
	if b == nil || a == nil {
		return dirDiff{all: b != a}
	}
	var diff []policy.AddrRange
	same := compareRules(b.Admin, a.Admin, &diff) && compareRules(b.Baseline, a.Baseline, &diff)
	switch {
	case !same:
	case b.NP == nil || a.NP == nil:
		same = b.NP == a.NP
	case !slices.Equal(b.NP.Policies, a.NP.Policies) || len(b.NP.Rules) != len(a.NP.Rules):
		same = false
	default:
		for i := range b.NP.Rules {
			rb, ra := &b.NP.Rules[i], &a.NP.Rules[i]
			if rb.Policy != ra.Policy || rb.Index != ra.Index || !compareMatch(rb.Match, ra.Match, &diff) {
				same = false
				break
			}
		}
	}
	if !same {
		return dirDiff{all: true}
	}
	return dirDiff{addrs: policy.NewAddrSet(diff...).Ranges()}
}

func compareRules(b, a []policy.RuleMatch, diff *[]policy.AddrRange) bool {
	if len(b) != len(a) {
		return false
	}
	for i := range b {
		if *b[i].Rule != *a[i].Rule || !compareMatch(b[i].Match, a[i].Match, diff) {
			return false
		}
	}
	return true
}

// compareMatch reports whether two matches have the same terms and ports,
// adding to diff the addresses where a term's address sets differ.
func compareMatch(b, a policy.Match, diff *[]policy.AddrRange) bool {
	if len(b) != len(a) {
		return false
	}
	for i := range b {
		if !samePorts(b[i].Ports, a[i].Ports) {
			return false
		}
		rb, ra := b[i].Addrs.Ranges(), a[i].Addrs.Ranges()
		if !slices.Equal(rb, ra) {
			*diff = append(*diff, subtract(rb, ra)...)
			*diff = append(*diff, subtract(ra, rb)...)
		}
	}
	return true
}

func samePorts(b, a *policy.PortSet) bool {
	if b == nil || a == nil {
		return b.Empty() && a.Empty()
	}
	if b.All || a.All {
		return b.All == a.All
	}
	return maps.EqualFunc(nonEmpty(b.ByProto), nonEmpty(a.ByProto), slices.Equal)
}

func nonEmpty(m map[policy.Protocol][]policy.PortRange) map[policy.Protocol][]policy.PortRange {
	out := make(map[policy.Protocol][]policy.PortRange, len(m))
	for p, rs := range m {
		if len(rs) > 0 {
			out[p] = rs
		}
	}
	return out
}

// subtract returns the addresses of a not in b; both are sorted, disjoint
// ranges (IPv4 before IPv6), so one pass over each suffices.
func subtract(a, b []policy.AddrRange) []policy.AddrRange {
	var out []policy.AddrRange
	j := 0
	for _, r := range a {
		cur := r
		for j < len(b) && b[j].To.Less(cur.From) {
			j++
		}
		alive := true
		for k := j; k < len(b) && !cur.To.Less(b[k].From); k++ {
			h := b[k]
			if cur.From.Less(h.From) {
				out = append(out, policy.AddrRange{From: cur.From, To: h.From.Prev()})
			}
			if !h.To.Less(cur.To) {
				alive = false
				break
			}
			cur.From = h.To.Next()
		}
		if alive {
			out = append(out, cur)
		}
	}
	return out
}
