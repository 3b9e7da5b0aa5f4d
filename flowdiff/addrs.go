package flowdiff

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// Addresses outside the pods are judged on implied peers, so that a change
// to an ipBlock, networks or nodes peer cannot hide between the pods and
// the --peer addresses:
//
//   - every node address of either state (a node is the remote end of
//     node-local traffic and of nodes peers);
//   - one address per class of the coarsest partition of the rest of the
//     address space that the rules of both states can tell apart: the
//     addresses every term of every rule either contains or not alike
//     (inside a CIDR and outside its excepts, inside each except, outside
//     everything), per family; the nodes' pod CIDRs divide it too, since
//     a source inside one that no pod owns is dropped as forged towards
//     that node (policy: forged sources).
//
// Addresses some endpoint already stands for (pods of either state, nodes,
// --peer) are never picked, so an implied peer is always a bare address,
// judged the same in both states.

// impliedPeers lists the implied peers of the two states, given the
// addresses already taken by the other endpoints.
func impliedPeers(before, after *policy.Program, taken []netip.Addr) []endpoint {
	all := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	taken = append(taken, before.PodAddrsIn(all)...)
	taken = append(taken, after.PodAddrsIn(all)...)
	for _, p := range []*policy.Program{before, after} {
		for i := range p.Pods {
			taken = append(taken, p.Pods[i].IPs...)
		}
	}
	var out []endpoint
	add := func(label string, a netip.Addr) {
		out = append(out, endpoint{label: label, before: bare(label, a), after: bare(label, a), addrs: []netip.Addr{a}, podBefore: -1, podAfter: -1})
	}
	sortAddrs(taken)
	nodes := map[netip.Addr][]string{}
	for _, p := range []*policy.Program{before, after} {
		for _, n := range p.Nodes {
			for _, a := range n.Addrs {
				if a = a.Unmap(); a.IsValid() && a.Zone() == "" && !isTaken(taken, a) && !slices.Contains(nodes[a], n.Name) {
					nodes[a] = append(nodes[a], n.Name)
				}
			}
		}
	}
	nodeAddrs := make([]netip.Addr, 0, len(nodes))
	for a := range nodes {
		nodeAddrs = append(nodeAddrs, a)
	}
	sortAddrs(nodeAddrs)
	for _, a := range nodeAddrs {
		add(fmt.Sprintf("%s (node %s)", a, strings.Join(nodes[a], ", ")), a)
	}
	taken = append(taken, nodeAddrs...)
	sortAddrs(taken)
	for _, c := range addrClasses(before, after, taken) {
		if a, ok := c.free(taken); ok {
			add(c.describe(), a)
		}
	}
	return out
}

func bare(label string, a netip.Addr) matrix.Endpoint {
	return matrix.Endpoint{Label: label, Endpoint: policy.Endpoint{Pod: -1, Addr: a}}
}

func sortAddrs(as []netip.Addr) {
	slices.SortFunc(as, netip.Addr.Compare)
}

func isTaken(taken []netip.Addr, a netip.Addr) bool {
	_, ok := slices.BinarySearchFunc(taken, a, netip.Addr.Compare)
	return ok
}

// allTaken reports whether every address of r is taken: such a range
// holds no address an implied peer could stand for (a selector's pods, a
// nodes peer's nodes), so it cuts nothing.
func allTaken(taken []netip.Addr, r policy.AddrRange) bool {
	i, _ := slices.BinarySearchFunc(taken, r.From, netip.Addr.Compare)
	a := r.From
	for ; i < len(taken) && taken[i] == a; i++ {
		if a == r.To {
			return true
		}
		a = a.Next()
	}
	return false
}

// addrClass is one class: its ranges, sorted; rest is the class no term
// contains.
type addrClass struct {
	ranges []policy.AddrRange
	rest   bool
}

// addrClasses partitions each family by which terms of both states
// contain an address, ignoring ranges of taken addresses only. Terms with
// the same peers share one *AddrSet, so it reads each distinct set once.
func addrClasses(before, after *policy.Program, taken []netip.Addr) []*addrClass {
	sets := map[*policy.AddrSet]int{}
	for _, p := range []*policy.Program{before, after} {
		for s := range p.RuleAddrSets() {
			if _, ok := sets[s]; !ok && !s.Empty() {
				sets[s] = len(sets)
			}
		}
	}
	for _, p := range []*policy.Program{before, after} {
		for _, n := range p.Nodes {
			for _, c := range n.PodCIDRs {
				sets[policy.NewAddrSet(policy.PrefixRange(c))] = len(sets)
			}
		}
	}
	// A sweep over the ends of every range: at each, the set of terms'
	// sets containing the addresses from there on changes.
	type edge struct {
		at    netip.Addr
		set   int
		start bool
	}
	var edges []edge
	for s, id := range sets {
		for _, r := range s.Ranges() {
			if allTaken(taken, r) {
				continue
			}
			edges = append(edges, edge{r.From, id, true})
			if r.To != lastOf(r.To.Is4()) {
				edges = append(edges, edge{r.To.Next(), id, false})
			}
		}
	}
	edges = append(edges, edge{at: netip.IPv4Unspecified(), set: -1}, edge{at: netip.IPv6Unspecified(), set: -1})
	slices.SortFunc(edges, func(a, b edge) int { return a.at.Compare(b.at) })
	active := map[int]bool{}
	byKey := map[string]*addrClass{}
	var out []*addrClass
	var key []byte
	for i := 0; i < len(edges); {
		at := edges[i].at
		for ; i < len(edges) && edges[i].at == at; i++ {
			if e := edges[i]; e.set >= 0 {
				if e.start {
					active[e.set] = true
				} else {
					delete(active, e.set)
				}
			}
		}
		end := lastOf(at.Is4())
		if i < len(edges) && edges[i].at.Is4() == at.Is4() {
			end = edges[i].at.Prev()
		}
		ids := make([]int, 0, len(active))
		for id := range active {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		key = key[:0]
		if at.Is4() {
			key = append(key, 4)
		} else {
			key = append(key, 6)
		}
		for _, id := range ids {
			key = binary.AppendUvarint(key, uint64(id))
		}
		c := byKey[string(key)]
		if c == nil {
			c = &addrClass{rest: len(ids) == 0}
			byKey[string(key)] = c
			out = append(out, c)
		}
		c.ranges = append(c.ranges, policy.AddrRange{From: at, To: end})
	}
	return out
}

func lastOf(v4 bool) netip.Addr {
	if v4 {
		return netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	return netip.AddrFrom16([16]byte{255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255})
}

// free picks an address of the class no endpoint stands for, avoiding the
// unspecified address.
func (c *addrClass) free(taken []netip.Addr) (netip.Addr, bool) {
	for _, r := range c.ranges {
		a := r.From
		if a.IsUnspecified() {
			if a == r.To {
				continue
			}
			a = a.Next()
		}
		i, _ := slices.BinarySearchFunc(taken, a, netip.Addr.Compare)
		for ; i < len(taken) && taken[i] == a; i++ {
			if a == r.To {
				break
			}
			a = a.Next()
		}
		if i >= len(taken) || taken[i] != a {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// describe names the class as an operator reads it: a prefix or range, a
// prefix with the holes it has ("10.0.0.0/8 except 10.1.0.0/16"), a few
// ranges, or for the class no rule names "any other IPv4 address".
func (c *addrClass) describe() string {
	rs := c.ranges
	hull := policy.AddrRange{From: rs[0].From, To: rs[len(rs)-1].To}
	if len(rs) == 1 {
		return hull.String()
	}
	if isPrefix(hull) && len(rs) <= 4 {
		var holes []string
		ok := true
		for i := 1; i < len(rs); i++ {
			h := policy.AddrRange{From: rs[i-1].To.Next(), To: rs[i].From.Prev()}
			ok = ok && isPrefix(h)
			holes = append(holes, h.String())
		}
		if ok {
			return hull.String() + " except " + strings.Join(holes, ", ")
		}
	}
	if c.rest {
		if hull.From.Is4() {
			return "any other IPv4 address"
		}
		return "any other IPv6 address"
	}
	if len(rs) <= 3 {
		names := make([]string, len(rs))
		for i, r := range rs {
			names[i] = r.String()
		}
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s, %s and %d more ranges", rs[0], rs[1], len(rs)-2)
}

// isPrefix reports whether the range is exactly one prefix (a single
// address is a /32 or /128).
func isPrefix(r policy.AddrRange) bool {
	for bits := 0; bits <= r.From.BitLen(); bits++ {
		p := netip.PrefixFrom(r.From, bits).Masked()
		if p.Addr() == r.From && policy.PrefixRange(p).To == r.To {
			return true
		}
	}
	return false
}
