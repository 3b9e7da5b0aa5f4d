package agent

import (
	"hash/maphash"
	"maps"
	"runtime"
	"slices"
	"sync"
	"weak"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// labelSets shares one labels map among the cached pods whose labels are
// equal. Pods of a workload carry the same labels, so a cluster has far
// fewer distinct label sets than pods, and a map of a few labels costs
// some 400 bytes; shared, the pod cache costs about half. The maps are
// read-only once interned (nothing in the agent or the policy compiler
// writes to a pod's labels; the compiler copies them when it must).
//
// The table holds its sets weakly, by a hash of their content: a set
// lives as long as a cached pod points at it, and its entry goes when the
// set is collected, so label churn leaves nothing behind.
type labelSets struct {
	mu   sync.Mutex
	seed maphash.Seed
	// byHash finds the sets by a hash of their content (colliding sets
	// share a slot); no key strings are kept.
	byHash map[uint64][]weak.Pointer[labelSet]
	// ports holds one shared value per numeric port policies name
	// (selectors.go); at most one per port number.
	ports map[int32]*intstr.IntOrString
}

// labelSet is one interned labels map. Pods keep a pointer to it so that
// it stays alive while they use its map.
type labelSet struct {
	m map[string]string
}

func newLabelSets() *labelSets {
	return &labelSets{seed: maphash.MakeSeed(), byHash: map[uint64][]weak.Pointer[labelSet]{}, ports: map[int32]*intstr.IntOrString{}}
}

// intern returns the shared set equal to l, making l the shared one if
// there is none. It returns nil for no labels.
func (t *labelSets) intern(l map[string]string) *labelSet {
	if len(l) == 0 {
		return nil
	}
	h := t.hash(l)
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, wp := range t.byHash[h] {
		if s := wp.Value(); s != nil && maps.Equal(s.m, l) {
			return s
		}
	}
	s := &labelSet{m: l}
	t.byHash[h] = append(t.byHash[h], weak.Make(s))
	runtime.AddCleanup(s, t.forget, h)
	return s
}

// forget drops the entries of collected sets under a hash.
func (t *labelSets) forget(h uint64) {
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

func (t *labelSets) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, wps := range t.byHash {
		n += len(wps)
	}
	return n
}

// hash is equal for equal maps: the sorted pairs, each key and value
// followed by a NUL (which label keys and values cannot contain).
func (t *labelSets) hash(l map[string]string) uint64 {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var h maphash.Hash
	h.SetSeed(t.seed)
	for _, k := range keys {
		h.WriteString(k)
		h.WriteByte(0)
		h.WriteString(l[k])
		h.WriteByte(0)
	}
	return h.Sum64()
}
