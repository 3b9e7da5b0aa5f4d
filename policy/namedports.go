package policy

import (
	"fmt"
	"slices"

	"github.com/RoaringBitmap/roaring/v2"
	"k8s.io/apimachinery/pkg/labels"
)

// Named ports that resolve nowhere are legal but allow nothing: the
// compiler warns about them (Program.Diagnostics, severity warning, at the
// port's field path), so that the agent can report them as Events. For
// ingress the name must be declared by one of the pods the policy selects
// (a policy that selects no pod is left alone: nothing to resolve on yet);
// for egress by some pod-network pod of the cluster. The warnings do not
// depend on Options.Node.

// namedKey is a declared port name, with its protocol (0: any protocol, as
// ClusterNetworkPolicy's destinationNamedPort asks).
type namedKey struct {
	name  string
	proto Protocol
}

// namedChange is a pod whose labels, named ports or pod-network status
// changed, as it was before.
type namedChange struct {
	ps        *podState
	oldLabels map[string]string
	wasNet    bool
}

// declare records (add) or forgets a pod-network pod's named ports.
func (s *state) declare(slot uint32, sig int32, add bool) {
	for _, cp := range s.sigs[sig].ports {
		for _, k := range []namedKey{{cp.Name, cp.Protocol}, {cp.Name, 0}} {
			bm := s.declared[k]
			if bm == nil {
				bm = roaring.New()
				s.declared[k] = bm
			}
			before := bm.IsEmpty()
			if add {
				bm.Add(slot)
			} else {
				bm.Remove(slot)
			}
			if before != bm.IsEmpty() {
				s.dirty.namesFlipped = true
			}
			if bm.IsEmpty() {
				delete(s.declared, k)
			}
		}
	}
}

// refreshNamed recomputes the named-port warnings of the policies a
// change may have touched.
func (s *state) refreshNamed() {
	d := &s.dirty
	if d.namesFlipped {
		for _, np := range s.nps {
			d.namedPolicies[np] = struct{}{}
		}
		for _, c := range s.cnps {
			d.namedPolicies[c] = struct{}{}
		}
	}
	for _, ch := range d.namedPods {
		ps := ch.ps
		for np := range ps.ns.tier.nps {
			if np.hasIngressNames() {
				d.namedPolicies[np] = struct{}{}
			}
		}
		for _, l := range []map[string]string{ch.oldLabels, ps.pod.Labels} {
			for _, t := range []*cnpTier{s.admin, s.baseline} {
				if len(t.names) == 0 {
					continue
				}
				ids := roaring.And(s.side(t.nsGroups, t.nsMemo, s.nsProj(t, ps.ns)), s.side(t.podGroups, t.podMemo, s.proj(l, t.podKeyList)))
				it := ids.Iterator()
				for it.HasNext() {
					if c := t.cnps[it.Next()]; len(c.names) > 0 {
						d.namedPolicies[c] = struct{}{}
					}
				}
			}
		}
	}
	subjects := map[[2]string]*roaring.Bitmap{}
	nsPods := map[string]*roaring.Bitmap{}
	podSels := subjectMemo{pods: map[string]*roaring.Bitmap{}, uses: map[string]int{}}
	for p := range d.namedPolicies {
		if np, ok := p.(*npState); ok {
			podSels.uses[np.subjKey]++
		}
	}
	for p := range d.namedPolicies {
		var before []Diagnostic
		switch p := p.(type) {
		case *npState:
			named := s.npNamedDiags(p, podSels)
			before = p.setNamed(named)
			d.diags = d.diags || !slices.Equal(before, named)
		case *cnpState:
			before, p.named = p.named, s.cnpNamedDiags(p, subjects, nsPods)
			d.diags = d.diags || !slices.Equal(before, p.named)
		}
	}
}

// subjectPods answers, for a policy's ingress named ports, how many pods it
// selects and whether one of them declares a name.
type subjectPods struct {
	count    int
	declares func(namedKey) bool
}

// scoped reports whether only some pods are classified (Options.Node,
// Options.Pods).
func (s *state) scoped() bool { return s.opts.Node != "" || len(s.opts.Pods) > 0 }

// fromClasses reads the subject pods off the classes of the lists holding a
// policy: every pod-network pod is classified unless the Program is scoped,
// and a class's signature resolves every name its tier's ingress rules use.
func (s *state) fromClasses(classes func(yield func(members int, sig int32))) subjectPods {
	var sel subjectPods
	var sigs []int32
	classes(func(members int, sig int32) {
		sel.count += members
		if !slices.Contains(sigs, sig) {
			sigs = append(sigs, sig)
		}
	})
	sel.declares = func(k namedKey) bool {
		for _, sig := range sigs {
			for _, p := range s.sigs[sig].ports {
				if p.Name == k.name && (k.proto == 0 || k.proto == p.Protocol) {
					return true
				}
			}
		}
		return false
	}
	return sel
}

// fromPods reads the subject pods from a bitmap of slots.
func (s *state) fromPods(pods *roaring.Bitmap) subjectPods {
	return subjectPods{count: int(pods.GetCardinality()), declares: func(k namedKey) bool {
		return s.declared[k] != nil && pods.Intersects(s.declared[k])
	}}
}

func (s *state) npSelection(np *npState, podSels subjectMemo) subjectPods {
	if s.scoped() {
		return s.fromPods(s.npSubjectPods(np, podSels))
	}
	return s.fromClasses(func(yield func(int, int32)) {
		for l := range np.lists {
			for c := range l.classes {
				yield(c.members, c.key.sig)
			}
		}
	})
}

func (s *state) npNamedDiags(np *npState, podSels subjectMemo) []Diagnostic {
	var out []Diagnostic
	var subject *subjectPods
	for _, n := range np.namedPorts {
		k := namedKey{n.name, n.proto}
		var msg string
		if n.dir == Ingress {
			if subject == nil {
				sel := s.npSelection(np, podSels)
				subject = &sel
			}
			if subject.count == 0 || subject.declares(k) {
				continue
			}
			msg = fmt.Sprintf("named port %q (%s) is declared by none of the %d pods the policy selects: the rule allows no traffic on it", n.name, n.proto, subject.count)
		} else {
			if s.declared[k] != nil {
				continue
			}
			msg = fmt.Sprintf("named port %q (%s) is declared by no pod in the cluster: the rule allows no traffic on it", n.name, n.proto)
		}
		out = append(out, Diagnostic{Severity: SeverityWarning, Object: np.ref().String(), Field: fmt.Sprintf("spec.%s[%d].ports[%d].port", n.dir, n.rule, n.index), Message: msg, Source: np.src.Source})
	}
	return out
}

func (s *state) cnpSelection(c *cnpState, subjects map[[2]string]*roaring.Bitmap, nsPods map[string]*roaring.Bitmap) subjectPods {
	if !s.scoped() {
		return s.fromClasses(func(yield func(int, int32)) {
			for l := range c.lists {
				for cl := range l.classes {
					yield(cl.members, cl.key.sig)
				}
			}
		})
	}
	k := [2]string{c.nsKey, c.podKey}
	if c.subjNone {
		k[0] = "\x00none"
	}
	pods := subjects[k]
	if pods == nil {
		pods = s.cnpSubjectPods(c, nsPods)
		subjects[k] = pods
	}
	return s.fromPods(pods)
}

func (s *state) cnpNamedDiags(c *cnpState, subjects map[[2]string]*roaring.Bitmap, nsPods map[string]*roaring.Bitmap) []Diagnostic {
	var out []Diagnostic
	var subject *subjectPods
	for _, n := range c.namedPorts {
		k := namedKey{n.name, 0}
		var msg string
		if n.dir == Ingress {
			if subject == nil {
				sel := s.cnpSelection(c, subjects, nsPods)
				subject = &sel
			}
			if subject.count == 0 || subject.declares(k) {
				continue
			}
			msg = fmt.Sprintf("named port %q is declared by none of the %d pods the policy selects: the rule allows no traffic on it", n.name, subject.count)
		} else {
			if s.declared[k] != nil {
				continue
			}
			msg = fmt.Sprintf("named port %q is declared by no pod in the cluster: the rule allows no traffic on it", n.name)
		}
		out = append(out, Diagnostic{Severity: SeverityWarning, Object: c.ref.String(), Field: fmt.Sprintf("spec.%s[%d].protocols[%d].destinationNamedPort", n.dir, n.rule, n.index), Message: msg, Source: c.src.Source})
	}
	return out
}

// smallNamespace is the most pods a namespace may hold for its pods to be
// matched one by one against a selector (npSubjectPods).
const smallNamespace = 64

// sharedSubject is how many of the policies one refresh of named-port
// warnings checks must share a pod selector for it to be evaluated once,
// cluster-wide, rather than matched against each namespace's pods
// (npSubjectPods): a full compile checks every policy, and tens of
// thousands of them share a few selectors.
const sharedSubject = 16

// subjectMemo holds, for one refresh of named-port warnings, the pods
// (anywhere) of the pod selectors already evaluated, and how many of the
// policies to check use each selector (by subjKey).
type subjectMemo struct {
	pods map[string]*roaring.Bitmap
	uses map[string]int
}

// npSubjectPods lists the pod-network pods a NetworkPolicy selects. In a
// small namespace, as most are, its pods are matched one by one, unless
// the selector is already evaluated or many policies of this refresh
// share it: the selector's pods cluster-wide, a bitmap of thousands, cost
// more to make than the few matches, and named-port warnings are redone
// for the policies of every relabelled pod's namespace.
func (s *state) npSubjectPods(np *npState, m subjectMemo) *roaring.Bitmap {
	if isEverything(np.subject) {
		return np.ns.pods
	}
	memo := m.pods
	if _, done := memo[np.subjKey]; !done && m.uses[np.subjKey] < sharedSubject && np.ns.pods.GetCardinality() <= smallNamespace {
		out := roaring.New()
		it := np.ns.pods.Iterator()
		for it.HasNext() {
			slot := it.Next()
			if np.subject.Matches(labels.Set(s.slots[slot].pod.Labels)) {
				out.Add(slot)
			}
		}
		return out
	}
	sel := memo[np.subjKey]
	if sel == nil {
		sel = s.podIndex.eval(np.subject)
		memo[np.subjKey] = sel
	}
	return roaring.And(np.ns.pods, sel)
}

// cnpSubjectPods lists the pod-network pods a ClusterNetworkPolicy selects;
// memo holds the pods of namespace selectors already resolved.
func (s *state) cnpSubjectPods(c *cnpState, memo map[string]*roaring.Bitmap) *roaring.Bitmap {
	if c.subjNone {
		return roaring.New()
	}
	nsPods := memo[c.nsKey]
	if nsPods == nil {
		if sel := s.nsSels[c.nsKey]; sel != nil {
			nsPods = s.nsSelPods(sel)
		} else {
			nss := s.nsIndex.eval(c.nsSel)
			var bms []*roaring.Bitmap
			it := nss.Iterator()
			for it.HasNext() {
				bms = append(bms, s.nsByID[it.Next()].pods)
			}
			nsPods = roaring.FastOr(bms...)
		}
		memo[c.nsKey] = nsPods
	}
	if isEverything(c.podSel) {
		return nsPods
	}
	if sel := s.podSels[c.podKey]; sel != nil {
		return roaring.And(nsPods, s.podSelPods(sel))
	}
	return roaring.And(nsPods, s.podIndex.eval(c.podSel))
}
