package clustergen

import (
	"fmt"
	"math/rand/v2"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/moat-net/moat/api/v1alpha2"
)

// The workload shape of issue 8 (Config.Workloads): namespaces owned by
// teams, each running a few apps as Deployments and StatefulSets whose pods
// carry a pod-template-hash (so nearly every pod's label set is its own),
// three container ports per pod, seven NetworkPolicies per namespace
// (default deny, same-app, cross-team, monitoring, an ipBlock, egress to
// DNS, egress to other apps and the internet) and ClusterNetworkPolicies
// selecting namespaces by team and pods by app.
var (
	// Scale10k .. Scale100k are that shape at the sizes the issue measures;
	// policies grow with pods.
	Scale10k  = Config{Nodes: 100, Namespaces: 1000, Pods: 10000, NetworkPolicies: 7000, ClusterPolicies: 500, Seed: 1, Workloads: true}
	Scale20k  = Config{Nodes: 200, Namespaces: 2000, Pods: 20000, NetworkPolicies: 14000, ClusterPolicies: 1000, Seed: 1, Workloads: true}
	Scale40k  = Config{Nodes: 400, Namespaces: 4000, Pods: 40000, NetworkPolicies: 28000, ClusterPolicies: 2000, Seed: 1, Workloads: true}
	Scale100k = Config{Nodes: 1000, Namespaces: 10000, Pods: 100000, NetworkPolicies: 70000, ClusterPolicies: 5000, Seed: 1, Workloads: true}
)

const (
	workloadTeams = 40 // teams owning namespaces
	workloadApps  = 20 // app names across the cluster
	appsPerNS     = 3
)

var workloadPorts = [][3]struct {
	name  string
	port  int32
	proto corev1.Protocol
}{
	{{"http", 8080, corev1.ProtocolTCP}, {"metrics", 9090, corev1.ProtocolTCP}, {"grpc", 9000, corev1.ProtocolTCP}},
	{{"http", 8080, corev1.ProtocolTCP}, {"metrics", 9100, corev1.ProtocolTCP}, {"https", 8443, corev1.ProtocolTCP}},
	{{"dns", 53, corev1.ProtocolUDP}, {"dns-tcp", 53, corev1.ProtocolTCP}, {"metrics", 9153, corev1.ProtocolTCP}},
	{{"postgres", 5432, corev1.ProtocolTCP}, {"metrics", 9187, corev1.ProtocolTCP}, {"http", 8008, corev1.ProtocolTCP}},
}

func teamOf(ns int) string { return fmt.Sprintf("team-%02d", ns%workloadTeams) }
func appName(a int) string { return fmt.Sprintf("app-%02d", a%workloadApps) }

// nsApp is the j-th app of namespace ns.
func nsApp(ns, j int) int { return (ns*7 + j*3) % workloadApps }

func generateWorkloads(r *rand.Rand, c Config, out *Cluster) {
	nss := max(c.Namespaces, 1)
	for i := range c.Namespaces {
		out.Namespaces = append(out.Namespaces, corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i), Labels: map[string]string{
			"team": teamOf(i), "env": envs[i%len(envs)], "kubernetes.io/metadata.name": nsName(i)}}})
	}
	// pod-template-hash per (namespace, app): one ReplicaSet each.
	hash := func(ns, app int) string {
		x := uint64(ns)*0x9e3779b97f4a7c15 ^ uint64(app)*0xbf58476d1ce4e5b9 ^ c.Seed
		x ^= x >> 29
		x *= 0x94d049bb133111eb
		return fmt.Sprintf("%010x", x>>24)
	}
	perNode := map[int]int{}
	for i := range c.Pods {
		node := r.IntN(max(c.Nodes, 1))
		k := perNode[node]
		perNode[node]++
		ns := i % nss
		j := (i / nss) % appsPerNS
		app := nsApp(ns, j)
		labels := map[string]string{"app": appName(app), "tier": tiers[app%len(tiers)], "version": fmt.Sprintf("v%d", (i/nss)%3)}
		if app%5 == 4 {
			// A StatefulSet: every pod has its own name label.
			labels["statefulset.kubernetes.io/pod-name"] = fmt.Sprintf("pod-%06d", i)
			labels["controller-revision-hash"] = hash(ns, app)
		} else {
			labels["pod-template-hash"] = hash(ns, app)
		}
		pod := corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%06d", i), Namespace: nsName(ns), Labels: labels},
			Spec:       corev1.PodSpec{NodeName: fmt.Sprintf("node-%03d", node), Containers: []corev1.Container{{Name: "main"}}},
			Status:     corev1.PodStatus{PodIP: fmt.Sprintf("10.%d.%d.%d", 128+node/64, (node%64)*4+k/250, k%250+1)},
		}
		for _, p := range workloadPorts[app%len(workloadPorts)] {
			pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: p.name, ContainerPort: p.port, Protocol: p.proto})
		}
		out.Pods = append(out.Pods, pod)
	}
	for i := range c.NetworkPolicies {
		out.NetworkPolicies = append(out.NetworkPolicies, workloadNP(r, i, c))
	}
	for i := range c.ClusterPolicies {
		out.ClusterNetworkPolicies = append(out.ClusterNetworkPolicies, workloadCNP(r, i))
	}
}

func matchApp(app int) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": appName(app)}}
}

// firstTCPPort is the name of an app's first TCP container port.
func firstTCPPort(app int) string {
	for _, p := range workloadPorts[app%len(workloadPorts)] {
		if p.proto == corev1.ProtocolTCP {
			return p.name
		}
	}
	return ""
}

// appIn selects two neighbouring apps, as a chart's policy template would.
func appIn(a int) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{appName(a), appName(a + 1)}}}}
}

// workloadNP is the (i / Namespaces)-th policy of namespace i % Namespaces,
// one of seven kinds.
func workloadNP(r *rand.Rand, i int, c Config) networkingv1.NetworkPolicy {
	nss := max(c.Namespaces, 1)
	ns, j := i%nss, i/nss
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(proto *corev1.Protocol, p intstr.IntOrString) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: proto, Port: &p}
	}
	app := nsApp(ns, r.IntN(appsPerNS))
	np := networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: nsName(ns)}}
	spec := &np.Spec
	switch j % 7 {
	case 0:
		np.Name = "default-deny-ingress"
		spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	case 1:
		np.Name = "allow-same-namespace-" + appName(app)
		spec.PodSelector = *matchApp(app)
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
			Ports: []networkingv1.NetworkPolicyPort{port(&tcp, intstr.FromString(firstTCPPort(app)))},
		}}
	case 2:
		np.Name = "allow-team-" + appName(app)
		spec.PodSelector = *matchApp(app)
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": teamOf(r.IntN(workloadTeams))}},
				PodSelector:       appIn(r.IntN(workloadApps)),
			}},
			Ports: []networkingv1.NetworkPolicyPort{port(&tcp, intstr.FromInt32(8080)), port(&tcp, intstr.FromInt32(8443))},
		}}
	case 3:
		np.Name = "allow-monitoring"
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": nsName(1)}},
				PodSelector:       matchApp(nsApp(1, 0)),
			}},
			Ports: []networkingv1.NetworkPolicyPort{port(&tcp, intstr.FromString("metrics"))},
		}}
	case 4:
		np.Name = "allow-office-" + appName(app)
		spec.PodSelector = *matchApp(app)
		b := r.IntN(256)
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("192.168.%d.0/24", b), Except: []string{fmt.Sprintf("192.168.%d.128/25", b)}}}},
			Ports: []networkingv1.NetworkPolicyPort{port(&tcp, intstr.FromInt32(8443)), {Protocol: &tcp, Port: ptr(intstr.FromInt32(30000)), EndPort: ptr(int32(32767))}},
		}}
	case 5:
		np.Name = "egress-dns"
		spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": nsName(0)}},
				PodSelector:       matchApp(nsApp(0, 0)),
			}},
			Ports: []networkingv1.NetworkPolicyPort{port(&udp, intstr.FromInt32(53)), port(&tcp, intstr.FromString("dns-tcp"))},
		}}
	default:
		np.Name = "egress-" + appName(app)
		spec.PodSelector = *matchApp(app)
		spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		spec.Egress = []networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": envs[r.IntN(len(envs))]}},
				PodSelector:       matchApp(r.IntN(workloadApps)),
			}}, Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromInt32(8000)), EndPort: ptr(int32(9000))}, port(&tcp, intstr.FromString("postgres"))}},
			{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}}}},
				Ports: []networkingv1.NetworkPolicyPort{port(&tcp, intstr.FromInt32(443))}},
		}
	}
	if j >= 7 {
		np.Name = fmt.Sprintf("%s-%d", np.Name, j/7)
	}
	return np
}

// workloadCNP selects pods by team namespace and app; half Admin, half
// Baseline.
func workloadCNP(r *rand.Rand, i int) v1alpha2.ClusterNetworkPolicy {
	cnp := v1alpha2.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cnp-%04d", i)}}
	cnp.Spec.Tier = v1alpha2.AdminTier
	if i%2 == 1 {
		cnp.Spec.Tier = v1alpha2.BaselineTier
	}
	cnp.Spec.Priority = int32(r.IntN(1001))
	team := metav1.LabelSelector{MatchLabels: map[string]string{"team": teamOf(r.IntN(workloadTeams))}}
	switch i % 4 {
	case 0:
		cnp.Spec.Subject.Namespaces = &team
	case 1:
		cnp.Spec.Subject.Pods = &v1alpha2.NamespacedPod{NamespaceSelector: team, PodSelector: *appIn(r.IntN(workloadApps))}
	default:
		cnp.Spec.Subject.Pods = &v1alpha2.NamespacedPod{NamespaceSelector: team, PodSelector: *matchApp(r.IntN(workloadApps))}
	}
	actions := []v1alpha2.ClusterNetworkPolicyRuleAction{v1alpha2.ClusterNetworkPolicyRuleActionAccept, v1alpha2.ClusterNetworkPolicyRuleActionDeny, v1alpha2.ClusterNetworkPolicyRuleActionPass}
	tcpPort := func(n int32) v1alpha2.ClusterNetworkPolicyProtocol {
		return v1alpha2.ClusterNetworkPolicyProtocol{TCP: &v1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &v1alpha2.Port{Number: n}}}
	}
	cnp.Spec.Ingress = []v1alpha2.ClusterNetworkPolicyIngressRule{
		{Name: "from-team", Action: actions[r.IntN(3)], From: []v1alpha2.ClusterNetworkPolicyIngressPeer{
			{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": teamOf(r.IntN(workloadTeams))}}}},
			Protocols: []v1alpha2.ClusterNetworkPolicyProtocol{tcpPort(8080), {DestinationNamedPort: "metrics"}}},
		{Name: "from-app", Action: actions[r.IntN(3)], From: []v1alpha2.ClusterNetworkPolicyIngressPeer{
			{Pods: &v1alpha2.NamespacedPod{NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"env": envs[r.IntN(len(envs))]}}, PodSelector: *matchApp(r.IntN(workloadApps))}}},
			Protocols: []v1alpha2.ClusterNetworkPolicyProtocol{{TCP: &v1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &v1alpha2.Port{Range: &v1alpha2.PortRange{Start: 8000, End: 9999}}}}}},
		{Name: "from-nets", Action: v1alpha2.ClusterNetworkPolicyRuleActionDeny, From: []v1alpha2.ClusterNetworkPolicyIngressPeer{
			{Networks: []v1alpha2.CIDR{v1alpha2.CIDR(fmt.Sprintf("203.0.%d.0/24", r.IntN(256))), "2001:db8::/32"}}}},
		{Name: "from-nodes", Action: v1alpha2.ClusterNetworkPolicyRuleActionAccept, From: []v1alpha2.ClusterNetworkPolicyIngressPeer{
			{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "gpu"}}}},
			Protocols: []v1alpha2.ClusterNetworkPolicyProtocol{tcpPort(10250)}},
	}
	cnp.Spec.Egress = []v1alpha2.ClusterNetworkPolicyEgressRule{
		{Name: "to-dns", Action: v1alpha2.ClusterNetworkPolicyRuleActionAccept, To: []v1alpha2.ClusterNetworkPolicyEgressPeer{
			{Pods: &v1alpha2.NamespacedPod{NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": nsName(0)}}, PodSelector: *matchApp(nsApp(0, 0))}}},
			Protocols: []v1alpha2.ClusterNetworkPolicyProtocol{{UDP: &v1alpha2.ClusterNetworkPolicyProtocolUDP{DestinationPort: &v1alpha2.Port{Number: 53}}}, {DestinationNamedPort: "dns-tcp"}}},
		{Name: "to-team", Action: actions[r.IntN(3)], To: []v1alpha2.ClusterNetworkPolicyEgressPeer{
			{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": teamOf(r.IntN(workloadTeams))}}}}},
		{Name: "outside", Action: actions[r.IntN(3)], To: []v1alpha2.ClusterNetworkPolicyEgressPeer{
			{Networks: []v1alpha2.CIDR{"0.0.0.0/0"}}}},
	}
	return cnp
}
