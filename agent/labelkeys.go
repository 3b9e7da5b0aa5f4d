package agent

import (
	"iter"
	"reflect"
	"slices"
	"strings"
	"unique"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Label changes no selector reads. A pod's labels matter to the program
// only through the label selectors of policies (subjects and peers); a
// change of labels that none of them mentions, such as a rollout's or a
// tool's bookkeeping label, cannot move the pod in or out of any
// selection. The agent drops such updates before the queue instead of
// recompiling, which is what most label churn in a cluster costs it then:
// the watch event alone.
//
// The keys are collected from every policy a compilation reads (a
// superset of what this node compiles is safe), by walking each decoded
// policy for every metav1.LabelSelector it holds, so that a selector in a
// field added later is not missed. A compilation reads the policies it
// compiles before any pod: a policy that reads a new key makes that sync a
// full compilation, and any update dropped before the set knew the key is
// read from the pod cache by that compilation (compile.go).

// keySet is a set of label keys; nil means "unknown yet: every key".
type keySet map[string]struct{}

// mentions reports whether a label change between old and cur touches a
// key in s; always true for a nil set.
func (s *keySet) mentions(old, cur map[string]string) bool {
	if s == nil {
		return true
	}
	for k, v := range old {
		if w, ok := cur[k]; !ok || w != v {
			if _, read := (*s)[k]; read {
				return true
			}
		}
	}
	for k := range cur {
		if _, ok := old[k]; !ok {
			if _, read := (*s)[k]; read {
				return true
			}
		}
	}
	return false
}

// keyList is a list of label keys, stored once per distinct list however
// many policies read it (the unique package drops it with the last).
type keyList struct{ h unique.Handle[string] }

// makeKeyList sorts keys (equal sets share one list) and joins them with
// NUL, which no label key contains.
func makeKeyList(keys []string) keyList {
	if len(keys) == 0 {
		return keyList{}
	}
	slices.Sort(keys)
	return keyList{unique.Make(strings.Join(keys, "\x00"))}
}

// all yields the keys.
func (l keyList) all() iter.Seq[string] {
	return func(yield func(string) bool) {
		if l == (keyList{}) {
			return
		}
		for k := range strings.SplitSeq(l.h.Value(), "\x00") {
			if !yield(k) {
				return
			}
		}
	}
}

var labelSelectorType = reflect.TypeFor[metav1.LabelSelector]()
var objectMetaType = reflect.TypeFor[metav1.ObjectMeta]()

// selectorKeys returns the label keys of every label selector in v.
func selectorKeys(v any) []string {
	seen := map[string]bool{}
	var keys []string
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	var walk func(reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer, reflect.Interface:
			if !v.IsNil() {
				walk(v.Elem())
			}
		case reflect.Struct:
			switch v.Type() {
			case objectMetaType:
				return // an object's own labels select nothing
			case labelSelectorType:
				// Read through reflect: the value may sit behind an
				// unexported field or in a map, where Interface panics.
				for _, k := range v.FieldByName("MatchLabels").MapKeys() {
					add(k.String())
				}
				exprs := v.FieldByName("MatchExpressions")
				for i := range exprs.Len() {
					add(exprs.Index(i).FieldByName("Key").String())
				}
				return
			}
			for i := range v.NumField() {
				walk(v.Field(i))
			}
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				walk(v.Index(i))
			}
		case reflect.Map:
			it := v.MapRange()
			for it.Next() {
				walk(it.Value())
			}
		}
	}
	walk(reflect.ValueOf(v))
	return keys
}

// keyLists are the distinct key lists of a set of policies: equal lists
// are one handle, so a cluster's thousands of policies have a few dozen.
// Each decoded policy carries its list, found when it was decoded (a new
// version is a new object).
type keyLists map[keyList]struct{}

func (ls keyLists) add(l keyList) { ls[l] = struct{}{} }

// covers reports whether s holds every key of ls; never for a nil set
// (nothing known yet).
func (s *keySet) covers(ls keyLists) bool {
	if s == nil {
		return false
	}
	for l := range ls {
		for k := range l.all() {
			if _, ok := (*s)[k]; !ok {
				return false
			}
		}
	}
	return true
}

// cachedKeyLists are the key lists of every cached policy.
func (a *Agent) cachedKeyLists() keyLists {
	ls := keyLists{}
	for _, store := range []cache.Store{a.inf.nps.GetStore(), a.inf.cnps.GetStore()} {
		for _, o := range store.List() {
			if d, ok := o.(interface{ readKeys() keyList }); ok {
				ls.add(d.readKeys())
			}
		}
	}
	return ls
}

// updateSelectorKeys makes the key set cover ls: the key lists of exactly
// the policies a full compilation is about to compile (or, before the pod
// informer starts, of every cached policy), read before any pod. A key
// not in the set (or no set yet) makes the set that of ls. Label changes
// on the new key may have been dropped, which the compilation repairs:
// it reads every pod from the cache after this, under the new set. Only
// a full compilation may therefore grow the set; the incremental path
// compiles a policy only when the set already covers it (compile.go).
//
// The set must come from the very objects compiled, not from another
// reading of the caches: a policy version with a new key stored between
// the two readings would be compiled against pods projected without that
// key, its selectors on it matching no pod (a subject isolating nothing,
// a deny peer denying nothing) until a later sync.
func (a *Agent) updateSelectorKeys(ls keyLists) {
	prev := a.selectorKeys.Load()
	if prev.covers(ls) {
		// The set stays as it was, a superset of what is read, which is
		// safe: pods cached under it need not be projected again
		// (labelproj.go), and the filter above only drops less.
		return
	}
	set := keySet{}
	for l := range ls {
		for k := range l.all() {
			set[k] = struct{}{}
		}
	}
	a.selectorKeys.Store(&set)
}
