package nft

import (
	"cmp"

	"github.com/moat-net/moat/policy"
)

// setDiff lists the elements of a set that only old has (del, in old's
// order) and those only cur has (add, in cur's order). A set's elements
// are kept sorted, so one walk of both lists finds them and only the
// changed elements are rendered: a peer's set of thousands of addresses
// changes by one or two when a pod comes, goes or is relabelled, and
// rendering every key of both versions was most of what a sync allocated.
// Should a list not be in the order the walk expects, it falls back to
// comparing every rendered key.
func setDiff(old, cur *namedSet) (del, add [][]string) {
	switch cur.Kind {
	case services:
		return diffSorted(old.Services, cur.Services, cmpService, serviceKey)
	case addr4, addr6:
		return diffSorted(old.Addrs, cur.Addrs, cmpAddrRange, cur.addrKey)
	}
	if old.PortMajor != cur.PortMajor {
		return diffKeys(renderKeys(old.Boxes, boxKey), renderKeys(cur.Boxes, boxKey))
	}
	return diffSorted(old.Boxes, cur.Boxes, cur.boxOrder(), boxKey)
}

// boxOrder is the order of a ports set's boxes (namedSet.Boxes).
func (s *namedSet) boxOrder() func(a, b box) int {
	if s.PortMajor {
		return cmpBoxPortMajor
	}
	return cmpBox
}

func diffSorted[T any](old, cur []T, compare func(a, b T) int, key func(T) []string) (del, add [][]string) {
	if !strictlySorted(old, compare) || !strictlySorted(cur, compare) {
		return diffKeys(renderKeys(old, key), renderKeys(cur, key))
	}
	i, j := 0, 0
	for i < len(old) || j < len(cur) {
		c := 0
		switch {
		case i == len(old):
			c = 1
		case j == len(cur):
			c = -1
		default:
			c = compare(old[i], cur[j])
		}
		switch {
		case c < 0:
			del = append(del, key(old[i]))
			i++
		case c > 0:
			add = append(add, key(cur[j]))
			j++
		default:
			i++
			j++
		}
	}
	return del, add
}

// strictlySorted: in ascending order without repeats, as diffSorted's
// walk needs.
func strictlySorted[T any](s []T, compare func(a, b T) int) bool {
	for i := 1; i < len(s); i++ {
		if compare(s[i-1], s[i]) >= 0 {
			return false
		}
	}
	return true
}

func cmpAddrRange(a, b policy.AddrRange) int {
	if c := a.From.Compare(b.From); c != 0 {
		return c
	}
	return a.To.Compare(b.To)
}

func cmpPortRange(a, b policy.PortRange) int {
	return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To))
}

func cmpService(a, b service) int {
	return cmp.Or(cmp.Compare(a.Proto, b.Proto), cmpPortRange(a.Ports, b.Ports))
}

func cmpBox(a, b box) int {
	return cmp.Or(cmpAddrRange(a.Addrs, b.Addrs), cmp.Compare(a.Proto, b.Proto), cmpPortRange(a.Ports, b.Ports))
}

func cmpBoxPortMajor(a, b box) int {
	return cmp.Or(cmp.Compare(a.Proto, b.Proto), cmpPortRange(a.Ports, b.Ports), cmpAddrRange(a.Addrs, b.Addrs))
}
