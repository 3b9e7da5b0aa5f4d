package policy

import (
	"slices"
	"strings"
)

// podProj is a pod's projection onto one interned key list.
type podProj struct{ keys, proj int32 }

// proj interns the projection of labels onto keys (sorted): the part of a
// label set that selectors reading only those keys can see.
func (s *state) proj(l map[string]string, keys []string) int32 {
	if len(keys) == 0 || len(l) == 0 {
		return 0
	}
	buf := s.projBuf[:0]
	for _, k := range keys {
		if v, ok := l[k]; ok {
			buf = append(buf, k...)
			buf = append(buf, 0)
			buf = append(buf, v...)
			buf = append(buf, 1)
		}
	}
	s.projBuf = buf
	if id, ok := s.projIDs[string(buf)]; ok {
		return id
	}
	m := map[string]string{}
	for _, k := range keys {
		if v, ok := l[k]; ok {
			m[k] = v
		}
	}
	id := int32(len(s.projs))
	s.projIDs[string(buf)] = id
	s.projs = append(s.projs, m)
	return id
}

// projOf is a pod's projection onto an interned key list, cached on the
// pod: the Admin and Baseline tiers (and NetworkPolicy tiers) often read
// the same keys. keys is the list's id from internKeys; a pod's labels
// changing resets the cache (updatePod).
func (s *state) projOf(ps *podState, keys int32) int32 {
	for i := range ps.projs {
		if ps.projs[i].keys == keys+1 {
			return ps.projs[i].proj
		}
	}
	p := s.proj(ps.pod.Labels, s.keyLists[keys])
	ps.projs[1] = ps.projs[0]
	ps.projs[0] = podProj{keys + 1, p}
	return p
}

// internKeys interns a sorted key list.
func (s *state) internKeys(keys []string) int32 {
	k := strings.Join(keys, "\x00")
	if id, ok := s.keyIDs[k]; ok {
		return id
	}
	id := int32(len(s.keyLists))
	s.keyIDs[k] = id
	s.keyLists = append(s.keyLists, keys)
	return id
}

// namedSig is what a pod's named container ports resolve to, restricted to
// some names: pods with the same signature resolve named-port rules alike.
type namedSig struct {
	id    int32
	ports []ContainerPort
}

func (s *state) internSig(ports []ContainerPort) int32 {
	if len(ports) == 0 {
		return 0
	}
	buf := s.projBuf[:0]
	for _, p := range ports {
		buf = append(buf, p.Name...)
		buf = append(buf, 0, byte(p.Protocol), byte(p.Port>>8), byte(p.Port), 1)
	}
	s.projBuf = buf
	if id, ok := s.sigIDs[string(buf)]; ok {
		return id
	}
	id := int32(len(s.sigs))
	s.sigIDs[string(buf)] = id
	s.sigs = append(s.sigs, &namedSig{id: id, ports: slices.Clone(ports)})
	return id
}

// podSig interns all named ports of a pod, sorted.
func (s *state) podSig(p *Pod) int32 {
	ports := s.sigBuf[:0]
	for _, cp := range p.Ports {
		if cp.Name != "" {
			ports = append(ports, cp)
		}
	}
	cmpPort := func(a, b ContainerPort) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		if a.Protocol != b.Protocol {
			return int(a.Protocol) - int(b.Protocol)
		}
		return int(a.Port) - int(b.Port)
	}
	if !slices.IsSortedFunc(ports, cmpPort) {
		slices.SortFunc(ports, cmpPort)
	}
	ports = slices.Compact(ports)
	s.sigBuf = ports
	return s.internSig(ports)
}

// internNames interns a set of port names.
func (s *state) internNames(set counts) int32 {
	if len(set) == 0 {
		return 0
	}
	list := set.keys()
	key := strings.Join(list, "\x00")
	if id, ok := s.namesIDs[key]; ok {
		return id
	}
	id := int32(len(s.names))
	s.namesIDs[key] = id
	s.names = append(s.names, list)
	return id
}

// sigFor restricts a pod's signature to some names.
func (s *state) sigFor(full, names int32) int32 {
	if full == 0 || names == 0 {
		return 0
	}
	k := [2]int32{full, names}
	if id, ok := s.sigMemo[k]; ok {
		return id
	}
	var ports []ContainerPort
	for _, p := range s.sigs[full].ports {
		if _, ok := slices.BinarySearch(s.names[names], p.Name); ok {
			ports = append(ports, p)
		}
	}
	id := s.internSig(ports)
	s.sigMemo[k] = id
	return id
}
