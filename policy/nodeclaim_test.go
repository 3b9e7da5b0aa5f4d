package policy_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// nodeClaimCluster: node n2's status lists 10.1.1.1, pod a/x's address
// (a compromised node writing its own status), and 10.0.0.9, no pod's yet.
// Pods in namespace b may reach nodes only; a/x is ingress-isolated but
// from nodes.
var nodeClaimCluster = manifests(
	fixNode{name: "n1", internal: []string{"10.0.0.1"}},
	fixNode{name: "n2", internal: []string{"10.0.0.2"}, external: []string{"10.1.1.1", "10.0.0.9"}},
	fixPod{namespace: "a", name: "x", node: "n1", ips: []string{"10.1.1.1"}},
	fixPod{namespace: "b", name: "z", node: "n1", ips: []string{"10.1.1.2"}},
	fixPod{namespace: "b", name: "w", node: "n1", ips: []string{"10.1.1.3"}},
	yamlDoc(`
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: only-nodes}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: b}}}
  egress:
  - {name: to-nodes, action: Accept, to: [{nodes: {}}]}
  - {name: deny-rest, action: Deny, to: [{networks: ["0.0.0.0/0"]}]}
`),
)

// nodeClaimFlows are the flows whose verdicts show whether the nodes
// peer holds 10.1.1.1 and 10.0.0.9: b/z's egress accepts nodes only.
func nodeClaimFlows(t *testing.T, p *policy.Program) map[string]bool {
	t.Helper()
	z, ok := p.PodByKey("b/z")
	if !ok {
		t.Fatal("no b/z")
	}
	out := map[string]bool{}
	for _, to := range []string{"10.1.1.1", "10.0.0.2", "10.0.0.9"} {
		dst, err := p.ParseEndpoint(to)
		if err != nil {
			t.Fatal(err)
		}
		out[to] = p.Allowed(policy.Flow{Src: policy.Endpoint{Pod: z, Addr: netip.MustParseAddr("10.1.1.2")}, Dst: dst, Proto: policy.ProtoTCP, Port: 80})
	}
	return out
}

// TestNodePeerLeavesOutPodAddresses: a `nodes` peer does not take an
// address that a pod-network pod claims (a Node listing pod
// a/x's address made "Accept to nodes" accept a/x), and a warning names
// node and pod; the Compiler refreshes the peer when a pod takes or gives
// back a node's address, as a full compile of each step does.
func TestNodePeerLeavesOutPodAddresses(t *testing.T) {
	c := loadAlone(t, nodeClaimCluster)
	for _, opts := range []policy.Options{{}, {Node: "n1"}} {
		comp := policy.NewCompiler(c, opts)
		steps := []struct {
			what string
			pod  func() *policy.Pod // nil: nothing changes
			want map[string]bool
			warn []string
		}{
			{"start", nil, map[string]bool{"10.1.1.1": false, "10.0.0.2": true, "10.0.0.9": true},
				[]string{"Node n2: status.addresses: address 10.1.1.1 is also pod a/x's"}},
			{"b/w takes 10.0.0.9", func() *policy.Pod { p := *c.Pods[2]; p.IPs = []netip.Addr{netip.MustParseAddr("10.0.0.9")}; return &p },
				map[string]bool{"10.1.1.1": false, "10.0.0.2": true, "10.0.0.9": false},
				[]string{"address 10.1.1.1 is also pod a/x's", "address 10.0.0.9 is also pod b/w's"}},
			{"a/x gives 10.1.1.1 back", func() *policy.Pod { p := *c.Pods[0]; p.IPs = []netip.Addr{netip.MustParseAddr("10.1.1.4")}; return &p },
				map[string]bool{"10.1.1.1": true, "10.0.0.2": true, "10.0.0.9": false},
				[]string{"address 10.0.0.9 is also pod b/w's"}},
			{"b/w goes to the host network", func() *policy.Pod { p := *c.Pods[2]; p.HostNetwork = true; return &p },
				map[string]bool{"10.1.1.1": true, "10.0.0.2": true, "10.0.0.9": true}, nil},
		}
		for _, st := range steps {
			if st.pod != nil {
				p := st.pod()
				i := slices.IndexFunc(c.Pods, func(q *policy.Pod) bool { return q.Key() == p.Key() })
				c.Pods[i] = p
				comp.UpsertPod(p)
			}
			inc, full := comp.Program(), policy.Compile(c, opts)
			for name, prog := range map[string]*policy.Program{"incremental": inc, "full": full} {
				got := nodeClaimFlows(t, prog)
				for to, want := range st.want {
					if got[to] != want {
						t.Errorf("node=%q %s, %s: b/z to %s allowed=%v, want %v (the nodes peer %s it)", opts.Node, st.what, name, to, got[to], want, map[bool]string{true: "should hold", false: "should not hold"}[want])
					}
				}
				var claims []string
				for _, d := range prog.Diagnostics {
					if strings.Contains(d.Message, "is also pod") {
						claims = append(claims, d.String())
					}
				}
				if len(claims) != len(st.warn) {
					t.Errorf("node=%q %s, %s: warnings %q, want %d like %q", opts.Node, st.what, name, claims, len(st.warn), st.warn)
				}
				for _, w := range st.warn {
					if !strings.Contains(strings.Join(claims, "\n"), w) {
						t.Errorf("node=%q %s, %s: no warning %q in %q", opts.Node, st.what, name, w, claims)
					}
				}
			}
			sameProgram(t, st.what, inc, full)
		}
		c = loadAlone(t, nodeClaimCluster)
	}
}
