package policy

import (
	"net/netip"
	"slices"
	"sort"
)

// matchIndex answers "which is the first of these matches that contains
// (address, protocol, port)?" in a few searches (segment, then port cell),
// however many matches and terms there are. The address space is cut into segments at every
// term boundary; each segment holds, per protocol, the port intervals
// painted with the lowest match index (tag) that covers them.
type matchIndex struct {
	// v4 and v6 segments are kept apart as plain integers, compared
	// without building a key per probe.
	v4 buckets
	v6 segments[u128]
	// pods are segments of pod ordinals (see termSplit): a remote address
	// that belongs to a policed pod is also looked up by its ordinal.
	pods buckets
	// podsMin is the lowest tag in pods, -1 if none: when the address
	// already matched a tag that low, the ordinal cannot do better, and
	// its search (the costlier one at scale) is skipped.
	podsMin int32
}

// segments[T]: seg i's cell covers [its start, the next seg's start); nil
// means no term covers it. A start and its cell sit side by side, so the
// search's last probe has already fetched the cell pointer.
type segments[T uint32 | u128] []seg[T]

type seg[T uint32 | u128] struct {
	start T
	cell  *cell
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

type cell struct {
	// any is the lowest tag of an all-traffic term, -1 if none.
	any int32
	// ports per protocol in PortProtocols order.
	ports [len(PortProtocols)][]portCell
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

// buildIndex indexes matches; a match's tag is its position.
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
	for tag, m := range matches {
		for i := range m {
			id := int32(len(b.tags))
			t := &m[i]
			b.tags = append(b.tags, int32(tag))
			b.group = append(b.group, b.portGroup(t.Ports))
			if t.split == nil {
				for _, r := range t.Addrs.Ranges() {
					addRange(r, id)
				}
				continue
			}
			for _, r := range t.split.cidrs.Ranges() {
				addRange(r, id)
			}
			for _, r := range t.split.ranges() {
				evPods = append(evPods, keyEvent[uint32]{r.from, true, id}, keyEvent[uint32]{r.to + 1, false, id})
			}
		}
	}
	// Each active set is identified by a 128-bit Zobrist hash kept up to
	// date in O(1) per event, so that segments with the same terms share
	// one cell without building a key per segment.
	b.seeds = make([][2]uint64, len(b.tags))
	var x uint64 = 0x9e3779b97f4a7c15
	for i := range b.seeds {
		b.seeds[i] = [2]uint64{splitmix(&x), splitmix(&x)}
	}
	b.memo = map[[2]uint64]*cell{}
	pods := sweep(b, evPods, cmp32)
	return &matchIndex{
		v4:      newBuckets(sweep(b, ev4, cmp32)),
		v6:      sweep(b, ev6, cmp128),
		pods:    newBuckets(pods),
		podsMin: minTag(pods),
	}
}

// indexBuilder holds what the sweeps of one index share: the terms (by
// id, in match order), their port sets grouped by content, the cells built
// so far by active set, and scratch space reused from cell to cell.
type indexBuilder struct {
	tags  []int32 // per term: its match's tag
	seeds [][2]uint64
	memo  map[[2]uint64]*cell

	// group is each term's port group: terms with equal port sets (the
	// rules of one policy often share them) are painted once per cell,
	// with the lowest active tag of the group. allGroup is the group of
	// all traffic (no ports), -1 until a term has it.
	group      []int32
	allGroup   int32
	groupOf    map[*PortSet]int32
	groupByKey map[string]int32
	// groupPorts holds each group's port intervals per protocol, as
	// half-open spans whose tag is filled in per cell.
	groupPorts [][len(PortProtocols)][]span

	// Scratch of cellFor: the lowest active tag of each active group, the
	// spans of one protocol, the paint heap.
	mins   []int32
	spans  []uint64
	sorted []uint64
	heap   []span
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

// sweep cuts one key space into segments at every event and gives each
// segment the cell of the terms active there. It keeps, per port group,
// how many of its terms are active and a heap of them by tag, and the
// groups with an active term as a dense set (O(1) to change, iterated in
// O(active groups)), so a new cell costs what its own port groups cost,
// not what all terms, or all its active terms, cost.
func sweep[K uint32 | u128](b *indexBuilder, events []keyEvent[K], cmp func(a, b K) int) segments[K] {
	slices.SortFunc(events, func(x, y keyEvent[K]) int { return cmp(x.at, y.at) })
	var out segments[K]
	if len(events) == 0 {
		return out
	}
	st := &sweepState{
		count:  make([]int32, len(b.tags)),
		gCount: make([]int32, len(b.groupPorts)),
		gPos:   make([]int32, len(b.groupPorts)),
		gHeap:  make([][]tagTerm, len(b.groupPorts)),
	}
	var hash [2]uint64
	for i := 0; i < len(events); {
		at := events[i].at
		for ; i < len(events) && events[i].at == at; i++ {
			e := events[i]
			before := st.count[e.term]
			if e.start {
				st.count[e.term]++
			} else {
				st.count[e.term]--
			}
			if (before == 0) == (st.count[e.term] == 0) {
				continue
			}
			hash[0] ^= b.seeds[e.term][0]
			hash[1] ^= b.seeds[e.term][1]
			g := b.group[e.term]
			if before == 0 {
				if st.gCount[g] == 0 {
					st.gPos[g] = int32(len(st.gActive))
					st.gActive = append(st.gActive, g)
				}
				st.gCount[g]++
				st.gHeap[g] = tagHeapPush(st.gHeap[g], tagTerm{b.tags[e.term], e.term})
				continue
			}
			if st.gCount[g]--; st.gCount[g] > 0 {
				continue // the term stays in the heap until it reaches the top
			}
			st.gHeap[g] = st.gHeap[g][:0]
			last := st.gActive[len(st.gActive)-1]
			st.gActive[st.gPos[g]] = last
			st.gPos[last] = st.gPos[g]
			st.gActive = st.gActive[:len(st.gActive)-1]
		}
		var c *cell
		if len(st.gActive) > 0 {
			var ok bool
			if c, ok = b.memo[hash]; !ok {
				c = b.cellFor(st)
				b.memo[hash] = c
			}
		}
		out.add(at, c)
	}
	return out
}

// sweepState is what a sweep knows at its current key.
type sweepState struct {
	count []int32 // per term: how many of its ranges hold the key
	// Per port group: active terms, position in gActive, and a heap of
	// its terms by tag (terms that are no longer active leave it when
	// they reach the top).
	gCount  []int32
	gPos    []int32
	gHeap   [][]tagTerm
	gActive []int32 // groups with an active term
}

// minTag is the lowest tag of an active term of group g (which has one).
func (st *sweepState) minTag(g int32) int32 {
	h := st.gHeap[g]
	for st.count[h[0].term] == 0 {
		h = tagHeapPop(h)
	}
	st.gHeap[g] = h
	return h[0].tag
}

type tagTerm struct{ tag, term int32 }

// tagHeapPush and tagHeapPop keep h a binary min-heap by tag.
func tagHeapPush(h []tagTerm, x tagTerm) []tagTerm {
	h = append(h, x)
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

func tagHeapPop(h []tagTerm) []tagTerm {
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

func (s *segments[T]) add(at T, c *cell) {
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

// cellFor computes the cell of the sweep's active terms, in time
// O(G + S log S) for G port groups with an active term holding S intervals
// (intervals of groups the all-traffic group beats left out).
func (b *indexBuilder) cellFor(st *sweepState) *cell {
	c := &cell{any: -1}
	b.mins = b.mins[:0]
	for _, g := range st.gActive {
		tag := st.minTag(g)
		b.mins = append(b.mins, tag)
		if g == b.allGroup {
			c.any = tag
		}
	}
	for pi := range PortProtocols {
		b.spans = b.spans[:0]
		for k, g := range st.gActive {
			tag := b.mins[k]
			if c.any >= 0 && tag >= c.any {
				continue // the all-traffic term wins wherever this group matches
			}
			for _, s := range b.groupPorts[g][pi] {
				b.spans = append(b.spans, packSpan(s.from, s.to, tag))
			}
		}
		c.ports[pi] = b.paint(b.spans)
	}
	return c
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
	var c *cell
	if a.Is4() {
		if i := ix.v4.find(v4key(a)); i >= 0 {
			c = ix.v4.segs[i].cell
		}
	} else {
		k := v6key(a)
		if i := sort.Search(len(ix.v6), func(i int) bool { return k.less(ix.v6[i].start) }) - 1; i >= 0 {
			c = ix.v6[i].cell
		}
	}
	best := c.tag(proto, port)
	if ord >= 0 && ix.podsMin >= 0 && (best < 0 || ix.podsMin < best) {
		if i := ix.pods.find(uint32(ord)); i >= 0 {
			if t := ix.pods.segs[i].cell.tag(proto, port); t >= 0 && (best < 0 || t < best) {
				best = t
			}
		}
	}
	return best
}

// minTag is the lowest tag of any cell of s, or -1.
func minTag(s segments[uint32]) int32 {
	lowest := int32(-1)
	low := func(t int32) {
		if t >= 0 && (lowest < 0 || t < lowest) {
			lowest = t
		}
	}
	seen := map[*cell]bool{}
	for _, sg := range s {
		if sg.cell == nil || seen[sg.cell] {
			continue
		}
		seen[sg.cell] = true
		low(sg.cell.any)
		for _, pcs := range sg.cell.ports {
			for _, pc := range pcs {
				low(pc.tag)
			}
		}
	}
	return lowest
}

// tag is the lowest tag of the cell that matches the packet, or -1.
func (c *cell) tag(proto Protocol, port uint16) int32 {
	if c == nil {
		return -1
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
