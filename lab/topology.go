package lab

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"sort"

	"github.com/moat-net/moat/policy"
)

// namePrefix starts the name of everything a lab creates; `moat lab
// clean` removes whatever carries it.
const namePrefix = "moat-"

// Addresses the lab itself uses inside its namespaces. They never reach
// the machine's own namespace.
var (
	// podGateway4 is the IPv4 next hop every pod uses: the node side of
	// each pod's veth holds it with link scope, like an L3 CNI.
	podGateway4 = netip.MustParseAddr("169.254.1.1")
	// podGateway6 is the IPv6 next hop, a link-local address.
	podGateway6 = netip.MustParseAddr("fe80::1")
	// generated4 is the block node addresses are made from when a node
	// has no IPv4 address of its own.
	generated4 = netip.MustParsePrefix("169.254.77.0/24")
)

// topology is the plan of a lab: which namespaces exist, which addresses
// live where and how they are routed. It is derived from a Program alone,
// so `lab up` can store it and later commands reopen the same lab.
type topology struct {
	Prefix   string    `json:"prefix"`
	Underlay string    `json:"underlay"`
	Nodes    []*nodeNS `json:"nodes"`
	Pods     []*podNS  `json:"pods"`
	Outside  outsideNS `json:"outside"`
}

// nodeNS is a node's namespace: a router for its pods, joined to the other
// nodes by the underlay.
type nodeNS struct {
	// Name is the Kubernetes node name ("" for pods without one).
	Name string `json:"name"`
	NS   string `json:"ns"`
	// Addrs are the addresses on the node's underlay link: the node's
	// own, its host-network pods', and a generated IPv4 one if it has
	// none.
	Addrs []netip.Addr `json:"addrs"`
	// Src4 and Src6 are the sources of the node's own traffic.
	Src4 netip.Addr `json:"src4"`
	Src6 netip.Addr `json:"src6,omitzero"`
	// LinkLocal is the node's IPv6 next hop on the underlay.
	LinkLocal netip.Addr `json:"linkLocal"`
}

// podNS is a pod-network pod's namespace, or that of a peer address in a
// node's pod CIDRs that no pod owns (Key says so), which stands for a pod
// the agent does not know.
type podNS struct {
	Key  string       `json:"key"`
	NS   string       `json:"ns"`
	Node int          `json:"node"`
	Link string       `json:"link"`
	IPs  []netip.Addr `json:"ips"`
}

// outsideNS is the namespace standing for the world outside the cluster.
type outsideNS struct {
	NS        string       `json:"ns"`
	Addrs     []netip.Addr `json:"addrs"`
	LinkLocal netip.Addr   `json:"linkLocal"`
}

// place says where an address lives in the lab.
type place struct {
	NS string
	// Node is the index of the node whose rules the address's traffic
	// crosses, -1 outside the cluster.
	Node int
}

// newName returns a fresh per-run prefix such as "moat-1a2b3c".
func newName() (string, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random lab prefix: %w", err)
	}
	return namePrefix + hex.EncodeToString(b[:]), nil
}

// planTopology lays out a lab for a Program and extra peer addresses. It fails
// on input the lab cannot build: clashing addresses, or a peer that is a
// pod's address.
func planTopology(prefix string, prog *policy.Program, peers []netip.Addr) (*topology, error) {
	t := &topology{Prefix: prefix, Underlay: prefix + "-ul", Outside: outsideNS{NS: prefix + "-out", LinkLocal: netip.MustParseAddr("fe80::77:ff")}}
	owner := map[netip.Addr]string{}
	claim := func(a netip.Addr, who string) error {
		a = a.Unmap()
		if prev, ok := owner[a]; ok && prev != who {
			return fmt.Errorf("address clash: %s is used by %s and %s", a, prev, who)
		}
		if podGateway4 == a || generated4.Contains(a) {
			return fmt.Errorf("address clash: %s (%s) is in %s or is %s, which the lab uses itself", a, who, generated4, podGateway4)
		}
		owner[a] = who
		return nil
	}
	nodeIdx := map[string]int{}
	addNode := func(name string) int {
		if i, ok := nodeIdx[name]; ok {
			return i
		}
		i := len(t.Nodes)
		nodeIdx[name] = i
		t.Nodes = append(t.Nodes, &nodeNS{Name: name, NS: fmt.Sprintf("%s-n%d", prefix, i)})
		return i
	}
	for _, n := range prog.Nodes {
		i := addNode(n.Name)
		for _, a := range n.Addrs {
			if err := claim(a, "node "+n.Name); err != nil {
				return nil, err
			}
			t.Nodes[i].Addrs = appendNew(t.Nodes[i].Addrs, a.Unmap())
		}
	}
	for pi := range prog.Pods {
		p := &prog.Pods[pi]
		if len(p.IPs) == 0 {
			continue
		}
		i := addNode(p.NodeName)
		if p.HostNetwork {
			for _, a := range p.IPs {
				a = a.Unmap()
				if prev, ok := owner[a]; ok && prev != "node "+p.NodeName && prev != "host-network pods of node "+p.NodeName {
					return nil, fmt.Errorf("address clash: host-network pod %s has %s, which belongs to %s", p.Key(), a, prev)
				}
				if _, ok := owner[a]; !ok {
					if err := claim(a, "host-network pods of node "+p.NodeName); err != nil {
						return nil, err
					}
				}
				t.Nodes[i].Addrs = appendNew(t.Nodes[i].Addrs, a)
			}
			continue
		}
		pod := &podNS{Key: p.Key(), NS: fmt.Sprintf("%s-p%d", prefix, len(t.Pods)), Node: i, Link: fmt.Sprintf("p%d", len(t.Pods))}
		for _, a := range p.IPs {
			if err := claim(a, "pod "+p.Key()); err != nil {
				return nil, err
			}
			pod.IPs = append(pod.IPs, a.Unmap())
		}
		t.Pods = append(t.Pods, pod)
	}
	for _, a := range peers {
		a = a.Unmap()
		prev, ok := owner[a]
		switch {
		case !ok && podNetNode(prog, a) != "":
			// Inside a node's pod CIDRs and no pod's: the pod network
			// routes it to that node, so it lives behind it like a pod,
			// one whose address the agent does not know (yet).
			who := "peer " + a.String() + " (no pod's, in node " + podNetNode(prog, a) + "'s pod CIDRs)"
			if err := claim(a, who); err != nil {
				return nil, err
			}
			i := addNode(podNetNode(prog, a))
			t.Pods = append(t.Pods, &podNS{Key: who, NS: fmt.Sprintf("%s-p%d", prefix, len(t.Pods)), Node: i, Link: fmt.Sprintf("p%d", len(t.Pods)), IPs: []netip.Addr{a}})
		case !ok:
			if err := claim(a, "peer "+a.String()); err != nil {
				return nil, err
			}
			t.Outside.Addrs = appendNew(t.Outside.Addrs, a)
		case len(prev) > 4 && prev[:4] == "pod ":
			return nil, fmt.Errorf("peer %s is the address of %s: name the pod instead of its address", a, prev)
		}
	}
	for i, n := range t.Nodes {
		sort.Slice(n.Addrs, func(a, b int) bool { return n.Addrs[a].Less(n.Addrs[b]) })
		for _, a := range n.Addrs {
			if a.Is4() && !n.Src4.IsValid() {
				n.Src4 = a
			}
			if a.Is6() && !n.Src6.IsValid() {
				n.Src6 = a
			}
		}
		if !n.Src4.IsValid() {
			if i > 250 {
				return nil, fmt.Errorf("too many nodes without an IPv4 address (%d)", i)
			}
			b := generated4.Addr().As4()
			b[3] = byte(i + 1)
			n.Src4 = netip.AddrFrom4(b)
			n.Addrs = append(n.Addrs, n.Src4)
		}
		n.LinkLocal = netip.AddrFrom16([16]byte{0xfe, 0x80, 12: 0, 13: 0x77, 14: byte(i >> 8), 15: byte(i + 1)})
	}
	sort.Slice(t.Outside.Addrs, func(a, b int) bool { return t.Outside.Addrs[a].Less(t.Outside.Addrs[b]) })
	return t, nil
}

// podNetNode is the node whose pod CIDRs hold a (the first by name), ""
// for none.
func podNetNode(prog *policy.Program, a netip.Addr) string {
	for _, n := range prog.Nodes {
		for _, c := range n.PodCIDRs {
			if c.Contains(a) {
				return n.Name
			}
		}
	}
	return ""
}

func appendNew(list []netip.Addr, a netip.Addr) []netip.Addr {
	for _, x := range list {
		if x == a {
			return list
		}
	}
	return append(list, a)
}

// Namespaces lists every namespace of the lab, underlay first.
func (t *topology) Namespaces() []string {
	out := []string{t.Underlay, t.Outside.NS}
	for _, n := range t.Nodes {
		out = append(out, n.NS)
	}
	for _, p := range t.Pods {
		out = append(out, p.NS)
	}
	return out
}

// Locate finds the namespace holding an address.
func (t *topology) Locate(a netip.Addr) (place, bool) {
	a = a.Unmap()
	for _, p := range t.Pods {
		for _, x := range p.IPs {
			if x == a {
				return place{NS: p.NS, Node: p.Node}, true
			}
		}
	}
	for i, n := range t.Nodes {
		for _, x := range n.Addrs {
			if x == a {
				return place{NS: n.NS, Node: i}, true
			}
		}
	}
	for _, x := range t.Outside.Addrs {
		if x == a {
			return place{NS: t.Outside.NS, Node: -1}, true
		}
	}
	return place{}, false
}

// NodeByName returns a node's index, -1 if the lab has no such node.
func (t *topology) NodeByName(name string) int {
	for i, n := range t.Nodes {
		if n.Name == name {
			return i
		}
	}
	return -1
}
