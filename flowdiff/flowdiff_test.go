package flowdiff

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// copyCluster deep-copies generated objects so a mutation leaves the
// original alone.
func copyCluster(c *clustergen.Cluster) *clustergen.Cluster {
	out := &clustergen.Cluster{}
	for i := range c.Nodes {
		out.Nodes = append(out.Nodes, *c.Nodes[i].DeepCopy())
	}
	for i := range c.Namespaces {
		out.Namespaces = append(out.Namespaces, *c.Namespaces[i].DeepCopy())
	}
	for i := range c.Pods {
		out.Pods = append(out.Pods, *c.Pods[i].DeepCopy())
	}
	for i := range c.NetworkPolicies {
		out.NetworkPolicies = append(out.NetworkPolicies, *c.NetworkPolicies[i].DeepCopy())
	}
	for i := range c.ClusterNetworkPolicies {
		out.ClusterNetworkPolicies = append(out.ClusterNetworkPolicies, *c.ClusterNetworkPolicies[i].DeepCopy())
	}
	return out
}

// mutations are the changes a pull request or a cluster makes: each one
// edits c in place and names itself.
var mutations = []func(r *rand.Rand, c *clustergen.Cluster) string{
	func(r *rand.Rand, c *clustergen.Cluster) string {
		p := &c.Pods[r.IntN(len(c.Pods))]
		p.Labels["tier"] = []string{"web", "api", "db", "cache", "worker"}[r.IntN(5)]
		return "relabel pod " + p.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		ns := &c.Namespaces[r.IntN(len(c.Namespaces))]
		ns.Labels["env"] = []string{"prod", "staging", "dev"}[r.IntN(3)]
		ns.Labels["team"] = fmt.Sprintf("team-%02d", r.IntN(50))
		return "relabel namespace " + ns.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		i := r.IntN(len(c.NetworkPolicies))
		name := c.NetworkPolicies[i].Name
		c.NetworkPolicies = slices.Delete(c.NetworkPolicies, i, i+1)
		return "delete NetworkPolicy " + name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		i := r.IntN(len(c.ClusterNetworkPolicies))
		name := c.ClusterNetworkPolicies[i].Name
		c.ClusterNetworkPolicies = slices.Delete(c.ClusterNetworkPolicies, i, i+1)
		return "delete ClusterNetworkPolicy " + name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		np := &c.NetworkPolicies[r.IntN(len(c.NetworkPolicies))]
		if len(np.Spec.Ingress) == 0 {
			return "nothing (NetworkPolicy " + np.Name + " has no ingress rules left)"
		}
		np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["tier"] = []string{"web", "api", "db"}[r.IntN(3)]
		return "change a peer of NetworkPolicy " + np.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		np := &c.NetworkPolicies[r.IntN(len(c.NetworkPolicies))]
		np.Spec.Ingress = np.Spec.Ingress[:r.IntN(len(np.Spec.Ingress))]
		return "drop rules of NetworkPolicy " + np.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		np := c.NetworkPolicies[r.IntN(len(c.NetworkPolicies))].DeepCopy()
		np.Name += "-copy"
		np.Namespace = c.Namespaces[r.IntN(len(c.Namespaces))].Name
		c.NetworkPolicies = append(c.NetworkPolicies, *np)
		return "add NetworkPolicy " + np.Namespace + "/" + np.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		cnp := &c.ClusterNetworkPolicies[r.IntN(len(c.ClusterNetworkPolicies))]
		actions := []v1alpha2.ClusterNetworkPolicyRuleAction{v1alpha2.ClusterNetworkPolicyRuleActionAccept, v1alpha2.ClusterNetworkPolicyRuleActionDeny, v1alpha2.ClusterNetworkPolicyRuleActionPass}
		cnp.Spec.Ingress[0].Action = actions[r.IntN(3)]
		cnp.Spec.Egress[1].Action = actions[r.IntN(3)]
		return "change actions of ClusterNetworkPolicy " + cnp.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		cnp := &c.ClusterNetworkPolicies[r.IntN(len(c.ClusterNetworkPolicies))]
		cnp.Spec.Subject.Pods.NamespaceSelector = metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}
		return "widen the subject of ClusterNetworkPolicy " + cnp.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		cnp := &c.ClusterNetworkPolicies[r.IntN(len(c.ClusterNetworkPolicies))]
		cnp.Spec.Priority = int32(r.IntN(1001))
		return "reprioritise ClusterNetworkPolicy " + cnp.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		p := &c.Pods[r.IntN(len(c.Pods))]
		p.Status.PodIP = fmt.Sprintf("10.250.%d.%d", r.IntN(250), r.IntN(250)+1)
		return "readdress pod " + p.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		a, b := &c.Pods[r.IntN(len(c.Pods))], &c.Pods[r.IntN(len(c.Pods))]
		b.Status.PodIP = a.Status.PodIP
		return "give pod " + b.Name + " the address of " + a.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		i := r.IntN(len(c.Pods))
		name := c.Pods[i].Name
		c.Pods = slices.Delete(c.Pods, i, i+1)
		return "delete pod " + name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		p := c.Pods[r.IntN(len(c.Pods))].DeepCopy()
		p.Name += "-new"
		p.Status.PodIP = fmt.Sprintf("10.251.%d.%d", r.IntN(250), r.IntN(250)+1)
		c.Pods = append(c.Pods, *p)
		return "add pod " + p.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		n := &c.Nodes[r.IntN(len(c.Nodes))]
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("172.17.0.%d", r.IntN(250)+1)}}
		return "readdress node " + n.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		n := &c.Nodes[r.IntN(len(c.Nodes))]
		n.Labels["pool"] = []string{"general", "gpu"}[r.IntN(2)]
		return "relabel node " + n.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		p := &c.Pods[r.IntN(len(c.Pods))]
		ports := p.Spec.Containers[0].Ports
		ports[0].ContainerPort = int32(8000 + r.IntN(3)*1000)
		return "move a named port of pod " + p.Name
	},
	func(r *rand.Rand, c *clustergen.Cluster) string {
		p := &c.Pods[r.IntN(len(c.Pods))]
		p.Spec.HostNetwork = !p.Spec.HostNetwork
		return "flip host network of pod " + p.Name
	},
}

// TestComputeMatchesFull checks the incremental diff against judging every
// flow of both states, over random clusters and random changes.
func TestComputeMatchesFull(t *testing.T) {
	rounds := 300
	if testing.Short() {
		rounds = 60
	}
	changed, saved := 0, 0
	for round := range rounds {
		seed := uint64(round)
		r := rand.New(rand.NewPCG(seed, 99))
		gen := clustergen.Generate(clustergen.Config{Nodes: 4, Namespaces: 6, Pods: 36, NetworkPolicies: 10, ClusterPolicies: 6, Seed: seed})
		next := copyCluster(gen)
		var what []string
		for range 1 + r.IntN(3) {
			what = append(what, mutations[r.IntN(len(mutations))](r, next))
		}
		opts := policy.Options{IngressNetworksAndNodes: round%2 == 0}
		before, after := policy.Compile(gen.ToCluster(), opts), policy.Compile(next.ToCluster(), opts)
		dopts := Options{Peers: []netip.Addr{netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("172.16.0.2"), netip.MustParseAddr("192.168.7.200")}}
		if round%3 == 0 {
			dopts.Ports = []matrix.PortProto{{Port: 8080, Protocol: policy.ProtoTCP}, {Port: 53, Protocol: policy.ProtoUDP}, {Port: 10250, Protocol: policy.ProtoTCP}}
		}
		got, want := Compute(before, after, dopts), Full(before, after, dopts)
		if got.Flows != want.Flows || !reflect.DeepEqual(got.Changes, want.Changes) || !slices.Equal(got.AddedPods, want.AddedPods) || !slices.Equal(got.RemovedPods, want.RemovedPods) {
			t.Errorf("round %d (%v): Compute found %d changes, Full %d", round, what, len(got.Changes), len(want.Changes))
			for _, c := range symmetricDifference(got.Changes, want.Changes) {
				t.Logf("  %s -> %s %d/%s: %v -> %v", c.From, c.To, c.Port, c.Protocol, c.Before.Allowed, c.After.Allowed)
			}
			continue
		}
		if len(want.Changes) > 0 {
			changed++
		}
		if got.Judged < want.Judged {
			saved++
		}
	}
	// The rounds must exercise something: changes found, and work saved.
	if changed < rounds/4 || saved < rounds/2 {
		t.Errorf("%d of %d rounds changed a verdict, %d judged fewer flows than Full", changed, rounds, saved)
	}
}

func symmetricDifference(a, b []Change) []Change {
	key := func(c Change) string { return fmt.Sprintf("%s>%s:%d/%s", c.From, c.To, c.Port, c.Protocol) }
	in := map[string]int{}
	for _, c := range a {
		in[key(c)]++
	}
	for _, c := range b {
		in[key(c)]--
	}
	var out []Change
	for _, c := range append(slices.Clone(a), b...) {
		if in[key(c)] != 0 {
			out = append(out, c)
			in[key(c)] = 0
		}
	}
	return out
}
