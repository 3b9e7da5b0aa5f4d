package policy

import "sort"

// portSpec is a rule's ports before named ports are resolved: numeric
// ranges apply everywhere, names resolve on the destination pod.
type portSpec struct {
	all     bool
	numeric []protoRange
	named   []namedPort
}

type protoRange struct {
	proto Protocol
	r     PortRange
}

// namedPort is a port name; proto 0 means "whatever protocol the container
// port declares" (ClusterNetworkPolicy destinationNamedPort).
type namedPort struct {
	proto Protocol
	name  string
}

func (s *portSpec) hasNamed() bool { return len(s.named) > 0 }

// numericSet is what the spec matches without named ports.
func (s *portSpec) numericSet() *PortSet {
	var b PortSetBuilder
	if s.all {
		b.AddAll()
	}
	for _, n := range s.numeric {
		b.Add(n.proto, n.r)
	}
	return b.Build()
}

// resolve is what the spec matches towards one destination pod (nil pod:
// an address that is no pod, where names match nothing).
func (s *portSpec) resolve(pod *Pod) *PortSet {
	var b PortSetBuilder
	if s.all {
		b.AddAll()
	}
	for _, n := range s.numeric {
		b.Add(n.proto, n.r)
	}
	if pod != nil {
		addNamed(&b, s.named, pod)
	}
	return b.Build()
}

func addNamed(b *PortSetBuilder, named []namedPort, pod *Pod) {
	for _, n := range named {
		for _, cp := range pod.Ports {
			if cp.Name == n.name && cp.Name != "" && (n.proto == 0 || n.proto == cp.Protocol) {
				b.Add(cp.Protocol, PortRange{cp.Port, cp.Port})
			}
		}
	}
}

// namedSignature identifies what named ports resolve to on a pod, so pods
// that resolve alike can share compiled rules.
func namedSignature(pod *Pod) string {
	ports := make([]string, 0, len(pod.Ports))
	for _, cp := range pod.Ports {
		if cp.Name != "" {
			ports = append(ports, cp.Name+"/"+cp.Protocol.String()+"/"+PortRange{cp.Port, cp.Port}.String())
		}
	}
	sort.Strings(ports)
	out := ""
	for _, p := range ports {
		out += p + ","
	}
	return out
}

// match compiles a rule's peers and ports into a Match. For ingress the
// destination is the subject pod; for egress named ports resolve on each
// destination pod among the peers, grouped so that pods resolving alike
// share one term.
func (k *compiler) match(peers peerSet, ports *portSpec, dir Direction, subject int) Match {
	if peers.addrs.Empty() {
		return nil
	}
	split := &termSplit{cidrs: peers.cidrs, pods: k.ordRanges(peers.pods)}
	if dir == Ingress {
		ps := ports.resolve(&k.prog.Pods[subject])
		if ps.Empty() {
			return nil
		}
		return Match{{Addrs: peers.addrs, Ports: ps, split: split}}
	}
	var m Match
	if ps := ports.numericSet(); !ps.Empty() {
		m = append(m, Term{Addrs: peers.addrs, Ports: ps, split: split})
	}
	if !ports.hasNamed() {
		return m
	}
	dests := peers.pods
	if peers.allPods {
		dests = k.policed
	}
	groups := map[string][]AddrRange{}
	groupPods := map[string][]int{}
	partial := map[string]bool{}
	sets := map[string]*PortSet{}
	var order []string
	for _, i := range dests {
		pod := &k.prog.Pods[i]
		var b PortSetBuilder
		addNamed(&b, ports.named, pod)
		ps := b.Build()
		if ps.Empty() {
			continue
		}
		key := ps.String()
		if _, ok := sets[key]; !ok {
			sets[key] = ps
			order = append(order, key)
		}
		all := true
		for _, a := range pod.IPs {
			if peers.addrs.Contains(a) {
				groups[key] = append(groups[key], AddrRange{a, a})
			} else {
				all = false
			}
		}
		if all {
			groupPods[key] = append(groupPods[key], i)
		} else {
			// Only some of the pod's addresses are peers: index them by
			// address.
			partial[key] = true
		}
	}
	for _, key := range order {
		if len(groups[key]) > 0 {
			t := Term{Addrs: NewAddrSet(groups[key]...), Ports: sets[key]}
			if !partial[key] {
				t.split = &termSplit{cidrs: NewAddrSet(), pods: k.ordRanges(groupPods[key])}
			}
			m = append(m, t)
		}
	}
	return m
}
