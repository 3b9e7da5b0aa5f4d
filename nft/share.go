package nft

import (
	"crypto/sha256"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/moat-net/moat/policy"
)

// maxLookups is the most shared lookups one run may take; a longer run
// (hundreds of NetworkPolicies selecting one pod, each with its own
// ipBlock) gets union sets instead, so that the rules a packet walks stay
// bounded whatever the number of policies.
const maxLookups = 32

// maxSharedLookups bounds the lookups of a run longer than maxLookups
// that takes shared sets anyway because its peers are mostly other runs'
// peers too (shareCrowded).
const maxSharedLookups = 512

// unionFloor is the number of address ranges under which a union run
// keeps its sets however many runs copy the same peers: small unions cost
// little, and they keep each chain one lookup long. (Not the same bound
// as unionBudgetFloor, which caps the elements one union may cut into.)
const unionFloor = 1024

// runShape is how a run is matched: by lookups into shared peer sets,
// or (union) by one lookup per kind into sets of its own, and then by
// lookups into shared sets for the peers it leaves out (fitLean).
type runShape struct {
	union bool
	// lookups are in rule order (by peer name, then ports) once the
	// Build has named its peers (sortLookups).
	lookups []lookup
	// pending are a union run's lookups until shareCrowded decides, with
	// the uses that name their peers' sets.
	pending []pendingLookup
	// run is the first run of the shape's memo: a union run's elements
	// are computed from it (fitUnion).
	run *run
}

type pendingLookup struct {
	lookup
	uses []string
}

// sortLookups puts every shape's lookups in rule order, once the peers
// are named: by peer name, then ports, so that equal runs give equal
// chains.
func (b *builder) sortLookups() {
	for _, sh := range b.shapes {
		slices.SortFunc(sh.lookups, func(x, y lookup) int {
			if c := strings.Compare(x.peer.name, y.peer.name); c != 0 {
				return c
			}
			return strings.Compare(x.key, y.key)
		})
	}
}

// lookup is one peer of a run with the ports the run matches towards it:
// one rule per address family.
type lookup struct {
	peer  *peerGroup
	ports *policy.PortSet // nil: all traffic
	key   string          // ports key, "" for all traffic
}

// peerGroup is one distinct peer: the addresses some terms match,
// whichever rules they come from. It becomes one shared set per family.
type peerGroup struct {
	key   string // content key: hash of the ranges
	addrs *policy.AddrSet
	// minUse is the smallest name of a rule (and ports) using the peer:
	// the set is named after it, so that the name stays while the peer's
	// pods come and go.
	minUse string
	used   bool
	name   string
	// merged: the union of a run's peers on equal ports (byPorts). Its
	// name is told apart from its members', whose smallest use may be
	// its own: otherwise one of the two would be named by content, and
	// renamed whenever a pod of it comes or goes.
	merged bool
}

func (g *peerGroup) use(u string) {
	if !g.used || u < g.minUse {
		g.minUse = u
	}
	g.used = true
}

// addrKey identifies a set of addresses by content. scratch is a buffer
// to reuse (nil: none); the key is the same either way.
func addrKey(s *policy.AddrSet, scratch []byte) string {
	h := sha256.New()
	buf := scratch[:0]
	for _, r := range s.Ranges() {
		buf = r.From.AppendTo(buf)
		buf = append(buf, '-')
		buf = r.To.AppendTo(buf)
		buf = append(buf, ',')
		if len(buf) > 4096 {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	h.Write(buf)
	return string(h.Sum(nil)[:16])
}

// peer returns the group of an address set: by pointer when the builder
// has seen it (the compiler shares one AddrSet between the rules of one
// resolved peer), by content otherwise.
func (b *builder) peer(s *policy.AddrSet) *peerGroup {
	if g, ok := b.peerOf[s]; ok {
		return g
	}
	key := b.cache.addrKey(s)
	g := b.peers[key]
	if g == nil {
		g = &peerGroup{key: key, addrs: s}
		b.peers[key] = g
	}
	b.peerOf[s] = g
	return g
}

// shape decides how a run is matched. Terms with the same peer merge into
// one lookup with the union of their ports: the run's rules share a
// verdict, so which of them matched does not matter.
func (b *builder) shape(r *run) *runShape {
	if sh, ok := b.shapes[r.memo]; ok {
		return sh
	}
	if r.terms == nil {
		_, r.terms = mergeTerms(r, func(s *policy.AddrSet) *policy.AddrSet { return s })
	}
	groups := make([]*peerGroup, len(r.terms))
	seen := make(map[*peerGroup]bool, len(r.terms))
	terms := r.terms
	for i, t := range r.terms {
		groups[i] = b.peer(t.addrs)
		if seen[groups[i]] {
			// Two address sets of one content: merge by peer instead.
			groups, terms = mergeTerms(r, b.peer)
			break
		}
		seen[groups[i]] = true
	}
	sh := &runShape{union: len(terms) > maxLookups, run: r}
	// A short run whose peers repeat ports waits for shareCrowded too,
	// which merges those no other run matches (mergeOwn).
	wait := sh.union || repeatsPorts(terms)
	for i, t := range terms {
		l := lookup{peer: groups[i], ports: t.ports, key: t.key}
		b.runsOf[groups[i]]++
		if wait {
			sh.pending = append(sh.pending, pendingLookup{l, t.uses})
			continue
		}
		for _, u := range t.uses {
			groups[i].use(u)
		}
		sh.lookups = append(sh.lookups, l)
	}
	b.shapes[r.memo] = sh
	return sh
}

// repeatsPorts reports whether two of a run's terms have equal ports.
func repeatsPorts(terms []peerTerms) bool {
	if len(terms) < 2 {
		return false
	}
	seen := make(map[string]bool, len(terms))
	for _, t := range terms {
		if seen[t.key] {
			return true
		}
		seen[t.key] = true
	}
	return false
}

// shareCrowded gives shared lookups to the union runs whose addresses
// are mostly in peers that other runs match too, once every run has its
// shape. A union run's sets are its own: when many pods each have a
// different long list of policies over the same peers (tens of
// NetworkPolicies selecting overlapping sets of pods), every list's union
// copies the same peers' addresses, and the node's elements grow with
// lists x their peers' pods (millions, past what nft can load) where
// shared sets hold each peer once. A run whose peers are its own (one
// pod's hundreds of ipBlocks) keeps its union: there is nothing to share;
// so does a small one (unionFloor) and one that would take more than
// maxSharedLookups lookups.
// A run whose union would be over its budget (contentsOf) takes a shared
// lookup for each of its fat port groups and a union of the rest
// (fitLean), or a shared lookup per port group when that is over budget
// too (shareGroups): its peers on equal ports merged into one lookup
// (byPorts), so that the chain grows with the distinct port lists.
// The decision depends only on the Build's runs, not on their order.
func (b *builder) shareCrowded() {
	for memo, sh := range b.shapes {
		if sh.union {
			switch {
			case b.crowded(sh):
				b.shareAll(sh)
			case b.fitUnion(memo, sh):
			default:
				groups := b.byPorts(sh.pending)
				if !b.fitLean(memo, sh, groups) {
					b.shareGroups(sh, groups)
				}
			}
		} else if len(sh.pending) > 0 {
			b.mergeOwn(sh)
		}
		sh.pending = nil
		sh.run = nil
	}
}

// shareAll gives a crowded union run a shared lookup per peer: its peers
// are other runs' too, and keep one set each (merging them would copy
// them, see shareCrowded).
func (b *builder) shareAll(sh *runShape) {
	sh.union = false
	for _, l := range sh.pending {
		b.share(sh, l)
	}
}

// share gives a run's peer a shared lookup.
func (b *builder) share(sh *runShape, l pendingLookup) {
	for _, u := range l.uses {
		l.peer.use(u)
	}
	sh.lookups = append(sh.lookups, l.lookup)
}

// fitUnion computes the elements of a union run, and reports whether
// they are within its budget: unions can take many more elements than
// their terms have ranges (cutBoxes). It depends only on the run.
func (b *builder) fitUnion(memo string, sh *runShape) bool {
	cr := b.cache.unionRun(sh.run)
	if cr.sc == nil {
		return false
	}
	b.content[memo] = cr.sc
	b.hashOf[memo] = cr.hash
	return true
}

// fitLean gives a union run over its budget one shared lookup for each
// of its fat port groups (fat, byPorts) and a union of its other terms,
// and reports whether that union is within its budget. A group of E
// address ranges matched on P port ranges is E x P boxes in a union
// however it is cut, E + P in a shared lookup: a few such terms (an
// ipBlock with hundreds of excepts on tens of port ranges, or hundreds of
// /24s on one list of tens of port ranges) would otherwise cost the run
// its union, and its chain one lookup per peer. It depends only on the
// run.
func (b *builder) fitLean(memo string, sh *runShape, groups []portGroupLookup) bool {
	isFat := map[*peerGroup]bool{}
	fat := 0
	for _, g := range groups {
		if g.fat() {
			fat++
			for _, p := range g.members {
				isFat[p] = true
			}
		}
	}
	if fat == 0 || fat == len(groups) {
		return false
	}
	cr := b.cache.leanRun(sh.run, func(s *policy.AddrSet) bool { return !isFat[b.peer(s)] })
	if cr.sc == nil {
		return false
	}
	b.content[memo] = cr.sc
	b.hashOf[memo] = cr.hash
	for _, g := range groups {
		if g.fat() {
			b.share(sh, g.pendingLookup)
		}
	}
	return true
}

// portGroupLookup is the peers of a run matched on equal ports, as one
// lookup: the union of their addresses on those ports (members: the
// peers merged).
type portGroupLookup struct {
	pendingLookup
	members []*peerGroup
}

// byPorts merges a run's pending lookups by ports: one lookup per
// distinct ports (all traffic included), whose peer is the union of the
// peers' addresses, named after all their uses. The run's rules share a
// verdict, comment and counter, so a packet matched by any of the merged
// lookups is matched by the merged one and judged the same, and no other
// packet is: (A1 x P) u (A2 x P) = (A1 u A2) x P. A port list with one
// peer keeps that peer's own set, which other runs may share.
// In a union run over budget the merged set copies its peers'
// addresses, as the union it replaces would have; a short run merges
// only peers of its own (mergeOwn), a crowded run none: their peers are
// shared so that they are not copied.
func (b *builder) byPorts(pending []pendingLookup) []portGroupLookup {
	at := make(map[string]int, len(pending))
	var out []portGroupLookup
	for _, l := range pending {
		i, ok := at[l.key]
		if !ok {
			i = len(out)
			at[l.key] = i
			out = append(out, portGroupLookup{pendingLookup: pendingLookup{lookup: l.lookup}})
		}
		g := &out[i]
		g.members = append(g.members, l.peer)
		g.uses = append(g.uses, l.uses...)
	}
	for i := range out {
		g := &out[i]
		if len(g.members) < 2 {
			continue
		}
		n := 0
		for _, p := range g.members {
			n += len(p.addrs.Ranges())
		}
		rs := make([]policy.AddrRange, 0, n)
		for _, p := range g.members {
			rs = append(rs, p.addrs.Ranges()...)
		}
		g.peer = b.peer(policy.NewAddrSet(rs...))
		// A member covering the others is the merge itself, and keeps
		// its name.
		if !slices.Contains(g.members, g.peer) {
			g.peer.merged = true
		}
	}
	return out
}

// mergeOwn gives a short run's peers on equal ports that no other run
// matches one lookup of their addresses' union (byPorts): their sets
// are the run's alone, so the merge copies no address and shortens the
// chain. A peer other runs match too keeps its shared set: merging it
// would copy it into a set per combination of peers, the growth shared
// sets avoid (a pod selector's pods in every list that names it).
func (b *builder) mergeOwn(sh *runShape) {
	var own []pendingLookup
	for _, l := range sh.pending {
		if b.runsOf[l.peer] == 1 {
			own = append(own, l)
		} else {
			b.share(sh, l)
		}
	}
	for _, g := range b.byPorts(own) {
		b.share(sh, g.pendingLookup)
	}
}

// shareGroups gives a union run one shared lookup per port group
// (byPorts): its union is over budget, and so is a union without its fat
// groups. Its chain is as long as its distinct port lists, not its peers.
func (b *builder) shareGroups(sh *runShape, groups []portGroupLookup) {
	sh.union = false
	for _, g := range groups {
		b.share(sh, g.pendingLookup)
	}
}

// fat reports whether a lookup's own boxes (its peer's address ranges
// times its port ranges) are more than unionBudgetFactor times its
// ranges.
func (l pendingLookup) fat() bool {
	if l.ports == nil {
		return false
	}
	a, p := len(l.peer.addrs.Ranges()), portRanges(l.ports.ByProto)
	return a*p > unionBudgetFactor*(a+p)
}

// crowded reports whether a union run should take shared lookups: its
// peers hold more than unionFloor ranges, mostly in peers other runs
// match too, and it needs at most maxSharedLookups lookups.
func (b *builder) crowded(sh *runShape) bool {
	if len(sh.pending) > maxSharedLookups {
		return false
	}
	shared, all := 0, 0
	for _, l := range sh.pending {
		n := len(l.peer.addrs.Ranges())
		all += n
		if b.runsOf[l.peer] > 1 {
			shared += n
		}
	}
	return all > unionFloor && 2*shared > all
}

// peerTerms are the terms of a run that share a peer, merged: the union
// of their ports, and the uses they name the peer's set after.
type peerTerms struct {
	addrs *policy.AddrSet
	ports *policy.PortSet // nil: all traffic
	key   string          // ports key, "" for all traffic
	uses  []string
}

// mergeTerms merges a run's terms by peer, as keyOf tells peers apart:
// by address set, which depends on the run alone (so a run planned in an
// earlier Build keeps the result), or by the Build's peer groups, which
// also merge address sets of equal content.
func mergeTerms[K comparable](r *run, keyOf func(*policy.AddrSet) K) ([]K, []peerTerms) {
	type acc struct {
		addrs *policy.AddrSet
		// first is the ports of the peer's first term: when it has no
		// other, they are the merge as they are (a PortSet is kept
		// sorted and merged), and nothing is built.
		first *policy.PortSet
		terms int
		ports policy.PortSetBuilder
		uses  []string
	}
	byPeer := map[K]*acc{}
	var order []K
	for i, m := range r.matches {
		for _, t := range m {
			if t.Addrs.Empty() || t.Ports.Empty() {
				continue
			}
			k := keyOf(t.Addrs)
			a := byPeer[k]
			if a == nil {
				a = &acc{addrs: t.Addrs}
				byPeer[k] = a
				order = append(order, k)
			}
			switch a.terms++; a.terms {
			case 1:
				a.first = t.Ports
			case 2:
				addPorts(&a.ports, a.first)
				fallthrough
			default:
				addPorts(&a.ports, t.Ports)
			}
			key := "all"
			if !t.Ports.All {
				key = portsKey(t.Ports.ByProto)
			}
			a.uses = append(a.uses, r.uses[i]+"|"+key)
		}
	}
	terms := make([]peerTerms, 0, len(order))
	for _, k := range order {
		a := byPeer[k]
		ports := a.first
		if a.terms > 1 {
			ports = a.ports.Build()
		}
		t := peerTerms{addrs: a.addrs, ports: ports, uses: a.uses}
		if t.ports.All {
			t.ports = nil
		} else {
			t.key = portsKey(t.ports.ByProto)
		}
		terms = append(terms, t)
	}
	return order, terms
}

// addPorts adds a PortSet's ranges to a builder.
func addPorts(b *policy.PortSetBuilder, ps *policy.PortSet) {
	if ps.All {
		b.AddAll()
		return
	}
	for p, rs := range ps.ByProto {
		for _, pr := range rs {
			b.Add(p, pr)
		}
	}
}

// namePeers names the peers that shared lookups use and adds their sets.
// A peer is named after its smallest use; two peers with the same
// smallest use (a rule whose named ports resolve differently per pod)
// are told apart by content.
func (b *builder) namePeers() {
	var groups []*peerGroup
	for _, g := range b.peers {
		if g.used {
			groups = append(groups, g)
		}
	}
	sort.Slice(groups, func(i, j int) bool {
		if groups[i].minUse != groups[j].minUse {
			return groups[i].minUse < groups[j].minUse
		}
		return groups[i].key < groups[j].key
	})
	taken := map[string]bool{}
	for _, g := range groups {
		var name string
		if g.merged {
			name = hashName("a-", "merged", g.minUse)
		} else {
			name = hashName("a-", g.minUse)
		}
		if taken[name] {
			name = hashName("a-", g.minUse, g.key)
		}
		taken[name] = true
		g.name = name
		rs := g.addrs.Ranges()
		split := sort.Search(len(rs), func(i int) bool { return !rs[i].From.Is4() })
		for _, s := range []*namedSet{
			{Name: name + "-4", Kind: addr4, Addrs: rs[:split:split]},
			{Name: name + "-6", Kind: addr6, Addrs: rs[split:]},
		} {
			s.hash = b.cache.elementsHash(g.key, s)
			b.rs.sets[s.Name] = s
		}
	}
}

// portRule completes a shared lookup's rule with its ports: inline when
// they are one protocol and one range, else a services set shared by
// every rule with the same ports.
func (b *builder) portRule(r *chainRule, l lookup) {
	if l.ports == nil {
		return
	}
	r.Ports = l.ports
	if _, single := singleService(l.ports); single {
		return
	}
	name := hashName("p-", l.key)
	r.PortSet = name
	if _, ok := b.rs.sets[name]; ok {
		return
	}
	s := &namedSet{Name: name, Kind: services}
	protos := make([]int, 0, len(l.ports.ByProto))
	for p := range l.ports.ByProto {
		protos = append(protos, int(p))
	}
	sort.Ints(protos)
	for _, p := range protos {
		for _, pr := range l.ports.ByProto[policy.Protocol(p)] {
			s.Services = append(s.Services, service{Proto: policy.Protocol(p), Ports: pr})
		}
	}
	s.hash = elementsHash(s)
	b.rs.sets[name] = s
}

// singleService returns the one protocol and port range of ps, if it
// has exactly one.
func singleService(ps *policy.PortSet) (service, bool) {
	var out service
	n := 0
	for p, rs := range ps.ByProto {
		for _, r := range rs {
			out = service{Proto: p, Ports: r}
			n++
		}
	}
	return out, n == 1
}

// lookupRules appends a run's shared lookups to dst (all of its rules, or
// a union run's peers left out of its union), one per lookup, in rule
// order (sortLookups).
func (b *builder) lookupRules(dst []chainRule, r *run, sh *runShape, v verdict, counter string) []chainRule {
	for _, l := range sh.lookups {
		rule := chainRule{Peers: l.peer.name, Verdict: v, Comment: r.comment, Counter: counter}
		b.portRule(&rule, l)
		dst = append(dst, rule)
	}
	return dst
}

// contains reports whether a shared rule matches: the Go twin of its
// rendered lookups.
func (rs *Ruleset) matchPeers(r chainRule, remote netip.Addr, p Packet) bool {
	fam := "-6"
	if remote.Is4() {
		fam = "-4"
	}
	s, ok := rs.sets[r.Peers+fam]
	if !ok || !s.contains(remote, 0, 0) {
		return false
	}
	switch {
	case r.PortSet != "":
		ps, ok := rs.sets[r.PortSet]
		return ok && ps.contains(remote, p.Proto, p.Port)
	case r.Ports != nil:
		return r.Ports.Matches(p.Proto, p.Port)
	}
	return true
}
