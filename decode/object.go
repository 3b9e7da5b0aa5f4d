package decode

import (
	"fmt"
	"slices"
	"strings"

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
	// caller named the stream.
	Source string
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
// land, as with kubectl.
const defaultNamespace = "default"

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

// decoder decodes objects from one source after another, sharing an
// intern table (label keys and values, node and namespace names repeat
// across objects).
type decoder struct {
	d      dec
	intern map[string]string
	// cont is the metadata.continue of the last List read.
	cont string
}

func newDecoder() *decoder { return &decoder{intern: map[string]string{}} }

// errNotObject is a document that is not a JSON object at all.
type errNotObject struct{ got vkind }

func (e errNotObject) Error() string {
	return fmt.Sprintf("not a Kubernetes object (want a mapping with apiVersion and kind, got %s)", e.got)
}

// value decodes one JSON value that must be an object (or a List of
// them), calling emit for every object in it. inherit is the header that
// items of a typed list (PodList) have when they do not say.
func (x *decoder) value(src source, source string, inherit header, emit func(*Object)) error {
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
		pending  []*Object
		isList   bool // "items" was read as a list of objects
		d        = &x.d
	)
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
			if k != kArray {
				if h.haveKind && strings.HasSuffix(h.kind, "List") {
					return fmt.Errorf("%s: items: must be a list, got %s", h.kind, k)
				}
				break
			}
			isList = true
			var items header
			if h.haveKind && strings.HasSuffix(h.kind, "List") && h.kind != "List" {
				items = header{apiVersion: h.apiVersion, kind: strings.TrimSuffix(h.kind, "List"), haveVersion: h.haveVersion, haveKind: true, inherited: true}
			}
			if err := src.enterArray(); err != nil {
				return err
			}
			for i := 0; ; i++ {
				ok, err := src.elem()
				if err != nil {
					return err
				}
				if !ok {
					break
				}
				if err := x.value(src, fmt.Sprintf("%s items[%d]", source, i), items, func(o *Object) { pending = append(pending, o) }); err != nil {
					return fmt.Errorf("items[%d]: %w", i, err)
				}
			}
			d.reset(src, false) // the items used the decoder
			continue
		}
		if b == nil && h.haveKind && h.haveVersion {
			b = x.start(h)
			d.strict = strictKind(h)
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
	if h.haveKind && strings.HasSuffix(h.kind, "List") && h.bad == "" {
		if lb, ok := b.(*listBody); ok {
			x.cont = lb.cont
		}
		for _, o := range pending {
			emit(o)
		}
		return nil
	}
	if b == nil {
		b = x.start(h)
		d.strict = strictKind(h)
		// metadata first: the identity is needed by what follows.
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
	}
	if isList && d.strict {
		// Read as items, but the object is not a List: for a policy, an
		// unknown field.
		d.unknown = append(d.unknown, "items")
	}
	o := &Object{Source: source}
	b.finish(d, o)
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
		h.bad = name + ": wrong type: want a string, got " + k.String()
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
