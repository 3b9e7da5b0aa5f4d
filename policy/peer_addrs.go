package policy

import (
	"net/netip"
	"slices"
	"sort"

	"github.com/RoaringBitmap/roaring/v2"
	"k8s.io/apimachinery/pkg/labels"
)

// podAddrs is the set of addresses of the given pods. Addresses are
// gathered from per-slot arrays and sorted as integers: peers are resolved
// once each, but there are many, and some hold most pods.
func (s *state) podAddrs(pods *roaring.Bitmap) *AddrSet {
	if pods == nil || pods.IsEmpty() {
		return noAddrs
	}
	n := int(pods.GetCardinality())
	v4 := make([]uint32, 0, n)
	var v6 []u128
	var odd []AddrRange
	it := pods.Iterator()
	for it.HasNext() {
		x := it.Next()
		a4, a6 := s.addrs4[x], s.addrs6[x]
		if a4 != 0 {
			v4 = append(v4, a4)
		}
		if a6 != (u128{}) {
			v6 = append(v6, a6)
		}
		if s.addrsOdd.Contains(x) {
			for _, a := range s.slots[x].pod.IPs {
				odd = append(odd, AddrRange{a, a})
			}
		}
	}
	slices.Sort(v4)
	slices.SortFunc(v6, func(a, b u128) int { return cmp128(a, b) })
	out := make([]AddrRange, 0, len(v4)+len(v6))
	for i := 0; i < len(v4); {
		j := i
		for j+1 < len(v4) && v4[j+1] <= v4[j]+1 {
			j++
		}
		out = append(out, AddrRange{addr4(v4[i]), addr4(v4[j])})
		i = j + 1
	}
	for i := 0; i < len(v6); {
		j := i
		for j+1 < len(v6) && (v6[j+1] == v6[j] || v6[j+1] == v6[j].next()) {
			j++
		}
		out = append(out, AddrRange{addr6(v6[i]), addr6(v6[j])})
		i = j + 1
	}
	if len(odd) > 0 {
		return NewAddrSet(append(out, odd...)...)
	}
	return &AddrSet{ranges: out}
}

// setSlotAddrs records a pod's addresses in the per-slot arrays: one IPv4
// and one IPv6 address each; pods with more (or with none, or the zero
// address) are "odd" and read from the pod.
func (s *state) setSlotAddrs(ps *podState) {
	for uint32(len(s.addrs4)) <= ps.slot {
		s.addrs4 = append(s.addrs4, 0)
		s.addrs6 = append(s.addrs6, u128{})
	}
	s.addrs4[ps.slot], s.addrs6[ps.slot] = 0, u128{}
	s.addrsOdd.Remove(ps.slot)
	if !ps.podnet {
		return
	}
	var n4, n6 int
	for _, a := range ps.pod.IPs {
		if a.Is4() {
			n4++
			s.addrs4[ps.slot] = v4key(a)
		} else {
			n6++
			s.addrs6[ps.slot] = v6key(a)
		}
	}
	if n4 > 1 || n6 > 1 || n4 == 1 && s.addrs4[ps.slot] == 0 || n6 == 1 && s.addrs6[ps.slot] == (u128{}) {
		s.addrs4[ps.slot], s.addrs6[ps.slot] = 0, u128{}
		s.addrsOdd.Add(ps.slot)
	}
}

func addr4(k uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(k >> 24), byte(k >> 16), byte(k >> 8), byte(k)})
}

func addr6(k u128) netip.Addr {
	var b [16]byte
	for i := 0; i < 8; i++ {
		b[i] = byte(k.hi >> (56 - 8*i))
		b[8+i] = byte(k.lo >> (56 - 8*i))
	}
	return netip.AddrFrom16(b)
}

func (a u128) next() u128 {
	if a.lo == ^uint64(0) {
		return u128{a.hi + 1, 0}
	}
	return u128{a.hi, a.lo + 1}
}

// nodeAddrs is the set of addresses of the nodes a selector selects,
// less those a pod-network pod claims: a packet's source cannot tell the
// node from the pod, which is judged as the pod (as NodeLocalAddrs leaves
// such an address out), and a Node that lists a pod's address, a forged
// status of a compromised node among them, must not make `nodes` peers
// match that pod. nodeDiags warns of each. A pod taking or releasing such
// an address refreshes the peers (publish: nodeClaimsChanged).
func (s *state) nodeAddrs(sel labels.Selector) *AddrSet {
	var addrs []AddrRange
	for _, n := range s.nodes {
		if sel.Matches(labels.Set(n.Labels)) {
			for _, a := range n.Addrs {
				if a = a.Unmap(); s.ipOwners.count(a) == 0 {
					addrs = append(addrs, AddrRange{a, a})
				}
			}
		}
	}
	return NewAddrSet(addrs...)
}

// podsInRanges lists the pod-network pods with an address in set, by
// slot: where a named port resolves towards pods an ipBlock, networks or
// "all" peer matches by address.
func (s *state) podsInRanges(set *AddrSet) *roaring.Bitmap {
	out := roaring.New()
	if set.Empty() {
		return out
	}
	if s.addrIndex == nil {
		for a, o := range s.ipOwners.pairs() {
			s.addrIndex = append(s.addrIndex, slotAddr{a, o.slot})
		}
		sort.Slice(s.addrIndex, func(i, j int) bool { return s.addrIndex[i].a.Less(s.addrIndex[j].a) })
		if s.addrIndex == nil {
			s.addrIndex = []slotAddr{}
		}
	}
	for _, r := range set.Ranges() {
		i := sort.Search(len(s.addrIndex), func(i int) bool { return !s.addrIndex[i].a.Less(r.From) })
		for ; i < len(s.addrIndex) && !r.To.Less(s.addrIndex[i].a); i++ {
			out.Add(s.addrIndex[i].slot)
		}
	}
	return out
}
