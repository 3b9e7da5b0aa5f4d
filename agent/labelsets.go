package agent

import (
	"runtime"
	"slices"
	"strings"
	"sync"
	"weak"
)

// labelSets shares one labels map among the cached pods whose labels are
// equal. Pods of a workload carry the same labels, so a cluster has far
// fewer distinct label sets than pods, and a map of a few labels costs
// some 400 bytes; shared, the pod cache costs about half. The maps are
// read-only once interned (nothing in the agent or the policy compiler
// writes to a pod's labels; the compiler copies them when it must).
//
// The table holds its sets weakly: a set lives as long as a cached pod
// points at it, and its entry goes when the set is collected, so label
// churn leaves nothing behind.
type labelSets struct {
	mu    sync.Mutex
	byKey map[string]weak.Pointer[labelSet]
}

// labelSet is one interned labels map. Pods keep a pointer to it so that
// it stays alive while they use its map.
type labelSet struct {
	m map[string]string
}

func newLabelSets() *labelSets {
	return &labelSets{byKey: map[string]weak.Pointer[labelSet]{}}
}

// intern returns the shared set equal to l, making l the shared one if
// there is none. It returns nil for no labels.
func (t *labelSets) intern(l map[string]string) *labelSet {
	if len(l) == 0 {
		return nil
	}
	key := canonicalLabels(l)
	t.mu.Lock()
	defer t.mu.Unlock()
	if wp, ok := t.byKey[key]; ok {
		if s := wp.Value(); s != nil {
			return s
		}
	}
	s := &labelSet{m: l}
	t.byKey[key] = weak.Make(s)
	runtime.AddCleanup(s, t.forget, key)
	return s
}

// forget drops a collected set's entry, unless a new set took its key.
func (t *labelSets) forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if wp, ok := t.byKey[key]; ok && wp.Value() == nil {
		delete(t.byKey, key)
	}
}

func (t *labelSets) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}

// canonicalLabels is a string equal for equal maps: the sorted pairs,
// separated by NUL (which label keys and values cannot contain).
func canonicalLabels(l map[string]string) string {
	keys := make([]string, 0, len(l))
	n := 0
	for k, v := range l {
		keys = append(keys, k)
		n += len(k) + len(v) + 2
	}
	slices.Sort(keys)
	var b strings.Builder
	b.Grow(n)
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(l[k])
		b.WriteByte(0)
	}
	return b.String()
}
