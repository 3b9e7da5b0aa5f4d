package policy_test

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/policy"
)

// A `nodes` peer selects "the IPs present in node.Status.Addresses": an IP
// literal is an address whatever its type (kubelet writes Hostname from
// --hostname-override, which may be an IP). Left out, an Admin Deny of the
// node let its address and its host-network pods through.
func TestNodeAddressesOfAnyType(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addrs []corev1.NodeAddress
		want  []string
	}{
		{"hostname IP only", []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "192.0.2.3"}}, []string{"192.0.2.3"}},
		{"hostname name", []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "node-3"}, {Type: corev1.NodeInternalIP, Address: "192.0.2.3"}}, []string{"192.0.2.3"}},
		{"dns IPs and a repeat", []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "192.0.2.3"},
			{Type: corev1.NodeHostName, Address: "192.0.2.3"},
			{Type: corev1.NodeInternalDNS, Address: "fd00::3"},
			{Type: corev1.NodeExternalDNS, Address: "node-3.example.com"},
		}, []string{"192.0.2.3", "fd00::3"}},
		{"mapped", []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "::ffff:192.0.2.4"}}, []string{"192.0.2.4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, diags := policy.NodeFromAPI(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3"}, Status: corev1.NodeStatus{Addresses: tc.addrs}})
			var got []string
			for _, a := range n.Addrs {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("addresses %v, want %v", got, tc.want)
			}
			if len(diags) != 0 {
				t.Errorf("diagnostics %+v, want none", diags)
			}
		})
	}

	// End to end, through the decoder: an Admin Deny of the node's nodes
	// peer denies its Hostname address and its host-network pods.
	prog := compile(t, `
apiVersion: v1
kind: Node
metadata: {name: n3, labels: {zone: c}}
status: {addresses: [{type: Hostname, address: 192.0.2.3}]}
---
apiVersion: v1
kind: Pod
metadata: {name: hn3, namespace: a}
spec: {nodeName: n3, hostNetwork: true, containers: [{name: c}]}
status: {podIP: 192.0.2.3}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-nodes}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  egress:
  - {action: Deny, to: [{nodes: {matchLabels: {zone: c}}}]}
`, policy.Options{})
	runFlows(t, prog, []flowCase{
		{name: "the node's Hostname address", from: "a/x", to: "192.0.2.3", port: 22, allowed: false, egress: admin, reasonHas: "deny-nodes"},
		{name: "its host-network pod", from: "a/x", to: "a/hn3", port: 22, allowed: false, egress: admin, reasonHas: "deny-nodes"},
	})
}
