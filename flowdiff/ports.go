package flowdiff

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// Without Options.Ports, a flow between two endpoints is judged on one
// probe per port class: the coarsest partition of (protocol, port) that
// the rules judging it - the source's egress and the destination's
// ingress policy, in both states - can tell apart. Declared container
// ports play no part in it (Kubernetes treats them as informational: an
// undeclared port is reachable), except to pick which port of a class is
// shown. Named ports need no care: a compiled Match holds them resolved
// for the pod it applies to.
//
// A term's ports are either all traffic or ranges per protocol. Two
// (protocol, port) that lie in the same terms' port sets are judged alike
// by every rule: so per protocol some set names, the ports between two
// cuts (where a range starts, or after one ends) are split off, and the
// pieces that lie in the same sets form one class. The pieces in no set,
// every port of the protocols no set names, ICMP and every protocol
// without ports are matched only by rules without ports: the last class,
// "the rest".

// portSets is an interned list of distinct port sets (by content, sorted
// by their text) of some policies' terms: endpoints whose policies name
// the same ports share one, so the classes of a pair are computed once per
// distinct pair of portSets.
type portSets struct {
	sets []*policy.PortSet
	keys []string
}

// protoRange is a range of ports of one protocol.
type protoRange struct {
	proto    policy.Protocol
	from, to uint16
}

// portClass is one class of a pair's partition: ranges, or (rest) the
// ranges in no set, the port protocols no set names (unnamed), ICMP and
// other protocols; covered is then what the other classes hold.
type portClass struct {
	ranges  []protoRange
	rest    bool
	unnamed []policy.Protocol
	covered []protoRange
}

// portClasses computes and remembers the port classes of endpoint pairs.
type portClasses struct {
	byDir   map[*policy.DirPolicy][]*policy.PortSet
	interns map[string]*portSets
	pairs   map[[2]*portSets][]portClass
}

func newPortClasses() *portClasses {
	return &portClasses{byDir: map[*policy.DirPolicy][]*policy.PortSet{}, interns: map[string]*portSets{}, pairs: map[[2]*portSets][]portClass{}}
}

// dirSets lists the port sets with ranges of every rule of one
// direction's policy (sets of all traffic or none cut nothing).
func (pc *portClasses) dirSets(dp *policy.DirPolicy) []*policy.PortSet {
	if dp == nil {
		return nil
	}
	if s, ok := pc.byDir[dp]; ok {
		return s
	}
	seen := map[*policy.PortSet]bool{}
	var out []*policy.PortSet
	add := func(m policy.Match) {
		for _, t := range m {
			if !seen[t.Ports] && !t.Ports.Empty() && !t.Ports.All {
				seen[t.Ports] = true
				out = append(out, t.Ports)
			}
		}
	}
	for _, r := range dp.Admin {
		add(r.Match)
	}
	if dp.NP != nil {
		for _, r := range dp.NP.Rules {
			add(r.Match)
		}
	}
	for _, r := range dp.Baseline {
		add(r.Match)
	}
	pc.byDir[dp] = out
	return out
}

// intern returns the shared portSets of the union of some lists of sets.
func (pc *portClasses) intern(lists ...[]*policy.PortSet) *portSets {
	byKey := map[string]*policy.PortSet{}
	for _, l := range lists {
		for _, s := range l {
			byKey[s.String()] = s
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	key := strings.Join(keys, "\x00")
	if ps, ok := pc.interns[key]; ok {
		return ps
	}
	ps := &portSets{keys: keys}
	for _, k := range keys {
		ps.sets = append(ps.sets, byKey[k])
	}
	pc.interns[key] = ps
	return ps
}

// endpointSets interns the sets of a pod's policies in one direction in
// both states.
func (pc *portClasses) endpointSets(b, a *policy.DirPolicy) *portSets {
	return pc.intern(pc.dirSets(b), pc.dirSets(a))
}

// protoRank orders protocols for output: TCP, UDP, SCTP, then by number.
func protoRank(p policy.Protocol) int {
	if i := slices.Index(policy.PortProtocols[:], p); i >= 0 {
		return i
	}
	return len(policy.PortProtocols) + int(p)
}

// classes is the partition of a pair whose ends' policies name ports as
// src (egress) and dst (ingress) do; the rest is last.
func (pc *portClasses) classes(src, dst *portSets) []portClass {
	key := [2]*portSets{src, dst}
	if out, ok := pc.pairs[key]; ok {
		return out
	}
	sets := pc.intern(src.sets, dst.sets).sets
	cuts := map[policy.Protocol][]uint16{}
	for _, s := range sets {
		for p, rs := range s.ByProto {
			if len(rs) == 0 {
				continue
			}
			cs := cuts[p]
			for _, r := range rs {
				if r.From > 1 {
					cs = append(cs, r.From)
				}
				if r.To < 65535 {
					cs = append(cs, r.To+1)
				}
			}
			cuts[p] = cs
		}
	}
	protos := make([]policy.Protocol, 0, len(cuts))
	for p := range cuts {
		protos = append(protos, p)
	}
	slices.SortFunc(protos, func(a, b policy.Protocol) int { return cmp.Compare(protoRank(a), protoRank(b)) })
	var out []portClass
	bySig := map[string]int{}
	rest := portClass{rest: true}
	var sig []byte
	for _, p := range protos {
		cs := cuts[p]
		slices.Sort(cs)
		cs = slices.Compact(cs)
		from := uint16(1)
		for i := 0; i <= len(cs); i++ {
			to := uint16(65535)
			if i < len(cs) {
				to = cs[i] - 1
			}
			r := protoRange{p, from, to}
			sig = sig[:0]
			for j, s := range sets {
				if s.Matches(p, from) {
					sig = binary.AppendUvarint(sig, uint64(j))
				}
			}
			if len(sig) == 0 {
				rest.ranges = appendProtoRange(rest.ranges, r)
			} else {
				rest.covered = appendProtoRange(rest.covered, r)
				k, ok := bySig[string(sig)]
				if !ok {
					k = len(out)
					bySig[string(sig)] = k
					out = append(out, portClass{})
				}
				out[k].ranges = appendProtoRange(out[k].ranges, r)
			}
			if i < len(cs) {
				from = cs[i]
			}
		}
	}
	for _, p := range policy.PortProtocols {
		if _, named := cuts[p]; !named {
			rest.unnamed = append(rest.unnamed, p)
		}
	}
	out = append(out, rest)
	pc.pairs[key] = out
	return out
}

// appendProtoRange appends r, merged into the last range when it follows
// it.
func appendProtoRange(rs []protoRange, r protoRange) []protoRange {
	if n := len(rs); n > 0 && rs[n-1].proto == r.proto && int(rs[n-1].to)+1 == int(r.from) {
		rs[n-1].to = r.to
		return rs
	}
	return append(rs, r)
}

// contains reports whether the class holds a protocol and port.
func (c *portClass) contains(p policy.Protocol, port uint16) bool {
	for _, r := range c.ranges {
		if r.proto == p && r.from <= port && port <= r.to {
			return true
		}
	}
	if !c.rest {
		return false
	}
	if !p.HasPorts() || slices.Contains(c.unnamed, p) {
		return true
	}
	return false
}

// probe is the port a class is judged on towards one destination: a port
// the destination declares in the class if there is one (so that the
// line names a port the operator knows), else the first of TCP, UDP and
// SCTP in the class, else ICMP.
func (c *portClass) probe(decl []matrix.PortProto) matrix.PortProto {
	for _, d := range decl {
		if c.contains(d.Protocol, d.Port) {
			return d
		}
	}
	if !c.rest {
		return matrix.PortProto{Port: c.ranges[0].from, Protocol: c.ranges[0].proto}
	}
	for _, p := range policy.PortProtocols {
		if slices.Contains(c.unnamed, p) {
			return matrix.PortProto{Port: 1, Protocol: p}
		}
		for _, r := range c.ranges {
			if r.proto == p {
				return matrix.PortProto{Port: r.from, Protocol: p}
			}
		}
	}
	return matrix.PortProto{Port: 0, Protocol: policy.ProtoICMP}
}

// describe says what the class's probe stands for, as the PORT column
// shows it after the probe: empty when the class is that one port.
func (c *portClass) describe() string {
	if !c.rest {
		if len(c.ranges) == 1 && c.ranges[0].from == c.ranges[0].to {
			return ""
		}
		return "any of " + formatRanges(c.ranges, false)
	}
	switch {
	case len(c.covered) == 0:
		return "any port or protocol"
	case len(c.ranges) == 0 && len(c.unnamed) == 0:
		return "any protocol but TCP, UDP and SCTP"
	case len(c.covered) <= 4:
		return "any port or protocol but " + formatRanges(c.covered, true)
	}
	return fmt.Sprintf("any port or protocol but the %d ranges the rules name", len(c.covered))
}

// formatRanges is "8000-9000" or "TCP 80, 443; UDP 53": the protocol is
// named when there are several, or when named.
func formatRanges(rs []protoRange, named bool) string {
	var b strings.Builder
	named = named || slices.ContainsFunc(rs, func(r protoRange) bool { return r.proto != rs[0].proto })
	for i, r := range rs {
		switch {
		case i > 0 && r.proto == rs[i-1].proto:
			b.WriteString(", ")
		case i > 0:
			b.WriteString("; ")
		}
		if r.from == 1 && r.to == 65535 {
			b.WriteString(r.proto.String()) // every port
			continue
		}
		if named && (i == 0 || r.proto != rs[i-1].proto) {
			b.WriteString(r.proto.String() + " ")
		}
		if r.from == r.to {
			fmt.Fprintf(&b, "%d", r.from)
		} else {
			fmt.Fprintf(&b, "%d-%d", r.from, r.to)
		}
	}
	return b.String()
}
