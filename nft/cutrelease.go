package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/moat-net/moat/policy"
)

// addrOwners maps each address of a node's pod-network pods to the pods
// that hold it.
type addrOwners map[netip.Addr]podOwner

// podOwner is the pod that holds an address, by namespace and name; when
// several claim it (an input problem), namespace is empty and name holds
// their keys ("namespace/name"), sorted and joined by spaces.
type podOwner struct{ namespace, name string }

func (o podOwner) keys() []string {
	if o.namespace == "" {
		return strings.Fields(o.name)
	}
	return []string{o.namespace + "/" + o.name}
}

// localOwners are the owners of the addresses of node's pod-network pods
// in prog, read from in (readInputs(prog, node)) when it holds the
// node's pods: a sync then walks the Program's pods once. Addresses of
// the node itself are left out (a pod claiming one is an input problem):
// releasing them would cut the node's own connections.
func localOwners(prog *policy.Program, node string, in *buildInputs) addrOwners {
	nodeAddrs := prog.NodeAddrs(node)
	out := addrOwners{}
	add := func(namespace, name string, hostNetwork bool, ips []netip.Addr) {
		if hostNetwork {
			return
		}
		for _, a := range ips {
			a = a.Unmap()
			if !a.IsValid() || slices.Contains(nodeAddrs, a) {
				continue
			}
			o, ok := out[a]
			if !ok {
				out[a] = podOwner{namespace, name}
				continue
			}
			key := namespace + "/" + name
			if keys := o.keys(); !slices.Contains(keys, key) {
				keys = append(keys, key)
				slices.Sort(keys)
				out[a] = podOwner{name: strings.Join(keys, " ")}
			}
		}
	}
	if !in.rebuild {
		for _, p := range in.pods {
			add(p.namespace, p.name, p.hostNetwork, p.ips)
		}
		return out
	}
	for i := range prog.Pods {
		if p := &prog.Pods[i]; p.NodeName == node {
			add(p.Namespace, p.Name, p.HostNetwork, p.IPs)
		}
	}
	return out
}

// released lists, sorted, the addresses whose owners differ between
// prev and cur: gone from the node, passed to other pods, or new to it.
func released(prev, cur addrOwners) []netip.Addr {
	var out []netip.Addr
	for a, o := range prev {
		if cur[a] != o {
			out = append(out, a)
		}
	}
	for a := range cur {
		if _, ok := prev[a]; !ok {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// afterApply runs, once rs is in force, what must follow it: releasing
// the addresses of the node's pods that changed owners (cur; nil: not
// known, nothing released), and, when cut, the cut of denied established
// connections (cutDenied). s.mu held.
func (s *Syncer) afterApply(ctx context.Context, rs *Ruleset, cur addrOwners, res *Result, cut bool) error {
	err := s.release(ctx, cur, res)
	if cut {
		err = errors.Join(err, s.cutDenied(ctx, rs, res))
	}
	return err
}

// release deletes the conntrack entries of every address of the node's
// pods whose owners changed since the last release: an address gone from
// the node, passed to another pod, or new to the node. Whatever --cut-
// denied-established says: an entry outlives its pod, so a pod given a
// deleted pod's address (which CNIs reuse) would receive, as established
// packets, the old pod's flows that its own policy denies (and send over
// them what its egress denies), for as long as they keep the entry alive.
// Once the address is gone, nothing legitimate can use its entries; once
// a new pod holds it, its connections are new ones and judged so. A new
// address is released too: connections to or from it before the agent
// knew its pod were judged by no policy of that pod.
//
// The first sync of a Syncer only learns the owners: it cannot tell what
// changed while no agent ran. The release comes after the rules are in
// force, so a packet that starts a new entry meanwhile meets the new
// owner's rules; when it fails, the next Sync tries again (the owners
// stay those of the last release that succeeded). s.mu held.
func (s *Syncer) release(ctx context.Context, cur addrOwners, res *Result) error {
	if cur == nil {
		return nil
	}
	if s.owners == nil {
		s.owners = cur
		return nil
	}
	addrs := released(s.owners, cur)
	if len(addrs) == 0 {
		return nil
	}
	n, err := s.opts.Conntrack.DeleteAddrs(ctx, addrs)
	res.ConntrackReleased = n
	if err != nil {
		return fmt.Errorf("rules applied on node %s; removing the connections of pod addresses that changed owners (%d addresses, first %s): %w", s.opts.Node, len(addrs), addrs[0], err)
	}
	s.owners = cur
	return nil
}
