package decode

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/policy"
)

// Broken is a NetworkPolicy or ClusterNetworkPolicy known by its identity
// only (an informer holds an object that cannot be decoded): it must still
// be enforced, so it is one whose spec could not be read, failing closed
// as such (a NetworkPolicy isolates its namespace both ways; a
// ClusterNetworkPolicy denies all traffic of every pod at its tier). why
// says what was wrong. Files never need it: there, such an object is
// dropped and commands refuse to judge traffic.
func Broken(kind string, meta metav1.ObjectMeta, source, why string) *Object {
	d := &dec{}
	whole := &field.Error{Type: field.ErrorTypeTypeInvalid, Field: "spec", BadValue: field.OmitValueType{}, Detail: why + "; the whole policy is enforced fail-closed"}
	o := &Object{Ref: ref(kind, &meta), Source: source}
	if kind == "NetworkPolicy" {
		if meta.Namespace == "" {
			meta.Namespace = defaultNamespace
		}
		np := networkingv1.NetworkPolicy{ObjectMeta: meta, Spec: networkingv1.NetworkPolicySpec{
			Ingress: make([]networkingv1.NetworkPolicyIngressRule, 1), Egress: make([]networkingv1.NetworkPolicyEgressRule, 1)}}
		d.invalid = append(d.invalid, whole, unreadable("spec.podSelector"), unreadable("spec.ingress[0]"), unreadable("spec.egress[0]"))
		o.NetworkPolicy = policy.NetworkPolicyFromAPI(&np)
		o.NetworkPolicy.SetDecoding(nil, d.invalid)
		o.NetworkPolicy.Source = source
		return o
	}
	cnp := &v1alpha2.ClusterNetworkPolicy{ObjectMeta: meta}
	d.brokenCNPSpec(&cnp.Spec, "spec")
	d.invalid = append(field.ErrorList{whole}, d.invalid...)
	o.ClusterNetworkPolicy = &policy.ClusterNetworkPolicy{ClusterNetworkPolicy: cnp, Invalid: d.invalid, Source: source}
	return o
}
