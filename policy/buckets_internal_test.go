package policy

import (
	"math/rand/v2"
	"sort"
	"testing"
)

// TestBucketsFind checks the bucket table against a plain binary search,
// on segments dense, sparse, clustered and reaching the top of the key
// space, and on keys before, between, at and past every start.
func TestBucketsFind(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	overflows := 0
	cases := map[string]func(n int) []uint32{
		"dense": func(n int) []uint32 {
			out := make([]uint32, n)
			for i := range out {
				out[i] = uint32(i)
			}
			return out
		},
		"scattered": func(n int) []uint32 {
			out := make([]uint32, n)
			for i := range out {
				out[i] = r.Uint32()
			}
			return out
		},
		"clustered": func(n int) []uint32 {
			out := make([]uint32, n)
			for i := range out {
				if i%10 == 0 {
					out[i] = r.Uint32()
				} else {
					out[i] = 0x0a000000 + r.Uint32N(4096)
				}
			}
			return out
		},
		"top": func(n int) []uint32 {
			out := make([]uint32, n)
			for i := range out {
				out[i] = ^uint32(0) - r.Uint32N(uint32(4*n))
			}
			if n > 0 {
				out[0] = 0
			}
			return out
		},
	}
	for name, gen := range cases {
		for _, n := range []int{0, 1, 63, 64, 65, 1000, 50000} {
			starts := gen(n)
			starts = slices32(starts)
			var segs segments[uint32]
			for i, s := range starts {
				segs = append(segs, seg[uint32]{s, int32(i)}) // a cell per segment: find names the segment
			}
			b := newBuckets(segs)
			if len(b.lines) > max(1, len(starts)/segsPerBucket) {
				t.Fatalf("%s n=%d: %d lines", name, n, len(b.lines))
			}
			for _, l := range b.lines {
				if l.n < 0 {
					overflows++
				}
			}
			probe := func(k uint32) {
				want := int32(sort.Search(len(starts), func(i int) bool { return k < starts[i] }) - 1)
				if got := b.find(&segs, k); got != want {
					t.Fatalf("%s n=%d: find(%#x) = %d, want %d", name, n, k, got, want)
				}
			}
			for _, s := range starts {
				probe(s)
				probe(s - 1)
				probe(s + 1)
			}
			for range 2000 {
				probe(r.Uint32())
			}
			probe(0)
			probe(^uint32(0))
		}
	}
	if overflows == 0 {
		t.Fatal("no bucket met more segments than a line holds: the overflow search went untested")
	}
}

// slices32 sorts and dedups in place (segments have distinct starts).
func slices32(s []uint32) []uint32 {
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != out[len(out)-1] {
			out = append(out, v)
		}
	}
	return out
}
