package decode

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	networkingv1beta1 "k8s.io/api/networking/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/policy"
)

// start picks the body decoder for an object's apiVersion and kind.
func (x *decoder) start(h header) body {
	switch {
	case h.bad != "":
		field, msg, _ := strings.Cut(h.bad, ": ")
		return &otherBody{kind: h.kind, drop: true, field: field, msg: msg}
	case !h.haveKind && !h.haveVersion && len(x.items) > 0:
		return &otherBody{kind: "<no kind>", drop: true, field: "kind", msg: "missing apiVersion and kind (only the items of a typed List, such as NetworkPolicyList, may leave them out)"}
	case !h.haveKind && !h.haveVersion:
		return &otherBody{kind: "<no kind>", drop: true, msg: notAnObjectMessage(x.doc)}
	case !h.haveKind || h.kind == "":
		return &otherBody{kind: "<no kind>", drop: true, field: "kind", msg: "missing kind"}
	case strings.HasSuffix(h.kind, "List"):
		return &listBody{kind: h.kind}
	}
	want, read := readKinds[h.kind]
	if !read {
		group := groupOf(h.apiVersion)
		switch {
		case group == policyGroup && unsupportedPolicyKinds[h.kind]:
			return &otherBody{kind: h.kind, group: group, warn: "policy kind not enforced by Moat (use ClusterNetworkPolicy, policy.networking.k8s.io/v1alpha2): none of its rules is applied"}
		case readsGroup(group) && !knownKind(group, h.kind):
			return &otherBody{kind: h.kind, drop: true, field: "kind", msg: unknownKindMessage(h)}
		}
		return &otherBody{kind: h.kind, group: group}
	}
	if h.apiVersion != want {
		if group := groupOf(h.apiVersion); !kubernetesGroup(group) {
			// Another project's kind of the same name (Calico's and
			// Antrea's NetworkPolicy): another API, enforced by its own
			// controller, not a version of the one Moat reads.
			return &otherBody{kind: h.kind, group: group, skip: fmt.Sprintf("kind of API group %s, not the Kubernetes %s Moat reads (%s)", group, h.kind, want)}
		}
		return &otherBody{kind: h.kind, drop: true, field: "apiVersion", msg: fmt.Sprintf("unsupported apiVersion %q for kind %s (want %q)", h.apiVersion, h.kind, want)}
	}
	switch h.kind {
	case "Pod":
		x.pod = podBody{}
		return &x.pod
	case "Node":
		x.node = nodeBody{}
		return &x.node
	case "Namespace":
		x.ns = namespaceBody{}
		return &x.ns
	case "NetworkPolicy":
		return &npBody{}
	}
	return &cnpBody{}
}

const policyGroup = "policy.networking.k8s.io"

// unsupportedPolicyKinds are policy kinds users may expect Moat to read;
// they get a warning rather than a silent skip.
var unsupportedPolicyKinds = map[string]bool{"AdminNetworkPolicy": true, "BaselineAdminNetworkPolicy": true}

func groupOf(apiVersion string) string {
	g, _, found := strings.Cut(apiVersion, "/")
	if !found {
		return "" // "v1": the core group
	}
	return g
}

// kubernetesGroup reports whether group is one of Kubernetes' own API
// groups (core, the legacy groups without a domain, *.k8s.io): there, a kind Moat reads in another
// version (networking.k8s.io/v1beta1, extensions/v1beta1 NetworkPolicy)
// is a version Moat cannot read, an error; in any other group it is
// another project's kind that only shares the name.
func kubernetesGroup(group string) bool {
	switch group {
	case "", "apps", "autoscaling", "batch", "extensions", "policy", "k8s.io":
		return true
	}
	return strings.HasSuffix(group, ".k8s.io")
}

// readsGroup reports whether Moat reads kinds of group: there, a kind it
// does not know is most likely a misspelling of one it reads, and leaving
// the object out could widen access.
func readsGroup(group string) bool {
	return group == "" || group == "networking.k8s.io" || group == policyGroup
}

var (
	kindsOnce sync.Once
	kinds     map[string]bool // "group/Kind" of every kind the API defines in the groups Moat reads
)

// knownKind reports whether group defines kind (in any version): the core
// and networking.k8s.io kinds of k8s.io/api, and the network-policy-api
// kinds.
func knownKind(group, kind string) bool {
	kindsOnce.Do(func() {
		kinds = map[string]bool{
			policyGroup + "/ClusterNetworkPolicy": true, policyGroup + "/AdminNetworkPolicy": true, policyGroup + "/BaselineAdminNetworkPolicy": true,
		}
		s := runtime.NewScheme()
		for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, networkingv1.AddToScheme, networkingv1beta1.AddToScheme} {
			if err := add(s); err != nil {
				panic(err) // static registration
			}
		}
		for gvk := range s.AllKnownTypes() {
			kinds[gvk.Group+"/"+gvk.Kind] = true
		}
	})
	return kinds[group+"/"+kind]
}

func unknownKindMessage(h header) string {
	msg := fmt.Sprintf("unknown kind %q in apiVersion %q", h.kind, h.apiVersion)
	for k := range readKinds {
		if strings.EqualFold(k, h.kind) || strings.EqualFold(k+"s", h.kind) || strings.EqualFold(strings.TrimSuffix(k, "y")+"ies", h.kind) {
			return msg + fmt.Sprintf(" (did you mean %s?)", k)
		}
	}
	return msg + " (Moat reads Namespace, Pod, Node, NetworkPolicy and ClusterNetworkPolicy)"
}

// ref names an object as diagnostics do.
func ref(kind string, m *metav1.ObjectMeta) string {
	switch kind {
	case "Pod", "NetworkPolicy":
		ns := m.Namespace
		if ns == "" {
			ns = defaultNamespace
		}
		return kind + " " + ns + "/" + nameOrNone(m.Name)
	}
	return kind + " " + nameOrNone(m.Name)
}

// nameOrNone shows a missing name as such, not as nothing
// ("Namespace : metadata.labels...").
func nameOrNone(name string) string {
	if name == "" {
		return "<no name>"
	}
	return name
}

// notAnObjectMessage is the error for a document with neither apiVersion
// nor kind: a file of something else in a directory of manifests (a CI
// workflow, a kustomization that was not rendered). doc is the document's
// name, "file#n".
func notAnObjectMessage(doc string) string {
	file, _, _ := strings.Cut(doc, "#")
	if base := path.Base(file); base == "kustomization.yaml" || base == "kustomization.yml" || base == "Kustomization" {
		return "not a Kubernetes object (no apiVersion or kind): a kustomization; render it first (kustomize build, kubectl kustomize) and pass the output"
	}
	return "not a Kubernetes object (no apiVersion or kind)"
}

func (o *Object) diag(sev policy.Severity, fieldPath, msg string) {
	o.Diagnostics = append(o.Diagnostics, policy.Diagnostic{Severity: sev, Object: o.Ref, Field: fieldPath, Message: msg, Source: o.Source})
}

func (o *Object) drop(fieldPath, msg string) {
	o.diag(policy.SeverityError, fieldPath, msg+": object not loaded")
	o.Dropped = true
}

// identity is the metadata every body reads, and whether it could be
// read.
type identity struct {
	meta    metav1.ObjectMeta
	bad     []problem
	hasMeta bool
}

func (id *identity) read(d *dec, labels bool) error {
	m := d.mark()
	if id.hasMeta && d.strict {
		d.problems = append(d.problems, problem{path: "metadata", msg: "duplicate field", dup: true})
	}
	id.hasMeta = true
	d.push("metadata")
	err := d.meta(&id.meta, labels)
	d.pop()
	id.bad = append(id.bad, d.since(m)...)
	d.problems = d.problems[:m]
	return err
}

// check drops an object whose identity is unknown; it returns false then.
func (id *identity) check(o *Object) bool {
	switch {
	case len(id.bad) > 0:
		o.drop(id.bad[0].path, "cannot decode: "+id.bad[0].msg)
	case id.meta.Name == "":
		o.drop("metadata.name", "Required value")
	default:
		return true
	}
	return false
}

// otherBody reads only the identity of objects Moat does not read.
type otherBody struct {
	kind, group string // group only for kinds skipped or warned about
	id          identity
	drop        bool
	field, msg  string
	warn        string
	skip        string // why it is skipped, when not "kind not used by Moat"
}

func (b *otherBody) member(d *dec, key []byte) error {
	if string(key) == "metadata" {
		return b.id.read(d, false)
	}
	return d.src.skip()
}

func (b *otherBody) finish(d *dec, o *Object) {
	o.Ref = ref(b.kind, &b.id.meta)
	switch {
	case b.drop:
		o.drop(b.field, b.msg)
	case b.id.meta.Namespace != "" && !clusterScoped[b.group+"/"+b.kind] && !d.inPlace(&b.id.meta, o):
		// kubectl apply -n refuses every namespaced object of another
		// namespace, whatever Moat makes of its kind. The scope of a kind
		// Moat does not know (a custom resource) is the API server's to
		// say: it is taken for namespaced, as nearly all are.
	case b.warn != "":
		o.diag(policy.SeverityWarning, "kind", b.warn)
		o.Skipped = b.warn
	case b.skip != "":
		o.Skipped = b.skip
	default:
		o.Skipped = "kind not used by Moat"
	}
}

// clusterScoped holds, as "group/Kind", the built-in kinds that are
// cluster-scoped: kubectl apply -n ignores their metadata.namespace
// instead of refusing a mismatch.
var clusterScoped = map[string]bool{
	"/Namespace": true, "/Node": true, "/PersistentVolume": true, "/ComponentStatus": true,
	"rbac.authorization.k8s.io/ClusterRole": true, "rbac.authorization.k8s.io/ClusterRoleBinding": true,
	"apiextensions.k8s.io/CustomResourceDefinition": true,
	"apiregistration.k8s.io/APIService":             true,
	"storage.k8s.io/StorageClass":                   true, "storage.k8s.io/CSIDriver": true, "storage.k8s.io/CSINode": true,
	"storage.k8s.io/VolumeAttachment": true, "storage.k8s.io/VolumeAttributesClass": true,
	"scheduling.k8s.io/PriorityClass":                             true,
	"node.k8s.io/RuntimeClass":                                    true,
	"admissionregistration.k8s.io/ValidatingWebhookConfiguration": true, "admissionregistration.k8s.io/MutatingWebhookConfiguration": true,
	"admissionregistration.k8s.io/ValidatingAdmissionPolicy": true, "admissionregistration.k8s.io/ValidatingAdmissionPolicyBinding": true,
	"admissionregistration.k8s.io/MutatingAdmissionPolicy": true, "admissionregistration.k8s.io/MutatingAdmissionPolicyBinding": true,
	"networking.k8s.io/IngressClass": true, "networking.k8s.io/IPAddress": true, "networking.k8s.io/ServiceCIDR": true,
	"certificates.k8s.io/CertificateSigningRequest": true, "certificates.k8s.io/ClusterTrustBundle": true,
	"flowcontrol.apiserver.k8s.io/FlowSchema": true, "flowcontrol.apiserver.k8s.io/PriorityLevelConfiguration": true,
	"resource.k8s.io/DeviceClass": true, "resource.k8s.io/ResourceSlice": true,
	"internal.apiserver.k8s.io/StorageVersion": true,
	"authentication.k8s.io/TokenReview":        true, "authentication.k8s.io/SelfSubjectReview": true,
	"authorization.k8s.io/SubjectAccessReview": true, "authorization.k8s.io/SelfSubjectAccessReview": true, "authorization.k8s.io/SelfSubjectRulesReview": true,
	policyGroup + "/ClusterNetworkPolicy": true, policyGroup + "/AdminNetworkPolicy": true, policyGroup + "/BaselineAdminNetworkPolicy": true,
}

// listBody is a List whose items were read, or are still to come.
type listBody struct {
	kind string
	// cont is metadata.continue, for paginated lists.
	cont string
}

var listMetaSchema = schema{fields: []string{"continue"}}

func (b *listBody) member(d *dec, key []byte) error {
	switch string(key) {
	case "metadata":
		_, err := d.object(&listMetaSchema, func(int) error { return d.str(&b.cont) })
		return err
	case "items":
		k, err := d.src.peek()
		if err != nil {
			return err
		}
		return fmt.Errorf("%s: items: must be a list, found %s", b.kind, k)
	}
	return d.src.skip()
}

// finish is reached only for a List without items.
func (b *listBody) finish(_ *dec, o *Object) {
	o.Ref = b.kind
	o.Skipped = "empty list"
}

type podBody struct {
	pod corev1.Pod
	id  identity
}

func (b *podBody) member(d *dec, key []byte) error {
	switch i := podSchema.member(key); i {
	case 0:
		return b.id.read(d, true)
	case 1, 2:
		d.push(podSchema.fields[i])
		defer d.pop()
		return d.podMember(&b.pod, i)
	}
	return d.src.skip()
}

func (b *podBody) finish(d *dec, o *Object) {
	b.pod.ObjectMeta = b.id.meta
	d.place(&b.pod.ObjectMeta)
	o.Ref = ref("Pod", &b.pod.ObjectMeta)
	if !b.id.check(o) || !d.inPlace(&b.pod.ObjectMeta, o) {
		return
	}
	if len(d.problems) > 0 {
		o.drop(d.problems[0].path, "cannot decode: "+d.problems[0].msg)
		return
	}
	if p := b.pod.Status.Phase; p == corev1.PodSucceeded || p == corev1.PodFailed {
		// As the agent: a finished pod's address may already be reused.
		o.Skipped = "phase " + string(p)
		return
	}
	pod, diags := policy.PodFromAPI(&b.pod)
	o.Pod = &pod
	o.LastApplied = lastAppliedLabels(&b.pod.ObjectMeta)
	for _, x := range diags {
		x.Source = o.Source
		o.Diagnostics = append(o.Diagnostics, x)
	}
}

type nodeBody struct {
	node corev1.Node
	id   identity
}

func (b *nodeBody) member(d *dec, key []byte) error {
	switch i := nodeSchema.member(key); i {
	case 0:
		return b.id.read(d, true)
	case 1:
		d.push("status")
		defer d.pop()
		return d.nodeMember(&b.node, i)
	case 2:
		d.push("spec")
		defer d.pop()
		return d.nodeMember(&b.node, i)
	}
	return d.src.skip()
}

func (b *nodeBody) finish(d *dec, o *Object) {
	b.node.ObjectMeta = b.id.meta
	o.Ref = ref("Node", &b.node.ObjectMeta)
	if !b.id.check(o) {
		return
	}
	if len(d.problems) > 0 {
		o.drop(d.problems[0].path, "cannot decode: "+d.problems[0].msg)
		return
	}
	node, diags := policy.NodeFromAPI(&b.node)
	o.Node = &node
	o.LastApplied = lastAppliedLabels(&b.node.ObjectMeta)
	for _, x := range diags {
		x.Source = o.Source
		o.Diagnostics = append(o.Diagnostics, x)
	}
}

type namespaceBody struct {
	id identity
}

func (b *namespaceBody) member(d *dec, key []byte) error {
	if string(key) == "metadata" {
		return b.id.read(d, true)
	}
	return d.src.skip()
}

func (b *namespaceBody) finish(_ *dec, o *Object) {
	o.Ref = ref("Namespace", &b.id.meta)
	if !b.id.check(o) {
		return
	}
	ns := policy.NamespaceFromAPI(&corev1.Namespace{ObjectMeta: b.id.meta})
	o.Namespace = &ns
	o.LastApplied = lastAppliedLabels(&b.id.meta)
}

// policyBody holds what both policy kinds share: strict top-level members.
type policyBody struct {
	id      identity
	hasSpec bool
}

// topLevel handles a member that is neither metadata nor spec: apiVersion
// and kind never get here, status is read by the caller; anything else is
// unknown, and (outside spec) fails the whole policy closed.
func unknownTop(d *dec, key []byte) error {
	d.unknown = append(d.unknown, string(key))
	return d.src.skip()
}

type npBody struct {
	policyBody
	spec networkingv1.NetworkPolicySpec
}

func (b *npBody) member(d *dec, key []byte) error {
	switch string(key) {
	case "metadata":
		return b.id.read(d, false)
	case "spec":
		if b.hasSpec {
			d.problems = append(d.problems, problem{path: "spec", msg: "duplicate field", dup: true})
		}
		b.hasSpec = true
		d.push("spec")
		defer d.pop()
		return d.npSpec(&b.spec)
	}
	return unknownTop(d, key)
}

func (b *npBody) finish(d *dec, o *Object) {
	m := &b.id.meta
	guessed := d.place(m) && d.ns.name == ""
	o.Ref = ref("NetworkPolicy", m)
	if !b.id.check(o) || !d.inPlace(m, o) {
		return
	}
	if guessed {
		// Its namespace decides which pods it selects, and kubectl apply
		// would put it in its -n or context namespace, not necessarily
		// this one.
		o.diag(policy.SeverityWarning, "metadata.namespace", "not set: judged in namespace "+defaultNamespace+", but kubectl apply puts it in the namespace of -n or of the current context: give -n NAMESPACE (or read the cluster with --live) to judge it there")
	}
	d.foldTopLevel(func() {
		b.spec = networkingv1.NetworkPolicySpec{Ingress: make([]networkingv1.NetworkPolicyIngressRule, 1), Egress: make([]networkingv1.NetworkPolicyEgressRule, 1)}
		d.invalid = append(d.invalid, unreadable("spec.podSelector"), unreadable("spec.ingress[0]"), unreadable("spec.egress[0]"))
	})
	np := policy.NetworkPolicyFromAPI(&networkingv1.NetworkPolicy{ObjectMeta: *m, Spec: b.spec})
	np.SetDecoding(sortedUnique(d.unknown), sortErrors(d.invalid))
	np.Source = o.Source
	o.NetworkPolicy = np
}

// foldTopLevel turns problems left outside any part (a repeated spec)
// into a failure of the whole spec, replaced by broken().
func (d *dec) foldTopLevel(broken func()) {
	if len(d.problems) == 0 {
		return
	}
	for _, p := range d.problems {
		d.invalid = append(d.invalid, p.fieldError("the whole policy is enforced fail-closed"))
	}
	broken()
	d.problems = nil
}

type cnpBody struct {
	policyBody
	cnp v1alpha2.ClusterNetworkPolicy
}

func (b *cnpBody) member(d *dec, key []byte) error {
	switch string(key) {
	case "metadata":
		return b.id.read(d, false)
	case "spec":
		if b.hasSpec {
			d.problems = append(d.problems, problem{path: "spec", msg: "duplicate field", dup: true})
		}
		b.hasSpec = true
		d.push("spec")
		defer d.pop()
		return d.cnpSpec(&b.cnp.Spec)
	case "status":
		d.push("status")
		defer d.pop()
		return d.cnpStatus(&b.cnp.Status)
	}
	return unknownTop(d, key)
}

func (b *cnpBody) finish(d *dec, o *Object) {
	b.cnp.ObjectMeta = b.id.meta
	o.Ref = ref("ClusterNetworkPolicy", &b.cnp.ObjectMeta)
	if !b.id.check(o) {
		return
	}
	b.cnp.TypeMeta = metav1.TypeMeta{}
	if root := requiredSchema(&cnpRootSchema, ""); root.required&(1<<1) != 0 && !b.hasSpec {
		// The CRD requires spec: without it nothing is known.
		d.brokenCNPSpec(&b.cnp.Spec, "spec")
		d.invalid = append(d.invalid, field.Required(field.NewPath("spec"), "the policy is enforced fail-closed"))
	}
	d.foldTopLevel(func() { d.brokenCNPSpec(&b.cnp.Spec, "spec") })
	cnp := new(v1alpha2.ClusterNetworkPolicy) // see npBody.finish
	*cnp = b.cnp
	o.ClusterNetworkPolicy = &policy.ClusterNetworkPolicy{ClusterNetworkPolicy: cnp, UnknownFields: sortedUnique(d.unknown), Invalid: sortErrors(d.invalid), Source: o.Source}
}

func sortedUnique(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	slices.Sort(s)
	return slices.Compact(s)
}

// sortErrors orders errors by path, so files (document order) and
// informers (name order) report alike.
func sortErrors(errs field.ErrorList) field.ErrorList {
	if len(errs) == 0 {
		return nil
	}
	slices.SortStableFunc(errs, func(a, b *field.Error) int { return strings.Compare(a.Field, b.Field) })
	return errs
}
