package v1alpha2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group shared with sigs.k8s.io/network-policy-api, so
// objects stored by either implementation are the same resource.
const GroupName = "policy.networking.k8s.io"

// Version is the only API version Moat serves for ClusterNetworkPolicy.
const Version = "v1alpha2"

// SchemeGroupVersion identifies this package's types to runtime.Scheme,
// serializers and the generated clientset.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// Resource qualifies a resource name (e.g. "clusternetworkpolicies") with
// this API group, as the listers and error helpers expect.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

var (
	// SchemeBuilder collects the functions that register this package's
	// types; callers use AddToScheme rather than touching it.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers ClusterNetworkPolicy and ClusterNetworkPolicyList
	// with a scheme, so clients, informers and universal decoders can handle
	// them.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&ClusterNetworkPolicy{},
		&ClusterNetworkPolicyList{},
	)
	// ListOptions, WatchEvent etc. must be known in this group version for
	// the generated clientset's List and Watch calls to work.
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
