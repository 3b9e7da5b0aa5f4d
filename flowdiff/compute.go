package flowdiff

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/moat-net/moat/policy"
)

// Compute lists the flows whose verdict differs between the two Programs,
// judging only flows that can differ (see the package comment). Its result
// equals Full's, Judged aside.
func Compute(before, after *policy.Program, opts Options) *Result {
	s := newSpace(before, after, opts)
	n := len(s.eps)
	idx := newAddrIndex(s.eps)
	cmp := dirComparer{memo: map[[2]*policy.DirPolicy]dirDiff{}}

	pairs := map[[2]int]bool{} // (src, dst) to judge, beyond whole rows and columns
	var rows, cols []bool      // every flow from / to this endpoint
	rows, cols = make([]bool, n), make([]bool, n)
	for e := range s.eps {
		ep := &s.eps[e]
		if s.factsChanged(ep) {
			rows[e], cols[e] = true, true
			continue
		}
		if !ep.pod {
			continue
		}
		pb, pa := before.Policies[ep.podBefore], after.Policies[ep.podAfter]
		if pb == nil || pa == nil {
			// Not policed in either state (factsChanged caught a change).
			continue
		}
		if d := cmp.compare(pb.Egress, pa.Egress); d.all {
			rows[e] = true
		} else {
			for _, r := range idx.within(d.addrs) {
				pairs[[2]int{e, r}] = true
			}
		}
		if d := cmp.compare(pb.Ingress, pa.Ingress); d.all {
			cols[e] = true
		} else {
			for _, r := range idx.within(d.addrs) {
				pairs[[2]int{r, e}] = true
			}
		}
	}
	for src := range n {
		if rows[src] {
			for dst := range n {
				s.judge(src, dst)
			}
		}
	}
	for dst := range n {
		if cols[dst] {
			for src := range n {
				if !rows[src] {
					s.judge(src, dst)
				}
			}
		}
	}
	for p := range pairs {
		if rows[p[0]] || cols[p[1]] {
			delete(pairs, p)
		}
	}
	rest := make([][2]int, 0, len(pairs))
	for p := range pairs {
		rest = append(rest, p)
	}
	slices.SortFunc(rest, func(a, b [2]int) int {
		if a[0] != b[0] {
			return a[0] - b[0]
		}
		return a[1] - b[1]
	})
	for _, p := range rest {
		s.judge(p[0], p[1])
	}
	return s.finish()
}

// factsChanged reports whether an endpoint's own facts, which every flow
// touching it depends on, differ between the states: a pod's addresses,
// host network, node, its node's addresses and pod CIDRs (which decide
// which sources reaching it are dropped as forged), whether it is policed;
// for an address that is no pod's, whether a pod claims it and the node
// it belongs to, with that node's addresses and pod CIDRs, and the node
// whose pod CIDRs hold it; for any
// endpoint, whether one of its addresses is claimed by several pods.
func (s *space) factsChanged(ep *endpoint) bool {
	for _, a := range ep.addrs {
		if s.before.DuplicateAddr(a) != s.after.DuplicateAddr(a) {
			return true
		}
	}
	if !ep.pod {
		for _, a := range ep.addrs {
			if claimed(s.before, a) != claimed(s.after, a) || nodeFacts(s.before, a) != nodeFacts(s.after, a) ||
				podNetFacts(s.before, a) != podNetFacts(s.after, a) {
				return true
			}
		}
		return false
	}
	b, a := &s.before.Pods[ep.podBefore], &s.after.Pods[ep.podAfter]
	if !slices.Equal(b.IPs, a.IPs) || b.HostNetwork != a.HostNetwork || b.NodeName != a.NodeName ||
		!slices.Equal(s.before.NodeAddrs(b.NodeName), s.after.NodeAddrs(a.NodeName)) ||
		!slices.Equal(s.before.PodCIDRs(b.NodeName), s.after.PodCIDRs(a.NodeName)) {
		return true
	}
	return (s.before.Policies[ep.podBefore] == nil) != (s.after.Policies[ep.podAfter] == nil)
}

// addrIndex finds endpoints by address.
type addrIndex []struct {
	addr netip.Addr
	ep   int
}

func newAddrIndex(eps []endpoint) addrIndex {
	var ix addrIndex
	for i, e := range eps {
		for _, a := range e.addrs {
			ix = append(ix, struct {
				addr netip.Addr
				ep   int
			}{a.Unmap(), i})
		}
	}
	slices.SortFunc(ix, func(a, b struct {
		addr netip.Addr
		ep   int
	}) int {
		return a.addr.Compare(b.addr)
	})
	return ix
}

// within lists the endpoints with an address in one of the ranges (sorted,
// disjoint), each once.
func (ix addrIndex) within(rs []policy.AddrRange) []int {
	var out []int
	for _, r := range rs {
		i, _ := slices.BinarySearchFunc(ix, r.From, func(e struct {
			addr netip.Addr
			ep   int
		}, a netip.Addr) int {
			return e.addr.Compare(a)
		})
		for ; i < len(ix) && ix[i].addr.Compare(r.To) <= 0; i++ {
			out = append(out, ix[i].ep)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// claimed reports whether a pod-network pod claims a, alone or with
// others.
func claimed(p *policy.Program, a netip.Addr) bool {
	_, ok := p.PodByIP(a)
	return ok || p.DuplicateAddr(a)
}

// podNetFacts names the node whose pod CIDRs hold a, if any, with the
// CIDR and the node's addresses: a node drops connections from and to an
// address there that no pod and no node owns, but for its own (policy:
// forged sources, unknown destinations).
func podNetFacts(p *policy.Program, a netip.Addr) string {
	for i := range p.Nodes {
		for _, c := range p.Nodes[i].PodCIDRs {
			if c.Contains(a.Unmap()) {
				return fmt.Sprint(p.Nodes[i].Name, c, p.Nodes[i].Addrs)
			}
		}
	}
	return ""
}

// nodeFacts describes the node that has address a, if any: its name,
// addresses and pod CIDRs.
func nodeFacts(p *policy.Program, a netip.Addr) string {
	n, ok := p.NodeByIP(a)
	if !ok {
		return ""
	}
	return fmt.Sprint(p.Nodes[n].Name, p.Nodes[n].Addrs, p.Nodes[n].PodCIDRs)
}
