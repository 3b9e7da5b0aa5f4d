package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/moat-net/moat/policy"
)

// builder holds the state of one Build.
type builder struct {
	rs    *Ruleset
	cache *buildCache
	plans map[*policy.DirPolicy]*dirPlan
	order []*policy.DirPolicy
	// Shared peers: by content key, and by the AddrSet seen.
	peers  map[string]*peerGroup
	peerOf map[*policy.AddrSet]*peerGroup
	shapes map[string]*runShape // by run memo
	// runsOf counts the distinct runs that match each peer.
	runsOf map[*peerGroup]int
	// Union runs, by run memo: elements, their hash, the sets' base name.
	content map[string]*setContents
	hashOf  map[string]string
	setName map[string]string
	chainOf map[*policy.DirPolicy]entry
	names   []string    // scratch for memoChains
	scratch []byte      // scratch for addChain
	rules   []chainRule // scratch for chain
	// counted are the counters chain registered for the DirPolicy it
	// builds (see keepChains).
	counted []*DropCounter
}

// entry is how a DirPolicy's chains are reached: the chain its pods'
// addresses map to, and, when that is the Admin tier's chain, the chain
// of the tiers after it ("": none can deny).
type entry struct {
	chain, next string
	admin       bool
}

// localPod is a policed pod on the node and the addresses it owns alone.
type localPod struct {
	pod int
	ips []netip.Addr
}

// Build computes the ruleset of one node: egress for the pod-network pods
// running on it, ingress for the same pods. Build never fails: input it
// cannot honour exactly (two local pods with one address) fails closed and
// is reported in Warnings.
func Build(prog *policy.Program, node string) *Ruleset {
	return buildCached(prog, node, nil, nil)
}

// buildCached is Build reusing (and refreshing) cache; nil means none.
// Entries the new Program does not use are dropped. in, when not nil, are
// the Program's inputs as readInputs read them: what they hold is not
// read again (the pod addresses in the node's pod CIDRs are a walk over
// every pod address of the cluster).
func buildCached(prog *policy.Program, node string, cache *buildCache, in *buildInputs) *Ruleset {
	defer cache.sweep()
	b := newBuilder(node, cache)
	// 1. The node's own addresses, allowed to reach its pods; its pod
	// CIDRs and the pod addresses in them.
	b.nodeLocal(prog)
	if in != nil && !in.rebuild {
		b.rs.podNets, b.rs.pods = in.podNets, in.podAddrs
	} else {
		b.podNet(prog)
	}
	// 2. The local pods, their addresses, and the runs of each distinct
	// DirPolicy that judges them.
	locals, conflict := b.localPods(prog)
	// 3. How each run is matched: shared peer sets or union sets.
	for _, dp := range b.order {
		for _, r := range b.plans[dp].runs() {
			r.shape = b.shape(r)
		}
	}
	b.shareCrowded()
	// 4. Set names and elements.
	b.namePeers()
	b.nameUnionSets()
	b.sortLookups()
	// 5. Chains, and the verdict maps that send each pod to its own.
	b.dispatch(prog, locals, conflict)
	sort.Strings(b.rs.warnings)
	return b.rs
}

func newBuilder(node string, cache *buildCache) *builder {
	b := &builder{
		cache: cache,
		rs: &Ruleset{
			node:        node,
			sets:        map[string]*namedSet{},
			chains:      map[string]*policyChain{},
			egress:      map[netip.Addr]string{},
			ingress:     map[netip.Addr]string{},
			egressNext:  map[netip.Addr]string{},
			ingressNext: map[netip.Addr]string{},
			counters:    map[string]*DropCounter{},
		},
		plans:   map[*policy.DirPolicy]*dirPlan{},
		peers:   map[string]*peerGroup{},
		peerOf:  map[*policy.AddrSet]*peerGroup{},
		shapes:  map[string]*runShape{},
		runsOf:  map[*peerGroup]int{},
		content: map[string]*setContents{},
		hashOf:  map[string]string{},
		setName: map[string]string{},
		chainOf: map[*policy.DirPolicy]entry{},
	}
	for i := range staticCounters {
		c := staticCounters[i]
		b.rs.counters[c.Name] = &c
	}
	return b
}

// nodeLocal lists the addresses whose connections to the node's pods
// are node-local (Program.NodeLocalAddrs), and the node's addresses a
// pod claims, which are not.
func (b *builder) nodeLocal(prog *policy.Program) {
	b.rs.own = ownAddrs(prog, b.rs.node)
	b.rs.nodeLocal = prog.NodeLocalAddrs(b.rs.node)
	b.rs.hostLocal = !prog.Options.DenyNodeLocal
	b.rs.nodeClaimed = nodeClaimed(prog, b.rs.node, b.rs.nodeLocal)
	b.rs.clusterNodes = clusterNodeAddrs(prog)
}

// clusterNodeAddrs lists, sorted, the status addresses of every Node of
// the cluster: the tunnel endpoints a pod's overlay encapsulation must
// not reach (encapRules).
func clusterNodeAddrs(prog *policy.Program) []netip.Addr {
	var out []netip.Addr
	for i := range prog.Nodes {
		for _, a := range prog.Nodes[i].Addrs {
			if a = a.Unmap(); a.IsValid() {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// ownAddrs lists, sorted, the addresses the Node's status gives it.
func ownAddrs(prog *policy.Program, node string) []netip.Addr {
	var out []netip.Addr
	for _, a := range prog.NodeAddrs(node) {
		if a = a.Unmap(); a.IsValid() {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// nodeClaimed lists, sorted, the node's addresses that NodeLocalAddrs
// leaves out because a pod-network pod claims them; nil when node-local
// traffic is policed anyway.
func nodeClaimed(prog *policy.Program, node string, nodeLocal []netip.Addr) []netip.Addr {
	if prog.Options.DenyNodeLocal {
		return nil
	}
	var out []netip.Addr
	for i := range prog.Nodes {
		if prog.Nodes[i].Name != node {
			continue
		}
		for _, a := range prog.Nodes[i].Addrs {
			if a = a.Unmap(); a.IsValid() && !slices.Contains(nodeLocal, a) && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// podNet reads the node's pod CIDRs and, when it has some, the pod
// addresses in them (see Ruleset.podNets), of pods on any node: with a
// CNI that allocates from the nodes' pod CIDRs these are the node's own
// pods; one that ignores them (its own IP pools while the controller
// manager still sets spec.podCIDRs) may give a pod of another node an
// address in them, and that pod's connections through this node must not
// be taken for forged ones.
func (b *builder) podNet(prog *policy.Program) {
	b.rs.podNets = podNets(prog, b.rs.node)
	b.rs.pods = prog.PodAddrsIn(b.rs.podNets)
}

// podNets are the node's pod CIDRs, less those another one contains (an
// interval set refuses overlapping elements).
func podNets(prog *policy.Program, node string) []netip.Prefix {
	cidrs := slices.Clone(prog.PodCIDRs(node))
	slices.SortFunc(cidrs, func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	})
	var out []netip.Prefix
	for _, c := range cidrs {
		if n := len(out); n > 0 && out[n-1].Overlaps(c) {
			continue // sorted by address then length: the earlier one contains c
		}
		out = append(out, c)
	}
	return out
}

// localPods finds the policed pods on the node and plans their
// DirPolicies. An address two pods claim, here or on any node, is a
// conflict: no pod owns it, and all its new connections are dropped, as
// the evaluator denies them (which pod the compiler polices for it, or
// whether the other claimant runs here, must not open it).
func (b *builder) localPods(prog *policy.Program) ([]localPod, map[netip.Addr]bool) {
	var locals []localPod
	owner := map[netip.Addr]int{}
	conflict := b.duplicates(prog)
	for i := range prog.Pods {
		pod := &prog.Pods[i]
		if pod.NodeName != b.rs.node || pod.HostNetwork || len(pod.IPs) == 0 || i >= len(prog.Policies) || prog.Policies[i] == nil {
			continue
		}
		var ips []netip.Addr
		for _, a := range pod.IPs {
			a = a.Unmap()
			if !a.IsValid() {
				continue
			}
			if conflict[a] {
				continue
			}
			if o, dup := owner[a]; dup && o != i {
				conflict[a] = true
				b.rs.warnings = append(b.rs.warnings, fmt.Sprintf("pods %s and %s both have address %s: all its new connections are dropped", prog.Pods[o].Key(), pod.Key(), a))
				continue
			}
			if _, dup := owner[a]; !dup {
				owner[a] = i
				ips = append(ips, a)
			}
		}
		locals = append(locals, localPod{pod: i, ips: ips})
		sig := podSignature(pod)
		for _, dir := range []policy.Direction{policy.Egress, policy.Ingress} {
			if dp := prog.Policies[i].Dir(dir); dp != nil {
				p := b.plan(dp, dir)
				p.users = append(p.users, sig)
			}
		}
	}
	return locals, conflict
}

// dispatch builds each local pod's chains and maps its addresses to them.
func (b *builder) dispatch(prog *policy.Program, locals []localPod, conflict map[netip.Addr]bool) {
	rs := b.rs
	for _, l := range locals {
		pp := prog.Policies[l.pod]
		for _, dir := range []policy.Direction{policy.Egress, policy.Ingress} {
			dp := pp.Dir(dir)
			if dp == nil {
				continue
			}
			e := b.chain(dp)
			if e.chain == "" {
				continue
			}
			m, next := rs.egress, rs.egressNext
			if dir == policy.Ingress {
				m, next = rs.ingress, rs.ingressNext
			}
			for _, a := range l.ips {
				if conflict[a] {
					continue
				}
				m[a] = e.chain
				if e.admin {
					next[a] = e.next
				}
			}
		}
		for _, a := range l.ips {
			if !conflict[a] {
				rs.self = append(rs.self, a)
			}
		}
	}
	for a := range conflict {
		rs.egress[a] = conflictChain
		rs.ingress[a] = conflictChain
	}
	sort.Slice(rs.self, func(i, j int) bool { return rs.self[i].Less(rs.self[j]) })
}

// duplicates is the conflict set the Program knows of (addresses several
// pods claim, wherever they run), with one warning per address naming its
// claimants.
func (b *builder) duplicates(prog *policy.Program) map[netip.Addr]bool {
	dups := prog.DuplicateAddrs()
	conflict := make(map[netip.Addr]bool, len(dups))
	if len(dups) == 0 {
		return conflict
	}
	for _, a := range dups {
		conflict[a] = true
		b.rs.warnings = append(b.rs.warnings, fmt.Sprintf("pods %s both have address %s: all its new connections are dropped", strings.Join(prog.Claimants(a), " and "), a))
	}
	return conflict
}

// podSignature identifies what makes a pod's rules resolve differently
// from another's: its declared ports (named ports resolve on them).
func podSignature(p *policy.Pod) string {
	parts := make([]string, len(p.Ports))
	for i, cp := range p.Ports {
		parts[i] = fmt.Sprintf("%s/%d/%d", cp.Name, cp.Protocol, cp.Port)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// runRules appends a run's chain rules to dst.
func (b *builder) runRules(dst []chainRule, r *run, v verdict) []chainRule {
	counter := b.counter(r.counter)
	if r.shape.union {
		dst = append(dst, chainRule{Set: b.setName[r.memo], Verdict: v, Comment: r.comment, Counter: counter})
	}
	return b.lookupRules(dst, r, r.shape, v, counter)
}

// chain returns how a DirPolicy's pods enter their chains, creating the
// chains it needs; no chain when nothing can deny (default allow). The
// Admin tier's chain goes to the tiers after it through nextChain, so
// its content does not depend on them.
func (b *builder) chain(dp *policy.DirPolicy) entry {
	if e, ok := b.chainOf[dp]; ok {
		return e
	}
	if e, ok := b.memoChains(dp); ok {
		b.chainOf[dp] = e
		return e
	}
	b.counted = b.counted[:0]
	p := b.plans[dp]
	// Rules are gathered in the builder's scratch list; addChain copies
	// them when the chain is new.
	rest := b.rules[:0]
	if p.hasNP {
		// The pod's Service hairpin: NetworkPolicies never isolate a pod
		// from itself (the Admin tier, before this chain, has judged it).
		rest = append(rest, chainRule{Self: true, Verdict: verdict{Kind: verdictReturn}, Comment: "Service hairpin: NetworkPolicy does not isolate a pod from itself"})
		if p.np != nil {
			rest = b.runRules(rest, p.np, verdict{Kind: verdictReturn})
		}
		rest = append(rest, chainRule{Verdict: verdict{Kind: verdictDrop}, Comment: "NetworkPolicy isolation", Counter: b.counter(p.isolation)})
	} else {
		for _, r := range p.baseline {
			rest = b.runRules(rest, r, verdict{Kind: r.verdict})
		}
	}
	e := entry{chain: b.addChain(p.dir, rest)}
	next := verdict{Kind: verdictGoto, Target: nextChain(p.dir)}
	admin := rest[:0]
	for _, r := range p.admin {
		v := verdict{Kind: r.verdict}
		if v.Kind == verdictGoto {
			v = next
		}
		admin = b.runRules(admin, r, v)
	}
	if len(admin) > 0 {
		admin = append(admin, chainRule{Verdict: next, Comment: "next tier"})
		e = entry{chain: b.addChain(p.dir, admin), next: e.chain, admin: true}
	}
	b.rules = admin[:0]
	b.chainOf[dp] = e
	b.keepChains(dp, e)
	return e
}

func (b *builder) addChain(dir policy.Direction, rules []chainRule) string {
	if len(rules) == 0 {
		return ""
	}
	// The name hashes the rules' fields, each ended by a 0 byte, joined
	// in the builder's scratch buffer.
	buf := joinParts(b.scratch[:0], dir.String())
	for _, r := range rules {
		ports := ""
		if r.Ports != nil {
			ports = portsKey(r.Ports.ByProto)
		}
		if r.Self {
			// Only then: the names of chains without it stay as they were.
			buf = joinParts(buf, "self")
		}
		buf = joinParts(buf, r.Peers, ports, r.PortSet, r.Set)
		buf = append(strconv.AppendInt(buf, int64(r.Verdict.Kind), 10), 0)
		buf = joinParts(buf, r.Verdict.Target, r.Comment, r.Counter, "|")
	}
	b.scratch = buf
	prefix := "eg-"
	if dir == policy.Ingress {
		prefix = "in-"
	}
	name := hashBytes(prefix, buf)
	if _, ok := b.rs.chains[name]; !ok {
		b.rs.chains[name] = &policyChain{Name: name, Dir: dir, Rules: slices.Clone(rules)}
	}
	return name
}

// counter records that a rule of the ruleset counts into c and returns
// its name ("" for nil: the rule counts nothing).
func (b *builder) counter(c *DropCounter) string {
	if c == nil {
		return ""
	}
	b.rs.counters[c.Name] = c
	b.counted = append(b.counted, c)
	return c.Name
}
