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

	k.isPoliced = make([]bool, len(p.Pods))
	for _, i := range k.policed {
		k.isPoliced[i] = true
	}
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

	k.cnpOrder, k.npOrder = cnpOrder, npOrder
	k.admin = make([][]int, len(p.Pods))
	k.baseline = make([][]int, len(p.Pods))
	k.npsOf = make([][]int, len(p.Pods))
	admin, baseline, nps := k.admin, k.baseline, k.npsOf
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

	k.dirCache = map[string]*DirPolicy{}
	k.dirKeys = map[string][]string{}
	k.memo = map[*Rule]Match{}
	for _, pod := range k.policed {
		p.Policies[pod] = k.podPolicy(pod)
	}
}

// podPolicy builds (or reuses from dirCache) one pod's PodPolicy from the
// per-pod policy lists.
func (k *compiler) podPolicy(pod int) *PodPolicy {
	pp := &PodPolicy{}
	var key strings.Builder
	for _, dir := range []Direction{Ingress, Egress} {
		key.Reset()
		key.WriteString(dir.String())
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
		writeIdx("|a:", k.admin[pod], nil)
		writeIdx("|n:", k.npsOf[pod], func(i int) bool { return k.nps[i].types[dir] })
		writeIdx("|b:", k.baseline[pod], nil)
		if dir == Ingress && k.usesNamed(k.admin[pod], k.npsOf[pod], k.baseline[pod]) {
			key.WriteString("|p:")
			key.WriteString(namedSignature(&k.prog.Pods[pod]))
		}
		dp, hit := k.dirCache[key.String()]
		if !hit {
			dp = k.dirPolicy(pod, dir, k.admin[pod], k.npsOf[pod], k.baseline[pod], k.memo)
			ks := key.String()
			k.dirCache[ks] = dp
			for _, ci := range k.admin[pod] {
				k.dirKeys[cnpTag(ci)] = append(k.dirKeys[cnpTag(ci)], ks)
			}
			for _, ci := range k.baseline[pod] {
				k.dirKeys[cnpTag(ci)] = append(k.dirKeys[cnpTag(ci)], ks)
			}
			for _, ni := range k.npsOf[pod] {
				k.dirKeys[npTag(ni)] = append(k.dirKeys[npTag(ni)], ks)
			}
		}
		if dir == Ingress {
			pp.Ingress = dp
		} else {
			pp.Egress = dp
		}
	}
	return pp
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

func cnpTag(i int) string { return "a" + strconv.Itoa(i) }
func npTag(i int) string  { return "n" + strconv.Itoa(i) }
