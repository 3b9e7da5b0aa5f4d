package policy

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Compile turns a snapshot into a Program. It never fails: objects that do
// not validate, or that carry fields Moat does not know, are compiled fail
// closed and reported in Program.Status and Program.Diagnostics.
//
// Its cost grows with the input, not with pods times policies: every
// selector and every peer is resolved once (bitmaps of pods by label), and
// each tier is compiled once per class of pods that its selectors cannot
// tell apart (see tiers.go).
func Compile(c *Cluster, opts Options) *Program {
	return build(c, opts).prog
}

// build compiles a snapshot into a fresh state and publishes its Program.
func build(c *Cluster, opts Options) *state {
	v := validateAll(c) // on other cores, while this one goes on
	s := newState(opts)
	s.loadNamespaces(c)
	s.loadNodes(c.Nodes)
	pods := s.uniquePods(c.Pods)
	// The compiler keeps the NetworkPolicies themselves (there are tens
	// of thousands; NewCompiler's doc says they must not change), and
	// copies of the ClusterNetworkPolicies' wrappers, so that the caller
	// may reuse the Cluster's slices.
	for i, np := range c.NetworkPolicies {
		s.addNP(np, v.get(i))
	}
	cnps := slices.Clone(c.ClusterNetworkPolicies)
	for i := range cnps {
		s.addCNP(&cnps[i], v.get(len(c.NetworkPolicies)+i))
	}
	s.loadPods(pods)
	s.dirty.full = true
	s.publish()
	s.loadKeys = nil
	return s
}

func (s *state) loadNamespaces(c *Cluster) {
	for _, ns := range c.Namespaces {
		if have := s.namespaces[ns.Name]; have != nil && have.explicit {
			s.diag(SeverityWarning, "Namespace "+ns.Name, "", "", "duplicate object: the first one is used")
			continue
		}
		n := s.namespace(ns.Name)
		n.explicit = true
		s.setNSLabels(n, ns.Labels)
	}
}

func (s *state) loadNodes(nodes []Node) {
	for _, n := range nodes {
		if _, dup := s.nodes[n.Name]; dup {
			s.diag(SeverityWarning, "Node "+n.Name, "", "", "duplicate object: the first one is used")
			continue
		}
		n := n
		s.nodes[n.Name] = &n
		s.countNodeAddrs(&n, 1)
	}
	s.dirty.nodes = true
}

// uniquePods sorts pods by key and keeps the first of duplicates; it
// keeps their keys for the first Program (loadKeys).
func (s *state) uniquePods(in []*Pod) []*Pod {
	type keyed struct {
		key string
		i   int
	}
	ks := make([]keyed, len(in))
	for i := range in {
		ks[i] = keyed{in[i].Key(), i}
	}
	slices.SortStableFunc(ks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	pods := make([]*Pod, 0, len(in))
	s.loadKeys = make([]string, 0, len(in))
	for j, k := range ks {
		if j > 0 && ks[j-1].key == k.key {
			s.diag(SeverityWarning, "Pod "+k.key, "", "", "duplicate object: the first one is used")
			continue
		}
		pods = append(pods, cleanAddrs(in[k.i]))
		s.loadKeys = append(s.loadKeys, k.key)
	}
	return pods
}

// loadPods adds the snapshot's pods, numbering them (slots) so that pods
// that peers pick together are adjacent: by their namespace's labels as
// namespace selectors see them, their own labels as pod selectors see
// them, then their namespace (peerKeys lists the keys). A selector peer
// is then a few runs of slots in the evaluator's index instead of
// thousands of scattered addresses.
func (s *state) loadPods(pods []*Pod) {
	nsKeyList, podKeyList := s.peerKeys()

	// Pods come sorted by key, so each namespace's pods are adjacent:
	// order the namespaces, then each namespace's pods.
	type nsRun struct {
		ns         *nsState
		sig        string
		start, end int
	}
	var runs []nsRun
	for i := 0; i < len(pods); {
		j := i
		for j < len(pods) && pods[j].Namespace == pods[i].Namespace {
			j++
		}
		ns := s.namespace(pods[i].Namespace)
		runs = append(runs, nsRun{ns, projString(ns.labels, nsKeyList), i, j})
		i = j
	}
	slices.SortFunc(runs, func(a, b nsRun) int {
		if c := strings.Compare(a.sig, b.sig); c != 0 {
			return c
		}
		return strings.Compare(a.ns.name, b.ns.name)
	})
	// Within a group of namespaces that namespace selectors cannot tell
	// apart, pods with the same projection are adjacent, whatever their
	// namespace; the interned projection's number orders them alike in
	// every group. A peer that picks pods by label in namespaces picked by
	// label (every ClusterNetworkPolicy peer, a NetworkPolicy's
	// namespaceSelector peers) is then a run or two of slots however many
	// namespaces it spans, where by namespace first it was a run per
	// namespace; a namespace's own pods become a run per projection.
	s.order = make([]*podState, len(pods))
	s.slots = make([]*podState, 0, len(pods))
	s.ipOwners = newAddrOwners(len(pods))
	keysID := s.internKeys(podKeyList)
	states := make([]podState, len(pods))
	type placed struct {
		group, rank int32
		ps          *podState
	}
	all := make([]placed, 0, len(pods))
	group := int32(-1)
	for ri, r := range runs {
		if ri == 0 || r.sig != runs[ri-1].sig {
			group++
		}
		for i := r.start; i < r.end; i++ {
			ps := &states[i]
			ps.pod, ps.ns, ps.index = pods[i], r.ns, int32(i)
			s.projOf(ps, keysID)
			all = append(all, placed{group, int32(ri), ps})
		}
	}
	slices.SortFunc(all, func(a, b placed) int {
		if a.group != b.group {
			return int(a.group - b.group)
		}
		if pa, pb := a.ps.projs[0].proj, b.ps.projs[0].proj; pa != pb {
			return int(pa - pb)
		}
		if a.rank != b.rank {
			return int(a.rank - b.rank)
		}
		return int(a.ps.index - b.ps.index)
	})
	byProj := map[int32][]uint32{}
	for _, pl := range all {
		ps := pl.ps
		s.addLoaded(ps)
		if ps.podnet {
			byProj[ps.projs[0].proj] = append(byProj[ps.projs[0].proj], ps.slot)
		}
	}
	// Index the keys pod selectors read from the projections just made,
	// rather than reading every pod's labels again.
	s.podIndex.indexFrom(podKeyList, byProj, s.projs)
	for _, owners := range s.ipOwners.shared() {
		for _, o := range owners {
			s.podsWithDiags[o] = struct{}{}
		}
	}
	s.dirty.diags = true
}

// addLoaded adds one pod of a full compile.
func (s *state) addLoaded(ps *podState) {
	p := ps.pod
	ns := ps.ns
	ns.refs++
	s.allocSlot(ps)
	s.order[ps.index] = ps
	s.setPodFacts(ps)
	s.setSlotAddrs(ps)
	if ps.podnet {
		ns.pods.Add(ps.slot)
		s.podIndex.add(ps.slot, p.Labels)
		for _, a := range p.IPs {
			s.ipOwners.add(a, ps)
		}
		s.declare(ps.slot, ps.fullSig, true)
	}
	if !p.HostNetwork {
		ns.nonHost++
	}
	if len(p.IPs) == 0 {
		s.podsWithDiags[ps] = struct{}{}
	}
}

// setPodFacts derives what policy needs to know about a pod's fields.
func (s *state) setPodFacts(ps *podState) {
	p := ps.pod
	ps.podnet = !p.HostNetwork && len(p.IPs) > 0
	ps.subject = ps.podnet && (s.opts.Node == "" || p.NodeName == s.opts.Node)
	if ps.subject && s.onlyPods != nil {
		_, ps.subject = s.onlyPods[p.Key()]
	}
	ps.fullSig = s.podSig(p)
}

// projString renders labels projected onto keys, for sorting.
func projString(l map[string]string, keys []string) string {
	var b strings.Builder
	for _, k := range keys {
		if v, ok := l[k]; ok {
			b.WriteString(k)
			b.WriteByte(0)
			b.WriteString(v)
		}
		b.WriteByte(1)
	}
	return b.String()
}

// validation is the validation of a snapshot's policies, NetworkPolicies
// then ClusterNetworkPolicies, done in chunks by other goroutines while
// the compiler goes on; get waits for the chunk it needs.
type validation struct {
	errs []field.ErrorList
	done []chan struct{} // closed when the chunk's errors are in
}

// validationChunk is how many policies a worker validates at a time.
const validationChunk = 256

// validateAll starts validating every policy, on every core: validation
// is a pure function of one object, and the most costly step of compiling
// one. Workers take chunks in input order, which is the order in which
// the compiler reads them, so it rarely waits; meanwhile it loads
// namespaces, nodes and pods, and compiles the policies already
// validated.
func validateAll(c *Cluster) *validation {
	nps := len(c.NetworkPolicies)
	n := nps + len(c.ClusterNetworkPolicies)
	chunks := (n + validationChunk - 1) / validationChunk
	v := &validation{errs: make([]field.ErrorList, n), done: make([]chan struct{}, chunks)}
	for k := range v.done {
		v.done[k] = make(chan struct{})
	}
	var next atomic.Int64
	for range min(runtime.GOMAXPROCS(0), chunks) {
		go func() {
			val := newValidator()
			for {
				k := int(next.Add(1) - 1)
				if k >= chunks {
					return
				}
				for i := k * validationChunk; i < min(n, (k+1)*validationChunk); i++ {
					if i < nps {
						v.errs[i] = val.validateNP(c.NetworkPolicies[i])
					} else {
						v.errs[i] = val.validateCNP(&c.ClusterNetworkPolicies[i-nps])
					}
				}
				close(v.done[k])
			}
		}()
	}
	return v
}

// get is the i-th policy's validation errors, waiting for them if needed.
func (v *validation) get(i int) field.ErrorList {
	<-v.done[i/validationChunk]
	return v.errs[i]
}

// addNP compiles a NetworkPolicy into its namespace's tier.
func (s *state) addNP(np *NetworkPolicy, errs field.ErrorList) *npState {
	st := s.compileNP(np, errs)
	s.npSeq++
	st.seq = s.npSeq
	s.nps = append(s.nps, st)
	st.ns.tier.add(st)
	s.dirty.relistNS[st.ns.tier] = struct{}{}
	s.policyChanged(st)
	return st
}

// addCNP compiles a ClusterNetworkPolicy into its tier.
func (s *state) addCNP(cnp *ClusterNetworkPolicy, errs field.ErrorList) *cnpState {
	st := s.compileCNP(cnp, errs)
	st.seq = int(st.id)
	s.cnps = append(s.cnps, st)
	s.cnpsByID[st.id] = st
	t := s.tierOf(st)
	t.add(st)
	s.dirty.relistCNP[t.idx] = true
	s.policyChanged(st)
	return st
}

// cleanAddrs returns p, or a copy of it with its addresses unmapped and
// de-duplicated (keeping their order) when they need it: the compiler
// keeps the pods it is given and never changes them.
func cleanAddrs(p *Pod) *Pod {
	if addrsClean(p.IPs) {
		return p
	}
	out := make([]netip.Addr, 0, len(p.IPs))
	for _, a := range p.IPs {
		a = a.Unmap()
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	cp := *p
	cp.IPs = out
	return &cp
}

// addrsClean: no IPv4-mapped IPv6 address and no address twice.
func addrsClean(in []netip.Addr) bool {
	for i, a := range in {
		if a.Is4In6() || slices.Contains(in[:i], a) {
			return false
		}
	}
	return true
}

// podDiags are the diagnostics of one pod's addresses.
func (s *state) podDiags(ps *podState) []Diagnostic {
	p := ps.pod
	if len(p.IPs) == 0 {
		return []Diagnostic{{Severity: SeverityWarning, Object: "Pod " + p.Key(), Field: "status.podIPs", Message: "pod has no IP address: it is not policed and cannot be a peer by address"}}
	}
	if !ps.podnet {
		return nil
	}
	var out []Diagnostic
	for _, a := range p.IPs {
		if n := s.ipOwners.count(a); n > 1 {
			out = append(out, Diagnostic{Severity: SeverityWarning, Object: "Pod " + p.Key(), Field: "status.podIPs", Message: fmt.Sprintf("address %s is claimed by %d pods: traffic from or to it is denied", a, n)})
		}
	}
	return out
}
