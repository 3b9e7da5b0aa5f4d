package policy

// cowMap is a map that Programs share copy-on-write: a version is a base
// map, never changed once shared, plus a small map of the changes made
// since. A new version copies only the changes, and folds them into a new
// base when they grow past a sixteenth of it, so an update costs amortised
// constant time and every earlier version stays valid.
type cowMap[K comparable, V any] struct {
	base  map[K]V
	delta map[K]cowEntry[V]
}

type cowEntry[V any] struct {
	v       V
	deleted bool
}

func newCOWMap[K comparable, V any](base map[K]V) *cowMap[K, V] {
	return &cowMap[K, V]{base: base}
}

func (m *cowMap[K, V]) get(k K) (V, bool) {
	if e, ok := m.delta[k]; ok {
		return e.v, !e.deleted
	}
	v, ok := m.base[k]
	return v, ok
}

// keys calls yield for each key of this version, in no order, until it
// returns false.
func (m *cowMap[K, V]) keys(yield func(K) bool) {
	for k := range m.base {
		if _, changed := m.delta[k]; !changed && !yield(k) {
			return
		}
	}
	for k, e := range m.delta {
		if !e.deleted && !yield(k) {
			return
		}
	}
}

// with returns a new version with the changes applied (nil: deleted).
func (m *cowMap[K, V]) with(changes map[K]*V) *cowMap[K, V] {
	if len(changes) == 0 {
		return m
	}
	out := &cowMap[K, V]{base: m.base, delta: make(map[K]cowEntry[V], len(m.delta)+len(changes))}
	for k, e := range m.delta {
		out.delta[k] = e
	}
	for k, v := range changes {
		if v == nil {
			out.delta[k] = cowEntry[V]{deleted: true}
		} else {
			out.delta[k] = cowEntry[V]{v: *v}
		}
	}
	if len(out.delta) > max(64, len(out.base)/16) {
		base := make(map[K]V, len(out.base)+len(out.delta))
		for k, v := range out.base {
			base[k] = v
		}
		for k, e := range out.delta {
			if e.deleted {
				delete(base, k)
			} else {
				base[k] = e.v
			}
		}
		out.base, out.delta = base, nil
	}
	return out
}
