package policy

import "sort"

// buckets are segments of a 32-bit key space with a table that narrows
// the search: the keys from the first start on are cut into buckets of
// 1<<shift keys, and first[b] is the segment that holds bucket b's first
// key. A lookup reads one entry of the table and searches the few starts
// between it and the next bucket's. A plain binary search over the
// segments of pods picked by selectors (up to ~80,000 runs of scattered
// pod ordinals at 100,000 pods) missed the CPU cache at nearly every
// step once thousands of indexes were in use.
type buckets struct {
	segs  segments[uint32]
	base  uint32
	shift uint8
	first []int32
}

// runsPerBucket is the average number of starts a bucket covers: the
// table costs a byte per segment, and a lookup searches about a cache
// line of starts.
const runsPerBucket = 4

// newBuckets adds the table to s when s is long enough for a binary
// search to leave the cache.
func newBuckets(s segments[uint32]) buckets {
	out := buckets{segs: s}
	n := len(s)
	if n < 16*runsPerBucket {
		return out
	}
	out.base = s[0].start
	span := uint64(s[n-1].start - out.base)
	for span>>out.shift >= uint64(n/runsPerBucket) {
		out.shift++
	}
	// One bucket past the last start's, so that first[b+1] always
	// exists for a key up to the last start.
	out.first = make([]int32, span>>out.shift+2)
	i := 0
	for b := range out.first {
		key := uint64(out.base) + uint64(b)<<out.shift
		for i+1 < n && uint64(s[i+1].start) <= key {
			i++
		}
		out.first[b] = int32(i)
	}
	return out
}

// find returns the segment that holds k, or -1 before the first start.
func (s *buckets) find(k uint32) int {
	segs := s.segs
	if len(segs) == 0 || k < segs[0].start {
		return -1
	}
	if s.first == nil {
		return sort.Search(len(segs), func(i int) bool { return k < segs[i].start }) - 1
	}
	b := uint64(k-s.base) >> s.shift
	if b+1 >= uint64(len(s.first)) {
		return len(segs) - 1
	}
	// The segment is between the one holding bucket b's first key and
	// the one holding the next bucket's.
	lo, hi := int(s.first[b]), int(s.first[b+1])
	return lo + sort.Search(hi-lo, func(j int) bool { return k < segs[lo+1+j].start })
}
