package policy

import (
	"iter"
	"net/netip"
	"slices"
)

// addrOwners finds the pods that claim each address. Nearly every address
// has one pod; only an input problem (two pods reporting one address)
// gives it more, so those are kept apart: one pointer per address instead
// of a slice and its allocation.
type addrOwners struct {
	one  addrMap[*podState]         // the owner, or the first of several
	many map[netip.Addr][]*podState // every owner, where there are several
}

func newAddrOwners(n int) addrOwners {
	return addrOwners{one: newAddrMap[*podState](n), many: map[netip.Addr][]*podState{}}
}

// of lists a's owners; the caller must not change the list.
func (o *addrOwners) of(a netip.Addr) []*podState {
	if m := o.many[a]; m != nil {
		return m
	}
	if p, _ := o.one.get(a); p != nil {
		return []*podState{p}
	}
	return nil
}

// count is how many pods claim a.
func (o *addrOwners) count(a netip.Addr) int {
	if m := o.many[a]; m != nil {
		return len(m)
	}
	if p, _ := o.one.get(a); p != nil {
		return 1
	}
	return 0
}

// set makes owners a's owners (none: a is no pod's).
func (o *addrOwners) set(a netip.Addr, owners []*podState) {
	switch len(owners) {
	case 0:
		o.one.delete(a)
		delete(o.many, a)
	case 1:
		o.one.set(a, owners[0])
		delete(o.many, a)
	default:
		o.one.set(a, owners[0])
		o.many[a] = owners
	}
}

// add adds ps to a's owners.
func (o *addrOwners) add(a netip.Addr, ps *podState) {
	first, _ := o.one.get(a)
	switch {
	case first == nil:
		o.one.set(a, ps)
	case o.many[a] == nil:
		o.many[a] = []*podState{first, ps}
	default:
		o.many[a] = append(o.many[a], ps)
	}
}

// pairs yields every claimed address with each of its owners.
func (o *addrOwners) pairs() iter.Seq2[netip.Addr, *podState] {
	return func(yield func(netip.Addr, *podState) bool) {
		for a, p := range o.one.all() {
			if m := o.many[a]; m != nil {
				for _, p := range m {
					if !yield(a, p) {
						return
					}
				}
			} else if !yield(a, p) {
				return
			}
		}
	}
}

// any reports whether f holds for one of a's owners.
func (o *addrOwners) any(a netip.Addr, f func(*podState) bool) bool {
	if m := o.many[a]; m != nil {
		return slices.ContainsFunc(m, f)
	}
	p, _ := o.one.get(a)
	return p != nil && f(p)
}

// shared yields the addresses several pods claim, with their owners.
func (o *addrOwners) shared() iter.Seq2[netip.Addr, []*podState] {
	return func(yield func(netip.Addr, []*podState) bool) {
		for a, owners := range o.many {
			if !yield(a, owners) {
				return
			}
		}
	}
}
