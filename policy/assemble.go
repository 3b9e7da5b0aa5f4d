package policy

import (
	"sort"
	"strconv"
	"strings"
)

// assemble builds every policed pod's PodPolicy. Pods selected by the same
// policies (and, where ingress rules use named ports, declaring the same
// named ports) share one DirPolicy, so memory grows with the number of
// distinct policy combinations, not with the number of pods.
func (k *compiler) assemble() {
	p := k.prog
	p.Policies = make([]*PodPolicy, len(p.Pods))

	cnpOrder := make([]int, len(k.cnps))
	for i := range cnpOrder {
		cnpOrder[i] = i
	}
	sort.SliceStable(cnpOrder, func(a, b int) bool {
		x, y := k.cnps[cnpOrder[a]], k.cnps[cnpOrder[b]]
		if x.priority != y.priority {
			return x.priority < y.priority
		}
		return x.ref.Name < y.ref.Name
	})
	npOrder := make([]int, len(k.nps))
	for i := range npOrder {
		npOrder[i] = i
	}
	sort.SliceStable(npOrder, func(a, b int) bool {
		x, y := k.nps[npOrder[a]].ref, k.nps[npOrder[b]].ref
		if x.Namespace != y.Namespace {
			return x.Namespace < y.Namespace
		}
		return x.Name < y.Name
	})

	admin := make([][]int, len(p.Pods))
	baseline := make([][]int, len(p.Pods))
	nps := make([][]int, len(p.Pods))
	for _, ci := range cnpOrder {
		c := k.cnps[ci]
		for _, pod := range c.selected {
			if c.tier == TierAdmin {
				admin[pod] = append(admin[pod], ci)
			} else {
				baseline[pod] = append(baseline[pod], ci)
			}
		}
	}
	for _, ni := range npOrder {
		for _, pod := range k.nps[ni].selected {
			nps[pod] = append(nps[pod], ni)
		}
	}

	cache := map[string]*DirPolicy{}
	memo := map[*Rule]Match{}
	var key strings.Builder
	for _, pod := range k.policed {
		pp := &PodPolicy{}
		for _, dir := range []Direction{Ingress, Egress} {
			key.Reset()
			key.WriteString(dir.String())
			named := false
			writeIdx := func(tag string, idx []int, filter func(int) bool) {
				key.WriteString(tag)
				for _, i := range idx {
					if filter != nil && !filter(i) {
						continue
					}
					key.WriteString(strconv.Itoa(i))
					key.WriteByte(',')
				}
			}
			writeIdx("|a:", admin[pod], nil)
			writeIdx("|n:", nps[pod], func(i int) bool { return k.nps[i].types[dir] })
			writeIdx("|b:", baseline[pod], nil)
			if dir == Ingress {
				named = k.usesNamed(admin[pod], nps[pod], baseline[pod])
				if named {
					key.WriteString("|p:")
					key.WriteString(namedSignature(&p.Pods[pod]))
				}
			}
			dp, hit := cache[key.String()]
			if !hit {
				dp = k.dirPolicy(pod, dir, admin[pod], nps[pod], baseline[pod], memo)
				cache[key.String()] = dp
			}
			if dir == Ingress {
				pp.Ingress = dp
			} else {
				pp.Egress = dp
			}
		}
		p.Policies[pod] = pp
	}
}

func (k *compiler) usesNamed(admin, nps, baseline []int) bool {
	for _, list := range [][]int{admin, baseline} {
		for _, ci := range list {
			for _, r := range k.cnps[ci].rules[Ingress] {
				if r.ports.hasNamed() {
					return true
				}
			}
		}
	}
	for _, ni := range nps {
		for _, r := range k.nps[ni].rules[Ingress] {
			if r.ports.hasNamed() {
				return true
			}
		}
	}
	return false
}

func (k *compiler) dirPolicy(pod int, dir Direction, admin, nps, baseline []int, memo map[*Rule]Match) *DirPolicy {
	dp := &DirPolicy{}
	cnpRules := func(list []int) []RuleMatch {
		var out []RuleMatch
		for _, ci := range list {
			for i := range k.cnps[ci].rules[dir] {
				r := &k.cnps[ci].rules[dir][i]
				m, ok := memo[r.rule]
				if !ok || (dir == Ingress && r.ports.hasNamed()) {
					m = k.match(r.peers, &r.ports, dir, pod)
					if !(dir == Ingress && r.ports.hasNamed()) {
						memo[r.rule] = m
					}
				}
				out = append(out, RuleMatch{Rule: r.rule, Match: m})
			}
		}
		return out
	}
	dp.Admin = cnpRules(admin)
	dp.Baseline = cnpRules(baseline)
	for _, ni := range nps {
		np := k.nps[ni]
		if !np.types[dir] {
			continue
		}
		if dp.NP == nil {
			dp.NP = &NPTier{}
		}
		dp.NP.Policies = append(dp.NP.Policies, np.ref)
		for _, r := range np.rules[dir] {
			if r.none {
				continue
			}
			m := k.match(r.peers, &r.ports, dir, pod)
			if len(m) > 0 {
				dp.NP.Rules = append(dp.NP.Rules, NPRule{Policy: np.ref, Index: r.index, Match: m})
			}
		}
	}
	return dp
}

// finishStatus gathers per-policy status in a stable order.
func (k *compiler) finishStatus() {
	for _, n := range k.nps {
		k.prog.Status = append(k.prog.Status, n.status)
	}
	for _, c := range k.cnps {
		k.prog.Status = append(k.prog.Status, c.status)
	}
	sort.SliceStable(k.prog.Status, func(i, j int) bool {
		return k.prog.Status[i].Policy.String() < k.prog.Status[j].Policy.String()
	})
}
