package agent

import (
	"hash/maphash"
	"runtime"
	"sync"
	"weak"
)

// interned is one value shared by every cached object holding an equal
// one. Holders keep a pointer to it so that it stays alive while they use
// its value; the value is read-only once interned.
type interned[T any] struct{ v T }

// internTable shares equal values among cached objects. It holds them
// weakly, by a hash of their content (colliding values share a slot, and
// no key strings are kept): a value lives as long as an object points at
// it, and its entry goes when it is collected, so churn leaves nothing
// behind.
type internTable[T any] struct {
	seed  maphash.Seed
	hash  func(h *maphash.Hash, v T) // writes what equal compares
	equal func(a, b T) bool

	mu     sync.Mutex
	byHash map[uint64][]weak.Pointer[interned[T]]
}

func newInternTable[T any](hash func(*maphash.Hash, T), equal func(a, b T) bool) *internTable[T] {
	return &internTable[T]{seed: maphash.MakeSeed(), hash: hash, equal: equal, byHash: map[uint64][]weak.Pointer[interned[T]]{}}
}

// intern returns the shared value equal to v, making v the shared one if
// there is none.
func (t *internTable[T]) intern(v T) *interned[T] {
	var mh maphash.Hash
	mh.SetSeed(t.seed)
	t.hash(&mh, v)
	h := mh.Sum64()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, wp := range t.byHash[h] {
		if s := wp.Value(); s != nil && t.equal(s.v, v) {
			return s
		}
	}
	s := &interned[T]{v: v}
	t.byHash[h] = append(t.byHash[h], weak.Make(s))
	runtime.AddCleanup(s, t.forget, h)
	return s
}

// forget drops the entries of collected values under a hash.
func (t *internTable[T]) forget(h uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	live := t.byHash[h][:0]
	for _, wp := range t.byHash[h] {
		if wp.Value() != nil {
			live = append(live, wp)
		}
	}
	if len(live) == 0 {
		delete(t.byHash, h)
	} else {
		t.byHash[h] = live
	}
}

// len counts the values held, collected or not yet forgotten.
func (t *internTable[T]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, wps := range t.byHash {
		n += len(wps)
	}
	return n
}
