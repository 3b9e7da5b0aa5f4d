package policy

import (
	"strconv"

	"github.com/RoaringBitmap/roaring/v2"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// labelIndex answers label selectors over a set of members (pods by slot,
// namespaces by id) with one bitmap per label key and value, so that a
// selector costs a few bitmap operations however many members there are.
// A key is indexed when a selector first reads it.
type labelIndex struct {
	all  *roaring.Bitmap
	keys map[string]*keyIndex
	// labelsOf returns a member's labels, to index a key late.
	labelsOf func(id uint32) map[string]string
}

// keyIndex is one indexed label key: the members that have it, and by value.
type keyIndex struct {
	has    *roaring.Bitmap
	values map[string]*roaring.Bitmap
}

func newLabelIndex(labelsOf func(uint32) map[string]string) *labelIndex {
	return &labelIndex{all: roaring.New(), keys: map[string]*keyIndex{}, labelsOf: labelsOf}
}

// add puts a member with its labels into the index.
func (x *labelIndex) add(id uint32, l map[string]string) {
	x.all.Add(id)
	for k, ki := range x.keys {
		if v, ok := l[k]; ok {
			ki.put(id, v)
		}
	}
}

// remove takes a member out; l must be the labels it was added with.
func (x *labelIndex) remove(id uint32, l map[string]string) {
	x.all.Remove(id)
	for k, ki := range x.keys {
		if v, ok := l[k]; ok {
			ki.has.Remove(id)
			if bm := ki.values[v]; bm != nil {
				bm.Remove(id)
				if bm.IsEmpty() {
					delete(ki.values, v)
				}
			}
		}
	}
}

func (ki *keyIndex) put(id uint32, v string) {
	ki.has.Add(id)
	bm := ki.values[v]
	if bm == nil {
		bm = roaring.New()
		ki.values[v] = bm
	}
	bm.Add(id)
}

// indexFrom indexes keys from members grouped by the projection of their
// labels onto (at least) those keys; members are sorted in each group.
func (x *labelIndex) indexFrom(keys []string, groups map[int32][]uint32, projs []map[string]string) {
	for _, k := range keys {
		if _, done := x.keys[k]; done {
			continue
		}
		ki := &keyIndex{has: roaring.New(), values: map[string]*roaring.Bitmap{}}
		for proj, members := range groups {
			v, ok := projs[proj][k]
			if !ok {
				continue
			}
			bm := ki.values[v]
			if bm == nil {
				bm = roaring.New()
				ki.values[v] = bm
			}
			bm.AddMany(members)
			ki.has.AddMany(members)
		}
		x.keys[k] = ki
	}
}

// key returns the index of one label key, building it on first use.
func (x *labelIndex) key(k string) *keyIndex {
	if ki, ok := x.keys[k]; ok {
		return ki
	}
	ki := &keyIndex{has: roaring.New(), values: map[string]*roaring.Bitmap{}}
	it := x.all.Iterator()
	for it.HasNext() {
		id := it.Next()
		if v, ok := x.labelsOf(id)[k]; ok {
			ki.put(id, v)
		}
	}
	x.keys[k] = ki
	return ki
}

// eval returns the members sel selects, as a new bitmap the caller owns.
func (x *labelIndex) eval(sel labels.Selector) *roaring.Bitmap {
	reqs, selectable := sel.Requirements()
	if !selectable {
		return roaring.New()
	}
	out := x.all.Clone()
	for _, r := range reqs {
		out.And(x.requirement(r))
		if out.IsEmpty() {
			break
		}
	}
	return out
}

// requirement returns the members one requirement selects; the result may
// be shared with the index and must not be modified.
func (x *labelIndex) requirement(r labels.Requirement) *roaring.Bitmap {
	ki := x.key(r.Key())
	union := func() *roaring.Bitmap {
		var bms []*roaring.Bitmap
		for _, v := range r.ValuesUnsorted() {
			if bm := ki.values[v]; bm != nil {
				bms = append(bms, bm)
			}
		}
		switch len(bms) {
		case 0:
			return roaring.New()
		case 1:
			return bms[0]
		}
		return roaring.FastOr(bms...)
	}
	switch r.Operator() {
	case selection.In, selection.Equals, selection.DoubleEquals:
		return union()
	case selection.NotIn, selection.NotEquals:
		// A member without the key matches too, as in labels.Selector.
		return roaring.AndNot(x.all, union())
	case selection.Exists:
		return ki.has
	case selection.DoesNotExist:
		return roaring.AndNot(x.all, ki.has)
	case selection.GreaterThan, selection.LessThan:
		vals := r.ValuesUnsorted()
		if len(vals) != 1 {
			return roaring.New()
		}
		bound, err := strconv.ParseInt(vals[0], 10, 64)
		if err != nil {
			return roaring.New()
		}
		out := roaring.New()
		for v, bm := range ki.values {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil && (r.Operator() == selection.GreaterThan && n > bound || r.Operator() == selection.LessThan && n < bound) {
				out.Or(bm)
			}
		}
		return out
	}
	return roaring.New()
}

// selectorKeys lists the label keys a selector reads.
func selectorKeys(sel labels.Selector) []string {
	reqs, _ := sel.Requirements()
	out := make([]string, 0, len(reqs))
	for _, r := range reqs {
		out = append(out, r.Key())
	}
	return out
}
