package nft

import (
	"net/netip"
	"slices"
	"sort"

	"github.com/moat-net/moat/policy"
)

// sweepGroup is a set of address ranges (disjoint, one family) that all
// carry the same ports.
type sweepGroup struct {
	ranges []policy.AddrRange
	ports  map[policy.Protocol][]policy.PortRange
}

// cutBoxes cuts the groups into disjoint boxes (address range, protocol,
// port range), at most limit of them; false when that is not enough.
//
// The boxes can be cut along either axis, and which needs fewer depends
// on the input: cut along addresses, each address piece gets one box per
// port range of the groups over it; cut along ports, each port piece
// gets one box per address range of the groups over it. N policies each
// allowing everything but its own /24 on its own port need N^2 boxes the
// first way (2N address pieces, each under N ports) and 2N the second
// (N ports, each over 2 address ranges); swap addresses and ports and the
// first way is the linear one. Both are tried, the address cut first
// (its boxes are in the order earlier builds used), the port cut limited
// to fewer boxes than it gave.
//
// Before either, the groups' own products (address ranges x port ranges)
// are summed, and a union whose products exceed limit is over budget: the
// work of a cut is that much at least, so this bounds the sweep's CPU.
// Where a wide group covers a narrower one (all TCP from 0.0.0.0/0 beside
// fat TCP peers), a cut could have merged the narrow group's boxes away
// and fit; such a run takes shared lookups instead, which is safe, only
// longer.
func cutBoxes(groups []sweepGroup, limit int) (boxes []box, portMajor bool, ok bool) {
	if len(groups) == 0 {
		return nil, false, true
	}
	product := 0
	for _, g := range groups {
		product += len(g.ranges) * portRanges(g.ports)
	}
	if product > limit {
		return nil, false, false
	}
	ax := newAxes(groups)
	byAddr, okAddr := ax.cut(ax.addrItems(), len(ax.addrs), len(ax.ports), nil, ax.protoStarts, limit)
	if okAddr {
		limit = len(byAddr) - 1
	}
	var byPort []cutBox
	okPort := false
	if limit >= 0 {
		byPort, okPort = ax.cut(ax.portItems(), len(ax.ports), len(ax.addrs), ax.protoStarts, nil, limit)
	}
	switch {
	case okPort:
		out := make([]box, len(byPort))
		for i, b := range byPort {
			out[i] = ax.box(b.sec, b.prim)
		}
		return out, true, true
	case okAddr:
		out := make([]box, len(byAddr))
		for i, b := range byAddr {
			out[i] = ax.box(b.prim, b.sec)
		}
		return out, false, true
	}
	return nil, false, false
}

// addrPoint is where a piece of the address axis starts: an address, or
// one past the family's last address (past).
type addrPoint struct {
	a    netip.Addr
	past bool
}

func cmpAddrPoint(x, y addrPoint) int {
	if c := x.a.Compare(y.a); c != 0 {
		return c
	}
	switch {
	case x.past == y.past:
		return 0
	case x.past:
		return 1
	}
	return -1
}

// portKey places a protocol and port on one line: protocol in the high
// bits, so that each protocol's ports are a contiguous stretch of it.
func portKey(p policy.Protocol, port uint16) uint32 { return uint32(p)<<16 | uint32(port) }

// span is a half-open range of piece indexes on one axis.
type span struct{ lo, hi int32 }

// cutItem is one group on the two axes: the spans it covers on the axis
// cut along (prim) and on the other (sec).
type cutItem struct{ prim, sec []span }

// cutBox is one box in piece indexes.
type cutBox struct{ prim, sec span }

// axes are the groups with both axes compressed into pieces: piece i of
// the address axis is [addrs[i], addrs[i+1]), of the port axis [ports[i],
// ports[i+1]).
type axes struct {
	groups []sweepGroup
	addrs  []addrPoint
	ports  []uint32
	// protoStarts are the port pieces that start a protocol's ports: a
	// box never spans two protocols, so pieces i-1 and i never merge.
	protoStarts []int32
	// addrSpans and portSpans are each group's spans on the two axes.
	addrSpans, portSpans [][]span
}

func newAxes(groups []sweepGroup) *axes {
	ax := &axes{groups: groups}
	for _, g := range groups {
		for _, r := range g.ranges {
			ax.addrs = append(ax.addrs, addrPoint{a: r.From}, addrEnd(r.To))
		}
		for p, rs := range g.ports {
			for _, r := range rs {
				ax.ports = append(ax.ports, portKey(p, r.From), portKey(p, r.To)+1)
			}
		}
	}
	slices.SortFunc(ax.addrs, cmpAddrPoint)
	ax.addrs = slices.Compact(ax.addrs)
	slices.Sort(ax.ports)
	ax.ports = slices.Compact(ax.ports)
	for i, k := range ax.ports {
		if k&0xffff == 0 {
			ax.protoStarts = append(ax.protoStarts, int32(i))
		}
	}
	addrAt := func(p addrPoint) int32 {
		i, _ := slices.BinarySearchFunc(ax.addrs, p, cmpAddrPoint)
		return int32(i)
	}
	portAt := func(k uint32) int32 {
		i, _ := slices.BinarySearch(ax.ports, k)
		return int32(i)
	}
	ax.addrSpans = make([][]span, len(groups))
	ax.portSpans = make([][]span, len(groups))
	for gi, g := range groups {
		for _, r := range g.ranges {
			ax.addrSpans[gi] = append(ax.addrSpans[gi], span{addrAt(addrPoint{a: r.From}), addrAt(addrEnd(r.To))})
		}
		for p, rs := range g.ports {
			for _, r := range rs {
				ax.portSpans[gi] = append(ax.portSpans[gi], span{portAt(portKey(p, r.From)), portAt(portKey(p, r.To) + 1)})
			}
		}
	}
	return ax
}

// addrEnd is the point one past to.
func addrEnd(to netip.Addr) addrPoint {
	if next := to.Next(); next.IsValid() && next.Is4() == to.Is4() {
		return addrPoint{a: next}
	}
	return addrPoint{a: to, past: true}
}

func (ax *axes) addrItems() []cutItem {
	items := make([]cutItem, len(ax.groups))
	for i := range items {
		items[i] = cutItem{prim: ax.addrSpans[i], sec: ax.portSpans[i]}
	}
	return items
}

func (ax *axes) portItems() []cutItem {
	items := make([]cutItem, len(ax.groups))
	for i := range items {
		items[i] = cutItem{prim: ax.portSpans[i], sec: ax.addrSpans[i]}
	}
	return items
}

// box converts pieces back to addresses and ports.
func (ax *axes) box(a, p span) box {
	from, to := ax.addrs[a.lo], ax.addrs[a.hi]
	last := to.a
	if !to.past {
		last = to.a.Prev()
	}
	lo, hi := ax.ports[p.lo], ax.ports[p.hi]-1
	return box{
		Addrs: policy.AddrRange{From: from.a, To: last},
		Proto: policy.Protocol(lo >> 16),
		Ports: policy.PortRange{From: uint16(lo), To: uint16(hi)},
	}
}

type cutEvent struct {
	at    int32
	item  int32
	delta int32
}

// cut sweeps the items along their prim axis (nPrim pieces), keeping the
// union of the sec spans of the items over the current piece in a
// coverTree: each stretch of prim pieces with one union becomes a box per
// range of the union. Neighbouring pieces with equal unions merge, except
// at the pieces primBreaks lists (sorted); so do neighbouring sec pieces,
// except at secBreaks. The boxes come in prim, then sec order. False
// when they are more than limit (negative: no limit), or when the sweep
// has spent that many steps on unions it did not keep.
func (ax *axes) cut(items []cutItem, nPrim, nSec int, primBreaks, secBreaks []int32, limit int) ([]cutBox, bool) {
	var evs []cutEvent
	for i, it := range items {
		for _, s := range it.prim {
			evs = append(evs, cutEvent{s.lo, int32(i), 1}, cutEvent{s.hi, int32(i), -1})
		}
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	t := newCoverTree(nSec)
	var out []cutBox
	var cur []span // the union over the stretch being extended
	var runs []span
	start := int32(-1) // the stretch's first prim piece; -1: none
	wasted := 0
	flush := func(end int32) {
		if start >= 0 {
			for _, r := range cur {
				out = append(out, cutBox{prim: span{start, end}, sec: r})
			}
		}
		start, cur = -1, cur[:0]
	}
	for i := 0; i < len(evs); {
		at := evs[i].at
		changed := false
		for ; i < len(evs) && evs[i].at == at; i++ {
			for _, s := range items[evs[i].item].sec {
				changed = t.add(s, evs[i].delta) || changed
			}
		}
		if int(at) >= nPrim-1 {
			flush(at)
			break
		}
		_, brk := slices.BinarySearch(primBreaks, at)
		if !changed && !brk {
			continue // the stretch goes on (or no union goes on)
		}
		if changed {
			runs = t.runs(runs[:0], secBreaks)
			wasted += len(runs)
		} else {
			runs = append(runs[:0], cur...)
		}
		if !brk && start >= 0 && slices.Equal(runs, cur) {
			continue
		}
		flush(at)
		if len(runs) > 0 {
			start = at
			cur = append(cur[:0], runs...)
			wasted -= len(runs)
		}
		if limit >= 0 && (len(out)+len(cur) > limit || wasted > limit) {
			return nil, false
		}
	}
	if limit >= 0 && len(out) > limit {
		return nil, false
	}
	return out, true
}

// coverTree counts, over n pieces of an axis, how many spans cover each
// piece, and lists the covered stretches: a segment tree whose node
// holds the spans covering all of it (count) and how many of its pieces
// some span covers (covered).
type coverTree struct {
	n       int32
	count   []int32
	covered []int32
}

func newCoverTree(n int) *coverTree {
	size := 1
	for size < n {
		size *= 2
	}
	return &coverTree{n: int32(n), count: make([]int32, 2*size), covered: make([]int32, 2*size)}
}

// add adds delta covers to the pieces of s, and reports whether the set
// of covered pieces changed.
func (t *coverTree) add(s span, delta int32) bool {
	if s.lo >= s.hi {
		return false
	}
	before := t.covered[1]
	t.update(1, 0, t.n, s, delta)
	return t.covered[1] != before
}

func (t *coverTree) update(node, lo, hi int32, s span, delta int32) {
	if s.hi <= lo || hi <= s.lo {
		return
	}
	if s.lo <= lo && hi <= s.hi {
		t.count[node] += delta
	} else {
		mid := (lo + hi) / 2
		t.update(2*node, lo, mid, s, delta)
		t.update(2*node+1, mid, hi, s, delta)
	}
	switch {
	case t.count[node] > 0:
		t.covered[node] = hi - lo
	case hi-lo == 1:
		t.covered[node] = 0
	default:
		t.covered[node] = t.covered[2*node] + t.covered[2*node+1]
	}
}

// runs appends the maximal covered stretches to dst, split at the
// pieces brks lists (sorted).
func (t *coverTree) runs(dst []span, brks []int32) []span {
	return t.walk(dst, 1, 0, t.n, brks)
}

func (t *coverTree) walk(dst []span, node, lo, hi int32, brks []int32) []span {
	switch {
	case lo >= hi || t.covered[node] == 0:
		return dst
	case t.count[node] > 0 || t.covered[node] == hi-lo:
		// The whole node is covered: pieces lo..hi-1, cut at the breaks
		// inside.
		from := lo
		i, _ := slices.BinarySearch(brks, lo+1)
		for ; i < len(brks) && brks[i] < hi; i++ {
			dst = appendRun(dst, span{from, brks[i]}, brks)
			from = brks[i]
		}
		return appendRun(dst, span{from, hi}, brks)
	}
	mid := (lo + hi) / 2
	dst = t.walk(dst, 2*node, lo, mid, brks)
	return t.walk(dst, 2*node+1, mid, hi, brks)
}

// appendRun appends s, merged with the last run when they touch and no
// break is between them.
func appendRun(dst []span, s span, brks []int32) []span {
	if n := len(dst); n > 0 && dst[n-1].hi == s.lo {
		if _, brk := slices.BinarySearch(brks, s.lo); !brk {
			dst[n-1].hi = s.hi
			return dst
		}
	}
	return append(dst, s)
}
