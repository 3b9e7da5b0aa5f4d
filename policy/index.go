package policy

import (
	"net/netip"
	"slices"
	"sort"
)

// matchIndex answers "which is the first of these matches that contains
// (address, protocol, port)?" in two binary searches, however many matches
// and terms there are. The address space is cut into segments at every
// term boundary; each segment holds, per protocol, the port intervals
// painted with the lowest match index (tag) that covers them.
type matchIndex struct {
	// v4 and v6 segments are kept apart as plain integers: compact arrays
	// without pointers keep the binary search in cache and out of the GC.
	v4 segments[uint32]
	v6 segments[u128]
	// pods are segments of pod ordinals (see termSplit): a remote address
	// that belongs to a policed pod is also looked up by its ordinal.
	pods segments[uint32]
}

// segments[T]: cells[i] covers [starts[i], starts[i+1]); nil means no term
// covers it.
type segments[T uint32 | u128] struct {
	starts []T
	cells  []*cell
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

type termRef struct {
	tag  int32
	term *Term
}

// keyEvent opens or closes a term at a key of one key space.
type keyEvent[K any] struct {
	at    K
	start bool
	term  int32
}

// buildIndex indexes matches; a match's tag is its position.
func buildIndex(matches []Match) *matchIndex {
	var terms []termRef
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
			id := int32(len(terms))
			t := &m[i]
			terms = append(terms, termRef{int32(tag), t})
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
	seeds := make([][2]uint64, len(terms))
	var x uint64 = 0x9e3779b97f4a7c15
	for i := range seeds {
		seeds[i] = [2]uint64{splitmix(&x), splitmix(&x)}
	}
	memo := map[[2]uint64]*cell{}
	return &matchIndex{
		v4:   sweep(ev4, cmp32, terms, seeds, memo),
		v6:   sweep(ev6, cmp128, terms, seeds, memo),
		pods: sweep(evPods, cmp32, terms, seeds, memo),
	}
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
// segment the cell of the terms active there.
func sweep[K uint32 | u128](events []keyEvent[K], cmp func(a, b K) int, terms []termRef, seeds [][2]uint64, memo map[[2]uint64]*cell) segments[K] {
	slices.SortFunc(events, func(a, b keyEvent[K]) int { return cmp(a.at, b.at) })
	var out segments[K]
	count := make([]int32, len(terms))
	var hash [2]uint64
	nActive := 0
	for i := 0; i < len(events); {
		at := events[i].at
		for ; i < len(events) && events[i].at == at; i++ {
			e := events[i]
			before := count[e.term]
			if e.start {
				count[e.term]++
			} else {
				count[e.term]--
			}
			if (before == 0) != (count[e.term] == 0) {
				hash[0] ^= seeds[e.term][0]
				hash[1] ^= seeds[e.term][1]
				if before == 0 {
					nActive++
				} else {
					nActive--
				}
			}
		}
		var c *cell
		if nActive > 0 {
			var ok bool
			if c, ok = memo[hash]; !ok {
				c = cellFor(terms, count)
				memo[hash] = c
			}
		}
		out.add(at, c)
	}
	return out
}

func (s *segments[T]) add(at T, c *cell) {
	if n := len(s.cells); n > 0 && s.cells[n-1] == c {
		return
	}
	s.starts = append(s.starts, at)
	s.cells = append(s.cells, c)
}

func splitmix(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// cellFor computes the cell of the active terms (count > 0).
func cellFor(terms []termRef, count []int32) *cell {
	c := &cell{any: -1}
	var spans [len(PortProtocols)][]span
	for id, n := range count {
		if n == 0 {
			continue
		}
		r := terms[id]
		if r.term.Ports.All {
			if c.any < 0 || r.tag < c.any {
				c.any = r.tag
			}
			continue
		}
		for pi, proto := range PortProtocols {
			for _, pr := range r.term.Ports.ByProto[proto] {
				spans[pi] = append(spans[pi], span{uint32(pr.From), uint32(pr.To) + 1, r.tag})
			}
		}
	}
	for pi := range PortProtocols {
		c.ports[pi] = paint(spans[pi])
	}
	return c
}

type span struct {
	from, to uint32 // [from, to)
	tag      int32
}

// paint flattens overlapping spans into cells carrying the lowest tag.
func paint(spans []span) []portCell {
	if len(spans) == 0 {
		return nil
	}
	var bounds []uint32
	for _, s := range spans {
		bounds = append(bounds, s.from, s.to)
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	out := make([]portCell, 0, len(bounds))
	for i, b := range bounds {
		tag := int32(-1)
		if i+1 < len(bounds) {
			for _, s := range spans {
				if s.from <= b && b < s.to && (tag < 0 || s.tag < tag) {
					tag = s.tag
				}
			}
		}
		if n := len(out); n > 0 && out[n-1].tag == tag {
			continue
		}
		out = append(out, portCell{b, tag})
	}
	return out
}

// lookup returns the lowest tag whose match contains the packet, or -1.
// ord is the ordinal of the policed pod that owns the address, or -1.
func (ix *matchIndex) lookup(a netip.Addr, ord int32, proto Protocol, port uint16) int32 {
	a = a.Unmap()
	var c *cell
	if a.Is4() {
		k := v4key(a)
		if i := sort.Search(len(ix.v4.starts), func(i int) bool { return k < ix.v4.starts[i] }) - 1; i >= 0 {
			c = ix.v4.cells[i]
		}
	} else {
		k := v6key(a)
		if i := sort.Search(len(ix.v6.starts), func(i int) bool { return k.less(ix.v6.starts[i]) }) - 1; i >= 0 {
			c = ix.v6.cells[i]
		}
	}
	best := c.tag(proto, port)
	if ord >= 0 && len(ix.pods.starts) > 0 {
		k := uint32(ord)
		if i := sort.Search(len(ix.pods.starts), func(i int) bool { return k < ix.pods.starts[i] }) - 1; i >= 0 {
			if t := ix.pods.cells[i].tag(proto, port); t >= 0 && (best < 0 || t < best) {
				best = t
			}
		}
	}
	return best
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
