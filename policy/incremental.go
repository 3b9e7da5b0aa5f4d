package policy

import (
	"maps"
	"slices"
)

// Compiler compiles a snapshot and keeps what it learned, so that the most
// frequent change in a cluster, a pod's labels, is applied in time
// proportional to the policies that pod touches rather than to the cluster.
// Programs it returned earlier stay valid and unchanged (copy on write).
// A Compiler is not safe for concurrent use.
type Compiler struct {
	k *compiler
}

// NewCompiler compiles c fully.
func NewCompiler(c *Cluster, opts Options) *Compiler {
	return &Compiler{k: newCompiler(c, opts)}
}

// Program is the latest compiled Program.
func (c *Compiler) Program() *Program { return c.k.prog }

// RelabelPod replaces the labels of pod "namespace/name" and returns the
// new Program. ok is false when the pod is unknown; callers then compile the
// new snapshot in full.
func (c *Compiler) RelabelPod(key string, labels map[string]string) (prog *Program, ok bool) {
	k := c.k
	i, ok := k.prog.podByKey[key]
	if !ok {
		return nil, false
	}
	next := *k.prog
	next.Pods = slices.Clone(k.prog.Pods)
	next.Pods[i].Labels = maps.Clone(labels)
	next.Policies = slices.Clone(k.prog.Policies)
	k.prog = &next
	if !k.isPoliced[i] {
		// Host-network pods and pods without an address are neither
		// subjects nor selector peers: labels change nothing.
		return k.prog, true
	}
	pod := &next.Pods[i]

	// 1. Selector peers and subjects whose membership flips.
	dirty := map[string]bool{}
	for key, def := range k.peerDefs {
		pe := k.peerCache[key]
		pos, was := slices.BinarySearch(pe.pods, i)
		now := def.selects(k, pod)
		if was == now {
			continue
		}
		pods := slices.Clone(pe.pods)
		if now {
			pods = slices.Insert(pods, pos, i)
			pe.addrs = pe.addrs.Union(AddrsOf(pod.IPs...))
		} else {
			pods = slices.Delete(pods, pos, pos+1)
			pe.addrs = pe.addrs.Subtract(AddrsOf(pod.IPs...))
		}
		pe.pods = pods
		k.peerCache[key] = pe
		dirty[key] = true
	}
	if len(dirty) == 0 {
		return k.prog, true
	}

	// 2. Policies whose subject or rules use a changed peer.
	var changed []string
	affected := map[int]bool{} // pods to reassemble
	affected[i] = true
	reunion := func(parts []peer) (peerSet, bool) {
		hit := false
		for j, p := range parts {
			if p.key != "" && dirty[p.key] {
				parts[j] = k.peerCache[p.key]
				hit = true
			}
		}
		if !hit {
			return peerSet{}, false
		}
		return unionPeers(parts), true
	}
	// subject re-reads a policy's selection when its subject changed.
	subject := func(key string, selected *[]int) bool {
		if key == "" || !dirty[key] {
			return false
		}
		*selected = k.peerCache[key].pods
		return true
	}
	// mark records a changed policy and the pods it selects.
	mark := func(tag string, selected []int) {
		changed = append(changed, tag)
		for _, p := range selected {
			affected[p] = true
		}
	}
	for ci, cp := range k.cnps {
		touched := subject(cp.subjectKey, &cp.selected)
		for d := range cp.rules {
			for ri := range cp.rules[d] {
				r := &cp.rules[d][ri]
				if ps, hit := reunion(r.parts); hit {
					r.peers = ps
					delete(k.memo, r.rule)
					touched = true
				}
			}
		}
		if touched {
			mark(cnpTag(ci), cp.selected)
		}
	}
	for ni, np := range k.nps {
		touched := subject(np.subjectKey, &np.selected)
		for d := range np.rules {
			for ri := range np.rules[d] {
				r := &np.rules[d][ri]
				if ps, hit := reunion(r.parts); hit {
					r.peers = ps
					touched = true
				}
			}
		}
		if touched {
			mark(npTag(ni), np.selected)
		}
	}

	// 3. Forget every compiled DirPolicy built from a changed policy, redo
	// the relabelled pod's selection, and reassemble the affected pods.
	for _, tag := range changed {
		for _, key := range k.dirKeys[tag] {
			delete(k.dirCache, key)
		}
		delete(k.dirKeys, tag)
	}
	k.admin[i], k.baseline[i], k.npsOf[i] = nil, nil, nil
	for _, ci := range k.cnpOrder {
		if _, in := slices.BinarySearch(k.cnps[ci].selected, i); in {
			if k.cnps[ci].tier == TierAdmin {
				k.admin[i] = append(k.admin[i], ci)
			} else {
				k.baseline[i] = append(k.baseline[i], ci)
			}
		}
	}
	for _, ni := range k.npOrder {
		if _, in := slices.BinarySearch(k.nps[ni].selected, i); in {
			k.npsOf[i] = append(k.npsOf[i], ni)
		}
	}
	for p := range affected {
		if k.isPoliced[p] {
			next.Policies[p] = k.podPolicy(p)
		}
	}
	return k.prog, true
}
