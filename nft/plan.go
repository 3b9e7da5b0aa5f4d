package nft

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/moat-net/moat/policy"
)

// run is a maximal sequence of consecutive rules of one tier with the same
// outcome. First match wins within a tier, so the order of such rules does
// not matter: the packet gets the same verdict whichever of them matches,
// and their lookups may be merged and reordered.
type run struct {
	// identity names the rules the run serves (not their current
	// matches): a union run's set names derive from it. It is a hash
	// (runKey), as is memo: a run of hundreds of rules would otherwise
	// keep kilobytes of joined names, in every plan that holds it.
	identity string
	verdict  verdictKind // return (Accept), drop (Deny) or goto (Pass)
	matches  []policy.Match
	// uses names the policy rule of each match (direction included), so
	// that a shared peer set can be named after the rules that use it.
	uses    []string
	comment string
	// counter is what a Drop run counts into: a run of Drop rules is
	// always a single rule, so that drops are counted per policy rule.
	counter *DropCounter
	// memo identifies the matches cheaply: the compiler shares Match
	// slices between pods whose rules resolve alike.
	memo string
	// shape is how the run is matched, decided by the builder.
	shape *runShape
	// terms are the run's terms merged by address set, computed on the
	// run's first Build.
	terms []peerTerms
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
	all       []*run   // admin, np and baseline (runs)
	users     []string // signatures of the pods judged by it
}

// runs are the plan's runs in order: admin, np, baseline.
func (p *dirPlan) runs() []*run { return p.all }

// plan returns the runs of a DirPolicy, computing them on first use.
func (b *builder) plan(dp *policy.DirPolicy, dir policy.Direction) *dirPlan {
	if p, ok := b.plans[dp]; ok {
		return p
	}
	p := b.cache.plan(dp, dir)
	b.plans[dp] = p
	b.order = append(b.order, dp)
	return p
}

// newPlan computes the runs of a DirPolicy.
func newPlan(c *buildCache, dp *policy.DirPolicy, dir policy.Direction) *dirPlan {
	p := &dirPlan{dir: dir}
	p.admin = cnpRuns(c, policy.TierAdmin, dir, dp.Admin)
	// A Pass at the end of the Admin tier goes where the tier ends anyway.
	for n := len(p.admin); n > 0 && p.admin[n-1].verdict == verdictGoto; n-- {
		p.admin = p.admin[:n-1]
	}
	if dp.NP != nil {
		p.hasNP = true
		p.isolation = isolationCounter(dp.NP.Policies, dir)
		p.np = npRun(dir, dp.NP)
	} else {
		p.baseline = cnpRuns(c, policy.TierBaseline, dir, dp.Baseline)
		// Accept and Pass both end in allow in the Baseline tier; a
		// trailing allow is what the end of the chain does anyway.
		for n := len(p.baseline); n > 0 && p.baseline[n-1].verdict != verdictDrop; n-- {
			p.baseline = p.baseline[:n-1]
		}
	}
	p.all = append(p.all, p.admin...)
	if p.np != nil {
		p.all = append(p.all, p.np)
	}
	p.all = append(p.all, p.baseline...)
	return p
}

// npRun is the NetworkPolicy tier of a pod as one run: every rule allows,
// so all of them form one run; nil when the tier has no rule.
func npRun(dir policy.Direction, np *policy.NPTier) *run {
	if len(np.Rules) == 0 {
		return nil
	}
	r := &run{verdict: verdictReturn}
	names := make([]string, len(np.Policies))
	for i, ref := range np.Policies {
		names[i] = ref.Namespace + "/" + ref.Name
	}
	for _, nr := range np.Rules {
		r.matches = append(r.matches, nr.Match)
		r.uses = append(r.uses, fmt.Sprintf("np|%s|%s/%s#%d", dir, nr.Policy.Namespace, nr.Policy.Name, nr.Index))
	}
	r.identity = runKey("np", dir.String(), names...)
	r.comment = comment("NetworkPolicy " + strings.Join(names, " "))
	r.memo = memoOf(r.identity, r.matches)
	return r
}

// cnpRuns groups a ClusterNetworkPolicy tier's rules into runs.
func cnpRuns(c *buildCache, tier policy.Tier, dir policy.Direction, rules []policy.RuleMatch) []*run {
	var out []*run
	var ids, descs []string
	// finish names the last run after all its rules.
	finish := func() {
		if len(out) == 0 {
			return
		}
		last := out[len(out)-1]
		last.identity = runKey(string(tier), dir.String(), ids...)
		last.comment = comment(string(tier) + " " + verdictWord(last.verdict, tier) + " " + strings.Join(descs, " "))
	}
	for _, rm := range rules {
		v := verdictReturn
		switch rm.Rule.Action {
		case policy.ActionDeny:
			v = verdictDrop
		case policy.ActionPass:
			v = verdictGoto
			if tier == policy.TierBaseline {
				v = verdictReturn
			}
		case policy.ActionAccept:
		default:
			// An action the backend does not know must not open access.
			v = verdictDrop
		}
		n := c.ruleNames(rm.Rule, dir)
		// Consecutive rules with one verdict form one run, except drops:
		// each keeps its own rules and counter (first match wins, so
		// which Deny rule dropped a packet is well defined).
		if k := len(out); k > 0 && out[k-1].verdict == v && v != verdictDrop {
			last := out[k-1]
			last.matches = append(last.matches, rm.Match)
			last.uses = append(last.uses, n.use)
			ids = append(ids, n.id)
			descs = append(descs, n.desc)
			continue
		}
		finish()
		ids, descs = []string{n.id}, []string{n.desc}
		r := &run{
			verdict: v,
			matches: []policy.Match{rm.Match},
			uses:    []string{n.use},
		}
		if v == verdictDrop {
			r.counter = n.counter
		}
		out = append(out, r)
	}
	finish()
	for _, r := range out {
		r.memo = memoOf(r.identity, r.matches)
	}
	return out
}

// ruleNames are the strings a ClusterNetworkPolicy rule contributes to
// the runs it joins, whichever pods it judges.
type ruleNames struct {
	desc, id, use string
	counter       *DropCounter
}

func newRuleNames(r *policy.Rule, dir policy.Direction) *ruleNames {
	id := r.Policy.String() + "#" + strconv.Itoa(r.Index)
	return &ruleNames{
		desc:    r.Policy.Name + "." + dir.String() + "[" + strconv.Itoa(r.Index) + "]",
		id:      id,
		use:     "cnp|" + dir.String() + "|" + id,
		counter: cnpCounter(r, dir),
	}
}

func verdictWord(v verdictKind, tier policy.Tier) string {
	switch v {
	case verdictDrop:
		return "Deny"
	case verdictGoto:
		return "Pass"
	}
	if tier == policy.TierBaseline {
		return "Accept/Pass"
	}
	return "Accept"
}

// runKey hashes what identifies a run (its tier, direction and the names
// of its rules or policies) into 16 bytes.
func runKey(tier, dir string, names ...string) string {
	var arr [512]byte
	sum := sha256.Sum256(joinParts(joinParts(arr[:0], tier, dir), names...))
	return string(sum[:16])
}

// memoOf identifies a run's matches cheaply, by the identity of the run
// and of the match slices: the compiler reuses one Match for every pod a
// rule resolves alike for. The memo keys the builder's maps only; a
// cachedRun keeps the slices it was computed from alive, so their
// addresses cannot be reused while its memo is in use.
func memoOf(identity string, ms []policy.Match) string {
	h := sha256.New()
	h.Write([]byte(identity))
	buf := make([]byte, 0, 16*len(ms))
	for _, m := range ms {
		var p uintptr
		if len(m) > 0 {
			p = uintptr(unsafe.Pointer(unsafe.SliceData(m)))
		}
		buf = binary.LittleEndian.AppendUint64(buf, uint64(p))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(len(m)))
	}
	h.Write(buf)
	return string(h.Sum(nil)[:16])
}
