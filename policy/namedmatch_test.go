package policy_test

import (
	"net/netip"
	"testing"

	"github.com/moat-net/moat/policy"
)

// namedEgressBase: a client and an egress rule to every destination on
// the named port https, beside another rule to every destination (DNS,
// as in nearly every cluster) that keeps their shared peer set alive.
// (load adds baseCluster's nodes and pods.)
const namedEgressBase = `
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: a}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {podIPs: [{ip: 10.3.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: other, namespace: b}
spec: {nodeName: n1, containers: [{name: c, image: x, ports: [{name: https, containerPort: 443}]}]}
status: {podIPs: [{ip: 10.3.1.3}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: dns, namespace: b}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{ports: [{port: 53, protocol: UDP}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: https-out, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{ports: [{port: https}]}]
`

// TestNamedEgressMatchNotStale: an egress rule with a named port to every
// destination resolves the name on the pods that declare it, and shares
// that Match with every rule of the same peers and ports. When its policy
// is updated or deleted and re-created while the pods declaring the name
// change, the incremental compile must agree with a fresh one. It did not,
// both ways (a stale Match denied a pod that now declares the
// name, and allowed a port no pod at the address declares any more).
func TestNamedEgressMatchNotStale(t *testing.T) {
	server := func(port uint16) *policy.Pod {
		return &policy.Pod{Namespace: "b", Name: "server", NodeName: "n1", IPs: []netip.Addr{netip.MustParseAddr("10.3.1.2")},
			Ports: []policy.ContainerPort{{Name: "https", Protocol: policy.ProtoTCP, Port: port}}}
	}
	httpsOut := func(c *policy.Cluster) (int, *policy.NetworkPolicy) {
		for i, np := range c.NetworkPolicies {
			if np.Name == "https-out" {
				return i, np
			}
		}
		t.Fatal("no https-out")
		return 0, nil
	}
	for _, node := range []string{"", "n1"} {
		opts := policy.Options{Node: node}
		t.Run("same batch/node="+node, func(t *testing.T) {
			// The server comes, declaring https, in the sync that also
			// updates the policy (in the agent's order: pods first).
			c := load(t, namedEgressBase)
			comp := policy.NewCompiler(c, opts)
			comp.Program()
			srv := server(443)
			c.Pods = append(c.Pods, srv)
			comp.UpsertPod(srv)
			i, np := httpsOut(c)
			next := *np
			next.Generation++
			c.NetworkPolicies[i] = &next
			comp.UpsertNetworkPolicy(&next)
			sameProgram(t, "server added, policy updated", comp.Program(), policy.Compile(c, opts), clientTo(443), clientTo(8443))
		})
		t.Run("across batches/node="+node, func(t *testing.T) {
			// The policy is deleted; the server at its address is
			// re-created declaring https on another port; the policy
			// comes back unchanged (kubectl delete and apply).
			c := load(t, namedEgressBase)
			c.Pods = append(c.Pods, server(443))
			comp := policy.NewCompiler(c, opts)
			comp.Program()
			i, np := httpsOut(c)
			c.NetworkPolicies = append(c.NetworkPolicies[:i:i], c.NetworkPolicies[i+1:]...)
			comp.DeleteNetworkPolicy(np.Namespace, np.Name)
			comp.Program()
			srv := server(8443)
			c.Pods[len(c.Pods)-1] = srv
			comp.UpsertPod(srv)
			comp.Program()
			back := *np
			c.NetworkPolicies = append(c.NetworkPolicies, &back)
			comp.UpsertNetworkPolicy(&back)
			sameProgram(t, "policy re-created", comp.Program(), policy.Compile(c, opts), clientTo(443), clientTo(8443))
		})
	}
}

// clientTo is namedEgressBase's client to the server's address on port.
func clientTo(port uint16) policy.Flow {
	return policy.Flow{
		Src: policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr("10.3.0.1")}, Dst: policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr("10.3.1.2")},
		Proto: policy.ProtoTCP, Port: port,
	}
}
