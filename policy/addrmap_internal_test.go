package policy

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// addrMap and addrCOW (IPv4 under 4-byte keys) behave exactly as a
// map[netip.Addr] under random sets and deletes of IPv4, IPv6,
// IPv4-mapped and zoned addresses: a wrong or lost owner here would give
// a flow the wrong pod's policy.
func TestAddrMapAgreesWithAMapOfAddrs(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	addr := func() netip.Addr {
		b := byte(r.IntN(16))
		switch r.IntN(5) {
		case 0:
			return netip.AddrFrom16([16]byte{0xfd, 15: b})
		case 1:
			return netip.AddrFrom16(netip.AddrFrom4([4]byte{10, 0, 0, b}).As16()) // mapped
		case 2:
			return netip.AddrFrom16([16]byte{0xfe, 0x80, 15: b}).WithZone("eth0")
		case 3:
			return netip.AddrFrom4([4]byte{0, 0, 0, b}) // 0.0.0.x: key 0 included
		}
		return netip.AddrFrom4([4]byte{10, 0, 0, b})
	}
	ref := map[netip.Addr]int{}
	m := newAddrMap[int](0)
	cow := newAddrCOW(newAddrMap[int](0))
	refs := []map[netip.Addr]int{}
	cows := []*addrCOW[int]{}
	for step := range 3000 {
		changes := map[netip.Addr]*int{}
		for range 1 + r.IntN(4) {
			a := addr()
			if r.IntN(3) == 0 {
				delete(ref, a)
				m.delete(a)
				changes[a] = nil
			} else {
				v := step
				ref[a] = v
				m.set(a, v)
				changes[a] = &v
			}
		}
		cow = cow.with(changes)
		refs, cows = append(refs, maps.Clone(ref)), append(cows, cow)
		if m.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", step, m.len(), len(ref))
		}
		got := map[netip.Addr]int{}
		for a, v := range m.all() {
			if _, dup := got[a]; dup {
				t.Fatalf("step %d: %v yielded twice", step, a)
			}
			got[a] = v
		}
		if !maps.Equal(got, ref) {
			t.Fatalf("step %d: all() = %v, want %v", step, got, ref)
		}
	}
	// Every version answers as the map did then, for every address.
	for i, c := range cows {
		for range 40 {
			a := addr()
			want, wok := refs[i][a]
			v, ok := c.get(a)
			if ok != wok || v != want {
				t.Fatalf("version %d: get(%v) = %d %v, want %d %v", i, a, v, ok, want, wok)
			}
			if v, ok := m.get(a); i == len(cows)-1 && (ok != wok || v != want) {
				t.Fatalf("get(%v) = %d %v, want %d %v", a, v, ok, want, wok)
			}
		}
	}
}

// TestCOWMapKeys: keys lists exactly the keys of a version, through
// changes and deletions on top of the shared base and after they are
// folded into a new one.
func TestCOWMapKeys(t *testing.T) {
	want := map[int]bool{}
	base := map[int]int{}
	for i := range 100 {
		base[i], want[i] = i, true
	}
	m := newCOWMap(base)
	one := 1
	for round := range 300 {
		k := (round * 37) % 250
		if want[k] && round%3 == 0 {
			m = m.with(map[int]*int{k: nil})
			delete(want, k)
		} else {
			m = m.with(map[int]*int{k: &one})
			want[k] = true
		}
		got := map[int]bool{}
		m.keys(func(k int) bool {
			if got[k] {
				t.Fatalf("round %d: key %d listed twice", round, k)
			}
			got[k] = true
			return true
		})
		if len(got) != len(want) {
			t.Fatalf("round %d: %d keys, want %d", round, len(got), len(want))
		}
		for k := range want {
			if !got[k] {
				t.Fatalf("round %d: key %d missing", round, k)
			}
		}
	}
}
