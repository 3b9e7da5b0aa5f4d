package decode

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/moat-net/moat/policy"
)

// Result collects decoded objects into the compiler's input. Every source
// (files, stdin, a live cluster) fills one the same way. The zero value is
// ready to use; a Result is not safe for concurrent use.
type Result struct {
	Cluster policy.Cluster
	// Diagnostics are problems found while decoding: duplicate fields,
	// duplicate objects, unusable values, kinds and versions Moat cannot
	// read. Objects with such problems are still loaded where possible so
	// the compiler can fail closed on them.
	Diagnostics []policy.Diagnostic
	// Dropped names objects that could not be loaded at all (wrong
	// apiVersion, an unknown kind in a group Moat reads, unreadable
	// metadata). Leaving out a policy could widen access, so commands that
	// judge traffic refuse to run when this is not empty.
	Dropped []string
	// Skipped lists objects Moat does not use, for -v: "<Ref> (<source>):
	// <why>".
	Skipped []string

	// LastApplied holds, by Ref, the labels that the
	// last-applied-configuration of a Namespace, Pod or Node names (see
	// Object.LastApplied): package snapshot models apply with it.
	LastApplied map[string]map[string]bool

	// Namespace is where namespaced objects (Pod, NetworkPolicy) without
	// metadata.namespace are put, as kubectl apply puts them in the
	// namespace of -n or of the kubeconfig context; "" means "default".
	// EnforceNamespace (kubectl's -n) drops an object that names another
	// namespace. Both are read when decoding starts: set them first.
	// Objects from the API server always have a namespace.
	Namespace        string
	EnforceNamespace bool

	seen map[string]location
	dec  *decoder
}

func (r *Result) decoder() *decoder {
	if r.dec == nil {
		r.dec = newDecoder()
		r.dec.d.ns = namespacing{name: r.Namespace, enforce: r.EnforceNamespace}
		r.seen = map[string]location{}
	}
	return r.dec
}

// Add puts one decoded object into the result. An object whose Ref was
// added before is dropped: which copy a cluster holds depends on how it
// was applied, and judging traffic with either could be wrong.
func (r *Result) Add(o *Object) {
	r.decoder()
	r.Diagnostics = append(r.Diagnostics, o.Diagnostics...)
	switch {
	case o.Dropped:
		r.Dropped = append(r.Dropped, o.Ref)
		return
	case o.Skipped != "":
		r.Skipped = append(r.Skipped, fmt.Sprintf("%s (%s): %s", o.Ref, o.source(), o.Skipped))
		return
	}
	if prev, dup := r.seen[o.Ref]; dup {
		r.Diagnostics = append(r.Diagnostics, policy.Diagnostic{Severity: policy.SeverityError, Object: o.Ref, Source: o.source(), Message: "duplicate object, also defined at " + prev.String() + ": object not loaded"})
		r.Dropped = append(r.Dropped, o.Ref)
		return
	}
	loc := o.loc
	if o.Source != "" {
		loc = location{doc: o.Source, item: -1} // made by the caller
	}
	r.seen[o.Ref] = loc
	if o.LastApplied != nil {
		if r.LastApplied == nil {
			r.LastApplied = map[string]map[string]bool{}
		}
		r.LastApplied[o.Ref] = o.LastApplied
	}
	c := &r.Cluster
	switch {
	case o.Namespace != nil:
		c.Namespaces = append(c.Namespaces, *o.Namespace)
	case o.Pod != nil:
		c.Pods = append(c.Pods, o.Pod)
	case o.Node != nil:
		c.Nodes = append(c.Nodes, *o.Node)
	case o.NetworkPolicy != nil:
		c.NetworkPolicies = append(c.NetworkPolicies, o.NetworkPolicy)
	case o.ClusterNetworkPolicy != nil:
		c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, *o.ClusterNetworkPolicy)
	}
}

// DecodeJSON reads a stream of JSON values (whitespace between them), each
// an object or a List of objects, such as `kubectl get -A -o json` prints
// or the API server returns for a list. It streams: memory holds the
// decoded objects, not the input. source names the stream in diagnostics
// ("<source>#<n>" for the n-th value, " items[i]" for list items). Input
// that is not JSON, or a value that is not an object, is an error naming
// it; everything else becomes a diagnostic.
func (r *Result) DecodeJSON(source string, in io.Reader) error {
	_, err := r.decodeJSON(source, in)
	return err
}

// DecodeListPage reads one page of a list from the API server and
// returns its metadata.continue, empty on the last page. The page must be
// one JSON object, a List of kind (a PodList for "Pod") in apiVersion
// with an items list, empty or not: anything else (an empty body, a
// Status, another kind, from a proxy or a gateway in front of the
// server) is an error, never an empty list. Items without apiVersion and
// kind take them from the list's kind.
func (r *Result) DecodeListPage(source string, in io.Reader, apiVersion, kind string) (cont string, err error) {
	x := r.decoder()
	s := newScanner(in)
	x.cont, x.top = "", topDoc{}
	want := apiVersion + " " + kind + "List"
	if _, ok, err := s.ws(); err != nil || !ok {
		if err == nil {
			err = errors.New("empty response")
		}
		return "", fmt.Errorf("%s: %w, want a %s", source, err, want)
	}
	name := source + "#1"
	if err := x.document(s, name, header{}, func(o *Object) { r.Add(o) }); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	if _, more, err := s.ws(); err != nil || more {
		if err == nil {
			err = errors.New("more than one JSON value")
		}
		return "", fmt.Errorf("%s: %w, want one %s", source, err, want)
	}
	switch t := x.top; {
	case t.apiVersion != apiVersion || t.kind != kind+"List":
		got := "a " + strings.TrimSpace(t.apiVersion+" "+t.kind)
		if t.apiVersion == "" && t.kind == "" {
			got = "an object without apiVersion and kind"
		}
		return "", fmt.Errorf("%s: the response is %s, want a %s", source, got, want)
	case !t.list:
		return "", fmt.Errorf("%s: the response is a %s without items", source, want)
	}
	return x.cont, nil
}

func (r *Result) decodeJSON(source string, in io.Reader) (string, error) {
	x := r.decoder()
	s := newScanner(in)
	x.cont = ""
	for doc := 1; ; doc++ {
		_, ok, err := s.ws()
		if err != nil {
			return "", fmt.Errorf("%s: %w", source, err)
		}
		if !ok {
			return x.cont, nil
		}
		name := fmt.Sprintf("%s#%d", source, doc)
		if err := x.document(s, name, header{}, func(o *Object) { r.Add(o) }); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
	}
}

// DecodeJSONBytes decodes one JSON value already in memory (a YAML
// document converted to JSON), named source. Its error does not repeat
// source.
func (r *Result) DecodeJSONBytes(source string, js []byte) error {
	x := r.decoder()
	s := newBytesScanner(js)
	if err := x.document(s, source, jsonAhead(js), func(o *Object) { r.Add(o) }); err != nil {
		return err
	}
	if _, more, err := s.ws(); err != nil || more {
		return s.errorf("data after the JSON value")
	}
	return nil
}

// DecodeJSONValue decodes one JSON value read from in, as DecodeJSONBytes
// decodes one in memory, but as it streams: head is the same value with
// its items left out or cut short, from which the apiVersion and kind of
// a List are read ahead when they follow its items (sorted keys put them
// there), as DecodeJSONBytes reads them ahead of the whole value. Nothing
// is added to r unless the whole value decoded: after an error r is as it
// was, so that the caller may read the value another way (package
// manifest converts a YAML List a few items at a time, and converts it
// whole when a piece does not convert). Its error does not repeat source.
func (r *Result) DecodeJSONValue(source string, in io.Reader, head []byte) error {
	x := r.decoder()
	s := newScanner(in)
	var objs []*Object
	if err := x.document(s, source, jsonAhead(head), func(o *Object) { objs = append(objs, o) }); err != nil {
		return err
	}
	if _, more, err := s.ws(); err != nil || more {
		return s.errorf("data after the JSON value")
	}
	for _, o := range objs {
		r.Add(o)
	}
	return nil
}

// DecodeUnstructured reads one object, or a List, held as the maps of
// client-go's unstructured objects (u.Object): what the dynamic client and
// informers give.
func (r *Result) DecodeUnstructured(source string, obj map[string]any) error {
	x := r.decoder()
	if err := x.document(newTree(obj), source, treeAhead(obj), func(o *Object) { r.Add(o) }); err != nil {
		return fmt.Errorf("%s: %w", source, err)
	}
	return nil
}

// Unstructured decodes one object held as an unstructured map (an
// informer's), with the same rules as files. It fails only when obj is a
// List (informers never hold one).
func Unstructured(source string, obj map[string]any) (*Object, error) {
	x := newDecoder()
	var out []*Object
	if err := x.document(newTree(obj), source, treeAhead(obj), func(o *Object) { out = append(out, o) }); err != nil {
		return nil, err
	}
	if len(out) != 1 {
		return nil, fmt.Errorf("%s: want one object, got a list of %d", source, len(out))
	}
	return out[0], nil
}

// treeAhead is jsonAhead for an unstructured map, whose members the
// decoder reads in name order (items before kind).
func treeAhead(obj map[string]any) header {
	kind, ok := obj["kind"]
	if !ok {
		return header{}
	}
	return listAhead(obj["apiVersion"], kind, 1)
}

// source is where o came from, as Source says or as decoding found.
func (o *Object) source() string {
	if o.Source != "" {
		return o.Source
	}
	return o.loc.String()
}
