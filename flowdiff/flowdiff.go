// Package flowdiff answers "what would this change do to traffic?": given
// the Program of the current state and the Program of a proposed one, it
// lists every flow whose verdict changes, with both explanations. `moat
// diff` prints it, to gate CI and GitOps pipelines.
//
// The flows compared are those between the pods present in both states
// (by namespace/name), the --peer addresses, every node address, and one
// implied peer per class of the address space the rules of either state
// can tell apart (see addrs.go): every source to every destination, on one
// port per class of the (protocol, port) space the rules judging that
// pair in either state can tell apart (see ports.go), or, with
// Options.Ports, on those ports. Declared container ports only choose
// which port of a class is shown: Kubernetes treats them as informational,
// and a policy change opens or closes undeclared ports as well. So every
// (address, protocol, port) falls in a class judged by one probe, and no
// change can hide between probes. Pods only one state has are listed as
// added or removed, and count as a change (Changed).
//
// Compute does not judge the whole matrix. A flow's verdict depends only on
// the source's compiled egress policy, the destination's compiled ingress
// policy, and the two ends' own facts (addresses, host network, node with
// its addresses and pod CIDRs, whether a pod claims an address, or
// several). So it compares, for
// every pod, its compiled policies in the two Programs - once per distinct
// pair, as pods with the same selecting policies share them - and, where
// they differ only in which addresses rules match, finds the remote
// endpoints inside the addresses that changed; only flows touching a pod
// whose facts or policy changed, towards the remotes that can be affected,
// are judged, in both Programs. The cost grows with what changed, not with
// the matrix.
package flowdiff

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// Options choose the flows compared.
type Options struct {
	// Ports, if set, are judged towards every destination instead of one
	// port per class of the ports the rules can tell apart.
	Ports []matrix.PortProto
	// Peers are addresses outside the pod network to judge too, beside
	// the implied peers (node addresses, one address per class of the
	// address space the rules can tell apart).
	Peers []netip.Addr
}

// Change is one flow whose verdict differs: the JSON schema of `moat diff
// -o json`.
type Change struct {
	// From and To are a pod (namespace/name), a --peer address, a node
	// address ("192.0.2.11 (node node-a)") or an implied peer standing for
	// the addresses no pod or node has in a class of the address space
	// ("198.51.100.0/24", "10.0.0.0/8 except 10.1.0.0/16", "any other
	// IPv4 address").
	From string `json:"from"`
	To   string `json:"to"`
	// Port and Protocol are the flow's probe; Ports, when set, is the
	// class of ports and protocols it stands for, all judged alike in
	// both states ("any of 8000-9000", "any port or protocol but TCP
	// 443"). Port is 0 for ICMP.
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"`
	Ports    string `json:"ports,omitempty"`
	// Family is IPv4 or IPv6 when the two ends share both families (in
	// either state): each family's flow is compared on its own.
	Family string         `json:"family,omitempty"`
	Before policy.Verdict `json:"before"`
	After  policy.Verdict `json:"after"`
}

// Result is every change, sorted by source, destination, port, protocol
// and family.
type Result struct {
	Changes []Change `json:"changes"`
	// AddedPods and RemovedPods are pods (namespace/name, with an address)
	// only the proposed or only the current state has; their flows are
	// not compared.
	AddedPods   []string `json:"addedPods"`
	RemovedPods []string `json:"removedPods"`
	// Flows is how many flows the comparison covers (one per source,
	// destination and port class); Judged how many of them were judged
	// (in both states) to find the changes.
	Flows  int `json:"flows"`
	Judged int `json:"judged"`
}

// endpoint is a row/column of the comparison: a pod both states have, or
// a peer.
type endpoint struct {
	label  string
	before matrix.Endpoint
	after  matrix.Endpoint
	addrs  []netip.Addr // in both states (a pod whose addresses changed is judged whole)
	// decl are the ports the pod declares in either state: only to pick
	// which port of a class a line shows.
	decl      []matrix.PortProto
	pod       bool
	podBefore int
	podAfter  int
	// egress and ingress are the port sets the endpoint's policies name
	// in both states (nil with Options.Ports).
	egress, ingress *portSets
}

// space is the set of flows both functions compare.
type space struct {
	before, after *policy.Program
	eps           []endpoint
	fixed         []matrix.PortProto // Options.Ports
	classes       *portClasses
	result        Result
}

func newSpace(before, after *policy.Program, opts Options) *space {
	s := &space{before: before, after: after, fixed: opts.Ports}
	afterByKey := map[string]int{}
	for i := range after.Pods {
		if len(after.Pods[i].IPs) > 0 {
			afterByKey[after.Pods[i].Key()] = i
		}
	}
	inBefore := map[string]bool{}
	var taken []netip.Addr
	for i := range before.Pods {
		p := &before.Pods[i]
		if len(p.IPs) == 0 {
			continue
		}
		key := p.Key()
		inBefore[key] = true
		j, ok := afterByKey[key]
		if !ok {
			s.result.RemovedPods = append(s.result.RemovedPods, key)
			continue
		}
		s.eps = append(s.eps, endpoint{
			label:     key,
			before:    matrix.Endpoint{Label: key, Endpoint: policy.Endpoint{Pod: i, Addr: p.IPs[0]}},
			after:     matrix.Endpoint{Label: key, Endpoint: policy.Endpoint{Pod: j, Addr: after.Pods[j].IPs[0]}},
			addrs:     p.IPs,
			decl:      declared(p, &after.Pods[j]),
			pod:       true,
			podBefore: i,
			podAfter:  j,
		})
	}
	for i := range after.Pods {
		if key := after.Pods[i].Key(); len(after.Pods[i].IPs) > 0 && !inBefore[key] {
			s.result.AddedPods = append(s.result.AddedPods, key)
		}
	}
	for _, a := range opts.Peers {
		a = a.Unmap()
		if slices.Contains(taken, a) {
			continue // named twice
		}
		taken = append(taken, a)
		e := matrix.Endpoint{Label: a.String(), Endpoint: policy.Endpoint{Pod: -1, Addr: a}}
		s.eps = append(s.eps, endpoint{label: e.Label, before: e, after: e, addrs: []netip.Addr{a}, podBefore: -1, podAfter: -1})
	}
	s.eps = append(s.eps, impliedPeers(before, after, taken)...)
	n := len(s.eps)
	if len(s.fixed) > 0 {
		s.result.Flows = n * n * len(s.fixed)
		return s
	}
	s.classes = newPortClasses()
	egress, ingress := map[*portSets]int{}, map[*portSets]int{}
	for e := range s.eps {
		ep := &s.eps[e]
		var pb, pa *policy.PodPolicy
		if ep.pod {
			pb, pa = before.Policies[ep.podBefore], after.Policies[ep.podAfter]
		}
		ep.egress = s.classes.endpointSets(dirOf(pb, policy.Egress), dirOf(pa, policy.Egress))
		ep.ingress = s.classes.endpointSets(dirOf(pb, policy.Ingress), dirOf(pa, policy.Ingress))
		egress[ep.egress]++
		ingress[ep.ingress]++
	}
	for e, ne := range egress {
		for i, ni := range ingress {
			s.result.Flows += ne * ni * len(s.classes.classes(e, i))
		}
	}
	return s
}

// dirOf is a pod's policy in one direction, nil for a pod not policed.
func dirOf(p *policy.PodPolicy, d policy.Direction) *policy.DirPolicy {
	if p == nil {
		return nil
	}
	return p.Dir(d)
}

// declared is the union of the ports a pod declares in both states, TCP
// first: the port of a class shown is the first declared in it.
func declared(a, b *policy.Pod) []matrix.PortProto {
	var out []matrix.PortProto
	for _, p := range []*policy.Pod{a, b} {
		for _, cp := range p.Ports {
			out = append(out, matrix.PortProto{Port: cp.Port, Protocol: cp.Protocol})
		}
	}
	slices.SortFunc(out, func(a, b matrix.PortProto) int {
		return cmp.Or(cmp.Compare(protoRank(a.Protocol), protoRank(b.Protocol)), cmp.Compare(a.Port, b.Port))
	})
	return slices.Compact(out)
}

// familyPairs are a source and destination's addresses per family in both
// states.
type familyPairs struct {
	pairs [2]struct {
		before, after   [2]policy.Endpoint
		inBefore, inAft bool
	}
	families int
}

// judge compares one source and destination on every port class of the
// pair (or every Options.Ports port), over each address family they share
// in either state (a dual-stack pair is two flows, which an ipBlock of one
// family can treat differently): verdicts first, explanations only for
// flows that changed.
func (s *space) judge(src, dst int) {
	from, to := &s.eps[src], &s.eps[dst]
	var fp familyPairs
	for f, v4 := range []bool{true, false} {
		pr := &fp.pairs[f]
		pr.before, pr.inBefore = s.before.PairAddrsIn(from.before.Endpoint, to.before.Endpoint, v4)
		pr.after, pr.inAft = s.after.PairAddrsIn(from.after.Endpoint, to.after.Endpoint, v4)
		if pr.inBefore || pr.inAft {
			fp.families++
		}
	}
	if len(s.fixed) > 0 {
		for _, pp := range s.fixed {
			s.judgePort(from, to, &fp, pp, nil)
		}
		return
	}
	cls := s.classes.classes(from.egress, to.ingress)
	for i := range cls {
		s.judgePort(from, to, &fp, cls[i].probe(to.decl), &cls[i])
	}
}

// judgePort judges one port (standing for class, if set) over each family.
func (s *space) judgePort(from, to *endpoint, fp *familyPairs, pp matrix.PortProto, class *portClass) {
	s.result.Judged++
	for f := range fp.pairs {
		pr := &fp.pairs[f]
		b := pr.inBefore && s.before.Allowed(policy.Flow{Src: pr.before[0], Dst: pr.before[1], Proto: pp.Protocol, Port: pp.Port})
		a := pr.inAft && s.after.Allowed(policy.Flow{Src: pr.after[0], Dst: pr.after[1], Proto: pp.Protocol, Port: pp.Port})
		if a == b {
			continue
		}
		c := Change{
			From: from.label, To: to.label, Port: pp.Port, Protocol: pp.Protocol.String(),
			Before: verdict(s.before, pr.before, pr.inBefore, pp),
			After:  verdict(s.after, pr.after, pr.inAft, pp),
		}
		if class != nil {
			c.Ports = class.describe()
		}
		if fp.families > 1 {
			c.Family = [2]string{"IPv4", "IPv6"}[f]
		}
		s.result.Changes = append(s.result.Changes, c)
	}
}

// verdict explains one flow over one family's pair; ok false: the ends
// share no address of that family in this state.
func verdict(p *policy.Program, pair [2]policy.Endpoint, ok bool, pp matrix.PortProto) policy.Verdict {
	if !ok {
		no := policy.Decision{Tier: policy.TierNotPoliced, Reason: "source and destination share no address of this family"}
		return policy.Verdict{Egress: no, Ingress: no}
	}
	return p.Evaluate(policy.Flow{Src: pair[0], Dst: pair[1], Proto: pp.Protocol, Port: pp.Port})
}

// Changed reports whether the proposed state changes traffic: some flow
// changes verdict, or a pod (with an address) is added or removed. A pod
// only one state has is not compared flow by flow, but every flow to and
// from it appears or disappears: a gate (`moat diff`'s exit status 3)
// must not call that "no change" (a deleted namespace cuts its clients
// off; a new pod is reachable, or not, by what the policies say).
func (r *Result) Changed() bool {
	return len(r.Changes) > 0 || len(r.AddedPods) > 0 || len(r.RemovedPods) > 0
}

// ChangedFlows counts the flows with a change: a dual-stack flow whose
// verdict changes over both families is one flow and two Changes.
func (r *Result) ChangedFlows() int {
	n := 0
	for i, c := range r.Changes {
		if i == 0 || c.Family == "" || !sameFlow(c, r.Changes[i-1]) {
			n++
		}
	}
	return n
}

func sameFlow(a, b Change) bool {
	return a.From == b.From && a.To == b.To && a.Port == b.Port && a.Protocol == b.Protocol
}

func (s *space) finish() *Result {
	slices.SortFunc(s.result.Changes, func(a, b Change) int {
		return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Family, b.Family))
	})
	slices.Sort(s.result.AddedPods)
	slices.Sort(s.result.RemovedPods)
	// JSON lists are [] when empty, never null: scripts iterate them.
	for _, l := range []*[]string{&s.result.AddedPods, &s.result.RemovedPods} {
		if *l == nil {
			*l = []string{}
		}
	}
	if s.result.Changes == nil {
		s.result.Changes = []Change{}
	}
	return &s.result
}

// Full judges every flow in both states: the reference Compute is checked
// against, and the cost Compute avoids.
func Full(before, after *policy.Program, opts Options) *Result {
	s := newSpace(before, after, opts)
	for i := range s.eps {
		for j := range s.eps {
			s.judge(i, j)
		}
	}
	return s.finish()
}
