package decode

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/policy"
)

// Object is one decoded object.
type Object struct {
	// Ref names the object as diagnostics do: "Pod default/web-1",
	// "Node n1" (namespaced kinds without a namespace are in "default",
	// as with kubectl).
	Ref string
	// Source is where it came from: "file.yaml#2 items[7]", or what the
	// caller named the stream. It is left empty for a pod, node or
	// namespace read without a problem (nothing keeps it; Result still
	// names it if it turns out to be a duplicate).
	Source string
	// LastApplied, for a Namespace, Pod or Node, is the set of labels its
	// kubectl.kubernetes.io/last-applied-configuration annotation names
	// (those client-side kubectl apply removes when a manifest no longer
	// sets them), nil without the annotation.
	LastApplied map[string]bool
	// Exactly one of these is set when the object was read.
	Namespace            *policy.Namespace
	Pod                  *policy.Pod
	Node                 *policy.Node
	NetworkPolicy        *policy.NetworkPolicy
	ClusterNetworkPolicy *policy.ClusterNetworkPolicy
	// Diagnostics are what decoding found: problems with pod and node
	// addresses, duplicate fields, kinds and versions Moat cannot read.
	// Validation errors and unknown fields of policies are the compiler's
	// to report (it owns what they do to enforcement).
	Diagnostics []policy.Diagnostic
	// Dropped means the object could not be loaded at all (an unknown kind
	// in a group Moat reads, an unsupported apiVersion, metadata that
	// cannot be read): leaving it out could widen access, so commands
	// that judge traffic refuse to run.
	Dropped bool
	// Skipped says why an object is not used (a kind Moat does not read,
	// a finished pod); empty otherwise.
	Skipped string

	loc location
}

// The kinds Moat reads, with the one apiVersion it reads each in.
const (
	coreV1       = "v1"
	networkingV1 = "networking.k8s.io/v1"
)

var readKinds = map[string]string{
	"Namespace":            coreV1,
	"Pod":                  coreV1,
	"Node":                 coreV1,
	"NetworkPolicy":        networkingV1,
	"ClusterNetworkPolicy": v1alpha2.SchemeGroupVersion.String(),
}

// defaultNamespace is where namespaced objects without metadata.namespace
// land when no namespace is given, as with kubectl.
const defaultNamespace = "default"

// namespacing is where namespaced objects (Pod, NetworkPolicy) without
// metadata.namespace go, the way kubectl apply places them: in the
// namespace of -n, else of the kubeconfig context. Only manifests leave it
// out: the API server always says it.
type namespacing struct {
	// name is the namespace; "" means defaultNamespace.
	name string
	// enforce: an object naming another namespace is refused, as kubectl
	// apply -n refuses it ("the namespace from the provided object does
	// not match").
	enforce bool
}

// place puts an object without a namespace in d's, reporting whether it
// had none.
func (d *dec) place(m *metav1.ObjectMeta) bool {
	if m.Namespace != "" {
		return false
	}
	m.Namespace = d.ns.name
	if m.Namespace == "" {
		m.Namespace = defaultNamespace
	}
	return true
}

// inPlace drops an object whose namespace is not the one -n gives (when
// it is enforced); it returns false then.
func (d *dec) inPlace(m *metav1.ObjectMeta, o *Object) bool {
	if !d.ns.enforce || m.Namespace == d.ns.name {
		return true
	}
	o.drop("metadata.namespace", fmt.Sprintf("the namespace from the provided object %q does not match the namespace %q given with -n (kubectl apply refuses it too)", m.Namespace, d.ns.name))
	return false
}

// header is an object's apiVersion and kind.
type header struct {
	apiVersion, kind string
	// have counts which of the two were given (or inherited from a
	// typed list such as PodList).
	haveVersion, haveKind bool
	// inherited: the two come from the list the object is an item of.
	inherited bool
	// bad notes a wrongly typed, repeated or conflicting apiVersion or
	// kind: the object is dropped.
	bad string
}

// body decodes the members of one kind of object.
type body interface {
	member(d *dec, key []byte) error
	// finish builds the Object.
	finish(d *dec, o *Object)
}

// topDoc is what a document was: its apiVersion and kind as given, and
// whether it was a List whose items were a list.
type topDoc struct {
	apiVersion, kind string
	list             bool
}

// decoder decodes objects from one source after another.
type decoder struct {
	d dec
	// cont is the metadata.continue of the last List read.
	cont string
	// top is what the last document read was (its header, and whether
	// it was a List with items), for DecodeListPage to check.
	top topDoc
	// doc names the document being read; items the list items being read
	// in it: they make the objects' Source.
	doc   string
	items []int
	// sequential turns off decoding a large List on every core (tests).
	sequential bool
	// ahead is the document's own apiVersion and kind when they could be
	// read ahead of its members (see listAhead): the items of a typed
	// List whose keys come sorted, as a YAML document converted to JSON
	// or an unstructured map has them, come before its kind.
	ahead header
	// Bodies of the kinds not kept whole, reused from object to object.
	pod  podBody
	node nodeBody
	ns   namespaceBody
}

func newDecoder() *decoder { return &decoder{} }

// document decodes one JSON value, named name in Sources. ahead is the
// header of a typed List read ahead of its items, if known.
func (x *decoder) document(src source, name string, ahead header, emit func(*Object)) error {
	x.doc, x.items, x.ahead = name, x.items[:0], ahead
	return x.value(src, header{}, emit)
}

// listAhead is the header of a typed List (PodList, NetworkPolicyList...)
// given its apiVersion and kind as read ahead of its members: the header
// its items take theirs from, as when the List says them first. Anything
// else (no List, a generic List, a kind given twice or not as a string)
// gives none, and items without their own kind are dropped as before.
func listAhead(apiVersion, kind any, kinds int) header {
	k, ok := kind.(string)
	if !ok || kinds != 1 || !strings.HasSuffix(k, "List") || k == "List" {
		return header{}
	}
	h := header{kind: k, haveKind: true}
	if v, ok := apiVersion.(string); ok {
		h.apiVersion, h.haveVersion = v, true
	}
	return h
}

// jsonAhead reads the top-level apiVersion and kind of the JSON object js
// ahead of decoding it, when its items come before its kind; errors are
// left to the decoding.
func jsonAhead(js []byte) header {
	s := newBytesScanner(js)
	if k, err := s.peek(); err != nil || k != kObject || s.enterObject() != nil {
		return header{}
	}
	var apiVersion, kind any
	kinds, versions, items := 0, 0, false
	for {
		key, ok, err := s.key()
		if err != nil {
			return header{}
		}
		if !ok {
			break
		}
		switch string(key) {
		case "kind", "apiVersion":
			if string(key) == "kind" {
				if !items {
					return header{} // read before the items: nothing to do
				}
				kinds++
			} else {
				versions++
			}
			var v any = false // not a string
			if k, err := s.peek(); err == nil && k == kString {
				str, err := s.str()
				if err != nil {
					return header{}
				}
				v = str
			} else if s.skip() != nil {
				return header{}
			}
			if string(key) == "kind" {
				kind = v
			} else {
				apiVersion = v
			}
			continue
		case "items":
			items = true
		}
		if s.skip() != nil {
			return header{}
		}
	}
	if versions > 1 {
		return header{}
	}
	return listAhead(apiVersion, kind, kinds)
}

// maxListDepth is how deep Lists may be nested in one another (a List
// among the items of a List, as kubectl flattens it): kubectl never
// writes one, and a hand-made one is a List or two deep. The bound keeps
// what a document can cost linear in its size: every level of an
// unbounded nesting named the levels above it in its Source.
const maxListDepth = 8

// location is where an object was read: a document and, in a List, its
// item (or items, in nested lists). It costs no allocation for the common
// cases; the Source string is made only when something keeps it.
type location struct {
	doc    string
	item   int   // -1 outside a List
	nested []int // the items, in nested Lists (item is then -1)
}

func (x *decoder) location() location {
	switch len(x.items) {
	case 0:
		return location{doc: x.doc, item: -1}
	case 1:
		return location{doc: x.doc, item: x.items[0]}
	}
	return location{doc: x.doc, item: -1, nested: append([]int(nil), x.items...)}
}

// String is "<doc> items[i] items[j]".
func (l location) String() string {
	items := l.nested
	if l.item >= 0 {
		items = []int{l.item}
	}
	if len(items) == 0 {
		return l.doc
	}
	b := []byte(l.doc)
	for _, i := range items {
		b = append(b, " items["...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, ']')
	}
	return string(b)
}

// setSource names the object's source wherever it is kept: policies,
// diagnostics, objects skipped or dropped. A pod, node or namespace read
// without a problem does not need it.
func (o *Object) setSource() {
	if (o.Pod != nil || o.Node != nil || o.Namespace != nil) && len(o.Diagnostics) == 0 {
		return
	}
	o.Source = o.loc.String()
	for i := range o.Diagnostics {
		o.Diagnostics[i].Source = o.Source
	}
	if o.NetworkPolicy != nil {
		o.NetworkPolicy.Source = o.Source
	}
	if o.ClusterNetworkPolicy != nil {
		o.ClusterNetworkPolicy.Source = o.Source
	}
}

// errNotObject is a document that is not a JSON object at all.
type errNotObject struct{ got vkind }

func (e errNotObject) Error() string {
	return fmt.Sprintf("not a Kubernetes object (want a mapping with apiVersion and kind, got %s)", e.got)
}

// value decodes one JSON value that must be an object (or a List of
// them), calling emit for every object in it, items as they come. inherit is the header that
// items of a typed list (PodList) have when they do not say.
func (x *decoder) value(src source, inherit header, emit func(*Object)) error {
	k, err := src.peek()
	if err != nil {
		return err
	}
	if k != kObject {
		return errNotObject{k}
	}
	if err := src.enterObject(); err != nil {
		return err
	}
	h := inherit
	var (
		b        body
		captured []capturedMember
		isList   bool // "items" was read as a list of objects
		d        = &x.d
	)
	// replay reads the members captured before the body was known,
	// metadata first: the identity is needed by what follows.
	replay := func(b body, captured []capturedMember) error {
		slices.SortStableFunc(captured, func(a, b capturedMember) int {
			return boolInt(b.key == "metadata") - boolInt(a.key == "metadata")
		})
		for _, c := range captured {
			d.src = c.src
			if err := b.member(d, []byte(c.key)); err != nil {
				return err
			}
		}
		d.src = src
		return nil
	}
	d.reset(src, false)
	for {
		key, ok, err := src.key()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(key) {
		case "apiVersion", "kind":
			if err := h.read(src, string(key), inherit); err != nil {
				return err
			}
			continue
		case "items":
			if _, list := b.(*listBody); b != nil && !list {
				break // a member of the object, unknown to it
			}
			k, err := src.peek()
			if err != nil {
				return err
			}
			lh := h // the List's header, read ahead if its kind comes later
			if !lh.haveKind && len(x.items) == 0 && x.ahead.haveKind {
				lh = x.ahead
			}
			if k != kArray {
				if lh.haveKind && strings.HasSuffix(lh.kind, "List") {
					return fmt.Errorf("%s: items: must be a list, found %s", lh.kind, k)
				}
				break
			}
			if len(x.items) >= maxListDepth {
				return fmt.Errorf("items: a List nested in %d others: Moat reads Lists nested at most %d deep", len(x.items), maxListDepth)
			}
			isList = true
			var items header
			if lh.haveKind && strings.HasSuffix(lh.kind, "List") && lh.kind != "List" {
				items = header{apiVersion: lh.apiVersion, kind: strings.TrimSuffix(lh.kind, "List"), haveVersion: lh.haveVersion, haveKind: true, inherited: true}
			}
			if err := src.enterArray(); err != nil {
				return err
			}
			if sc, ok := src.(*scanner); ok && len(x.items) == 0 && !x.sequential && runtime.GOMAXPROCS(0) > 1 {
				if err := x.parallelItems(sc, items, emit); err != nil {
					return err
				}
				d.reset(src, false)
				continue
			}
			for i := 0; ; i++ {
				ok, err := src.elem()
				if err != nil {
					return err
				}
				if !ok {
					break
				}
				x.items = append(x.items, i)
				err = x.value(src, items, emit)
				x.items = x.items[:len(x.items)-1]
				if err != nil {
					return fmt.Errorf("items[%d]: %w", i, err)
				}
			}
			d.reset(src, false) // the items used the decoder
			continue
		}
		if b == nil && h.haveKind && h.haveVersion {
			b = x.start(h)
			d.strict = strictKind(h)
			// Members seen before apiVersion and kind (keys sorted: a
			// mis-indented top-level "ingress" comes before "kind").
			if err := replay(b, captured); err != nil {
				return err
			}
			captured = nil
		}
		if b != nil {
			if err := b.member(d, key); err != nil {
				return err
			}
			continue
		}
		c, err := src.captureValue()
		if err != nil {
			return err
		}
		captured = append(captured, capturedMember{string(key), c})
	}
	if len(x.items) == 0 {
		x.top = topDoc{apiVersion: h.apiVersion, kind: h.kind}
	}
	if h.haveKind && strings.HasSuffix(h.kind, "List") && h.bad == "" {
		if lb, ok := b.(*listBody); ok {
			x.cont = lb.cont
		}
		x.top.list = isList && len(x.items) == 0
		return nil
	}
	if b == nil {
		b = x.start(h)
		d.strict = strictKind(h)
		if err := replay(b, captured); err != nil {
			return err
		}
	}
	o := &Object{loc: x.location()}
	b.finish(d, o)
	if isList && !o.Dropped {
		// Its items were taken for objects as they came (a dump's List
		// says "kind" after them), but this is no List: an object with a
		// list of objects inside cannot be trusted either way.
		o.Skipped = ""
		o.Namespace, o.Pod, o.Node, o.NetworkPolicy, o.ClusterNetworkPolicy = nil, nil, nil, nil, nil
		o.drop("items", "a list of objects in a "+h.kind+", which is not a List")
	}
	o.setSource()
	emit(o)
	return nil
}

// read reads apiVersion or kind.
func (h *header) read(src source, name string, inherit header) error {
	k, err := src.peek()
	if err != nil {
		return err
	}
	var v string
	if k == kString {
		v, err = src.str()
	} else {
		err = src.skip()
		h.bad = name + ": must be a string, found " + k.String()
	}
	if err != nil {
		return err
	}
	have, cur := &h.haveKind, &h.kind
	if name == "apiVersion" {
		have, cur = &h.haveVersion, &h.apiVersion
	}
	switch {
	case h.inherited && v != *cur:
		h.bad = fmt.Sprintf("%s: %q in a list of %s %s", name, v, inherit.apiVersion, inherit.kind)
	case *have && !h.inherited && v != *cur:
		// Named by the first value, the message giving both: which one
		// the author meant is not known.
		h.bad = fmt.Sprintf("%s: duplicate field, given as %q and as %q", name, *cur, v)
		return nil
	case *have && !h.inherited:
		h.bad = name + ": duplicate field"
	}
	*cur, *have = v, true
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// strictKind reports whether objects of h are read strictly: the
// policies (when their apiVersion is the one Moat reads).
func strictKind(h header) bool {
	want, ok := readKinds[h.kind]
	return ok && want == h.apiVersion && h.bad == "" && (h.kind == "NetworkPolicy" || h.kind == "ClusterNetworkPolicy")
}

type capturedMember struct {
	key string
	src source
}
