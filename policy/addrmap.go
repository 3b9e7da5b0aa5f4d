package policy

import (
	"iter"
	"net/netip"
)

// addrMap is a map keyed by address that keeps IPv4 addresses, nearly all
// pod addresses, under 4-byte keys rather than netip.Addr's 24 bytes: the
// compiler holds one entry per pod address (owners, the Program's
// address table), and in a map keyed by netip.Addr the key is most of the
// entry. Every other address (IPv6, IPv4-mapped IPv6, zoned) is kept
// under the address itself, so keys mean exactly what they do in a
// map[netip.Addr]V: an IPv4 address and its IPv4-mapped form stay
// distinct.
type addrMap[V any] struct {
	v4    map[uint32]V
	other map[netip.Addr]V
}

func newAddrMap[V any](n int) addrMap[V] {
	return addrMap[V]{v4: make(map[uint32]V, n), other: map[netip.Addr]V{}}
}

func (m *addrMap[V]) get(a netip.Addr) (V, bool) {
	if a.Is4() {
		v, ok := m.v4[v4key(a)]
		return v, ok
	}
	v, ok := m.other[a]
	return v, ok
}

func (m *addrMap[V]) set(a netip.Addr, v V) {
	if a.Is4() {
		m.v4[v4key(a)] = v
	} else {
		m.other[a] = v
	}
}

func (m *addrMap[V]) delete(a netip.Addr) {
	if a.Is4() {
		delete(m.v4, v4key(a))
	} else {
		delete(m.other, a)
	}
}

func (m *addrMap[V]) len() int { return len(m.v4) + len(m.other) }

// all yields every address with its value.
func (m *addrMap[V]) all() iter.Seq2[netip.Addr, V] {
	return func(yield func(netip.Addr, V) bool) {
		for k, v := range m.v4 {
			if !yield(addr4(k), v) {
				return
			}
		}
		for a, v := range m.other {
			if !yield(a, v) {
				return
			}
		}
	}
}

// addrCOW is the copy-on-write map (cowMap) of the Program's address
// table, split as addrMap is: IPv4 addresses under 4-byte keys.
type addrCOW[V any] struct {
	v4    *cowMap[uint32, V]
	other *cowMap[netip.Addr, V]
}

func newAddrCOW[V any](base addrMap[V]) *addrCOW[V] {
	return &addrCOW[V]{v4: newCOWMap(base.v4), other: newCOWMap(base.other)}
}

func (m *addrCOW[V]) get(a netip.Addr) (V, bool) {
	if a.Is4() {
		return m.v4.get(v4key(a))
	}
	return m.other.get(a)
}

// with returns a new version with the changes applied (nil: deleted).
func (m *addrCOW[V]) with(changes map[netip.Addr]*V) *addrCOW[V] {
	if len(changes) == 0 {
		return m
	}
	var c4 map[uint32]*V
	var c6 map[netip.Addr]*V
	for a, v := range changes {
		if a.Is4() {
			if c4 == nil {
				c4 = map[uint32]*V{}
			}
			c4[v4key(a)] = v
		} else {
			if c6 == nil {
				c6 = map[netip.Addr]*V{}
			}
			c6[a] = v
		}
	}
	return &addrCOW[V]{v4: m.v4.with(c4), other: m.other.with(c6)}
}
