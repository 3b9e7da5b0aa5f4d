package matrix

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/moat-net/moat/policy"
)

// Endpoints the evaluator cannot tell apart get the same verdict, with the
// same explanation, towards every other endpoint, so a matrix judges one
// pair of classes instead of every pair of endpoints. Two pod-network pods
// are alike when they have the same compiled policy (Program.Policies
// shares one PodPolicy between pods judged alike as the local end) and, as
// the remote end, each of their addresses lies in the same address sets of
// the Program's rules (which is all a rule reads of a remote end: ports
// are the cell's, and named ports resolve into terms of their own). When
// some endpoint is a node's address, node-local traffic is judged by the
// pod's node, so the node is part of the likeness too.
//
// Every other endpoint is a class of its own: --peer addresses (a reason
// may name the node an address belongs to), host-network pods and pods
// without a PodPolicy (their addresses are nodes' or unowned), and pods
// whose address another pod claims too (denied as a duplicate). A pod's
// flow to itself is never judged as a pair of its class: the diagonal is
// judged on its own.
//
// Membership is summarised by a 128-bit hash per address: the XOR of one
// random value per address set containing it, swept over the sorted
// addresses in O(ranges x log(addresses) + addresses), where testing every
// set for every pod would cost pods x sets. Two addresses with different
// memberships collide with probability 2^-128 per pair; the values are
// drawn from crypto/rand on every run, so a policy author cannot aim for a
// collision.

// classes partitions a matrix's endpoints.
type classes struct {
	of []int32 // endpoint index -> class
	// reps are the first two endpoints of each class (the second -1 when
	// the class has one).
	reps [][2]int
}

// hash128 is one address's summary of the sets that contain it.
type hash128 [2]uint64

// endpointKey is what makes a pod-network pod alike to another.
type endpointKey struct {
	policy *policy.PodPolicy
	node   string
	// addrs holds, per address of the pod in order, its family and the
	// hash of its sets.
	addrs string
}

func newClasses(p *policy.Program, eps []Endpoint) (*classes, error) {
	alike := make([]bool, len(eps))
	nodeSensitive := false
	var addrs []netip.Addr
	for i, e := range eps {
		for _, a := range endpointIPs(p, e) {
			if _, ok := p.NodeByIP(a); ok {
				nodeSensitive = true
			}
		}
		alike[i] = groupable(p, e)
		if alike[i] {
			addrs = append(addrs, p.Pods[e.Endpoint.Pod].IPs...)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	hashes, err := membership(p, addrs)
	if err != nil {
		return nil, err
	}
	c := &classes{of: make([]int32, len(eps))}
	byKey := map[endpointKey]int32{}
	var buf []byte
	for i, e := range eps {
		if alike[i] {
			pod := &p.Pods[e.Endpoint.Pod]
			k := endpointKey{policy: p.Policies[e.Endpoint.Pod]}
			if nodeSensitive {
				k.node = pod.NodeName
			}
			buf = buf[:0]
			for _, a := range pod.IPs {
				j, _ := slices.BinarySearchFunc(addrs, a, netip.Addr.Compare)
				fam := byte(6)
				if a.Is4() {
					fam = 4
				}
				buf = append(buf, fam)
				buf = binary.LittleEndian.AppendUint64(buf, hashes[j][0])
				buf = binary.LittleEndian.AppendUint64(buf, hashes[j][1])
			}
			k.addrs = string(buf)
			if ci, ok := byKey[k]; ok {
				c.of[i] = ci
				if r := &c.reps[ci]; r[1] < 0 {
					r[1] = i
				}
				continue
			}
			byKey[k] = int32(len(c.reps))
		}
		c.of[i] = int32(len(c.reps))
		c.reps = append(c.reps, [2]int{i, -1})
	}
	return c, nil
}

// groupable reports whether an endpoint may share a class: a pod-network
// pod with a PodPolicy that owns each of its addresses alone.
func groupable(p *policy.Program, e Endpoint) bool {
	i := e.Endpoint.Pod
	if i < 0 || i >= len(p.Policies) || p.Policies[i] == nil {
		return false
	}
	pod := &p.Pods[i]
	if pod.HostNetwork || len(pod.IPs) == 0 {
		return false
	}
	for _, a := range pod.IPs {
		if j, ok := p.PodByIP(a); !ok || j != i || p.DuplicateAddr(a) {
			return false
		}
	}
	return true
}

// endpointIPs is every address an endpoint may carry in a matrix.
func endpointIPs(p *policy.Program, e Endpoint) []netip.Addr {
	if e.Endpoint.Pod >= 0 && !e.Endpoint.Fixed {
		return p.Pods[e.Endpoint.Pod].IPs
	}
	return []netip.Addr{e.Endpoint.Addr}
}

// membership hashes, for each of the sorted addrs, the address sets of
// the Program's rules that contain it.
func membership(p *policy.Program, addrs []netip.Addr) ([]hash128, error) {
	sets := ruleAddrSets(p)
	keys := make([]byte, 16*len(sets))
	if _, err := rand.Read(keys); err != nil {
		return nil, fmt.Errorf("matrix: drawing class hash keys: %w", err)
	}
	// diff[i] toggles the sets whose ranges start at addrs[i] or end just
	// before it; a prefix XOR turns it into each address's sets.
	diff := make([]hash128, len(addrs)+1)
	for s, set := range sets {
		h := hash128{binary.LittleEndian.Uint64(keys[16*s:]), binary.LittleEndian.Uint64(keys[16*s+8:])}
		for _, r := range set.Ranges() {
			from, _ := slices.BinarySearchFunc(addrs, r.From, netip.Addr.Compare)
			to, found := slices.BinarySearchFunc(addrs, r.To, netip.Addr.Compare)
			if found {
				to++
			}
			if from >= to {
				continue
			}
			diff[from][0] ^= h[0]
			diff[from][1] ^= h[1]
			diff[to][0] ^= h[0]
			diff[to][1] ^= h[1]
		}
	}
	out := make([]hash128, len(addrs))
	var acc hash128
	for i := range addrs {
		acc[0] ^= diff[i][0]
		acc[1] ^= diff[i][1]
		out[i] = acc
	}
	return out, nil
}

// ruleAddrSets lists the distinct address sets of every rule of every
// compiled policy, once each (terms naming the same peers share one).
func ruleAddrSets(p *policy.Program) []*policy.AddrSet {
	seen := map[*policy.AddrSet]bool{}
	var out []*policy.AddrSet
	for s := range p.RuleAddrSets() {
		if s != nil && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
