package agent

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// Policies arrive from dynamic informers as JSON-shaped maps and are decoded
// here, strictly: a typed informer would silently drop fields this agent's
// types do not have, and the compiler could then not fail closed on them
// (DESIGN §3, NPEP-187). The informers store the decoded form, so a policy
// is decoded once per change, not once per sync.

// decodedNP is a NetworkPolicy as the informer cache stores it.
type decodedNP struct {
	policy.NetworkPolicy
	// Undecodable lists the parts that could not be decoded at all (wrong
	// JSON types): they are enforced fail-closed like unknown fields, but
	// reported as invalid.
	Undecodable []string
}

// decodedCNP is a ClusterNetworkPolicy as the informer cache stores it.
type decodedCNP struct {
	policy.ClusterNetworkPolicy
	Undecodable []string
	// Gated lists fields that this agent knows but that a disabled feature
	// gate turned into unknown ones.
	Gated []string
}

// DeepCopyObject keeps the decoding results with the copy (the embedded
// type's method would drop them).
func (d *decodedNP) DeepCopyObject() runtime.Object {
	out := &decodedNP{NetworkPolicy: d.NetworkPolicy, Undecodable: append([]string(nil), d.Undecodable...)}
	out.NetworkPolicy.NetworkPolicy = d.NetworkPolicy.NetworkPolicy.DeepCopy()
	out.UnknownFields = append([]string(nil), d.UnknownFields...)
	return out
}

// DeepCopyObject: see decodedNP.DeepCopyObject.
func (d *decodedCNP) DeepCopyObject() runtime.Object {
	out := &decodedCNP{ClusterNetworkPolicy: d.ClusterNetworkPolicy, Undecodable: append([]string(nil), d.Undecodable...), Gated: append([]string(nil), d.Gated...)}
	out.ClusterNetworkPolicy.ClusterNetworkPolicy = d.ClusterNetworkPolicy.ClusterNetworkPolicy.DeepCopy()
	out.UnknownFields = append([]string(nil), d.UnknownFields...)
	return out
}

// decodeNP turns an unstructured NetworkPolicy into the compiler's form,
// keeping of the metadata only what the agent uses (no managedFields or
// annotations such as kubectl's last-applied-configuration). It never
// fails: what cannot be decoded is recorded and fails closed.
func decodeNP(u *unstructured.Unstructured) *decodedNP {
	np := &networkingv1.NetworkPolicy{}
	unknown, bad := decodeStrict(u.Object, np)
	restoreMeta(u, &np.ObjectMeta)
	np.ObjectMeta = slimMeta(&np.ObjectMeta)
	if slices.Contains(bad, "spec") {
		// Which pods it selects is unknown: the whole namespace.
		bad = append(bad, "spec.podSelector")
	}
	return &decodedNP{
		NetworkPolicy: policy.NetworkPolicy{NetworkPolicy: np, UnknownFields: append(unknown, bad...), Source: "api"},
		Undecodable:   bad,
	}
}

// decodeCNP turns an unstructured ClusterNetworkPolicy into the compiler's
// form. With ingressPeers false (feature gate off), ingress `networks` and
// `nodes` peers are treated as fields this agent does not know.
func decodeCNP(u *unstructured.Unstructured, ingressPeers bool) *decodedCNP {
	cnp := &v1alpha2.ClusterNetworkPolicy{}
	unknown, bad := decodeStrict(u.Object, cnp)
	restoreMeta(u, &cnp.ObjectMeta)
	cnp.ObjectMeta = slimMeta(&cnp.ObjectMeta)
	if slices.Contains(bad, "spec") {
		// Which pods it selects is unknown: every pod.
		bad = append(bad, "spec.subject")
	}
	var gated []string
	if !ingressPeers {
		for i := range cnp.Spec.Ingress {
			for j := range cnp.Spec.Ingress[i].From {
				p := &cnp.Spec.Ingress[i].From[j]
				if p.Networks != nil {
					gated = append(gated, fmt.Sprintf("spec.ingress[%d].from[%d].networks", i, j))
					p.Networks = nil
				}
				if p.Nodes != nil {
					gated = append(gated, fmt.Sprintf("spec.ingress[%d].from[%d].nodes", i, j))
					p.Nodes = nil
				}
			}
		}
	}
	all := append(append(unknown, bad...), gated...)
	return &decodedCNP{
		ClusterNetworkPolicy: policy.ClusterNetworkPolicy{ClusterNetworkPolicy: cnp, UnknownFields: all, Source: "api"},
		Undecodable:          bad,
		Gated:                gated,
	}
}

// restoreMeta makes sure the identity of the object is the one the
// informer knows, even when its metadata did not decode, so the policy can
// still be enforced fail-closed and reported under its name.
func restoreMeta(u *unstructured.Unstructured, m *metav1.ObjectMeta) {
	if m.Name == "" {
		m.Name, m.Namespace = u.GetName(), u.GetNamespace()
	}
	if m.UID == "" {
		m.UID = u.GetUID()
	}
	if m.ResourceVersion == "" {
		m.ResourceVersion = u.GetResourceVersion()
	}
	if m.Generation == 0 {
		m.Generation = u.GetGeneration()
	}
}

// ruleLists are the spec fields that hold rules, in both policy kinds.
var ruleLists = map[string]bool{"ingress": true, "egress": true}

// decodeStrict decodes obj into into (a pointer to a policy type). unknown
// holds the paths of fields the type lacks; bad the paths of parts whose
// JSON types are wrong, which were left out. A rule that does not decode is
// replaced by an empty one and a rule list that is not a list by one empty
// rule, each named in bad, so that the compiler fails closed on exactly
// that rule (an Accept or NetworkPolicy rule matches nothing, a Deny or
// Pass rule denies everything) while indexes keep naming the same rules.
// A spec that is not an object at all becomes one empty rule per list.
func decodeStrict(obj map[string]any, into any) (unknown, bad []string) {
	js, err := json.Marshal(obj)
	if err == nil {
		var dup []string
		unknown, dup, err = manifest.StrictDecode(js, into)
		if err == nil {
			return append(unknown, dup...), nil
		}
	}
	// Something has the wrong type. Find which parts of spec decode on
	// their own and keep only those.
	typ := reflect.TypeOf(into).Elem()
	fits := func(specValue map[string]any) bool {
		js, err := json.Marshal(map[string]any{"spec": specValue})
		if err != nil {
			return false
		}
		_, _, err = manifest.StrictDecode(js, reflect.New(typ).Interface())
		return err == nil
	}
	kept := map[string]any{}
	if md, ok := obj["metadata"].(map[string]any); ok {
		kept["metadata"] = md
	}
	spec, ok := obj["spec"].(map[string]any)
	if !ok {
		if obj["spec"] != nil {
			bad = append(bad, "spec")
		}
		spec = map[string]any{}
		for k := range ruleLists {
			spec[k] = "placeholder"
		}
	}
	keptSpec := map[string]any{}
	keys := make([]string, 0, len(spec))
	for k := range spec {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := spec[k]
		if fits(map[string]any{k: v}) {
			keptSpec[k] = v
			continue
		}
		list, isList := v.([]any)
		switch {
		case isList && ruleLists[k]:
			out := make([]any, len(list))
			for i, e := range list {
				if fits(map[string]any{k: []any{e}}) {
					out[i] = e
				} else {
					out[i] = map[string]any{}
					bad = append(bad, fmt.Sprintf("spec.%s[%d]", k, i))
				}
			}
			keptSpec[k] = out
		case ruleLists[k]:
			keptSpec[k] = []any{map[string]any{}}
			bad = append(bad, fmt.Sprintf("spec.%s[0]", k))
		default:
			bad = append(bad, "spec."+k)
		}
	}
	kept["spec"] = keptSpec
	reflect.ValueOf(into).Elem().SetZero()
	js, err = json.Marshal(kept)
	if err == nil {
		unknown, _, err = manifest.StrictDecode(js, into)
	}
	if err != nil {
		// Metadata itself is broken: the caller restores the identity.
		reflect.ValueOf(into).Elem().SetZero()
		delete(kept, "metadata")
		js, _ = json.Marshal(kept)
		if unknown, _, err = manifest.StrictDecode(js, into); err != nil {
			// Cannot happen: every kept part decoded on its own.
			bad = append(bad, "spec")
		}
	}
	return unknown, bad
}
