package v1alpha2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Channel markers used below (read by hack/tools/crdgen, ignored by plain
// controller-gen):
//
//   - +moat:channel=experimental on a field keeps that field out of the
//     standard-channel CRD. The Go field always exists, so one binary can
//     read objects from either channel.
//   - +moat:experimental:XValidation:rule=...,message=... is a CEL rule that
//     only the experimental-channel CRD carries, because it refers to
//     experimental fields.

// ClusterNetworkPolicy lets a cluster administrator set network rules for
// many namespaces at once, in an Admin tier that overrides namespaced
// NetworkPolicy and a Baseline tier that NetworkPolicy can override.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cnp,scope=Cluster
// +kubebuilder:printcolumn:name="Tier",type=string,JSONPath=".spec.tier"
// +kubebuilder:printcolumn:name="Priority",type=string,JSONPath=".spec.priority"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ClusterNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	// Spec is what the administrator asks for: which pods, in which tier
	// and order, with which ingress and egress rules.
	Spec ClusterNetworkPolicySpec `json:"spec"`

	// Status is written by the implementation (Moat's agent), for example
	// to say that a policy fails closed because it uses a field Moat does
	// not understand.
	//
	// +optional
	Status ClusterNetworkPolicyStatus `json:"status,omitempty"`
}

// ClusterNetworkPolicyList is the collection type the API server returns
// for list and watch calls.
//
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ClusterNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterNetworkPolicy `json:"items"`
}

// ClusterNetworkPolicySpec is the desired behaviour of a
// ClusterNetworkPolicy.
type ClusterNetworkPolicySpec struct {
	// Tier places the policy in the evaluation order of a connection:
	// the Admin tier first, then namespaced NetworkPolicy, then the
	// Baseline tier, then the Kubernetes default (allow). An Admin rule's
	// Accept or Deny is final and cannot be overridden by NetworkPolicy;
	// a Baseline rule applies only to pods that no NetworkPolicy selects
	// for that direction, which lets namespaces override it. Pass skips
	// the rest of the current tier.
	Tier Tier `json:"tier"`

	// Priority orders policies within a tier: lower values are evaluated
	// first. Two policies of one tier with the same priority may match
	// the same connection in an implementation-defined order, so an
	// administrator who needs a deterministic outcome gives them distinct
	// priorities (Moat breaks ties by name and documents it).
	//
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Priority int32 `json:"priority"`

	// Subject selects the pods whose traffic this policy governs.
	Subject ClusterNetworkPolicySubject `json:"subject"`

	// Ingress rules apply to connections towards the subject pods. They
	// are evaluated in the order written; the first matching rule
	// decides. With no ingress rules the policy leaves ingress alone.
	// At most 25 rules keep the evaluation cost of one policy bounded.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=25
	Ingress []ClusterNetworkPolicyIngressRule `json:"ingress,omitempty"`

	// Egress rules apply to connections from the subject pods, in the
	// order written; the first matching rule decides. With no egress rules
	// the policy leaves egress alone. At most 25 rules.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=25
	Egress []ClusterNetworkPolicyEgressRule `json:"egress,omitempty"`
}

// Tier names one of the two tiers a ClusterNetworkPolicy can live in.
//
// +kubebuilder:validation:Enum={"Admin", "Baseline"}
type Tier string

const (
	// AdminTier is evaluated before any NetworkPolicy; its Accept and Deny
	// cannot be overridden by namespace owners.
	AdminTier Tier = "Admin"
	// BaselineTier is evaluated only for pods that no NetworkPolicy
	// selects, so it sets defaults that namespace owners may override.
	BaselineTier Tier = "Baseline"
)

// ClusterNetworkPolicyStatus is what the implementation reports about a
// policy.
type ClusterNetworkPolicyStatus struct {
	// Conditions report, per condition type, whether the implementation
	// applied the policy and why not if it did not.
	//
	// +patchMergeKey=type
	// +patchStrategy=merge
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions" patchStrategy:"merge" patchMergeKey:"type"`
}

// ClusterNetworkPolicySubject selects the pods a policy applies to. It is a
// one-of: exactly one field is set. An object with none set (for instance
// because it used a field from a newer API this code does not know) must
// make the implementation fail closed. Host-network pods are never
// subjects, since their traffic is the node's.
//
// +kubebuilder:validation:MaxProperties=1
// +kubebuilder:validation:MinProperties=1
type ClusterNetworkPolicySubject struct {
	// Namespaces selects every pod in the namespaces whose labels match.
	//
	// +optional
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`

	// Pods selects pods by pod labels within namespaces selected by
	// namespace labels (both selectors must match).
	//
	// +optional
	Pods *NamespacedPod `json:"pods,omitempty"`
}

// ClusterNetworkPolicyIngressRule is one ordered ingress rule: the action to
// take on connections from any of From that match Protocols.
//
// +moat:experimental:XValidation:rule="!(self.from.exists(peer, has(peer.networks) || has(peer.nodes)) && has(self.protocols) && self.protocols.exists(protocol, has(protocol.destinationNamedPort)))",message="networks/nodes peer cannot be set with namedPorts since there are no namedPorts for networks/nodes"
type ClusterNetworkPolicyIngressRule struct {
	// Name labels the rule in status, logs and Moat's explanations.
	// At most 100 characters.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Name string `json:"name,omitempty"`

	// Action is what happens to matching connections: Accept admits them
	// and ends evaluation (other layers such as host firewalls or a
	// service mesh may still block them); Deny drops them and ends
	// evaluation; Pass skips the remaining rules of this tier and
	// continues with the next tier.
	Action ClusterNetworkPolicyRuleAction `json:"action"`

	// From lists the sources this rule matches; any one matching is
	// enough. It must have between 1 and 25 entries, so a rule never
	// matches "everything" by accident of an empty list.
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	From []ClusterNetworkPolicyIngressPeer `json:"from"`

	// Protocols narrows the rule to particular protocols and destination
	// ports; any one matching entry is enough. Omitted means all traffic
	// from the peers, including protocols without ports such as ICMP.
	//
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	Protocols []ClusterNetworkPolicyProtocol `json:"protocols,omitempty"`
}

// ClusterNetworkPolicyEgressRule is one ordered egress rule: the action to
// take on connections to any of To that match Protocols.
//
// +moat:experimental:XValidation:rule="!(self.to.exists(peer, has(peer.networks) || has(peer.nodes) || has(peer.domainNames)) && has(self.protocols) && self.protocols.exists(protocol, has(protocol.destinationNamedPort)))",message="networks/nodes/domainNames peer cannot be set with namedPorts since there are no namedPorts for networks/nodes/domainNames"
type ClusterNetworkPolicyEgressRule struct {
	// Name labels the rule in status, logs and Moat's explanations.
	// At most 100 characters.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Name string `json:"name,omitempty"`

	// Action is what happens to matching connections: Accept lets them
	// leave and ends evaluation; Deny drops them and ends evaluation;
	// Pass skips the remaining rules of this tier and continues with the
	// next tier.
	Action ClusterNetworkPolicyRuleAction `json:"action"`

	// To lists the destinations this rule matches; any one matching is
	// enough. Between 1 and 25 entries.
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	To []ClusterNetworkPolicyEgressPeer `json:"to"`

	// Protocols narrows the rule to particular protocols and destination
	// ports; any one matching entry is enough. Omitted means all traffic
	// to the peers, including protocols without ports such as ICMP.
	//
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	Protocols []ClusterNetworkPolicyProtocol `json:"protocols,omitempty"`
}

// ClusterNetworkPolicyRuleAction is the verdict a matching rule gives.
//
// +enum
// +kubebuilder:validation:Enum={"Accept", "Deny", "Pass"}
type ClusterNetworkPolicyRuleAction string

const (
	// ClusterNetworkPolicyRuleActionAccept allows the connection in this
	// direction; no later policy of any tier is consulted.
	ClusterNetworkPolicyRuleActionAccept ClusterNetworkPolicyRuleAction = "Accept"
	// ClusterNetworkPolicyRuleActionDeny drops the connection; no later
	// policy of any tier is consulted.
	ClusterNetworkPolicyRuleActionDeny ClusterNetworkPolicyRuleAction = "Deny"
	// ClusterNetworkPolicyRuleActionPass skips the rest of the current tier:
	// from Admin, evaluation continues with NetworkPolicy; from Baseline,
	// with the default (allow).
	ClusterNetworkPolicyRuleActionPass ClusterNetworkPolicyRuleAction = "Pass"
)

// ClusterNetworkPolicyIngressPeer is one source of an ingress rule. It is a
// one-of: exactly one field is set, enforced by the CRD. A peer with no
// field set means the object carries a field this code does not know, and
// the implementation fails closed: an Accept rule then matches nothing, and
// a Deny or Pass rule denies everything it could have matched.
//
// +kubebuilder:validation:MaxProperties=1
// +kubebuilder:validation:MinProperties=1
type ClusterNetworkPolicyIngressPeer struct {
	// Namespaces matches every pod-network pod in the namespaces whose
	// labels match. Host-network pods are not included; use Nodes.
	//
	// +optional
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`

	// Pods matches pod-network pods by pod labels within namespaces
	// selected by namespace labels. Host-network pods are not included.
	//
	// +optional
	Pods *NamespacedPod `json:"pods,omitempty"`

	// Nodes matches connections from the addresses in status.addresses
	// of nodes whose labels match (an empty selector matches all nodes),
	// which also covers host-network pods. NPEP-127; experimental channel
	// only, ahead of upstream.
	//
	// +optional
	// +moat:channel=experimental
	Nodes *metav1.LabelSelector `json:"nodes,omitempty"`

	// Networks matches connections from addresses in any of these CIDR
	// blocks, IPv4 or IPv6. It is meant for sources outside the cluster,
	// but cluster-internal addresses match too: Accept or Deny from
	// "0.0.0.0/0" covers all IPv4 pod traffic as well, so Pass pod
	// traffic in an earlier rule if that is not wanted. At most 25
	// CIDRs. NPEP-127; experimental channel only, ahead of upstream.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	// +moat:channel=experimental
	Networks []CIDR `json:"networks,omitempty"`
}

// ClusterNetworkPolicyEgressPeer is one destination of an egress rule. It
// is a one-of with the same fail-closed meaning as
// ClusterNetworkPolicyIngressPeer.
//
// +kubebuilder:validation:MaxProperties=1
// +kubebuilder:validation:MinProperties=1
type ClusterNetworkPolicyEgressPeer struct {
	// Namespaces matches every pod-network pod in the namespaces whose
	// labels match. Host-network pods are not included; use Nodes.
	//
	// +optional
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`

	// Pods matches pod-network pods by pod labels within namespaces
	// selected by namespace labels. Host-network pods are not included.
	//
	// +optional
	Pods *NamespacedPod `json:"pods,omitempty"`

	// Nodes matches connections to the addresses in status.addresses of
	// nodes whose labels match (an empty selector matches all nodes),
	// which also covers host-network pods. Experimental channel only.
	//
	// +optional
	// +moat:channel=experimental
	Nodes *metav1.LabelSelector `json:"nodes,omitempty"`

	// Networks matches connections to addresses in any of these CIDR
	// blocks, IPv4 or IPv6. Cluster-internal addresses match too, so a
	// rule for "0.0.0.0/0" also covers IPv4 pod traffic unless an
	// earlier rule passes it. At most 25 CIDRs.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	Networks []CIDR `json:"networks,omitempty"`

	// DomainNames matches connections to these DNS names. Only Accept
	// rules may use it: the intent is an allow-list of names in front of
	// a lower-precedence deny. At most 25 names. Experimental channel
	// only. Moat does no DNS-based matching, so such a peer matches no
	// address: for an Accept-only field that is the fail-closed reading.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	// +moat:channel=experimental
	DomainNames []DomainName `json:"domainNames,omitempty"`
}

// NamespacedPod selects pods by two selectors that must both match: one on
// the namespace's labels and one on the pod's labels.
type NamespacedPod struct {
	// NamespaceSelector matches namespace labels; empty matches all
	// namespaces.
	//
	// +optional
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`

	// PodSelector matches pod labels within the selected namespaces;
	// empty matches all pods there.
	//
	// +required
	PodSelector metav1.LabelSelector `json:"podSelector"`
}

// ClusterNetworkPolicyProtocol is one protocol match of a rule (NPEP-187).
// It is a one-of: exactly one field is set; none set means a newer field
// this code does not know, and the rule fails closed.
//
// +kubebuilder:validation:MaxProperties=1
// +kubebuilder:validation:MinProperties=1
type ClusterNetworkPolicyProtocol struct {
	// TCP matches TCP traffic, optionally by destination port.
	//
	// +optional
	TCP *ClusterNetworkPolicyProtocolTCP `json:"tcp,omitempty"`

	// UDP matches UDP traffic, optionally by destination port.
	//
	// +optional
	UDP *ClusterNetworkPolicyProtocolUDP `json:"udp,omitempty"`

	// SCTP matches SCTP traffic, optionally by destination port.
	//
	// +optional
	SCTP *ClusterNetworkPolicyProtocolSCTP `json:"sctp,omitempty"`

	// DestinationNamedPort matches the container port of this name (and
	// its protocol) on the destination pod. Nodes and networks have no
	// named ports, so it never matches traffic towards them.
	//
	// +optional
	DestinationNamedPort string `json:"destinationNamedPort,omitempty"`
}

// ClusterNetworkPolicyProtocolTCP narrows a TCP match. It must not be
// empty; to match all TCP, give the full port range.
//
// +kubebuilder:validation:MinProperties=1
type ClusterNetworkPolicyProtocolTCP struct {
	// DestinationPort is the port or port range to match.
	//
	// +optional
	DestinationPort *Port `json:"destinationPort,omitempty"`
}

// ClusterNetworkPolicyProtocolUDP narrows a UDP match. It must not be
// empty.
//
// +kubebuilder:validation:MinProperties=1
type ClusterNetworkPolicyProtocolUDP struct {
	// DestinationPort is the port or port range to match.
	//
	// +optional
	DestinationPort *Port `json:"destinationPort,omitempty"`
}

// ClusterNetworkPolicyProtocolSCTP narrows an SCTP match. It must not be
// empty.
//
// +kubebuilder:validation:MinProperties=1
type ClusterNetworkPolicyProtocolSCTP struct {
	// DestinationPort is the port or port range to match.
	//
	// +optional
	DestinationPort *Port `json:"destinationPort,omitempty"`
}

// Port is a one-of: a single port Number or a port Range.
//
// +kubebuilder:validation:MaxProperties=1
// +kubebuilder:validation:MinProperties=1
type Port struct {
	// Number is a single port, 1 to 65535.
	//
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Number int32 `json:"number,omitempty"`

	// Range is an inclusive range of ports.
	//
	// +optional
	Range *PortRange `json:"range,omitempty"`
}

// PortRange is the inclusive range Start..End. Start must be strictly less
// than End: a single port is written as Number, so each port set has one
// spelling.
//
// +kubebuilder:validation:XValidation:rule="self.start < self.end", message="Start port must be less than End port"
type PortRange struct {
	// Start is the first port of the range, 1 to 65535.
	//
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Start int32 `json:"start"`

	// End is the last port of the range, 1 to 65535, greater than Start.
	//
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	End int32 `json:"end"`
}

// CIDR is an IPv4 or IPv6 prefix such as "10.0.0.0/8" or "fd00::/8". The
// API server checks the syntax with CEL's isCIDR, and 43 characters is the
// longest IPv6 CIDR text.
//
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="Invalid CIDR format provided"
// +kubebuilder:validation:MaxLength=43
type CIDR string

// DomainName is a DNS name used as an egress peer: either exact
// ("kubernetes.io" matches only that name) or with a leading "*." that
// stands for one or more whole labels ("*.kubernetes.io" matches
// "www.kubernetes.io" and "a.b.kubernetes.io" but not "kubernetes.io").
// Partial-label wildcards are not allowed.
//
// +kubebuilder:validation:Pattern=`^(\*\.)?([a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$`
type DomainName string
