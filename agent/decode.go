package agent

import (
	"maps"
	"slices"
	"unique"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/decode"
	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/policy"
)

// Policies arrive from dynamic informers as JSON-shaped maps and are decoded
// here by package decode, the decoder files go through too: a typed
// informer would silently drop fields this agent's types do not have, and
// the compiler could then not fail closed on them (docs/semantics.md,
// NPEP-187). The informers store the decoded form, so a policy is decoded
// once per change, not once per sync.

// decodedNP is a NetworkPolicy as the informer cache stores it.
type decodedNP struct {
	policy.NetworkPolicy
	// labels keeps its podSelector's shared matchLabels map alive (the
	// shared peer selectors keep theirs: selectors.go); nil when not
	// shared. One pointer rather than a list of every selector's set:
	// 24 bytes of the struct and a small list less per policy, which
	// took the struct from 240 to 224 bytes with the Go allocator's
	// size classes.
	labels *labelSet
	// keys are the label keys its selectors read (labelkeys.go), found
	// once when it is decoded; policies reading the same keys share them.
	keys keyList
	// ns keeps the canonical copy of its namespace's name alive, which
	// Namespace points into: without a handle unique forgets it at the
	// next collection, and the next policy of the namespace would get a
	// copy of its own (8 bytes; the struct stays in the 224-byte class).
	ns unique.Handle[string]
}

// decodedCNP is a ClusterNetworkPolicy as the informer cache stores it.
type decodedCNP struct {
	policy.ClusterNetworkPolicy
	labels []*labelSet
	keys   keyList
}

// readKeys are the label keys a cached policy's selectors read.
func (d *decodedNP) readKeys() keyList  { return d.keys }
func (d *decodedCNP) readKeys() keyList { return d.keys }

// GetObjectMeta gives the informer the policy's identity (cache keys,
// resource versions).
func (d *decodedNP) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: d.Namespace, Name: d.Name, UID: d.UID, ResourceVersion: d.ResourceVersion, Generation: d.Generation}
}

// DeepCopyObject keeps the decoding results with the copy (the embedded
// type's method would drop them).
func (d *decodedCNP) DeepCopyObject() runtime.Object {
	out := &decodedCNP{ClusterNetworkPolicy: d.ClusterNetworkPolicy, keys: d.keys}
	out.ClusterNetworkPolicy.ClusterNetworkPolicy = d.ClusterNetworkPolicy.ClusterNetworkPolicy.DeepCopy()
	out.UnknownFields = slices.Clone(d.UnknownFields)
	out.Invalid = copyErrors(d.Invalid)
	return out
}

func copyErrors(errs field.ErrorList) field.ErrorList {
	if errs == nil {
		return nil
	}
	out := make(field.ErrorList, len(errs))
	for i, e := range errs {
		c := *e
		out[i] = &c
	}
	return out
}

// decodeNP and decodeCNP decode without sharing selectors.
func decodeNP(u *unstructured.Unstructured) *decodedNP   { return (*labelSets)(nil).decodeNP(u) }
func decodeCNP(u *unstructured.Unstructured) *decodedCNP { return (*labelSets)(nil).decodeCNP(u) }

// decodeNP turns an unstructured NetworkPolicy into the compiler's form,
// its selectors shared with equal ones through t (nil: not shared). It
// never fails: what cannot be decoded is recorded and fails closed.
func (t *labelSets) decodeNP(u *unstructured.Unstructured) *decodedNP {
	o := decodeObject(u, "NetworkPolicy", networkingv1.SchemeGroupVersion.String())
	d := &decodedNP{NetworkPolicy: *o.NetworkPolicy}
	// A namespace's name is repeated by each of its policies.
	d.ns = unique.Make(d.Namespace)
	d.Namespace = d.ns.Value()
	if d.labels = t.internPodSelector(&d.Spec.PodSelector); d.labels != nil {
		d.Spec.PodSelector.MatchLabels = d.labels.v
	}
	t.sharePeerSelectors(&d.Spec)
	t.sharePorts(&d.Spec)
	d.keys = makeKeyList(selectorKeys(&d.Spec))
	return d
}

// decodeCNP turns an unstructured ClusterNetworkPolicy into the compiler's
// form, as decodeNP does. Feature gates (IngressNetworksAndNodes) apply
// when it is compiled.
func (t *labelSets) decodeCNP(u *unstructured.Unstructured) *decodedCNP {
	o := decodeObject(u, "ClusterNetworkPolicy", v1alpha2.SchemeGroupVersion.String())
	d := &decodedCNP{ClusterNetworkPolicy: *o.ClusterNetworkPolicy}
	d.labels = t.internSelectors(cnpSelectors(d.ClusterNetworkPolicy.ClusterNetworkPolicy))
	d.keys = makeKeyList(selectorKeys(d.ClusterNetworkPolicy.ClusterNetworkPolicy))
	return d
}

// decodeObject decodes what an informer of kind holds; the result always
// holds a policy of that kind. Objects from the API server always carry
// their kind; the informer's is used otherwise.
func decodeObject(u *unstructured.Unstructured, kind, apiVersion string) *decode.Object {
	obj := u.Object
	if u.GetKind() == "" || u.GetAPIVersion() == "" {
		obj = maps.Clone(obj)
		obj["kind"], obj["apiVersion"] = kind, apiVersion
	}
	o, err := decode.Unstructured("api", obj)
	if err == nil && (o.NetworkPolicy != nil && kind == "NetworkPolicy" || o.ClusterNetworkPolicy != nil && kind == "ClusterNetworkPolicy") {
		return o
	}
	// Something the API server would not have accepted (metadata that
	// cannot be read): identify the object as the informer does, and
	// enforce it fail-closed rather than leave it out.
	why := "cannot decode the object"
	switch {
	case err != nil:
		why = err.Error()
	case len(o.Diagnostics) > 0:
		why = o.Diagnostics[0].Field + ": " + o.Diagnostics[0].Message
	}
	meta := metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace(), UID: u.GetUID(), ResourceVersion: u.GetResourceVersion(), Generation: u.GetGeneration()}
	return decode.Broken(kind, meta, "api", why)
}

// undecodable lists the parts of a policy that decoding could not read
// (wrong JSON types): they are enforced fail-closed, and the agent reports
// them as an input problem.
func undecodable(invalid field.ErrorList) []string {
	var out []string
	for _, e := range invalid {
		if e.Type == field.ErrorTypeTypeInvalid || e.Type == field.ErrorTypeDuplicate {
			out = append(out, e.Field)
		}
	}
	return out
}

// policyOptions are the compiler options this agent's configuration asks
// for: its feature gates decide how decoded policies are enforced.
func (a *Agent) policyOptions() policy.Options {
	return policy.Options{
		DenyNodeLocal:           !a.cfg.AllowNodeLocal,
		IngressNetworksAndNodes: a.cfg.Features.Enabled(features.IngressNetworksAndNodes),
	}
}
