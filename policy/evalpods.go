package policy

import "net/netip"

// evalPod is what a verdict reads of one pod, packed so that a pod's
// entry is half a cache line: its two DirPolicies (without the PodPolicy
// between), and its slot with the IPv4 address that yields it. Read
// through Pods, Policies and podSlot, an end cost five dependent or
// scattered loads (the Pod, its IPs, the slot, the PodPolicy, the
// DirPolicy), each a likely cache miss once a workload's flows touch
// tens of thousands of pods (BENCHMARKS.md, evaluator).
type evalPod struct {
	dirs [2]*DirPolicy // by Direction; nil: the pod is not policed
	slot uint32
	// ip4 is the pod's first IPv4 address as a key, when own4: the
	// pod is a pod-network pod and an end with that address is the pod
	// (any other address goes the long way, through Pods).
	ip4  uint32
	own4 bool
}

// evalPodTable is a Program's evalPod table with the slices it was made
// from.
type evalPodTable struct {
	pods     []evalPod
	policies []*PodPolicy
	podList  []Pod
}

// evalPods returns the Program's evalPod table, made on the first
// verdict: a Program compiled for a dataplane never pays for it.
// Goroutines that race to make it make the same table, and one wins. A
// copy of a Program given other Pods or Policies (tests build variants
// so) does not match the table it copied, and makes its own.
func (p *Program) evalPods() []evalPod {
	if t, _ := p.evalTable.Load().(*evalPodTable); t != nil && sameSlice(t.policies, p.Policies) && sameSlice(t.podList, p.Pods) {
		return t.pods
	}
	t := &evalPodTable{pods: make([]evalPod, len(p.Pods)), policies: p.Policies, podList: p.Pods}
	for i := range p.Pods {
		e := &t.pods[i]
		if i < len(p.Policies) && p.Policies[i] != nil {
			e.dirs = [2]*DirPolicy{Ingress: p.Policies[i].Ingress, Egress: p.Policies[i].Egress}
		}
		if i < len(p.podSlot) {
			e.slot = p.podSlot[i]
			if pod := &p.Pods[i]; !pod.HostNetwork {
				for _, a := range pod.IPs {
					if a.Is4() {
						e.ip4, e.own4 = v4key(a), true
						break
					}
				}
			}
		}
	}
	p.evalTable.Store(t)
	return t.pods
}

// sameSlice reports whether a and b are the same slice (not merely equal
// contents).
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// slotOf is the slot of the pod-network pod that owns the endpoint's
// address, or -1. An endpoint naming its pod by its first IPv4 address
// is read off the pod's evalPod, without the address map.
func (p *Program) slotOf(pods []evalPod, e Endpoint) int32 {
	a := e.Addr.Unmap()
	if e.Pod >= 0 {
		if ep := &pods[e.Pod]; ep.own4 && a.Is4() && v4key(a) == ep.ip4 {
			return int32(ep.slot)
		}
		if pod := &p.Pods[e.Pod]; !pod.HostNetwork && containsAddr(pod.IPs, a) {
			return int32(p.podSlot[e.Pod])
		}
	}
	if s, ok := p.podByIP.get(a); ok {
		return int32(s)
	}
	return -1
}

func containsAddr(as []netip.Addr, a netip.Addr) bool {
	for _, x := range as {
		if x == a {
			return true
		}
	}
	return false
}
