package nft

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"net/netip"
	"sort"
	"strings"

	"github.com/moat-net/moat/policy"
)

// run is a maximal sequence of consecutive rules of one tier with the same
// outcome. First match wins within a tier, so such rules can share one set
// lookup: the packet gets the same verdict whichever of them matches.
type run struct {
	// identity names the rules the run serves (not their current
	// matches): the set name is derived from it.
	identity string
	verdict  VerdictKind // Return (Accept), Drop (Deny) or Goto (Pass)
	matches  []policy.Match
	comment  string
	// counter is what a Drop run counts into: a run of Drop rules is
	// always a single rule, so that drops are counted per policy rule.
	counter *DropCounter
	// memo identifies the matches cheaply: the compiler shares Match
	// slices between pods whose rules resolve alike.
	memo string
}

// dirPlan is one DirPolicy as runs, before set names are known.
type dirPlan struct {
	dir   policy.Direction
	admin []*run
	hasNP bool
	np    *run // nil when the NetworkPolicy tier has no rule
	// isolation counts the NetworkPolicy tier's final drop.
	isolation *DropCounter
	baseline  []*run
	users     []string // signatures of the pods judged by it
}

// builder holds the state of one Build.
type builder struct {
	rs      *Ruleset
	plans   map[*policy.DirPolicy]*dirPlan
	order   []*policy.DirPolicy
	content map[string]*setContents // by run memo
	// variants: run identity -> content hash -> smallest user signature
	variants map[string]map[string]string
	hashOf   map[string]string // run memo -> content hash
	setName  map[string]string // run memo -> set base name
	chainOf  map[*policy.DirPolicy]string
	cache    *Cache
}

// Cache keeps the elements computed for rule runs between Builds. The
// compiler reuses a rule's Match for as long as the rule and its peers are
// unchanged (policy.Compiler), so after a relabel only the runs whose
// matches changed are recomputed. A Cache holds references to the matches
// it was computed from, which keeps their identity unique while cached.
// It is not safe for concurrent use.
type Cache struct {
	runs map[string]*cachedRun
	used map[string]bool
	// byInput finds runs whose matches were rebuilt (new slices) with
	// the same content, which is common: a changed peer makes the
	// compiler rebuild every rule that mentions it.
	byInput map[uint64]*cachedRun
	seed    maphash.Seed
}

type cachedRun struct {
	matches []policy.Match // keeps the memo's pointers alive
	input   uint64
	sc      *setContents
	hash    string
	used    bool
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{runs: map[string]*cachedRun{}, byInput: map[uint64]*cachedRun{}, seed: maphash.MakeSeed()}
}

// inputHash hashes what a run's elements are computed from.
func (c *Cache) inputHash(identity string, ms []policy.Match) uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(identity)
	var buf []byte
	for _, m := range ms {
		buf = append(buf, 0xff)
		for _, t := range m {
			buf = append(buf, 0xfe)
			for _, r := range t.Addrs.Ranges() {
				buf = r.From.AppendTo(buf)
				buf = r.To.AppendTo(buf)
			}
			buf = append(buf, 0xfd)
			if t.Ports == nil {
				buf = append(buf, 0)
			} else if t.Ports.All {
				buf = append(buf, 1)
			} else {
				buf = append(buf, portsKey(t.Ports.ByProto)...)
			}
			if len(buf) > 8192 {
				h.Write(buf)
				buf = buf[:0]
			}
		}
	}
	h.Write(buf)
	return h.Sum64()
}

// Build computes the ruleset of one node: egress for the pod-network pods
// running on it, ingress for the same pods. Build never fails: input it
// cannot honour exactly (two local pods with one address) fails closed and
// is reported in Warnings.
func Build(prog *policy.Program, node string) *Ruleset {
	return BuildCached(prog, node, nil)
}

// BuildCached is Build reusing (and refreshing) cache; nil means none.
// Entries the new Program does not use are dropped.
func BuildCached(prog *policy.Program, node string, cache *Cache) *Ruleset {
	if cache != nil {
		cache.used = map[string]bool{}
		defer func() {
			for k, cr := range cache.runs {
				if !cache.used[k] {
					delete(cache.runs, k)
				} else {
					cr.used = true
				}
			}
			for k, cr := range cache.byInput {
				if !cr.used {
					delete(cache.byInput, k)
				}
				cr.used = false
			}
			cache.used = nil
		}()
	}
	b := &builder{
		cache: cache,
		rs: &Ruleset{
			Node:     node,
			Sets:     map[string]*Set{},
			Chains:   map[string]*Chain{},
			Egress:   map[netip.Addr]string{},
			Ingress:  map[netip.Addr]string{},
			Counters: map[string]*DropCounter{},
		},
		plans:    map[*policy.DirPolicy]*dirPlan{},
		content:  map[string]*setContents{},
		variants: map[string]map[string]string{},
		hashOf:   map[string]string{},
		setName:  map[string]string{},
		chainOf:  map[*policy.DirPolicy]string{},
	}
	rs := b.rs
	for i := range staticCounters {
		c := staticCounters[i]
		rs.Counters[c.Name] = &c
	}
	if !prog.Options.DenyNodeLocal {
		seen := map[netip.Addr]bool{}
		for _, n := range prog.Nodes {
			if n.Name != node {
				continue
			}
			for _, a := range n.Addrs {
				a = a.Unmap()
				if a.IsValid() && !seen[a] {
					seen[a] = true
					rs.NodeLocal = append(rs.NodeLocal, a)
				}
			}
		}
		sort.Slice(rs.NodeLocal, func(i, j int) bool { return rs.NodeLocal[i].Less(rs.NodeLocal[j]) })
	}

	type local struct {
		pod int
		ips []netip.Addr
	}
	var locals []local
	owner := map[netip.Addr]int{}
	conflict := map[netip.Addr]bool{}
	for i := range prog.Pods {
		pod := &prog.Pods[i]
		if pod.NodeName != node || pod.HostNetwork || len(pod.IPs) == 0 || i >= len(prog.Policies) || prog.Policies[i] == nil {
			continue
		}
		var ips []netip.Addr
		for _, a := range pod.IPs {
			a = a.Unmap()
			if !a.IsValid() {
				continue
			}
			if o, dup := owner[a]; dup && o != i {
				conflict[a] = true
				rs.Warnings = append(rs.Warnings, fmt.Sprintf("pods %s and %s both have address %s: all its new connections are dropped", prog.Pods[o].Key(), pod.Key(), a))
				continue
			}
			if _, dup := owner[a]; !dup {
				owner[a] = i
				ips = append(ips, a)
			}
		}
		locals = append(locals, local{pod: i, ips: ips})
		sig := podSignature(pod)
		for _, dir := range []policy.Direction{policy.Egress, policy.Ingress} {
			dp := prog.Policies[i].Dir(dir)
			if dp == nil {
				continue
			}
			b.plan(dp, dir).users = append(b.plan(dp, dir).users, sig)
		}
	}

	b.nameSets()
	for _, l := range locals {
		pp := prog.Policies[l.pod]
		for _, dir := range []policy.Direction{policy.Egress, policy.Ingress} {
			dp := pp.Dir(dir)
			if dp == nil {
				continue
			}
			chain := b.chain(dp)
			if chain == "" {
				continue
			}
			m := rs.Egress
			if dir == policy.Ingress {
				m = rs.Ingress
			}
			for _, a := range l.ips {
				if !conflict[a] {
					m[a] = chain
				}
			}
		}
		for _, a := range l.ips {
			if !conflict[a] {
				rs.Self = append(rs.Self, a)
			}
		}
	}
	for a := range conflict {
		rs.Egress[a] = conflictChain
		rs.Ingress[a] = conflictChain
	}
	sort.Slice(rs.Self, func(i, j int) bool { return rs.Self[i].Less(rs.Self[j]) })
	sort.Strings(rs.Warnings)
	return rs
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

func (b *builder) plan(dp *policy.DirPolicy, dir policy.Direction) *dirPlan {
	if p, ok := b.plans[dp]; ok {
		return p
	}
	p := &dirPlan{dir: dir}
	p.admin = cnpRuns(policy.TierAdmin, dir, dp.Admin)
	// A Pass at the end of the Admin tier goes where the tier ends anyway.
	for n := len(p.admin); n > 0 && p.admin[n-1].verdict == Goto; n-- {
		p.admin = p.admin[:n-1]
	}
	if dp.NP != nil {
		p.hasNP = true
		p.isolation = isolationCounter(dp.NP.Policies, dir)
		if len(dp.NP.Rules) > 0 {
			r := &run{identity: "np|" + dir.String(), verdict: Return}
			names := make([]string, len(dp.NP.Policies))
			for i, ref := range dp.NP.Policies {
				r.identity += "|" + ref.Namespace + "/" + ref.Name
				names[i] = ref.Namespace + "/" + ref.Name
			}
			for _, nr := range dp.NP.Rules {
				r.matches = append(r.matches, nr.Match)
			}
			r.comment = "NetworkPolicy " + strings.Join(names, " ")
			r.memo = r.identity + memoOf(r.matches)
			p.np = r
		}
	} else {
		p.baseline = cnpRuns(policy.TierBaseline, dir, dp.Baseline)
		// Accept and Pass both end in allow in the Baseline tier; a
		// trailing allow is what the end of the chain does anyway.
		for n := len(p.baseline); n > 0 && p.baseline[n-1].verdict != Drop; n-- {
			p.baseline = p.baseline[:n-1]
		}
	}
	b.plans[dp] = p
	b.order = append(b.order, dp)
	return p
}

// cnpRuns groups a ClusterNetworkPolicy tier's rules into runs.
func cnpRuns(tier policy.Tier, dir policy.Direction, rules []policy.RuleMatch) []*run {
	var out []*run
	var ids, descs []string
	for _, rm := range rules {
		v := Return
		switch rm.Rule.Action {
		case policy.ActionDeny:
			v = Drop
		case policy.ActionPass:
			v = Goto
			if tier == policy.TierBaseline {
				v = Return
			}
		case policy.ActionAccept:
		default:
			// An action the backend does not know must not open access.
			v = Drop
		}
		desc := fmt.Sprintf("%s.%s[%d]", rm.Rule.Policy.Name, dir, rm.Rule.Index)
		id := rm.Rule.Policy.String() + "#" + fmt.Sprint(rm.Rule.Index)
		// Consecutive rules with one verdict share a lookup, except
		// drops: each keeps its own rule and counter (first match wins,
		// so which Deny rule dropped a packet is well defined).
		if n := len(out); n > 0 && out[n-1].verdict == v && v != Drop {
			last := out[n-1]
			last.matches = append(last.matches, rm.Match)
			ids = append(ids, id)
			descs = append(descs, desc)
			last.identity = string(tier) + "|" + dir.String() + "|" + strings.Join(ids, "|")
			last.comment = string(tier) + " " + verdictWord(v, tier) + " " + strings.Join(descs, " ")
			continue
		}
		ids, descs = []string{id}, []string{desc}
		r := &run{
			identity: string(tier) + "|" + dir.String() + "|" + id,
			verdict:  v,
			matches:  []policy.Match{rm.Match},
			comment:  string(tier) + " " + verdictWord(v, tier) + " " + desc,
		}
		if v == Drop {
			r.counter = cnpCounter(rm.Rule, dir)
		}
		out = append(out, r)
	}
	for _, r := range out {
		r.memo = r.identity + memoOf(r.matches)
	}
	return out
}

func verdictWord(v VerdictKind, tier policy.Tier) string {
	switch v {
	case Drop:
		return "Deny"
	case Goto:
		return "Pass"
	}
	if tier == policy.TierBaseline {
		return "Accept/Pass"
	}
	return "Accept"
}

// memoOf identifies a list of matches by the slices' identity: the
// compiler reuses one Match for every pod a rule resolves alike for.
func memoOf(ms []policy.Match) string {
	var b strings.Builder
	for _, m := range ms {
		if len(m) == 0 {
			b.WriteString("|-")
			continue
		}
		fmt.Fprintf(&b, "|%p/%d", &m[0], len(m))
	}
	return b.String()
}

// nameSets computes every run's elements and gives its sets a name that
// stays stable while only the elements change.
func (b *builder) nameSets() {
	for _, dp := range b.order {
		p := b.plans[dp]
		for _, r := range p.runs() {
			if _, ok := b.hashOf[r.memo]; ok {
				continue
			}
			var cr *cachedRun
			if b.cache != nil {
				cr = b.cache.runs[r.memo]
				if cr == nil {
					in := b.cache.inputHash(r.identity, r.matches)
					if hit := b.cache.byInput[in]; hit != nil {
						cr = &cachedRun{matches: r.matches, input: in, sc: hit.sc, hash: hit.hash}
					} else {
						sc := contentsOf(r.matches)
						cr = &cachedRun{matches: r.matches, input: in, sc: sc, hash: contentHash(sc)}
					}
					b.cache.runs[r.memo] = cr
					b.cache.byInput[in] = cr
				}
				b.cache.used[r.memo] = true
			} else {
				sc := contentsOf(r.matches)
				cr = &cachedRun{sc: sc, hash: contentHash(sc)}
			}
			b.content[r.memo] = cr.sc
			b.hashOf[r.memo] = cr.hash
		}
	}
	// Variants of one identity (rules whose named ports resolve
	// differently per pod) are told apart by the smallest signature of the
	// pods that use them.
	for _, dp := range b.order {
		p := b.plans[dp]
		for _, r := range p.runs() {
			v := b.variants[r.identity]
			if v == nil {
				v = map[string]string{}
				b.variants[r.identity] = v
			}
			h := b.hashOf[r.memo]
			for _, sig := range p.users {
				if cur, ok := v[h]; !ok || sig < cur {
					v[h] = sig
				}
			}
			if _, ok := v[h]; !ok {
				v[h] = ""
			}
		}
	}
	taken := map[string]string{} // set name -> content hash
	for _, dp := range b.order {
		for _, r := range b.plans[dp].runs() {
			if _, ok := b.setName[r.memo]; ok {
				continue
			}
			h := b.hashOf[r.memo]
			name := hashName("s-", r.identity)
			if v := b.variants[r.identity]; len(v) > 1 {
				name = hashName("s-", r.identity, v[h])
			}
			if other, ok := taken[name]; ok && other != h {
				name = hashName("s-", r.identity, h)
			}
			taken[name] = h
			b.setName[r.memo] = name
			sc := b.content[r.memo]
			for i := range sc {
				s := sc[i]
				s.Name = name + s.Kind.suffix()
				b.rs.Sets[s.Name] = &s
			}
		}
	}
}

func (p *dirPlan) runs() []*run {
	out := append([]*run{}, p.admin...)
	if p.np != nil {
		out = append(out, p.np)
	}
	return append(out, p.baseline...)
}

func contentHash(sc *setContents) string {
	h := sha256.New()
	for i := range sc {
		h.Write([]byte(sc[i].hash))
	}
	return hex.EncodeToString(h.Sum(nil))[:hashLen]
}

// chain returns the entry chain of a DirPolicy, creating the chains it
// needs; "" when nothing can deny (default allow).
func (b *builder) chain(dp *policy.DirPolicy) string {
	if name, ok := b.chainOf[dp]; ok {
		return name
	}
	p := b.plans[dp]
	var rest []Rule
	if p.hasNP {
		if p.np != nil {
			rest = append(rest, Rule{Set: b.setName[p.np.memo], Verdict: Verdict{Kind: Return}, Comment: p.np.comment})
		}
		rest = append(rest, Rule{Verdict: Verdict{Kind: Drop}, Comment: "NetworkPolicy isolation", Counter: b.counter(p.isolation)})
	} else {
		for _, r := range p.baseline {
			rest = append(rest, Rule{Set: b.setName[r.memo], Verdict: Verdict{Kind: r.verdict}, Comment: r.comment, Counter: b.counter(r.counter)})
		}
	}
	restName := b.addChain(p.dir, rest)
	var admin []Rule
	for _, r := range p.admin {
		v := Verdict{Kind: r.verdict}
		if v.Kind == Goto {
			if restName == "" {
				v = Verdict{Kind: Return}
			} else {
				v.Target = restName
			}
		}
		admin = append(admin, Rule{Set: b.setName[r.memo], Verdict: v, Comment: r.comment, Counter: b.counter(r.counter)})
	}
	name := restName
	if len(admin) > 0 {
		if restName != "" {
			admin = append(admin, Rule{Verdict: Verdict{Kind: Goto, Target: restName}, Comment: "next tier"})
		}
		name = b.addChain(p.dir, admin)
	}
	b.chainOf[dp] = name
	return name
}

func (b *builder) addChain(dir policy.Direction, rules []Rule) string {
	if len(rules) == 0 {
		return ""
	}
	parts := []string{dir.String()}
	for _, r := range rules {
		parts = append(parts, fmt.Sprintf("%s|%d|%s|%s|%s", r.Set, r.Verdict.Kind, r.Verdict.Target, r.Comment, r.Counter))
	}
	prefix := "eg-"
	if dir == policy.Ingress {
		prefix = "in-"
	}
	name := hashName(prefix, parts...)
	if _, ok := b.rs.Chains[name]; !ok {
		b.rs.Chains[name] = &Chain{Name: name, Dir: dir, Rules: rules}
	}
	return name
}

// counter records that a rule of the ruleset counts into c and returns
// its name ("" for nil: the rule counts nothing).
func (b *builder) counter(c *DropCounter) string {
	if c == nil {
		return ""
	}
	b.rs.Counters[c.Name] = c
	return c.Name
}
