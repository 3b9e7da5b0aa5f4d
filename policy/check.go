package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// check turns a policy's validation errors and unknown fields into
// diagnostics, the paths to fail closed on, and the policy's status.
func (s *state) check(ref PolicyRef, source string, errs field.ErrorList, unknown []string) (badPaths, PolicyStatus, []Diagnostic) {
	var diags []Diagnostic
	for _, e := range errs {
		diags = append(diags, Diagnostic{Severity: SeverityError, Object: ref.String(), Field: e.Field, Message: e.ErrorBody(), Source: source})
	}
	for _, u := range unknown {
		diags = append(diags, Diagnostic{Severity: SeverityError, Object: ref.String(), Field: u, Message: s.unknownMessage(u), Source: source})
	}
	status := PolicyStatus{Policy: ref, Accepted: true}
	bad := s.newBadPaths(errs, unknown)
	if len(bad) > 0 {
		status.Accepted = false
		status.Reason, status.Message = s.statusReason(errs, unknown)
	}
	return bad, status, diags
}

// badPaths collects the field paths of an object that failed validation or
// were not understood, so compilation can fail closed on exactly the parts
// they belong to.
type badPaths []badPath

type badPath struct {
	path, msg string
}

func (s *state) newBadPaths(errs field.ErrorList, unknown []string) badPaths {
	var b badPaths
	for _, e := range errs {
		b = append(b, badPath{e.Field, e.ErrorBody()})
	}
	for _, u := range unknown {
		b = append(b, badPath{u, s.unknownCause(u)})
	}
	return b
}

// under returns the first problem at or below path, "" if none. Compiling
// asks it of every peer and protocol of a rule, so it allocates nothing
// until it finds one.
func (b badPaths) under(path string) string {
	for _, p := range b {
		if isAtOrBelow(path, p.path) {
			return p.path + ": " + p.msg
		}
	}
	return ""
}

// isAtOrBelow reports whether p is path or a field or item below it.
func isAtOrBelow(path, p string) bool {
	if !strings.HasPrefix(p, path) {
		return false
	}
	return len(p) == len(path) || p[len(path)] == '.' || p[len(path)] == '['
}

// exactly returns the first problem at exactly path, "" if none.
func (b badPaths) exactly(path string) string {
	for _, p := range b {
		if p.path == path {
			return p.path + ": " + p.msg
		}
	}
	return ""
}

// objectProblem returns the first unknown field outside spec, metadata
// and status (a mis-indented `ingress:` at the top level), "" if none.
// Such a field may have been meant to change anything about the policy,
// so the whole policy fails closed (docs/semantics.md, Fail closed).
// Metadata and status do not change what a policy means.
func objectProblem(unknown []string) string {
	for _, u := range unknown {
		root, _, _ := strings.Cut(u, ".")
		root, _, _ = strings.Cut(root, "[")
		switch root {
		case "spec", "metadata", "status":
			continue
		}
		return u + ": unknown field outside spec: the whole policy is enforced fail-closed"
	}
	return ""
}

func isDirectChild(parent, path string) bool {
	if len(path) <= len(parent)+1 || path[:len(parent)+1] != parent+"." {
		return false
	}
	rest := path[len(parent)+1:]
	for _, c := range rest {
		if c == '.' || c == '[' {
			return false
		}
	}
	return true
}

// isListField reports whether a bad path lies inside one of the rule's
// list fields, where problems are contained to one entry.
func isListField(rulePath, badPath string, fields ...string) bool {
	for _, f := range fields {
		p := rulePath + "." + f
		if badPath == p || len(badPath) > len(p) && badPath[:len(p)] == p && badPath[len(p)] == '[' {
			return true
		}
	}
	return false
}

// Bounds of a status message: it is an Accepted=False condition's message
// and a warning line, so it lists enough problems that an operator can fix
// them in one run (moat check lists them all) and stays well inside the
// API's 32768-byte limit for condition messages; the agent cuts its
// messages at 1024 bytes, and the count of what was left out must survive
// that.
const (
	statusMaxProblems = 10
	statusMaxBytes    = 900
)

// statusReason summarises problems for a status condition: every unknown
// or gated field and every validation error, each with its field path, up
// to the bounds above, then how many more there are. The reason is
// UnknownField when any field was not understood, InvalidSpec otherwise.
func (s *state) statusReason(errs field.ErrorList, unknown []string) (reason, msg string) {
	if len(unknown) == 0 && len(errs) == 0 {
		return "", ""
	}
	reason = "InvalidSpec"
	if len(unknown) > 0 {
		reason = "UnknownField"
	}
	total := len(unknown) + len(errs)
	var b strings.Builder
	shown := 0
	add := func(item string) bool {
		if shown == statusMaxProblems || shown > 0 && b.Len()+len("; ")+len(item) > statusMaxBytes {
			return false
		}
		if shown > 0 {
			b.WriteString("; ")
		}
		if len(item) > statusMaxBytes {
			item = truncateUTF8(item, statusMaxBytes-len("...")) + "..."
		}
		b.WriteString(item)
		shown++
		return true
	}
	for _, u := range unknown {
		if !add(u + ": " + s.unknownCause(u)) {
			break
		}
	}
	if shown == len(unknown) {
		for _, e := range errs {
			if !add(e.Error()) {
				break
			}
		}
	}
	if shown < total {
		fmt.Fprintf(&b, "; and %d more (moat check lists them all)", total-shown)
	}
	b.WriteString(": enforced fail-closed")
	return reason, b.String()
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// selectorCache converts API label selectors once per distinct selector,
// keeping each one's canonical string (labels.Selector.String).
type selectorCache map[string]*cachedSel

type cachedSel struct {
	sel labels.Selector // nil: invalid
	str string
}

// getKeyed converts sel and returns its canonical string; ok is false
// when the selector is invalid, and callers must then fail closed. A nil
// selector selects nothing.
func (c selectorCache) getKeyed(sel *metav1.LabelSelector) (labels.Selector, string, bool) {
	if sel == nil {
		return labels.Nothing(), "<nothing>", true
	}
	if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
		return everything, "", true
	}
	var buf [256]byte
	key := appendSelectorKey(buf[:0], sel)
	if cs, hit := c[string(key)]; hit { // no copy of the key to look it up
		return cs.sel, cs.str, cs.sel != nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		c[string(key)] = &cachedSel{}
		return nil, "", false
	}
	cs := &cachedSel{s, s.String()}
	c[string(key)] = cs
	return s, cs.str, true
}

// appendSelectorKey appends a key that identifies an API selector by
// content, more cheaply than its String method. Every string is
// length-prefixed and every count ends in '#', so that the key reads back
// one way only and no two selectors share a key, valid or not (a count
// written straight before a length would let "1"+"140:" equal
// "11"+"40:", and the validator's memo take an invalid selector for a
// valid one).
// Callers look keys up from a buffer on their stack: the compiler and
// validation key every selector of every policy, and nearly all are
// repeats.
func appendSelectorKey(b []byte, sel *metav1.LabelSelector) []byte {
	str := func(s string) {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	b = strconv.AppendInt(b, int64(len(sel.MatchLabels)), 10)
	b = append(b, '#')
	switch len(sel.MatchLabels) {
	case 0:
	case 1:
		for k, v := range sel.MatchLabels {
			str(k)
			str(v)
		}
	default:
		var arr [8]string
		keys := arr[:0]
		for k := range sel.MatchLabels {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			str(k)
			str(sel.MatchLabels[k])
		}
	}
	for _, r := range sel.MatchExpressions {
		b = append(b, '|')
		str(r.Key)
		str(string(r.Operator))
		b = strconv.AppendInt(b, int64(len(r.Values)), 10)
		b = append(b, '#')
		for _, v := range r.Values {
			str(v)
		}
	}
	return b
}

// isEverything reports whether a selector selects every object.
func isEverything(sel labels.Selector) bool {
	reqs, selectable := sel.Requirements()
	return selectable && len(reqs) == 0
}
