package nft

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/maphash"

	"github.com/moat-net/moat/policy"
)

// buildCache keeps what Builds compute from the Program's address sets and
// matches between Builds. The compiler reuses an AddrSet and a rule's
// Match for as long as the rule and its peers are unchanged
// (policy.Compiler), so after a relabel only what changed is recomputed.
// A buildCache holds references to the sets and matches it was computed from,
// which keeps their identity unique while cached. It is not safe for
// concurrent use; a nil buildCache computes everything.
type buildCache struct {
	// addrs: content key of an address set.
	addrs map[*policy.AddrSet]*cachedKey
	// hashes: elements hash of a peer set, by content key and kind.
	hashes map[string]*cachedKey
	// runs: a union run's elements, by run memo.
	runs map[string]*cachedRun
	// byInput finds union runs whose matches were rebuilt (new slices)
	// with the same content, which is common: a changed peer makes the
	// compiler rebuild every rule that mentions it.
	byInput map[uint64]*cachedRun
	// plans: the runs of a DirPolicy, which depend on nothing else. The
	// compiler hands unchanged pods the same DirPolicy in successive
	// Programs, so a relabel replans only the pods it changed.
	plans map[*policy.DirPolicy]*cachedPlan
	// rules: what a ClusterNetworkPolicy rule contributes to runs; the
	// compiler keeps one Rule per policy rule while the policy is
	// unchanged, so a new Match for it does not cost new names.
	rules map[ruleDir]*cachedRule
	seed  maphash.Seed
	// scratch is addrKey's buffer: it flushes to the hash at 4 KB.
	scratch []byte
}

type ruleDir struct {
	rule *policy.Rule
	dir  policy.Direction
}

type cachedRule struct {
	names *ruleNames
	used  bool
}

type cachedPlan struct {
	plan *dirPlan
	// chains are the chains last built for the plan.
	chains *chainMemo
	used   bool
}

type cachedKey struct {
	key  string
	used bool
}

type cachedRun struct {
	matches []policy.Match // keeps the memo's pointers alive
	input   uint64
	sc      *setContents
	hash    string
	used    bool
}

// newBuildCache returns an empty cache.
func newBuildCache() *buildCache {
	return &buildCache{
		addrs:   map[*policy.AddrSet]*cachedKey{},
		hashes:  map[string]*cachedKey{},
		runs:    map[string]*cachedRun{},
		byInput: map[uint64]*cachedRun{},
		plans:   map[*policy.DirPolicy]*cachedPlan{},
		rules:   map[ruleDir]*cachedRule{},
		seed:    maphash.MakeSeed(),
	}
}

// sweep drops what the Build that just ended did not use.
func (c *buildCache) sweep() {
	if c == nil {
		return
	}
	sweepUnused(c.addrs, func(e *cachedKey) *bool { return &e.used })
	sweepUnused(c.hashes, func(e *cachedKey) *bool { return &e.used })
	sweepUnused(c.plans, func(e *cachedPlan) *bool { return &e.used })
	sweepUnused(c.rules, func(e *cachedRule) *bool { return &e.used })
	// runs and byInput share their entries: both maps are swept before
	// the marks are cleared.
	for k, cr := range c.runs {
		if !cr.used {
			delete(c.runs, k)
		}
	}
	sweepUnused(c.byInput, func(e *cachedRun) *bool { return &e.used })
	for _, cr := range c.runs {
		cr.used = false
	}
}

// sweepUnused deletes the entries of m whose mark is not set and clears
// the marks of the others for the next Build.
func sweepUnused[K comparable, V any](m map[K]V, mark func(V) *bool) {
	for k, v := range m {
		if used := mark(v); *used {
			*used = false
		} else {
			delete(m, k)
		}
	}
}

// ruleNames returns the names of r in direction dir.
func (c *buildCache) ruleNames(r *policy.Rule, dir policy.Direction) *ruleNames {
	if c == nil {
		return newRuleNames(r, dir)
	}
	k := ruleDir{r, dir}
	cr := c.rules[k]
	if cr == nil {
		cr = &cachedRule{names: newRuleNames(r, dir)}
		c.rules[k] = cr
	}
	cr.used = true
	return cr.names
}

// plan returns the runs of dp, planned once while successive Builds use
// it. The copy returned has no users yet; its runs are shared with the
// cached plan (each Build sets their shapes anew before use).
func (c *buildCache) plan(dp *policy.DirPolicy, dir policy.Direction) *dirPlan {
	if c == nil {
		return newPlan(c, dp, dir)
	}
	cp := c.plans[dp]
	if cp == nil || cp.plan.dir != dir {
		cp = &cachedPlan{plan: newPlan(c, dp, dir)}
		c.plans[dp] = cp
	}
	cp.used = true
	p := *cp.plan
	return &p
}

func (c *buildCache) addrKey(s *policy.AddrSet) string {
	if c == nil {
		return addrKey(s, nil)
	}
	e := c.addrs[s]
	if e == nil {
		if c.scratch == nil {
			c.scratch = make([]byte, 0, 4096+128)
		}
		e = &cachedKey{key: addrKey(s, c.scratch)}
		c.addrs[s] = e
	}
	e.used = true
	return e.key
}

// elementsHash of a peer's set of one family, computed once per content.
func (c *buildCache) elementsHash(key string, s *namedSet) string {
	if c == nil {
		return elementsHash(s)
	}
	k := key + s.Kind.suffix()
	e := c.hashes[k]
	if e == nil {
		e = &cachedKey{key: elementsHash(s)}
		c.hashes[k] = e
	}
	e.used = true
	return e.key
}

// unionRun returns the elements of a union run and their hash.
func (c *buildCache) unionRun(r *run) *cachedRun {
	if c == nil {
		sc := contentsOf(r.matches)
		return &cachedRun{sc: sc, hash: contentHash(sc)}
	}
	cr := c.runs[r.memo]
	if cr == nil {
		in := c.inputHash(r.identity, r.matches)
		if hit := c.byInput[in]; hit != nil {
			cr = &cachedRun{matches: r.matches, input: in, sc: hit.sc, hash: hit.hash}
		} else {
			sc := contentsOf(r.matches)
			cr = &cachedRun{matches: r.matches, input: in, sc: sc, hash: contentHash(sc)}
		}
		c.runs[r.memo] = cr
		c.byInput[in] = cr
	}
	cr.used = true
	return cr
}

// leanRun returns the elements of a union run without the terms whose
// address sets keep rejects (fitLean), and their hash. The terms keep
// rejects depend only on the run, so they are cached by its memo too.
func (c *buildCache) leanRun(r *run, keep func(*policy.AddrSet) bool) *cachedRun {
	if c == nil {
		sc := contentsOf(leanMatches(r.matches, keep))
		return &cachedRun{sc: sc, hash: contentHash(sc)}
	}
	key := r.memo + "\x00lean"
	cr := c.runs[key]
	if cr == nil {
		sc := contentsOf(leanMatches(r.matches, keep))
		cr = &cachedRun{matches: r.matches, sc: sc, hash: contentHash(sc)}
		c.runs[key] = cr
	}
	cr.used = true
	return cr
}

// leanMatches are the matches with only the terms whose address sets
// keep accepts (terms that match nothing left out).
func leanMatches(ms []policy.Match, keep func(*policy.AddrSet) bool) []policy.Match {
	out := make([]policy.Match, len(ms))
	for i, m := range ms {
		for _, t := range m {
			if !t.Addrs.Empty() && !t.Ports.Empty() && keep(t.Addrs) {
				out[i] = append(out[i], t)
			}
		}
	}
	return out
}

// inputHash hashes what a run's elements are computed from.
func (c *buildCache) inputHash(identity string, ms []policy.Match) uint64 {
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

// contentHash hashes a union's elements ("" for nil: over budget).
func contentHash(sc *setContents) string {
	if sc == nil {
		return ""
	}
	h := sha256.New()
	for i := range sc {
		h.Write([]byte(sc[i].hash))
	}
	return hex.EncodeToString(h.Sum(nil))[:hashLen]
}

// nameUnionSets gives the sets of every union run (their elements
// computed by fitUnion) a name that stays stable while only the elements
// change.
func (b *builder) nameUnionSets() {
	var unions []*run
	for _, dp := range b.order {
		for _, r := range b.plans[dp].runs() {
			if r.shape.union {
				unions = append(unions, r)
			}
		}
	}
	variants := b.unionVariants()
	taken := map[string]string{} // set name -> content hash
	for _, r := range unions {
		if _, ok := b.setName[r.memo]; ok {
			continue
		}
		h := b.hashOf[r.memo]
		name := hashName("s-", r.identity)
		if v := variants[r.identity]; len(v) > 1 {
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
			b.rs.sets[s.Name] = &s
		}
	}
}

// unionVariants tells apart the variants of one union run identity (rules
// whose named ports resolve differently per pod) by the smallest signature
// of the pods that use each: identity -> content hash -> signature.
func (b *builder) unionVariants() map[string]map[string]string {
	variants := map[string]map[string]string{}
	for _, dp := range b.order {
		p := b.plans[dp]
		for _, r := range p.runs() {
			if !r.shape.union {
				continue
			}
			v := variants[r.identity]
			if v == nil {
				v = map[string]string{}
				variants[r.identity] = v
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
	return variants
}
