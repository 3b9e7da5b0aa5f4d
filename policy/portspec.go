package policy

import "strconv"

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
	// index is the entry's position in ports (protocols), for warnings.
	index int
}

func (s *portSpec) hasNamed() bool { return len(s.named) > 0 }

// key identifies what the spec matches, for sharing compiled matches.
func (s *portSpec) key() string {
	var b []byte
	if s.all {
		b = append(b, "all;"...)
	}
	for _, n := range s.numeric {
		b = strconv.AppendUint(b, uint64(n.proto), 10)
		b = append(b, ':')
		b = strconv.AppendUint(b, uint64(n.r.From), 10)
		b = append(b, '-')
		b = strconv.AppendUint(b, uint64(n.r.To), 10)
		b = append(b, ';')
	}
	for _, n := range s.named {
		b = strconv.AppendUint(b, uint64(n.proto), 10)
		b = append(b, ':')
		b = append(b, n.name...)
		b = append(b, ';')
	}
	if len(b) == 0 {
		return "none"
	}
	return string(b)
}

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

// resolve is what the spec matches towards a destination pod whose named
// container ports are given.
func (s *portSpec) resolve(ports []ContainerPort) *PortSet {
	var b PortSetBuilder
	if s.all {
		b.AddAll()
	}
	for _, n := range s.numeric {
		b.Add(n.proto, n.r)
	}
	addNamed(&b, s.named, ports)
	return b.Build()
}

// addNamed adds the container ports the names resolve to.
func addNamed(b *PortSetBuilder, named []namedPort, ports []ContainerPort) {
	for _, n := range named {
		for _, cp := range ports {
			if cp.Name == n.name && cp.Name != "" && (n.proto == 0 || n.proto == cp.Protocol) {
				b.Add(cp.Protocol, PortRange{cp.Port, cp.Port})
			}
		}
	}
}
