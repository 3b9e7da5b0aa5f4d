package policy

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/moat-net/moat/api/v1alpha2"
)

// Cluster is the snapshot the compiler works from: what sources (manifest
// files, informers) know about the cluster, reduced to what policy needs.
// Sources build it; nothing downstream reaches back into them.
type Cluster struct {
	Namespaces             []Namespace
	Pods                   []*Pod
	Nodes                  []Node
	NetworkPolicies        []*NetworkPolicy
	ClusterNetworkPolicies []ClusterNetworkPolicy
}

// Namespace carries the labels that namespace selectors match.
type Namespace struct {
	Name   string
	Labels map[string]string
}

// Pod is a pod as policy sees it: labels for selectors, IPs for address
// matching, named ports for named-port resolution, and where it runs.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	NodeName        string
	// HostNetwork pods share their node's addresses; they are never
	// subjects nor pod/namespace peers.
	HostNetwork bool
	// IPs are status.podIPs, primary first.
	IPs   []netip.Addr
	Ports []ContainerPort
}

// Key is "namespace/name".
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// ContainerPort is one declared container port; Name may be empty.
type ContainerPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

// Node carries labels for the `nodes` peer and the addresses it selects.
type Node struct {
	Name   string
	Labels map[string]string
	Addrs  []netip.Addr
	// PodCIDRs are spec.podCIDRs (or spec.podCIDR): the ranges the node's
	// pod-network pods get their addresses from, when the CNI uses them.
	// The node's agent drops new connections from an address in them
	// that no pod it knows owns (a forged source).
	PodCIDRs []netip.Prefix
}

// NetworkPolicy is a networking.k8s.io/v1 NetworkPolicy as Moat reads it:
// the metadata it uses, the spec, and what decoding learned about the
// object. It holds no networkingv1.NetworkPolicy: a cluster has tens of
// thousands of NetworkPolicies and every agent keeps all of them, where
// the API type's mostly empty ObjectMeta and TypeMeta cost twice the
// fields below.
type NetworkPolicy struct {
	Namespace, Name string
	UID             types.UID
	ResourceVersion string
	Generation      int64
	Spec            networkingv1.NetworkPolicySpec
	// Decoding is what decoding learned that the typed object cannot
	// show (UnknownFields, Invalid); nil when it learned nothing, as for
	// nearly every policy: its two lists in every policy cost 48 bytes
	// each of the tens of thousands an agent caches.
	Decoding *Decoding
	// Source names where the object came from (file:line or "api").
	Source string
}

// Decoding is what decoding learned about a NetworkPolicy.
type Decoding struct {
	// UnknownFields are JSON field paths (e.g. "spec.ingress[0].from[1].foo")
	// that the decoder found but Moat's types do not have. The compiler
	// fails closed on the parts they belong to.
	UnknownFields []string
	// Invalid are problems decoding found that the typed object cannot
	// show: a wrongly typed or repeated value (at its own path; decoding
	// left it empty) and required fields that were missing. The compiler
	// treats them as validation errors, failing closed on the part each
	// path belongs to.
	Invalid field.ErrorList
}

// UnknownFields are the field paths decoding did not know (Decoding).
func (np *NetworkPolicy) UnknownFields() []string {
	if np.Decoding == nil {
		return nil
	}
	return np.Decoding.UnknownFields
}

// Invalid are the problems decoding found (Decoding).
func (np *NetworkPolicy) Invalid() field.ErrorList {
	if np.Decoding == nil {
		return nil
	}
	return np.Decoding.Invalid
}

// SetDecoding records what decoding learned, leaving Decoding nil when
// it learned nothing (and an empty list of either nil).
func (np *NetworkPolicy) SetDecoding(unknown []string, invalid field.ErrorList) {
	if len(unknown) == 0 {
		unknown = nil
	}
	if len(invalid) == 0 {
		invalid = nil
	}
	np.Decoding = nil
	if unknown != nil || invalid != nil {
		np.Decoding = &Decoding{UnknownFields: unknown, Invalid: invalid}
	}
}

// NetworkPolicyFromAPI takes what Moat reads from an API object (its
// decoding results are left empty).
func NetworkPolicyFromAPI(np *networkingv1.NetworkPolicy) *NetworkPolicy {
	return &NetworkPolicy{
		Namespace: np.Namespace, Name: np.Name, UID: np.UID,
		ResourceVersion: np.ResourceVersion, Generation: np.Generation,
		Spec: np.Spec,
	}
}

// ClusterNetworkPolicy wraps the API object with what decoding learned
// about it.
type ClusterNetworkPolicy struct {
	*v1alpha2.ClusterNetworkPolicy
	// UnknownFields: see NetworkPolicy.UnknownFields.
	UnknownFields []string
	// Invalid: see NetworkPolicy.Invalid.
	Invalid field.ErrorList
	// Source names where the object came from.
	Source string
}
