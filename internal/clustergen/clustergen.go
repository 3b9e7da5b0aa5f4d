// Package clustergen builds synthetic clusters as Kubernetes API objects:
// the scale benchmarks of the compiler, the agent and the lab all need the
// same realistic mix of selectors, ipBlocks, port ranges and named ports.
// Generation is deterministic for a given Config.
package clustergen

import (
	"fmt"
	"math/rand/v2"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/policy"
)

// Config sizes a cluster.
type Config struct {
	Nodes, Namespaces, Pods          int
	NetworkPolicies, ClusterPolicies int
	Seed                             uint64
	// Workloads selects the workload shape of issue 8 (see Scale100k)
	// instead of the original mix of Scale.
	Workloads bool
}

// Scale is the benchmark cluster: 10,000 pods in 1,000 namespaces
// on 100 nodes, 2,000 NetworkPolicies and 200 ClusterNetworkPolicies.
var Scale = Config{Nodes: 100, Namespaces: 1000, Pods: 10000, NetworkPolicies: 2000, ClusterPolicies: 200, Seed: 1}

// Cluster is the generated objects.
type Cluster struct {
	Nodes                  []corev1.Node
	Namespaces             []corev1.Namespace
	Pods                   []corev1.Pod
	NetworkPolicies        []networkingv1.NetworkPolicy
	ClusterNetworkPolicies []v1alpha2.ClusterNetworkPolicy
}

var (
	tiers = []string{"web", "api", "db", "cache", "worker"}
	envs  = []string{"prod", "staging", "dev"}
	ports = []struct {
		name  string
		port  int32
		proto corev1.Protocol
	}{{"http", 8080, corev1.ProtocolTCP}, {"https", 8443, corev1.ProtocolTCP}, {"metrics", 9090, corev1.ProtocolTCP}, {"dns", 53, corev1.ProtocolUDP}, {"grpc", 9000, corev1.ProtocolTCP}}
)

// Generate builds the cluster.
func Generate(c Config) *Cluster {
	r := rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))
	out := &Cluster{}
	genNodes(c, out)
	if c.Workloads {
		generateWorkloads(r, c, out)
		return out
	}
	generateMix(r, c, out)
	return out
}

func genNodes(c Config, out *Cluster) {
	for i := range c.Nodes {
		out.Nodes = append(out.Nodes, corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%03d", i), Labels: map[string]string{
				"topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", i%3), "pool": []string{"general", "gpu"}[i%2]}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("172.16.%d.%d", i/250, i%250+1)}}},
		})
	}
}

// generateMix is the original shape of Scale.
func generateMix(r *rand.Rand, c Config, out *Cluster) {
	for i := range c.Namespaces {
		out.Namespaces = append(out.Namespaces, corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i), Labels: map[string]string{
			"team": fmt.Sprintf("team-%02d", i%50), "env": envs[i%len(envs)], "kubernetes.io/metadata.name": nsName(i)}}})
	}
	perNode := map[int]int{}
	for i := range c.Pods {
		node := r.IntN(max(c.Nodes, 1))
		k := perNode[node]
		perNode[node]++
		tier := tiers[i%len(tiers)]
		pod := corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%05d", i), Namespace: nsName(i % max(c.Namespaces, 1)), Labels: map[string]string{
				"app": fmt.Sprintf("app-%d", (i/max(c.Namespaces, 1))%10), "tier": tier, "version": fmt.Sprintf("v%d", i%3)}},
			Spec:   corev1.PodSpec{NodeName: fmt.Sprintf("node-%03d", node), Containers: []corev1.Container{{Name: "main"}}},
			Status: corev1.PodStatus{PodIP: fmt.Sprintf("10.%d.%d.%d", 128+node/64, (node%64)*4+k/250, k%250+1)},
		}
		for j := 0; j < 2; j++ {
			p := ports[(i+j)%len(ports)]
			pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: p.name, ContainerPort: p.port, Protocol: p.proto})
		}
		out.Pods = append(out.Pods, pod)
	}
	for i := range c.NetworkPolicies {
		out.NetworkPolicies = append(out.NetworkPolicies, genNP(r, i, c))
	}
	for i := range c.ClusterPolicies {
		out.ClusterNetworkPolicies = append(out.ClusterNetworkPolicies, genCNP(r, i, c))
	}
}

func nsName(i int) string { return fmt.Sprintf("ns-%04d", i) }

func genNP(r *rand.Rand, i int, c Config) networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	np := networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("np-%04d", i), Namespace: nsName(i % max(c.Namespaces, 1))}}
	if i%2 == 0 {
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"tier": tiers[r.IntN(len(tiers))]}}
	} else {
		np.Spec.PodSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{tiers[r.IntN(len(tiers))], tiers[r.IntN(len(tiers))]}}}}
	}
	endPort := int32(32767)
	named := intstr.FromString(ports[r.IntN(len(ports))].name)
	num := intstr.FromInt32(int32(1024 + r.IntN(20000)))
	rng := intstr.FromInt32(30000)
	np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{
		{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": tiers[r.IntN(len(tiers))]}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &named}, {Protocol: &tcp, Port: &num}}},
		{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{fmt.Sprintf("team-%02d", r.IntN(50))}}}},
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "api"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &rng, EndPort: &endPort}}},
		{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("192.168.%d.0/24", r.IntN(256)), Except: []string{fmt.Sprintf("192.168.%d.128/25", r.IntN(256))}}}}},
	}
	if i%3 == 0 {
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": envs[r.IntN(len(envs))]}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: ptr(intstr.FromInt32(53))}, {Protocol: &tcp, Port: ptr(intstr.FromInt32(8000)), EndPort: ptr(int32(9000))}}},
		}
	}
	// Keep Except inside CIDR: the generator aims for valid objects.
	for j := range np.Spec.Ingress[2].From {
		b := np.Spec.Ingress[2].From[j].IPBlock
		b.Except = []string{b.CIDR[:len(b.CIDR)-4] + "128/25"}
	}
	return np
}

func genCNP(r *rand.Rand, i int, c Config) v1alpha2.ClusterNetworkPolicy {
	tier := v1alpha2.AdminTier
	if i%2 == 1 {
		tier = v1alpha2.BaselineTier
	}
	cnp := v1alpha2.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cnp-%03d", i)}}
	cnp.Spec.Tier = tier
	cnp.Spec.Priority = int32(r.IntN(1001))
	cnp.Spec.Subject = v1alpha2.ClusterNetworkPolicySubject{Pods: &v1alpha2.NamespacedPod{
		NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("team-%02d", r.IntN(50))}},
		PodSelector:       metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{tiers[r.IntN(len(tiers))]}}}},
	}}
	actions := []v1alpha2.ClusterNetworkPolicyRuleAction{v1alpha2.ClusterNetworkPolicyRuleActionAccept, v1alpha2.ClusterNetworkPolicyRuleActionDeny, v1alpha2.ClusterNetworkPolicyRuleActionPass}
	cnp.Spec.Ingress = []v1alpha2.ClusterNetworkPolicyIngressRule{
		{Name: "from-team", Action: actions[r.IntN(3)], From: []v1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"env": envs[r.IntN(3)]}}}},
			Protocols: []v1alpha2.ClusterNetworkPolicyProtocol{{TCP: &v1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &v1alpha2.Port{Range: &v1alpha2.PortRange{Start: 8000, End: 9999}}}}, {DestinationNamedPort: "metrics"}}},
		{Name: "from-nets", Action: v1alpha2.ClusterNetworkPolicyRuleActionDeny, From: []v1alpha2.ClusterNetworkPolicyIngressPeer{{Networks: []v1alpha2.CIDR{v1alpha2.CIDR(fmt.Sprintf("203.0.%d.0/24", r.IntN(256))), "2001:db8::/32"}}}},
		{Name: "from-nodes", Action: v1alpha2.ClusterNetworkPolicyRuleActionAccept, From: []v1alpha2.ClusterNetworkPolicyIngressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "gpu"}}}},
			Protocols: []v1alpha2.ClusterNetworkPolicyProtocol{{TCP: &v1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &v1alpha2.Port{Number: 10250}}}}},
	}
	cnp.Spec.Egress = []v1alpha2.ClusterNetworkPolicyEgressRule{
		{Name: "to-dns", Action: v1alpha2.ClusterNetworkPolicyRuleActionAccept, To: []v1alpha2.ClusterNetworkPolicyEgressPeer{{Pods: &v1alpha2.NamespacedPod{NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": nsName(0)}}, PodSelector: metav1.LabelSelector{}}}},
			Protocols: []v1alpha2.ClusterNetworkPolicyProtocol{{UDP: &v1alpha2.ClusterNetworkPolicyProtocolUDP{DestinationPort: &v1alpha2.Port{Number: 53}}}}},
		{Name: "outside", Action: actions[r.IntN(3)], To: []v1alpha2.ClusterNetworkPolicyEgressPeer{{Networks: []v1alpha2.CIDR{"0.0.0.0/0"}}}},
	}
	return cnp
}

func ptr[T any](v T) *T { return &v }

// ToCluster converts the objects into the compiler's model, as a source
// would.
func (c *Cluster) ToCluster() *policy.Cluster {
	out := &policy.Cluster{}
	for i := range c.Namespaces {
		out.Namespaces = append(out.Namespaces, policy.NamespaceFromAPI(&c.Namespaces[i]))
	}
	for i := range c.Nodes {
		n, _ := policy.NodeFromAPI(&c.Nodes[i])
		out.Nodes = append(out.Nodes, n)
	}
	for i := range c.Pods {
		p, _ := policy.PodFromAPI(&c.Pods[i])
		out.Pods = append(out.Pods, &p)
	}
	for i := range c.NetworkPolicies {
		out.NetworkPolicies = append(out.NetworkPolicies, policy.NetworkPolicyFromAPI(&c.NetworkPolicies[i]))
	}
	for i := range c.ClusterNetworkPolicies {
		out.ClusterNetworkPolicies = append(out.ClusterNetworkPolicies, policy.ClusterNetworkPolicy{ClusterNetworkPolicy: &c.ClusterNetworkPolicies[i]})
	}
	return out
}
