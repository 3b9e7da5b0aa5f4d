// Package v1alpha2 holds Moat's copy of the ClusterNetworkPolicy API
// (group policy.networking.k8s.io, version v1alpha2).
//
// The types are wire-compatible with sigs.k8s.io/network-policy-api v0.2.0:
// the same Go names, JSON field names, validation markers and CEL rules, so a
// manifest written for any implementation of that API decodes here unchanged
// and vice versa. Moat owns its copy because it implements NPEP-127 ahead of
// upstream: ingress peers gain `networks` and `nodes`, mirroring egress. Those
// fields exist only in the experimental CRD channel; the standard channel's
// CRD is generated without them (see hack/update-codegen.sh and the
// +moat:channel markers below).
//
// Everything in this package is required unless explicitly marked optional,
// matching the upstream API's convention.
//
// +kubebuilder:validation:Required
// +k8s:deepcopy-gen=package
// +groupName=policy.networking.k8s.io
package v1alpha2
