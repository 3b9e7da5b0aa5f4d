package agent

import (
	"encoding/binary"
	"maps"
	"slices"

	"github.com/moat-net/moat/policy"
)

// Labels no selector reads. Pods carry labels for their controllers and
// tools (pod-template-hash, a chart's labels, a StatefulSet's pod name)
// that no policy selects on, and those make nearly every pod's label set
// distinct, so that the sharing of equal sets (labelsets.go) does little:
// in a 30,000-pod cluster they were the largest part of the pod cache.
// The pod cache therefore keeps, of each pod's labels, a map of the keys
// policies read (the keySet when the pod arrived), shared with every pod
// that agrees on those, and the other labels packed into one string.
//
// When policies come to read a key that was packed away, no information
// is lost: the compiler gets each pod's labels through labelsFor, which
// unpacks and projects again for the current keys when the pod was cached
// under other ones; the key-set growth already makes that sync a full
// compilation (labelkeys.go). The projection never decides a verdict:
// selectors only read keys in the set, and a pod always carries every one
// of them it has.

// split returns the labels of l whose keys are in s, and the others
// packed; l itself when all its keys are in s.
func (s *keySet) split(l map[string]string) (read map[string]string, rest string) {
	if s == nil {
		return l, ""
	}
	var other []string
	for k := range l {
		if _, ok := (*s)[k]; !ok {
			other = append(other, k)
		}
	}
	if len(other) == 0 {
		return l, ""
	}
	slices.Sort(other)
	var b []byte
	for _, k := range other {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		v := l[k]
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	if len(other) < len(l) {
		read = make(map[string]string, len(l)-len(other))
		for k, v := range l {
			if _, ok := (*s)[k]; ok {
				read[k] = v
			}
		}
	}
	return read, string(b)
}

// unpack adds the labels packed by split to m.
func unpack(rest string, m map[string]string) {
	for len(rest) > 0 {
		k := next(&rest)
		m[k] = next(&rest)
	}
}

// next reads one length-prefixed string off *rest. The input is always
// split's output, so a short read cannot happen; it stops the loop if it
// did.
func next(rest *string) string {
	n, w := binary.Uvarint([]byte((*rest)[:min(len(*rest), binary.MaxVarintLen64)]))
	if w <= 0 || uint64(len(*rest)-w) < n {
		*rest = ""
		return ""
	}
	s := (*rest)[w : w+int(n)]
	*rest = (*rest)[w+int(n):]
	return s
}

// projectedFor reports whether the cached labels are already what the
// compiler needs under keys: cached under keys, or nothing packed away.
func (p *cachedPod) projectedFor(keys *keySet) bool { return p.rest == "" || p.keys == keys }

// labelsFor returns the pod's labels as the compiler needs them under the
// key set keys (nil: every label): the cached map when the pod was cached
// under keys or packed nothing away, else the labels unpacked and
// projected again.
func (p *cachedPod) labelsFor(keys *keySet) map[string]string {
	if p.projectedFor(keys) {
		return p.Labels
	}
	all := maps.Clone(p.Labels)
	if all == nil {
		all = map[string]string{}
	}
	unpack(p.rest, all)
	read, _ := keys.split(all)
	return read
}

// podFor returns the pod as the compiler needs it under keys: the cached
// one itself (cached pods are never changed, so the compiler may keep it)
// unless its labels must be projected again.
func (p *cachedPod) podFor(keys *keySet) *policy.Pod {
	if p.projectedFor(keys) {
		return &p.Pod
	}
	pod := p.Pod
	pod.Labels = p.labelsFor(keys)
	return &pod
}
