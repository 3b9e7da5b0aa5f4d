package manifest

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	sigsjson "sigs.k8s.io/json"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/policy"
)

// unsupportedPolicyKinds are policy kinds users may expect Moat to read;
// they get a warning rather than a silent skip.
var unsupportedPolicyKinds = map[string]bool{"AdminNetworkPolicy": true, "BaselineAdminNetworkPolicy": true}

// defaultNamespace is where namespaced objects without metadata.namespace
// land, as with kubectl.
const defaultNamespace = "default"

type decoder struct {
	res  Result
	seen map[string]string
}

func newDecoder() *decoder { return &decoder{seen: map[string]string{}} }

func (d *decoder) result() *Result { return &d.res }

// header is what every document must have before its kind can be known.
// Fields are decoded loosely so that a wrongly typed field becomes a
// diagnostic naming it, not a failure of the whole file.
type header struct {
	APIVersion, Kind, Name, Namespace string
	Items                             []json.RawMessage
	isList                            bool
}

func parseHeader(js []byte) (header, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return header{}, fmt.Errorf("not a Kubernetes object (want a mapping with apiVersion and kind): %w", err)
	}
	var h header
	str := func(m map[string]json.RawMessage, key string) string {
		var s string
		if v, ok := m[key]; ok {
			if json.Unmarshal(v, &s) != nil {
				s = strings.Trim(string(v), `"`)
			}
		}
		return s
	}
	h.APIVersion, h.Kind = str(raw, "apiVersion"), str(raw, "kind")
	var md map[string]json.RawMessage
	if v, ok := raw["metadata"]; ok {
		_ = json.Unmarshal(v, &md)
	}
	h.Name, h.Namespace = str(md, "name"), str(md, "namespace")
	if v, ok := raw["items"]; ok {
		h.isList = true
		if err := json.Unmarshal(v, &h.Items); err != nil {
			return h, fmt.Errorf("%s: items: must be a list: %w", h.Kind, err)
		}
	}
	return h, nil
}

// drop reports an object that could not be loaded at all.
func (d *decoder) drop(object, field, source, msg string) {
	d.add(policy.SeverityError, object, field, source, msg+": object not loaded")
	d.res.Dropped = append(d.res.Dropped, object)
}

func (d *decoder) addAll(source string, diags []policy.Diagnostic) {
	for _, x := range diags {
		x.Source = source
		d.res.Diagnostics = append(d.res.Diagnostics, x)
	}
}

func (d *decoder) add(sev policy.Severity, object, field, source, msg string) {
	d.res.Diagnostics = append(d.res.Diagnostics, policy.Diagnostic{Severity: sev, Object: object, Field: field, Source: source, Message: msg})
}

// decodeObject decodes one JSON document. Only a document that is not a
// JSON object at all is an error; everything else is a diagnostic.
func (d *decoder) decodeObject(source string, js []byte) error {
	tm, err := parseHeader(js)
	if err != nil {
		return err
	}
	if tm.Kind == "" {
		d.drop("<unknown kind>", "kind", source, "missing kind")
		return nil
	}
	if strings.HasSuffix(tm.Kind, "List") && tm.isList {
		for i, item := range tm.Items {
			if err := d.decodeObject(fmt.Sprintf("%s items[%d]", source, i), item); err != nil {
				return fmt.Errorf("items[%d]: %w", i, err)
			}
		}
		return nil
	}
	ns := tm.Namespace
	if ns == "" {
		ns = defaultNamespace
	}
	want := map[string]string{
		"Namespace":            "v1",
		"Pod":                  "v1",
		"Node":                 "v1",
		"NetworkPolicy":        "networking.k8s.io/v1",
		"ClusterNetworkPolicy": "policy.networking.k8s.io/v1alpha2",
	}
	wantVersion, known := want[tm.Kind]
	object := tm.Kind + " " + tm.Name
	switch tm.Kind {
	case "Pod", "NetworkPolicy":
		object = tm.Kind + " " + ns + "/" + tm.Name
	}
	if !known {
		if unsupportedPolicyKinds[tm.Kind] {
			d.add(policy.SeverityWarning, object, "kind", source, "policy kind not enforced by Moat (use ClusterNetworkPolicy, policy.networking.k8s.io/v1alpha2): ignored")
			return nil
		}
		d.res.Skipped = append(d.res.Skipped, fmt.Sprintf("%s %s (%s): kind not used by Moat", tm.Kind, tm.Name, source))
		return nil
	}
	if tm.APIVersion != wantVersion {
		d.drop(object, "apiVersion", source, fmt.Sprintf("unsupported apiVersion %q for kind %s (want %q)", tm.APIVersion, tm.Kind, wantVersion))
		return nil
	}
	key := object
	if prev, dup := d.seen[key]; dup {
		// Which copy a cluster would hold depends on how it was applied;
		// judging traffic with either could be wrong.
		d.drop(object, "", source, "duplicate object, also defined at "+prev)
		return nil
	}
	d.seen[key] = source

	switch tm.Kind {
	case "Namespace":
		var o corev1.Namespace
		if !d.unmarshal(object, source, js, &o) {
			return nil
		}
		d.res.Cluster.Namespaces = append(d.res.Cluster.Namespaces, policy.NamespaceFromAPI(&o))
	case "Pod":
		var o corev1.Pod
		if !d.unmarshal(object, source, js, &o) {
			return nil
		}
		if o.Namespace == "" {
			o.Namespace = defaultNamespace
		}
		if o.Status.Phase == corev1.PodSucceeded || o.Status.Phase == corev1.PodFailed {
			// As the agent: a finished pod's address may already be reused.
			d.res.Skipped = append(d.res.Skipped, fmt.Sprintf("%s (%s): phase %s", object, source, o.Status.Phase))
			return nil
		}
		pod, diags := policy.PodFromAPI(&o)
		d.addAll(source, diags)
		d.res.Cluster.Pods = append(d.res.Cluster.Pods, pod)
	case "Node":
		var o corev1.Node
		if !d.unmarshal(object, source, js, &o) {
			return nil
		}
		node, diags := policy.NodeFromAPI(&o)
		d.addAll(source, diags)
		d.res.Cluster.Nodes = append(d.res.Cluster.Nodes, node)
	case "NetworkPolicy":
		var o networkingv1.NetworkPolicy
		unknown, ok := d.strict(object, source, js, &o)
		if !ok {
			return nil
		}
		if o.Namespace == "" {
			o.Namespace = defaultNamespace
		}
		d.res.Cluster.NetworkPolicies = append(d.res.Cluster.NetworkPolicies, policy.NetworkPolicy{NetworkPolicy: &o, UnknownFields: unknown, Source: source})
	case "ClusterNetworkPolicy":
		var o v1alpha2.ClusterNetworkPolicy
		unknown, ok := d.strict(object, source, js, &o)
		if !ok {
			return nil
		}
		d.res.Cluster.ClusterNetworkPolicies = append(d.res.Cluster.ClusterNetworkPolicies, policy.ClusterNetworkPolicy{ClusterNetworkPolicy: &o, UnknownFields: unknown, Source: source})
	}
	return nil
}

// unmarshal decodes leniently (inventory objects: Pods, Nodes, Namespaces
// carry many fields Moat does not need).
func (d *decoder) unmarshal(object, source string, js []byte, into any) bool {
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(js, into); err != nil {
		d.drop(object, "", source, fmt.Sprintf("cannot decode: %v", err))
		return false
	}
	return true
}

// strict decodes a policy and returns the paths of unknown and duplicate
// fields, reporting duplicates here. Unknown fields are reported by the
// compiler, which owns what they do to enforcement.
func (d *decoder) strict(object, source string, js []byte, into any) ([]string, bool) {
	unknown, duplicate, err := StrictDecode(js, into)
	if err != nil {
		d.drop(object, "", source, fmt.Sprintf("cannot decode: %v", err))
		return nil, false
	}
	for _, p := range duplicate {
		d.add(policy.SeverityError, object, p, source, "duplicate field (the part it belongs to is enforced fail-closed)")
	}
	return append(unknown, duplicate...), true
}

// StrictDecode decodes a JSON object into a policy type and returns the
// field paths (e.g. "spec.ingress[0].from[1].serviceAccounts") of fields
// the type does not have and of fields given twice, leaving out metadata
// and status. Every source of policies (files, informers) decodes through
// it, so an object written for a newer API is enforced fail-closed instead
// of losing its unknown parts silently (NPEP-187, network-policy-api #340).
// err is set only when the object cannot be decoded at all.
func StrictDecode(js []byte, into any) (unknown, duplicate []string, err error) {
	strictErrs, err := sigsjson.UnmarshalStrict(js, into, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range strictErrs {
		msg := e.Error()
		for prefix, list := range map[string]*[]string{"unknown field ": &unknown, "duplicate field ": &duplicate} {
			if !strings.HasPrefix(msg, prefix) {
				continue
			}
			path := strings.Trim(strings.TrimPrefix(msg, prefix), `"`)
			if strings.HasPrefix(path, "metadata.") || strings.HasPrefix(path, "status.") {
				continue
			}
			*list = append(*list, path)
		}
	}
	return unknown, duplicate, nil
}
