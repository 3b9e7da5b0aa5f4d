package nft

import (
	"net/netip"
	"slices"

	"github.com/moat-net/moat/policy"
)

// buildInputs is everything Build reads from a Program for one node, read
// cheaply: when the inputs of two Programs are equal, so are the two
// rulesets, and Sync keeps the one programmed instead of building it
// again. Most syncs of an agent change nothing on its node (a pod
// elsewhere changed labels that none of the node's peers read), and at
// 30,000 pods building the ruleset only to find an empty diff costs
// 15-25 ms of a sync.
//
// The local pods' DirPolicies are compared by identity, which is exact
// because a Program is immutable (package policy): a DirPolicy and the
// rules, matches and address sets it holds never change once published,
// and a Compiler hands a pod the same DirPolicy only while none of them
// changed; a peer that gains or loses an address makes new matches, so
// new DirPolicies for the pods whose rules use it. (The build cache keys
// its plans by DirPolicy on the same grounds.) The inputs hold the
// DirPolicies they compare, so that none can be freed and its address
// reused by a new one. Everything else is compared by value.
//
// Whatever buildCached comes to read from a Program must be read here too,
// or Sync would keep a stale ruleset: TestReuseIsExact and
// TestRandomReuseIsExact fail when something is missing.
type buildInputs struct {
	// rebuild means these inputs are never equal to any: the Program has
	// addresses that several pods claim, whose warnings name claimants
	// from anywhere in the cluster (rare, and an input problem anyway).
	rebuild       bool
	denyNodeLocal bool
	// own are Ruleset.own, the node's status addresses.
	own []netip.Addr
	// nodeAddrs are the node's node-local addresses
	// (Program.NodeLocalAddrs).
	nodeAddrs []netip.Addr
	// nodeClaimed are the node's addresses a pod claims (nodeClaimed).
	nodeClaimed []netip.Addr
	// clusterNodes are Ruleset.clusterNodes, every Node's addresses.
	clusterNodes []netip.Addr
	// podNets and podAddrs are Ruleset.podNets and Ruleset.pods: the
	// latter may hold pods of other nodes (Program.PodAddrsIn).
	podNets  []netip.Prefix
	podAddrs []netip.Addr
	// pods are the Program's pods on the node, in order.
	pods []podInputs
}

// podInputs is what Build reads of one pod on the node.
type podInputs struct {
	namespace, name string
	hostNetwork     bool
	ips             []netip.Addr
	ports           []policy.ContainerPort
	ingress, egress *policy.DirPolicy
	hasPolicy       bool
}

// readInputs reads the inputs of Build(prog, node).
func readInputs(prog *policy.Program, node string) *buildInputs {
	in := &buildInputs{denyNodeLocal: prog.Options.DenyNodeLocal}
	if len(prog.DuplicateAddrs()) > 0 {
		in.rebuild = true
		return in
	}
	in.own = ownAddrs(prog, node)
	in.nodeAddrs = prog.NodeLocalAddrs(node)
	in.nodeClaimed = nodeClaimed(prog, node, in.nodeAddrs)
	in.clusterNodes = clusterNodeAddrs(prog)
	in.podNets = podNets(prog, node)
	in.podAddrs = prog.PodAddrsIn(in.podNets)
	for i := range prog.Pods {
		p := &prog.Pods[i]
		if p.NodeName != node {
			continue
		}
		pi := podInputs{namespace: p.Namespace, name: p.Name, hostNetwork: p.HostNetwork, ips: p.IPs, ports: p.Ports}
		if i < len(prog.Policies) && prog.Policies[i] != nil {
			pi.hasPolicy = true
			pi.ingress, pi.egress = prog.Policies[i].Ingress, prog.Policies[i].Egress
		}
		in.pods = append(in.pods, pi)
	}
	return in
}

// equal reports whether Build gives the same ruleset for both inputs.
func (in *buildInputs) equal(o *buildInputs) bool {
	if in == nil || o == nil || in.rebuild || o.rebuild {
		return false
	}
	return in.denyNodeLocal == o.denyNodeLocal && slices.Equal(in.own, o.own) &&
		slices.Equal(in.nodeAddrs, o.nodeAddrs) && slices.Equal(in.nodeClaimed, o.nodeClaimed) &&
		slices.Equal(in.clusterNodes, o.clusterNodes) &&
		slices.Equal(in.podNets, o.podNets) && slices.Equal(in.podAddrs, o.podAddrs) &&
		slices.EqualFunc(in.pods, o.pods, podInputs.equal)
}

func (p podInputs) equal(o podInputs) bool {
	return p.namespace == o.namespace && p.name == o.name && p.hostNetwork == o.hostNetwork &&
		slices.Equal(p.ips, o.ips) && slices.Equal(p.ports, o.ports) &&
		p.hasPolicy == o.hasPolicy && p.ingress == o.ingress && p.egress == o.egress
}
