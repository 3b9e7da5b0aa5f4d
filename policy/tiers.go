package policy

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/RoaringBitmap/roaring/v2"
	"k8s.io/apimachinery/pkg/labels"
)

// A tier is compiled per class of pods its selectors cannot tell apart,
// not per pod. For the Admin and Baseline tiers a pod's class is the
// projection of its namespace's labels and of its own labels onto the keys
// that some subject selector of the tier reads, plus what its named ports
// resolve to for the names the tier's ingress rules use; for the
// NetworkPolicy tier it is, per namespace, the projection of its labels
// onto the keys that namespace's pod selectors read, plus its named ports
// for the names there. Every class has the ordered list of policies that
// select it; classes with the same list share the compiled rules.

// cnpTier is the Admin or the Baseline tier.
type cnpTier struct {
	tier Tier
	idx  int
	cnps map[uint32]*cnpState
	// Keys the subjects read and port names the ingress rules use,
	// counted per policy.
	nsKeys, podKeys, names counts
	nsKeyList, podKeyList  []string
	podKeysID              int32
	namesID                int32
	keysVer                int
	// Subjects grouped by selector, for matching many at once: the
	// policies (by id) whose namespace (pod) selector is the key.
	nsGroups, podGroups map[string]*subjGroup
	// nsMemo and podMemo: the policies whose namespace (pod) selector
	// selects a projection.
	nsMemo, podMemo map[int32]*roaring.Bitmap
	classes         map[cnpClassKey]*cnpClass
	lists           map[string]*cnpList
	// stale: keys or names changed, so every subject pod's class is
	// recomputed; relist: policies changed, so every class's list is.
	stale, relist bool
}

type subjGroup struct {
	sel labels.Selector
	ids *roaring.Bitmap
}

type cnpClassKey struct{ ns, pod, sig int32 }

// cnpClass is one class of pods of an Admin or Baseline tier.
type cnpClass struct {
	key     cnpClassKey
	tier    *cnpTier
	list    *cnpList
	members int
	combos  map[*combo]struct{}
}

// cnpList is an ordered list of ClusterNetworkPolicies of one tier that
// select some class, with its compiled rules per direction (ingress per
// named-port signature), built when first needed.
type cnpList struct {
	key     string
	tier    *cnpTier
	cnps    []*cnpState
	classes map[*cnpClass]struct{}
	egress  *cnpDir
	ingress map[int32]*cnpDir
}

// cnpDir is the compiled rules of a list in one direction, with the
// evaluator's index built on first use. DirPolicies share it.
type cnpDir struct {
	rules []RuleMatch
	once  sync.Once
	index *matchIndex
}

func (d *cnpDir) idx() *matchIndex {
	d.once.Do(func() {
		ms := make([]Match, len(d.rules))
		for i, r := range d.rules {
			ms[i] = r.Match
		}
		d.index = buildIndex(ms)
	})
	return d.index
}

func newCNPTier(t Tier) *cnpTier {
	idx := 0
	if t == TierBaseline {
		idx = 1
	}
	return &cnpTier{
		tier: t, idx: idx, cnps: map[uint32]*cnpState{},
		nsGroups: map[string]*subjGroup{}, podGroups: map[string]*subjGroup{},
		nsMemo: map[int32]*roaring.Bitmap{}, podMemo: map[int32]*roaring.Bitmap{},
		classes: map[cnpClassKey]*cnpClass{}, lists: map[string]*cnpList{},
		stale: true,
	}
}

func (s *state) tierOf(c *cnpState) *cnpTier {
	if c.tier == TierBaseline {
		return s.baseline
	}
	return s.admin
}

// add puts a policy into its tier.
func (t *cnpTier) add(c *cnpState) {
	t.count(c, 1)
	t.cnps[c.id] = c
	if !c.subjNone {
		group(t.nsGroups, c.nsKey, c.nsSel).ids.Add(c.id)
		group(t.podGroups, c.podKey, c.podSel).ids.Add(c.id)
	}
	clear(t.nsMemo)
	clear(t.podMemo)
	t.relist = true
}

func (t *cnpTier) remove(c *cnpState) {
	t.count(c, -1)
	delete(t.cnps, c.id)
	if !c.subjNone {
		ungroup(t.nsGroups, c.nsKey, c.id)
		ungroup(t.podGroups, c.podKey, c.id)
	}
	clear(t.nsMemo)
	clear(t.podMemo)
	t.relist = true
}

func (t *cnpTier) count(c *cnpState, d int) {
	for _, k := range c.nsKeys {
		t.stale = t.nsKeys.add(k, d) || t.stale
	}
	for _, k := range c.podKeys {
		t.stale = t.podKeys.add(k, d) || t.stale
	}
	for _, n := range c.names {
		t.stale = t.names.add(n, d) || t.stale
	}
}

func group(m map[string]*subjGroup, key string, sel labels.Selector) *subjGroup {
	g := m[key]
	if g == nil {
		g = &subjGroup{sel: sel, ids: roaring.New()}
		m[key] = g
	}
	return g
}

func ungroup(m map[string]*subjGroup, key string, id uint32) {
	if g := m[key]; g != nil {
		g.ids.Remove(id)
		if g.ids.IsEmpty() {
			delete(m, key)
		}
	}
}

// refresh recomputes the derived key lists after keys changed.
func (t *cnpTier) refresh(s *state) {
	t.nsKeyList, t.podKeyList = t.nsKeys.keys(), t.podKeys.keys()
	t.podKeysID = s.internKeys(t.podKeyList)
	t.namesID = s.internNames(t.names)
	t.keysVer++
}

// side is the policies whose selectors of one side (grouped) select a
// projection.
func (s *state) side(groups map[string]*subjGroup, memo map[int32]*roaring.Bitmap, proj int32) *roaring.Bitmap {
	if bm, ok := memo[proj]; ok {
		return bm
	}
	l := labels.Set(s.projs[proj])
	var bms []*roaring.Bitmap
	for _, g := range groups {
		if g.sel.Matches(l) {
			bms = append(bms, g.ids)
		}
	}
	bm := roaring.FastOr(bms...)
	memo[proj] = bm
	return bm
}

// nsProj is a namespace's projection for the tier.
func (s *state) nsProj(t *cnpTier, ns *nsState) int32 {
	if ns.projVer[t.idx] != t.keysVer {
		ns.proj[t.idx] = s.proj(ns.labels, t.nsKeyList)
		ns.projVer[t.idx] = t.keysVer
	}
	return ns.proj[t.idx]
}

// classOf finds (or makes) a pod's class in the tier.
func (s *state) cnpClassOf(t *cnpTier, ps *podState) *cnpClass {
	k := cnpClassKey{s.nsProj(t, ps.ns), s.projOf(ps, t.podKeysID), s.sigFor(ps.fullSig, t.namesID)}
	if c := t.classes[k]; c != nil {
		return c
	}
	c := &cnpClass{key: k, tier: t}
	c.list = s.cnpListFor(t, k)
	addTo(&c.list.classes, c)
	t.classes[k] = c
	return c
}

// cnpListFor is the ordered list of the tier's policies selecting a class.
func (s *state) cnpListFor(t *cnpTier, k cnpClassKey) *cnpList {
	ids := roaring.And(s.side(t.nsGroups, t.nsMemo, k.ns), s.side(t.podGroups, t.podMemo, k.pod))
	cnps := make([]*cnpState, 0, ids.GetCardinality())
	it := ids.Iterator()
	for it.HasNext() {
		cnps = append(cnps, t.cnps[it.Next()])
	}
	slices.SortFunc(cnps, func(a, b *cnpState) int {
		if a.priority != b.priority {
			return cmp.Compare(a.priority, b.priority)
		}
		if c := strings.Compare(a.ref.Name, b.ref.Name); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	var key strings.Builder
	for _, c := range cnps {
		key.WriteString(strconv.FormatUint(uint64(c.id), 36))
		key.WriteByte(',')
	}
	if l := t.lists[key.String()]; l != nil {
		return l
	}
	l := &cnpList{key: key.String(), tier: t, cnps: cnps}
	for _, c := range cnps {
		addTo(&c.lists, l)
	}
	t.lists[l.key] = l
	return l
}

// drop forgets a list's compiled rules after one of its policies changed;
// the pods of its classes get new DirPolicies.
func (l *cnpList) drop(s *state, dir Direction) {
	if dir != Ingress {
		l.egress = nil
	}
	if dir != Egress {
		l.ingress = nil
	}
	for c := range l.classes {
		s.combosDirty(c.combos)
	}
}

// release forgets a list no class uses.
func (l *cnpList) release() {
	if len(l.classes) > 0 {
		return
	}
	delete(l.tier.lists, l.key)
	for _, c := range l.cnps {
		delete(c.lists, l)
	}
}

// dir compiles the list's rules in one direction; ingress rules with
// named ports resolve on the signature sig.
func (s *state) cnpDirOf(l *cnpList, dir Direction, sig int32) *cnpDir {
	if dir == Egress {
		if l.egress == nil {
			l.egress = s.buildCNPDir(l, Egress, 0)
		}
		return l.egress
	}
	if d := l.ingress[sig]; d != nil {
		return d
	}
	d := s.buildCNPDir(l, Ingress, sig)
	if l.ingress == nil {
		l.ingress = map[int32]*cnpDir{}
	}
	l.ingress[sig] = d
	return d
}

func (s *state) buildCNPDir(l *cnpList, dir Direction, sig int32) *cnpDir {
	n := 0
	for _, c := range l.cnps {
		n += len(s.cnpRulesOf(c)[dir])
	}
	d := &cnpDir{rules: make([]RuleMatch, 0, n)}
	for _, c := range l.cnps {
		for _, r := range s.cnpRulesOf(c)[dir] {
			d.rules = append(d.rules, RuleMatch{Rule: r.cnp, Match: s.ruleMatch(r, sig)})
		}
	}
	return d
}

// relistCNP recomputes every class's list after the tier's policies
// changed.
func (s *state) relistCNP(t *cnpTier) {
	t.relist = false
	for k, c := range t.classes {
		l := s.cnpListFor(t, k)
		if l == c.list {
			continue
		}
		delete(c.list.classes, c)
		c.list.release()
		c.list = l
		addTo(&l.classes, c)
		s.combosDirty(c.combos)
	}
}
