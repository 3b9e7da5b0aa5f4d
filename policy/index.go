package policy

import (
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
)

// matchIndex answers "which is the first of these matches that contains
// (address, protocol, port)?" in a few searches (segment, then port cell),
// however many matches and terms there are. The address space is cut into
// segments at every term boundary; each segment's cell holds, per
// protocol, the port intervals painted with the lowest match index (tag)
// that covers them. Cells are painted on their first lookup (see cell):
// that lookup allocates, later ones do not.
type matchIndex struct {
	// podsMin is the lowest tag the cells of pods hold (painted or not:
	// it is known from the terms), -1 if none: when the address already
	// matched a tag that low, the ordinal cannot do better, and its
	// search (the costlier one at scale) is skipped.
	podsMin int32
	// v4 and v6 segments are kept apart as plain integers, compared
	// without building a key per probe; v4 is searched through its
	// buckets, which hold its segments by line (v4segs is the flat
	// list).
	v4 buckets
	// cells are the distinct cells of all three key spaces, which
	// segments name by position.
	cells []cell
	// pods are segments of pod ordinals (see termSplit): a remote address
	// that belongs to a policed pod is also looked up by its ordinal.
	pods     buckets
	v4segs   segments[uint32]
	podsSegs segments[uint32]
	v6       segments[u128]
	// The fields are laid out, and padded to a size class of whole
	// cache lines (192 bytes, so that the index starts a line), for an
	// IPv4 lookup to read podsMin, v4 and cells in the first line and
	// pods in the second: unaligned at 144 bytes, a lookup read three
	// lines about as often as two, each a likely miss at scale.
	_ [24]byte
}

// segments[T]: seg i's cell covers [its start, the next seg's start).
type segments[T uint32 | u128] []seg[T]

// seg is a segment's start and its cell's position in the index's cells,
// -1 when no term covers it: 8 bytes for IPv4 and pod ordinals.
type seg[T uint32 | u128] struct {
	start T
	cell  int32
}

// u128 is an IPv6 address as a comparable integer pair.
type u128 struct{ hi, lo uint64 }

func (a u128) less(b u128) bool { return a.hi < b.hi || a.hi == b.hi && a.lo < b.lo }

func v4key(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func v6key(a netip.Addr) u128 {
	b := a.As16()
	var k u128
	for i := 0; i < 8; i++ {
		k.hi = k.hi<<8 | uint64(b[i])
		k.lo = k.lo<<8 | uint64(b[8+i])
	}
	return k
}

// cell is the paint of one set of active terms. The sweep that finds
// the cells only records where each set was first met; the cell is
// painted on its first lookup. Painted when the index was built, N rules
// "everything except my own range, on my own port" made N+1 cells of ~2N
// port intervals each: 10,240 such NetworkPolicies took 1.5 GiB peak for
// one `moat explain`, which reads one or two cells (BENCHMARKS.md).
type cell struct {
	// pending is set until any and ports hold the paint: the lookup's one
	// extra check. A cell made with its paint (pending false) needs no
	// from.
	pending atomic.Bool
	// any is the lowest tag of an all-traffic term, -1 if none.
	any int32
	// ports per protocol in PortProtocols order.
	ports [len(PortProtocols)][]portCell
	// from is the key space the cell's set was first met in and pos that
	// key's position there: the stabbing query at pos rebuilds the set.
	from *stabber
	pos  int32
}

// portCell covers ports [from, next cell's from) with tag (-1: none).
type portCell struct {
	from uint32
	tag  int32
}

// keyEvent opens or closes a term at a key of one key space.
type keyEvent[K any] struct {
	at    K
	start bool
	term  int32
}

// buildIndex indexes matches; a match's tag is its position. It finds
// the segments and their distinct cells, in O(E log E) for E term
// boundaries, and paints no cell: see cell.
func buildIndex(matches []Match) *matchIndex {
	b := &indexBuilder{groupOf: map[*PortSet]int32{}, groupByKey: map[string]int32{}, allGroup: -1}
	var ev4 []keyEvent[uint32]
	var ev6 []keyEvent[u128]
	var evPods []keyEvent[uint32]
	addRange := func(r AddrRange, id int32) {
		if r.From.Is4() {
			ev4 = append(ev4, keyEvent[uint32]{v4key(r.From), true, id})
			if to := v4key(r.To); to != ^uint32(0) {
				ev4 = append(ev4, keyEvent[uint32]{to + 1, false, id})
			}
			return
		}
		ev6 = append(ev6, keyEvent[u128]{v6key(r.From), true, id})
		if next := r.To.Next(); next.IsValid() {
			ev6 = append(ev6, keyEvent[u128]{v6key(next), false, id})
		}
	}
	// podsMin is the lowest tag of a term with slots that paints
	// something (all traffic, or some port): the lowest tag the slot
	// cells can hold once painted.
	podsMin := int32(-1)
	for tag, m := range matches {
		for i := range m {
			id := int32(len(b.tags))
			t := &m[i]
			g := b.portGroup(t.Ports)
			b.tags = append(b.tags, int32(tag))
			b.group = append(b.group, g)
			if t.split == nil {
				for _, r := range t.Addrs.Ranges() {
					addRange(r, id)
				}
				continue
			}
			for _, r := range t.split.cidrs.Ranges() {
				addRange(r, id)
			}
			runs := t.split.ranges()
			for _, r := range runs {
				evPods = append(evPods, keyEvent[uint32]{r.from, true, id}, keyEvent[uint32]{r.to + 1, false, id})
			}
			if len(runs) > 0 && podsMin < 0 && b.paints(g) {
				podsMin = int32(tag) // tags only grow
			}
		}
	}
	// Each active set is identified by a 128-bit Zobrist hash kept up to
	// date in O(1) per event, so that segments with the same terms share
	// one cell without building a key per segment.
	seeds := make([][2]uint64, len(b.tags))
	var x uint64 = 0x9e3779b97f4a7c15
	for i := range seeds {
		seeds[i] = [2]uint64{splitmix(&x), splitmix(&x)}
	}
	sw := &sweeper{b: b, seeds: seeds, memo: map[[2]uint64]int32{}}
	ix := &matchIndex{
		v4segs:   sweep(sw, ev4, cmp32),
		v6:       sweep(sw, ev6, cmp128),
		podsSegs: sweep(sw, evPods, cmp32),
		podsMin:  podsMin,
	}
	ix.v4, ix.pods = newBuckets(ix.v4segs), newBuckets(ix.podsSegs)
	ix.cells = make([]cell, len(sw.cells))
	for i, at := range sw.cells {
		c := &ix.cells[i]
		c.from, c.pos = at.from, at.pos
		c.pending.Store(true)
	}
	// What only the build needed goes: painting reads terms' tags and
	// groups off the stabbers' runs.
	b.tags, b.group, b.groupOf, b.groupByKey = nil, nil, nil, nil
	return ix
}

// indexBuilder holds what the cells of one index share: the terms (by
// id, in match order) and their port sets grouped by content, and scratch
// space reused from cell to cell. mu serialises painting: cells are
// looked up from several goroutines (matrix, lab).
type indexBuilder struct {
	mu   sync.Mutex
	tags []int32 // per term: its match's tag (while building)

	// group is each term's port group (while building): terms with equal
	// port sets (the rules of one policy often share them) are painted
	// once per cell, with the lowest active tag of the group. allGroup is
	// the group of all traffic (no ports), -1 until a term has it.
	group      []int32
	allGroup   int32
	groupOf    map[*PortSet]int32 // while building
	groupByKey map[string]int32   // while building
	// groupPorts holds each group's port intervals per protocol, as
	// half-open spans whose tag is filled in per cell.
	groupPorts [][len(PortProtocols)][]span

	// Scratch of paintCell: the active terms, the lowest active tag of
	// each group (-1: none; made on first use), the groups with an active
	// term, the spans of one protocol, the paint heap.
	terms   []bound
	gMin    []int32
	gActive []int32
	spans   []uint64
	sorted  []uint64
	heap    []span
}

// portGroup returns the group of a port set.
func (b *indexBuilder) portGroup(ps *PortSet) int32 {
	if g, ok := b.groupOf[ps]; ok {
		return g
	}
	if ps.All {
		if b.allGroup < 0 {
			b.allGroup = int32(len(b.groupPorts))
			b.groupPorts = append(b.groupPorts, [len(PortProtocols)][]span{})
		}
		b.groupOf[ps] = b.allGroup
		return b.allGroup
	}
	var key []byte
	var ports [len(PortProtocols)][]span
	for pi, proto := range PortProtocols {
		for _, pr := range ps.ByProto[proto] {
			ports[pi] = append(ports[pi], span{uint32(pr.From), uint32(pr.To) + 1, -1})
			key = append(key, byte(pi), byte(pr.From>>8), byte(pr.From), byte(pr.To>>8), byte(pr.To))
		}
	}
	g, ok := b.groupByKey[string(key)]
	if !ok {
		g = int32(len(b.groupPorts))
		b.groupPorts = append(b.groupPorts, ports)
		b.groupByKey[string(key)] = g
	}
	b.groupOf[ps] = g
	return g
}

// paints reports whether group g's terms paint anything.
func (b *indexBuilder) paints(g int32) bool {
	if g == b.allGroup {
		return true
	}
	for _, ps := range b.groupPorts[g] {
		if len(ps) > 0 {
			return true
		}
	}
	return false
}

func cmp32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmp128(a, b u128) int {
	switch {
	case a.less(b):
		return -1
	case b.less(a):
		return 1
	}
	return 0
}

// sweeper is what the sweeps of one index share: the terms' hash seeds,
// the cells found so far (where each was first met) and their positions
// by active set.
type sweeper struct {
	b     *indexBuilder
	seeds [][2]uint64
	memo  map[[2]uint64]int32
	cells []cellAt
}

// cellAt is where a cell's set of active terms was first met.
type cellAt struct {
	from *stabber
	pos  int32
}

// sweep cuts one key space into segments at every event and gives each
// segment the cell of the terms active there, unpainted: a new active set
// costs one map entry and one cell, whatever its terms. It also records
// each term's runs of active positions (a position is a distinct event
// key) in the key space's stabber, which rebuilds a cell's set on its
// first lookup.
func sweep[K uint32 | u128](sw *sweeper, events []keyEvent[K], cmp func(a, b K) int) segments[K] {
	slices.SortFunc(events, func(x, y keyEvent[K]) int { return cmp(x.at, y.at) })
	var out segments[K]
	if len(events) == 0 {
		return out
	}
	st := &stabber{b: sw.b}
	count := make([]int32, len(sw.b.tags)) // per term: its ranges that hold the key
	opened := make([]int32, len(sw.b.tags))
	var runs []termRun
	var hash [2]uint64
	active := 0
	pos := int32(0)
	for i := 0; i < len(events); pos++ {
		at := events[i].at
		for ; i < len(events) && events[i].at == at; i++ {
			e := events[i]
			before := count[e.term]
			if e.start {
				count[e.term]++
			} else {
				count[e.term]--
			}
			if (before == 0) == (count[e.term] == 0) {
				continue
			}
			hash[0] ^= sw.seeds[e.term][0]
			hash[1] ^= sw.seeds[e.term][1]
			if before == 0 {
				active++
				opened[e.term] = pos
				continue
			}
			active--
			if opened[e.term] < pos { // else it opened and closed at this key
				runs = append(runs, termRun{opened[e.term], pos - 1, e.term})
			}
		}
		c := int32(-1)
		if active > 0 {
			var ok bool
			if c, ok = sw.memo[hash]; !ok {
				c = int32(len(sw.cells))
				sw.cells = append(sw.cells, cellAt{st, pos})
				sw.memo[hash] = c
			}
		}
		out.add(at, c)
	}
	for t, n := range count {
		if n > 0 {
			runs = append(runs, termRun{opened[t], pos - 1, int32(t)})
		}
	}
	st.build(pos, runs)
	return out
}

// termRun is a run of positions [from, to] where a term is active.
type termRun struct{ from, to, term int32 }

// stabber answers "which terms are active at position p of a key space"
// in O(log P + k) for P positions and k such terms, in O(P + runs)
// memory: a centered interval tree whose nodes are the positions
// themselves. The node of positions [lo, hi) is their middle m, with the
// runs that hold m and lie within [lo, hi); its children are [lo, m) and
// [m+1, hi). A run is kept at one node, in two lists: by start ascending
// and by end descending, so that a query left of m reads the first list
// up to its first run starting past p, and right of m the second.
type stabber struct {
	b      *indexBuilder
	n      int32
	off    []int32 // node m's runs are [off[m], off[m+1]) of both lists
	byFrom []bound // run starts, each node's ascending
	byTo   []bound // run ends, each node's descending
}

// bound is a run's start or end with what painting needs of its term,
// so that a stab reads its lists in order and nothing else.
type bound struct{ at, tag, group int32 }

// node is the position whose node holds the run [from, to].
func (st *stabber) node(from, to int32) int32 {
	lo, hi := int32(0), st.n
	for {
		m := lo + (hi-lo)/2
		switch {
		case to < m:
			hi = m
		case from > m:
			lo = m + 1
		default:
			return m
		}
	}
}

func (st *stabber) build(n int32, runs []termRun) {
	st.n = n
	st.off = make([]int32, n+1)
	nodes := make([]int32, len(runs))
	for i, r := range runs {
		nodes[i] = st.node(r.from, r.to)
		st.off[nodes[i]+1]++
	}
	for m := int32(0); m < n; m++ {
		st.off[m+1] += st.off[m]
	}
	st.byFrom = make([]bound, len(runs))
	st.byTo = make([]bound, len(runs))
	fill := slices.Clone(st.off[:n])
	for i, r := range runs {
		k := fill[nodes[i]]
		fill[nodes[i]]++
		tag, g := st.b.tags[r.term], st.b.group[r.term]
		st.byFrom[k] = bound{r.from, tag, g}
		st.byTo[k] = bound{r.to, tag, g}
	}
	for m := int32(0); m < n; m++ {
		a, z := st.off[m], st.off[m+1]
		if z-a < 2 {
			continue
		}
		slices.SortFunc(st.byFrom[a:z], func(x, y bound) int { return int(x.at - y.at) })
		slices.SortFunc(st.byTo[a:z], func(x, y bound) int { return int(y.at - x.at) })
	}
}

// stab appends the runs that hold position p to out: one per term
// active there, its runs being disjoint.
func (st *stabber) stab(p int32, out []bound) []bound {
	lo, hi := int32(0), st.n
	for lo < hi {
		m := lo + (hi-lo)/2
		a, z := st.off[m], st.off[m+1]
		switch {
		case p < m:
			for _, bd := range st.byFrom[a:z] {
				if bd.at > p {
					break
				}
				out = append(out, bd)
			}
			hi = m
		case p > m:
			for _, bd := range st.byTo[a:z] {
				if bd.at < p {
					break
				}
				out = append(out, bd)
			}
			lo = m + 1
		default:
			return append(out, st.byFrom[a:z]...)
		}
	}
	return out
}

func (s *segments[T]) add(at T, c int32) {
	if n := len(*s); n > 0 && (*s)[n-1].cell == c {
		return
	}
	*s = append(*s, seg[T]{at, c})
}

func splitmix(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// paint paints a pending cell (once, under its index's lock: a cell may
// be looked up by several goroutines first). The cell's active terms are
// stabbed at its position (O(log P + k) for k terms), each port group is
// painted once with its lowest active tag, intervals an all-traffic term
// already wins are left out, and the rest are flattened in O(S log S)
// for S intervals. This is the only allocation of a lookup.
func (c *cell) paint() {
	b := c.from.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !c.pending.Load() {
		return // painted by another goroutine meanwhile
	}
	b.terms = c.from.stab(c.pos, b.terms[:0])
	if b.gMin == nil {
		b.gMin = make([]int32, len(b.groupPorts))
		for g := range b.gMin {
			b.gMin[g] = -1
		}
	}
	b.gActive = b.gActive[:0]
	for _, bd := range b.terms {
		g, tag := bd.group, bd.tag
		switch m := b.gMin[g]; {
		case m < 0:
			b.gActive = append(b.gActive, g)
			b.gMin[g] = tag
		case tag < m:
			b.gMin[g] = tag
		}
	}
	c.any = -1
	if b.allGroup >= 0 {
		c.any = b.gMin[b.allGroup]
	}
	for pi := range PortProtocols {
		b.spans = b.spans[:0]
		for _, g := range b.gActive {
			tag := b.gMin[g]
			if c.any >= 0 && tag >= c.any {
				continue // the all-traffic term wins wherever this group matches
			}
			for _, s := range b.groupPorts[g][pi] {
				b.spans = append(b.spans, packSpan(s.from, s.to, tag))
			}
		}
		c.ports[pi] = b.paint(b.spans)
	}
	for _, g := range b.gActive {
		b.gMin[g] = -1
	}
	c.pending.Store(false)
}

type span struct {
	from, to uint32 // [from, to)
	tag      int32
}

// A span is packed for sorting into one integer: from (16 bits: ports
// start at most at 65535) above to (17 bits: at most 65536) above the tag
// (31 bits: a non-negative int32).
func packSpan(from, to uint32, tag int32) uint64 {
	return uint64(from)<<48 | uint64(to)<<31 | uint64(tag)
}

func unpackSpan(p uint64) span {
	return span{uint32(p >> 48), uint32(p>>31) & (1<<17 - 1), int32(p & (1<<31 - 1))}
}

// sortSpans orders packed spans by start: a two-pass radix sort on the
// 16 start bits (linear) when there are many, else a comparison sort.
func (b *indexBuilder) sortSpans(spans []uint64) []uint64 {
	if len(spans) < 256 {
		slices.Sort(spans)
		return spans
	}
	b.sorted = slices.Grow(b.sorted[:0], len(spans))[:len(spans)]
	src, dst := spans, b.sorted
	for shift := uint(48); shift < 64; shift += 8 {
		var count [257]int
		for _, p := range src {
			count[(p>>shift)&0xff+1]++
		}
		for i := 1; i < len(count); i++ {
			count[i] += count[i-1]
		}
		for _, p := range src {
			k := (p >> shift) & 0xff
			dst[count[k]] = p
			count[k]++
		}
		src, dst = dst, src
	}
	// Two passes: the result is back in spans.
	return src
}

// paint flattens overlapping spans into cells carrying the lowest tag, in
// O(S log S): a sweep in order of span starts with a heap of the spans
// open there, lowest tag on top. Only the top's end or the next start can
// change the lowest tag; spans that ended under the top leave the heap
// when they reach it.
func (b *indexBuilder) paint(packed []uint64) []portCell {
	if len(packed) == 0 {
		return nil
	}
	packed = b.sortSpans(packed)
	h := b.heap[:0]
	var out []portCell
	i := 0
	next := unpackSpan(packed[0])
	at := next.from
	for {
		for next.from == at {
			h = heapPush(h, next)
			if i++; i == len(packed) {
				next.from = noSpan
				break
			}
			next = unpackSpan(packed[i])
		}
		for len(h) > 0 && h[0].to <= at {
			h = heapPop(h)
		}
		tag := int32(-1)
		if len(h) > 0 {
			tag = h[0].tag
		}
		if n := len(out); n == 0 || out[n-1].tag != tag {
			out = append(out, portCell{at, tag})
		}
		switch {
		case len(h) > 0:
			at = min(h[0].to, next.from)
		case next.from != noSpan:
			at = next.from
		default:
			b.heap = h
			return slices.Clip(out)
		}
	}
}

// noSpan is a start past every port: no span left.
const noSpan = 1 << 17

// heapPush and heapPop keep h a binary min-heap by tag. They are
// tagHeapPush and tagHeapPop for spans: a generic pair (a method for the
// tag) built the heavy BenchmarkBuildIndex shape 30-50% slower, the
// type parameter's method being called through its dictionary.
func heapPush(h []span, s span) []span {
	h = append(h, s)
	for j := len(h) - 1; j > 0; {
		p := (j - 1) / 2
		if h[p].tag <= h[j].tag {
			break
		}
		h[p], h[j] = h[j], h[p]
		j = p
	}
	return h
}

func heapPop(h []span) []span {
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for j := 0; ; {
		l := 2*j + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].tag < h[l].tag {
			m = r
		}
		if h[j].tag <= h[m].tag {
			break
		}
		h[j], h[m] = h[m], h[j]
		j = m
	}
	return h
}

// lookup returns the lowest tag whose match contains the packet, or -1.
// ord is the ordinal of the policed pod that owns the address, or -1.
func (ix *matchIndex) lookup(a netip.Addr, ord int32, proto Protocol, port uint16) int32 {
	a = a.Unmap()
	var c int32
	if a.Is4() {
		c = ix.v4.find(&ix.v4segs, v4key(a))
	} else {
		k := v6key(a)
		c = -1
		if i := sort.Search(len(ix.v6), func(i int) bool { return k.less(ix.v6[i].start) }) - 1; i >= 0 {
			c = ix.v6[i].cell
		}
	}
	best := ix.tag(c, proto, port)
	if ord >= 0 && ix.podsMin >= 0 && (best < 0 || ix.podsMin < best) {
		if t := ix.tag(ix.pods.find(&ix.podsSegs, uint32(ord)), proto, port); t >= 0 && (best < 0 || t < best) {
			best = t
		}
	}
	return best
}

// tag is the lowest tag of cell c (-1: none) that matches the packet, or
// -1.
func (ix *matchIndex) tag(c int32, proto Protocol, port uint16) int32 {
	if c < 0 {
		return -1
	}
	return ix.cells[c].tag(proto, port)
}

// tag is the lowest tag of the cell that matches the packet, or -1.
func (c *cell) tag(proto Protocol, port uint16) int32 {
	if c.pending.Load() {
		c.paint()
	}
	best := c.any
	for pi, p := range PortProtocols {
		if p != proto {
			continue
		}
		cells := c.ports[pi]
		j := sort.Search(len(cells), func(j int) bool { return uint32(port) < cells[j].from }) - 1
		if j >= 0 && cells[j].tag >= 0 && (best < 0 || cells[j].tag < best) {
			best = cells[j].tag
		}
	}
	return best
}
