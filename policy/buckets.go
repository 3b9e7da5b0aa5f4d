package policy

import "sort"

// buckets narrow the search for the segment of a key in a 32-bit key
// space to one cache line: the keys from the first start on are cut into
// buckets of 1<<shift keys, and lines[b] holds the segments that bucket b
// meets (the one holding its first key, then those starting in it),
// start and cell side by side. A lookup reads the line and nothing else
// of the segments, unless the bucket met more than a line holds, when it
// searches those segments in the flat list. A binary search over the
// segments of pods picked by selectors (up to ~130,000 runs of pod
// ordinals at 100,000 pods) missed the CPU cache at nearly every step
// once thousands of indexes were in use; a table of segment numbers
// beside the flat list still cost two or three misses (the table, then
// the segments, often across a line).
type buckets struct {
	base  uint32
	shift uint8
	// tailNil: no term covers the keys past the last start, so that a
	// key there is answered without reading the flat list.
	tailNil bool
	lines   []bucketLine
}

// lineSegs is how many segments a bucketLine holds: with the count and
// the overflow's first segment, 64 bytes, one cache line.
const lineSegs = 7

// bucketLine is one bucket's segments: start[j] and cell[j] for j < n,
// in key order, entry 0 being the segment that holds the bucket's first
// key. n < 0 marks a bucket that meets more segments than a line holds:
// they are segs[lo:start[0]] of the flat list.
type bucketLine struct {
	start [lineSegs]uint32
	cell  [lineSegs]int32
	n     int32
	lo    int32
}

// segsPerBucket is the average number of segments a bucket meets: with
// segments spread evenly, about 3% of buckets (Poisson) meet more than
// a line holds. The lines cost about 21 bytes per segment besides the
// flat list's 8.
const segsPerBucket = 3

// newBuckets makes the lines of segments s.
func newBuckets(s segments[uint32]) buckets {
	var out buckets
	n := len(s)
	if n == 0 {
		return out
	}
	out.base = s[0].start
	span := uint64(s[n-1].start - out.base)
	for span>>out.shift >= uint64(max(1, n/segsPerBucket)) {
		out.shift++
	}
	out.tailNil = s[n-1].cell < 0
	out.lines = make([]bucketLine, span>>out.shift+1)
	i := 0 // the segment that holds the bucket's first key
	for b := range out.lines {
		first := uint64(out.base) + uint64(b)<<out.shift
		last := min(first+(1<<out.shift)-1, uint64(^uint32(0)))
		for i+1 < n && uint64(s[i+1].start) <= first {
			i++
		}
		j := i // the segment that holds the bucket's last key
		for j+1 < n && uint64(s[j+1].start) <= last {
			j++
		}
		l := &out.lines[b]
		if j-i+1 > lineSegs {
			l.n, l.lo, l.start[0] = -1, int32(i), uint32(j+1)
			continue
		}
		for k := i; k <= j; k++ {
			l.start[k-i], l.cell[k-i] = s[k].start, s[k].cell
		}
		l.n = int32(j - i + 1)
	}
	return out
}

// find returns the cell of the segment of *flat (the list the buckets
// were made of) that holds k: -1 when none does, or k is before the
// first start. The list is passed by pointer, and read only past the
// last start or in a bucket that overflowed: its header is in another
// cache line of the index than the buckets'.
func (b *buckets) find(flat *segments[uint32], k uint32) int32 {
	if len(b.lines) == 0 || k < b.base {
		return -1
	}
	i := uint64(k-b.base) >> b.shift
	if i >= uint64(len(b.lines)) {
		if b.tailNil {
			return -1
		}
		s := *flat
		return s[len(s)-1].cell // past the last start
	}
	l := &b.lines[i]
	if l.n < 0 {
		s := *flat
		lo, hi := int(l.lo), int(l.start[0])
		return s[lo+sort.Search(hi-lo-1, func(j int) bool { return k < s[lo+1+j].start })].cell
	}
	j := 1
	for j < int(l.n) && l.start[j] <= k {
		j++
	}
	return l.cell[j-1]
}
