package policy

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/labels"
)

// npTier is the NetworkPolicy tier of one namespace.
type npTier struct {
	ns      *nsState
	nps     map[*npState]struct{}
	keys    counts
	names   counts
	keyList []string
	keysID  int32
	namesID int32
	classes map[npClassKey]*npClass
	lists   map[string]*npList
	stale   bool
	relist  bool
}

type npClassKey struct{ pod, sig int32 }

// npClass is one class of pods of a namespace's NetworkPolicy tier.
type npClass struct {
	key     npClassKey
	tier    *npTier
	list    *npList
	members int
	combos  map[*combo]struct{}
}

// npList is an ordered list of NetworkPolicies selecting a class, with
// their compiled tier per direction.
type npList struct {
	key     string
	tier    *npTier
	nps     []*npState
	classes map[*npClass]struct{}
	egress  *npDir
	ingress map[int32]*npDir
}

// npDir is the compiled NetworkPolicy tier of a list in one direction
// (tier nil when no policy of the list has the direction).
type npDir struct {
	tier  *NPTier
	once  sync.Once
	index *matchIndex
}

func (d *npDir) idx() *matchIndex {
	d.once.Do(func() {
		if d.tier == nil {
			return
		}
		ms := make([]Match, len(d.tier.Rules))
		for i, r := range d.tier.Rules {
			ms[i] = r.Match
		}
		d.index = buildIndex(ms)
	})
	return d.index
}

func newNPTier(ns *nsState) *npTier {
	return &npTier{ns: ns}
}

func (t *npTier) add(np *npState) {
	t.count(np, 1)
	addTo(&t.nps, np)
	t.relist = true
}

func (t *npTier) remove(np *npState) {
	t.count(np, -1)
	delete(t.nps, np)
	t.relist = true
}

func (t *npTier) count(np *npState, d int) {
	for _, k := range selectorKeys(np.subject) {
		t.stale = t.keys.add(k, d) || t.stale
	}
	for _, n := range np.ingressNames() {
		t.stale = t.names.add(n, d) || t.stale
	}
}

func (s *state) npClassOf(t *npTier, ps *podState) *npClass {
	k := npClassKey{s.projOf(ps, t.keysID), s.sigFor(ps.fullSig, t.namesID)}
	if c := t.classes[k]; c != nil {
		return c
	}
	if t.classes == nil {
		t.classes = map[npClassKey]*npClass{}
	}
	c := &npClass{key: k, tier: t}
	c.list = s.npListFor(t, k.pod)
	addTo(&c.list.classes, c)
	t.classes[k] = c
	return c
}

func (s *state) npListFor(t *npTier, proj int32) *npList {
	l := labels.Set(s.projs[proj])
	var nps []*npState
	for np := range t.nps {
		if np.subject.Matches(l) {
			nps = append(nps, np)
		}
	}
	slices.SortFunc(nps, func(a, b *npState) int {
		if c := strings.Compare(a.ref().Name, b.ref().Name); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	var key strings.Builder
	for _, np := range nps {
		key.WriteString(strconv.Itoa(np.seq))
		key.WriteByte(',')
	}
	if l := t.lists[key.String()]; l != nil {
		return l
	}
	list := &npList{key: key.String(), tier: t, nps: nps}
	if t.lists == nil {
		t.lists = map[string]*npList{}
	}
	for _, np := range nps {
		addTo(&np.lists, list)
	}
	t.lists[list.key] = list
	return list
}

func (l *npList) drop(s *state, dir Direction) {
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

func (l *npList) release() {
	if len(l.classes) > 0 {
		return
	}
	delete(l.tier.lists, l.key)
	for _, np := range l.nps {
		delete(np.lists, l)
	}
}

func (s *state) npDirOf(l *npList, dir Direction, sig int32) *npDir {
	if dir == Egress {
		if l.egress == nil {
			l.egress = s.buildNPDir(l, Egress, 0)
		}
		return l.egress
	}
	if d := l.ingress[sig]; d != nil {
		return d
	}
	d := s.buildNPDir(l, Ingress, sig)
	if l.ingress == nil {
		l.ingress = map[int32]*npDir{}
	}
	l.ingress[sig] = d
	return d
}

func (s *state) buildNPDir(l *npList, dir Direction, sig int32) *npDir {
	// Sized first: a full compile builds hundreds of thousands of these
	// lists, and growing them copied each several times.
	policies, rules := 0, 0
	for _, np := range l.nps {
		if np.types[dir] {
			policies++
			rules += len(s.rulesOf(np)[dir])
		}
	}
	if policies == 0 {
		return &npDir{}
	}
	t := &NPTier{Policies: make([]PolicyRef, 0, policies)}
	if rules > 0 {
		t.Rules = make([]NPRule, 0, rules)
	}
	for _, np := range l.nps {
		if !np.types[dir] {
			continue
		}
		t.Policies = append(t.Policies, np.ref())
		for _, r := range s.rulesOf(np)[dir] {
			if m := s.ruleMatch(r, sig); len(m) > 0 {
				t.Rules = append(t.Rules, NPRule{Policy: np.ref(), Index: r.index, Match: m})
			}
		}
	}
	if len(t.Rules) == 0 {
		t.Rules = nil // as when nothing was appended
	}
	return &npDir{tier: t}
}

func (s *state) relistNP(t *npTier) {
	t.relist = false
	for k, c := range t.classes {
		l := s.npListFor(t, k.pod)
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
