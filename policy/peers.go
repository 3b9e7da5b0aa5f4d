package policy

import (
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/RoaringBitmap/roaring/v2"
	"k8s.io/apimachinery/pkg/labels"
)

// podSel is a pod label selector with, once a peer needed it, the
// pod-network pods (by slot) it selects anywhere in the cluster. Policies
// repeat the same selectors, so each is resolved once, and a pod's relabel
// re-checks each selector once.
type podSel struct {
	key   string
	sel   labels.Selector
	keys  []string
	pods  *roaring.Bitmap // nil until resolved; changed in place
	peers map[*peer]struct{}
}

// nsSel is a namespace label selector with the namespaces it selects and
// their pod-network pods.
type nsSel struct {
	key   string
	sel   labels.Selector
	ns    *roaring.Bitmap // namespace ids; nil until resolved
	pods  *roaring.Bitmap // their pods by slot
	peers map[*peer]struct{}
}

type peerKind uint8

const (
	peerPods  peerKind = iota // pods by namespace and pod selectors
	peerNodes                 // addresses of nodes by label
	peerAddrs                 // fixed addresses (ipBlock, networks)
)

// peer is one distinct peer of any rule: a selector peer (pods of the
// policy's own namespace or of selected namespaces, by pod selector), a
// nodes peer, or fixed addresses. Rules that name the same peer share it,
// and its address set, which the nftables backend then shares too.
type peer struct {
	key    string
	kind   peerKind
	ns     *nsState // scope: this namespace, when nsSel is nil
	nsSel  *nsSel
	podSel *podSel // nil: every pod of the scope
	node   labels.Selector
	fixed  *AddrSet
	refs   int

	resolved bool
	// pods and addrs are immutable once published: a change replaces them.
	pods  *roaring.Bitmap
	addrs *AddrSet
	// pending are addresses whose membership in addrs may have changed
	// since the last publish, settled once per batch (settlePeers).
	pending []netip.Addr
	sets    map[*peerSet]struct{}
}

// peerSet is the union of one rule's peers, shared by rules with the same
// peers.
type peerSet struct {
	key   string
	parts []*peer
	// all: every address, and every pod for named ports (an empty from/to
	// list, or peers widened by fail-closed).
	all   bool
	refs  int
	rules map[*rule]struct{}

	resolved bool
	addrs    *AddrSet
	// cidrs is the part of addrs that comes from address peers.
	cidrs *AddrSet
	pods  *roaring.Bitmap // pods of selector parts; nil if none
	split *termSplit
	// matches are the compiled matches of the rules using the set, by
	// direction, ports and named-port signature.
	matches map[matchKey]Match
}

// termSplit describes a term's addresses for the evaluator's index as the
// addresses of some pods (by slot) plus other ranges, so that pods picked by
// selectors cost one segment per run of slots instead of one per address.
// The runs are computed on first evaluation.
type termSplit struct {
	cidrs *AddrSet
	pods  *roaring.Bitmap
	once  sync.Once
	runs  []ordRange
}

// ordRange is an inclusive range of pod slots.
type ordRange struct{ from, to uint32 }

func newSplit(cidrs *AddrSet, pods *roaring.Bitmap) *termSplit {
	return &termSplit{cidrs: cidrs, pods: pods}
}

func (t *termSplit) ranges() []ordRange {
	t.once.Do(func() {
		if t.pods == nil {
			return
		}
		it := t.pods.Iterator()
		for it.HasNext() {
			o := it.Next()
			if n := len(t.runs); n > 0 && t.runs[n-1].to+1 == o {
				t.runs[n-1].to = o
				continue
			}
			t.runs = append(t.runs, ordRange{o, o})
		}
	})
	return t.runs
}

var (
	everything = labels.Everything()
	allAddrs   = AllAddrs()
	noAddrs    = NewAddrSet()
)

// internPodSel returns the shared pod selector for a key.
func (s *state) internPodSel(key string, sel labels.Selector) *podSel {
	if ps := s.podSels[key]; ps != nil {
		return ps
	}
	ps := &podSel{key: key, sel: sel, keys: selectorKeys(sel)}
	s.podSels[key] = ps
	return ps
}

func (s *state) internNSSel(key string, sel labels.Selector) *nsSel {
	if ns := s.nsSels[key]; ns != nil {
		return ns
	}
	ns := &nsSel{key: key, sel: sel}
	s.nsSels[key] = ns
	return ns
}

// selectorPeer interns a pod peer: the pods of namespace ns (nsSel nil) or
// of the namespaces nsSel selects that podSel (nil: all) selects.
func (s *state) selectorPeer(ns *nsState, nsSel *nsSel, podSel *podSel) *peer {
	// The key is looked up from a buffer on the stack: nearly every rule
	// of every policy names a peer met before.
	var buf [256]byte
	b := buf[:0]
	if nsSel == nil {
		b = append(append(b, "ns="...), ns.name...)
	} else {
		b = append(append(b, "nssel="...), nsSel.key...)
	}
	if podSel != nil {
		b = append(append(b, "|pod="...), podSel.key...)
	}
	if p := s.peers[string(b)]; p != nil {
		return p
	}
	key := string(b)
	p := &peer{key: key, kind: peerPods, nsSel: nsSel, podSel: podSel}
	if nsSel == nil {
		p.ns = ns
		ns.refs++
		addTo(&ns.peers, p)
	} else {
		addTo(&nsSel.peers, p)
	}
	if podSel != nil {
		addTo(&podSel.peers, p)
	}
	s.peers[key] = p
	return p
}

func (s *state) nodePeer(key string, sel labels.Selector) *peer {
	key = "nodes=" + key
	if p := s.peers[key]; p != nil {
		return p
	}
	p := &peer{key: key, kind: peerNodes, node: sel}
	s.peers[key] = p
	return p
}

func (s *state) addrPeer(key string, addrs *AddrSet) *peer {
	key = "addrs=" + key
	if p := s.peers[key]; p != nil {
		return p
	}
	p := &peer{key: key, kind: peerAddrs, fixed: addrs}
	s.peers[key] = p
	return p
}

// internSet returns the shared union of peers (all: every address).
func (s *state) internSet(parts []*peer, all bool) *peerSet {
	var buf [256]byte
	b := append(buf[:0], '*')
	if !all {
		slices.SortFunc(parts, func(a, b *peer) int { return strings.Compare(a.key, b.key) })
		parts = slices.CompactFunc(parts, func(a, b *peer) bool { return a == b })
		b = b[:0]
		for i, p := range parts {
			if i > 0 {
				b = append(b, '\n')
			}
			b = append(b, p.key...)
		}
	} else {
		parts = nil
	}
	if ps := s.sets[string(b)]; ps != nil { // no copy of the key to look it up
		ps.refs++
		return ps
	}
	key := string(b)
	ps := &peerSet{key: key, parts: parts, all: all, refs: 1}
	for _, p := range parts {
		p.refs++
		addTo(&p.sets, ps)
	}
	s.sets[key] = ps
	return ps
}

// releaseSet drops one rule's use of a set, forgetting what nothing uses.
func (s *state) releaseSet(ps *peerSet) {
	if ps.refs--; ps.refs > 0 {
		return
	}
	delete(s.sets, ps.key)
	for _, p := range ps.parts {
		delete(p.sets, ps)
		if p.refs--; p.refs == 0 {
			s.releasePeer(p)
		}
	}
}

func (s *state) releasePeer(p *peer) {
	delete(s.peers, p.key)
	delete(s.dirty.peers, p)
	if p.ns != nil {
		delete(p.ns.peers, p)
		p.ns.refs--
		s.dropNamespace(p.ns)
	}
	if p.nsSel != nil {
		delete(p.nsSel.peers, p)
		if len(p.nsSel.peers) == 0 {
			delete(s.nsSels, p.nsSel.key)
		}
	}
	if p.podSel != nil {
		delete(p.podSel.peers, p)
		if len(p.podSel.peers) == 0 {
			delete(s.podSels, p.podSel.key)
		}
	}
}

// podSelPods resolves a pod selector.
func (s *state) podSelPods(ps *podSel) *roaring.Bitmap {
	if ps.pods == nil {
		ps.pods = s.podIndex.eval(ps.sel)
	}
	return ps.pods
}

// nsSelPods resolves a namespace selector to its namespaces and their pods.
func (s *state) nsSelPods(ns *nsSel) *roaring.Bitmap {
	if ns.ns == nil {
		ns.ns = s.nsIndex.eval(ns.sel)
		var bms []*roaring.Bitmap
		it := ns.ns.Iterator()
		for it.HasNext() {
			bms = append(bms, s.nsByID[it.Next()].pods)
		}
		ns.pods = roaring.FastOr(bms...)
	}
	return ns.pods
}

// resolvePeer computes a peer's pods and addresses.
func (s *state) resolvePeer(p *peer) {
	if p.resolved {
		return
	}
	p.resolved = true
	switch p.kind {
	case peerAddrs:
		p.addrs = p.fixed
	case peerNodes:
		p.addrs = s.nodeAddrs(p.node)
	default:
		p.pods = s.peerPods(p)
		p.addrs, p.pending = s.podAddrs(p.pods), nil
	}
}

// peerPods computes the pods a selector peer selects, as a new bitmap.
func (s *state) peerPods(p *peer) *roaring.Bitmap {
	var scope *roaring.Bitmap
	if p.nsSel == nil {
		scope = p.ns.pods
	} else {
		scope = s.nsSelPods(p.nsSel)
	}
	if p.podSel == nil {
		return scope.Clone()
	}
	sel := s.podSelPods(p.podSel)
	if scope.GetCardinality() < 64 {
		out := roaring.New()
		it := scope.Iterator()
		for it.HasNext() {
			if x := it.Next(); sel.Contains(x) {
				out.Add(x)
			}
		}
		return out
	}
	return roaring.And(scope, sel)
}

// inScope reports whether a pod's namespace is in a selector peer's scope.
func (s *state) inScope(p *peer, ns *nsState) bool {
	if p.nsSel == nil {
		return p.ns == ns
	}
	return s.nsSelPods(p.nsSel) != nil && p.nsSel.ns.Contains(ns.id)
}

// resolveSet computes a peer set's union.
func (s *state) resolveSet(ps *peerSet) {
	if ps.resolved {
		return
	}
	ps.resolved = true
	ps.matches = nil
	if ps.all {
		ps.addrs, ps.cidrs = allAddrs, allAddrs
		ps.split = newSplit(allAddrs, nil)
		return
	}
	for _, p := range ps.parts {
		s.resolvePeer(p)
	}
	if len(ps.parts) == 1 {
		p := ps.parts[0]
		ps.addrs, ps.pods, ps.cidrs = p.addrs, p.pods, noAddrs
		if p.kind != peerPods {
			ps.cidrs = p.addrs
		}
		ps.split = newSplit(ps.cidrs, ps.pods)
		return
	}
	var ranges, cidrs []AddrRange
	var pods []*roaring.Bitmap
	for _, p := range ps.parts {
		ranges = append(ranges, p.addrs.Ranges()...)
		if p.kind == peerPods {
			pods = append(pods, p.pods)
		} else {
			cidrs = append(cidrs, p.addrs.Ranges()...)
		}
	}
	ps.addrs, ps.cidrs = NewAddrSet(ranges...), NewAddrSet(cidrs...)
	if len(pods) > 0 {
		ps.pods = roaring.FastOr(pods...)
	}
	ps.split = newSplit(ps.cidrs, ps.pods)
}
