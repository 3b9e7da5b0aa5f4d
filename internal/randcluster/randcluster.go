// Package randcluster generates random but valid clusters and policies
// for differential testing: the evaluator's predictions against the
// kernel's verdicts on real packets. A scenario is a list of Kubernetes
// objects, so a disagreement can be reproduced from its manifests alone.
package randcluster

import (
	"bytes"
	"fmt"
	"math/rand"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/moat-net/moat/api/v1alpha2"
)

// Doc is one object of a scenario.
type Doc struct {
	Kind, Name string
	Object     any
}

// Scenario is a generated cluster: its objects and the external peers
// whose flows are probed too.
type Scenario struct {
	Seed  int64
	Docs  []Doc
	Peers []netip.Addr
}

// Manifests renders the scenario as multi-document YAML, the input of
// `moat matrix` and `moat lab run`.
func (s *Scenario) Manifests() ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# randcluster seed %d\n", s.Seed)
	for i, d := range s.Docs {
		y, err := yaml.Marshal(d.Object)
		if err != nil {
			return nil, fmt.Errorf("marshal %s %s: %w", d.Kind, d.Name, err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	return b.Bytes(), nil
}

// Without returns a copy without document i: a step of shrinking a
// failing scenario to a minimal reproduction.
func (s *Scenario) Without(i int) *Scenario {
	out := *s
	out.Docs = append(append([]Doc{}, s.Docs[:i]...), s.Docs[i+1:]...)
	return &out
}

// Config bounds what Generate makes.
type Config struct {
	Nodes                int
	MinPods, MaxPods     int
	Namespaces           int
	MaxNetworkPolicies   int
	MaxClusterPolicies   int
	HostNetworkPod       bool
	ExternalPeers        bool
	SCTP                 bool
	IPv6                 bool
	MaxRulesPerDirection int
	// PodCIDRs gives each node spec.podCIDRs (its pods' /24 and /64) and
	// its gateway address in the /24 among its status addresses
	// (GatewayAddr4), some pods an address from another node's CIDR (a
	// CNI with IP pools of its own), and, with ExternalPeers, a peer
	// inside node-0's CIDRs that is no pod: the source the agent's
	// anti-spoofing rules drop on node-0.
	PodCIDRs bool
}

// Default is the shape the issue asks for: 2 nodes, 6-12 pods in 2-3
// namespaces, a host-network pod, 2 external peers, dual stack.
func Default() Config {
	return Config{Nodes: 2, MinPods: 6, MaxPods: 12, Namespaces: 3, MaxNetworkPolicies: 4,
		MaxClusterPolicies: 3, HostNetworkPod: true, ExternalPeers: true, IPv6: true, MaxRulesPerDirection: 3}
}

type gen struct {
	r   *rand.Rand
	cfg Config
	sc  *Scenario
	ns  []string
}

var (
	appValues  = []string{"web", "db", "api", "cache"}
	tierValues = []string{"fe", "be"}
	teamValues = []string{"red", "blue"}
	// portPool holds container ports; names repeat with different
	// numbers so named ports resolve differently per pod.
	portPool = []corev1.ContainerPort{
		{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP},
		{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "https", ContainerPort: 443, Protocol: corev1.ProtocolTCP},
		{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
		{Name: "pg", ContainerPort: 5432, Protocol: corev1.ProtocolTCP},
		{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
		{Name: "stats", ContainerPort: 8125, Protocol: corev1.ProtocolUDP},
	}
	sctpPort = corev1.ContainerPort{Name: "sig", ContainerPort: 3868, Protocol: corev1.ProtocolSCTP}
)

// NodeAddr4 and friends fix the address plan, so tests can tell pods,
// nodes and peers apart.
func NodeAddr4(i int) netip.Addr { return netip.AddrFrom4([4]byte{192, 168, 77, byte(10 + i)}) }

// NodeAddr6 is node i's IPv6 address.
func NodeAddr6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0x00, 0, 0x77, 14: 0, 15: byte(10 + i)})
}

func podAddr4(node, i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 77, byte(node), byte(10 + i)})
}
func podAddr6(node, i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0x00, 0, 0x78, 7: byte(node), 15: byte(10 + i)})
}

// GatewayAddr4 is node i's address inside its IPv4 pod CIDR
// (Config.PodCIDRs), where a bridge or ptp CNI puts the node's gateway
// address; a Node rarely lists it, but one that does must not have its
// own connections taken for forged ones.
func GatewayAddr4(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 77, byte(i), 1}) }

// Peer4 and Peer6 are the external peers.
var (
	Peer4 = netip.MustParseAddr("203.0.113.50")
	Peer6 = netip.MustParseAddr("2001:db8:77::50")
)

// StrayPeer4 and StrayPeer6 are inside node-0's pod CIDRs (Config.PodCIDRs)
// but no pod's: a forged or not yet known source.
var (
	StrayPeer4 = podAddr4(0, 240)
	StrayPeer6 = podAddr6(0, 240)
)

// Generate makes one scenario from a seed.
func Generate(seed int64, cfg Config) *Scenario {
	g := &gen{r: rand.New(rand.NewSource(seed)), cfg: cfg, sc: &Scenario{Seed: seed}}
	g.nodes()
	g.namespaces()
	g.pods()
	for i, n := 0, g.r.Intn(cfg.MaxNetworkPolicies+1); i < n; i++ {
		g.networkPolicy(i)
	}
	for i, n := 0, g.r.Intn(cfg.MaxClusterPolicies+1); i < n; i++ {
		g.clusterPolicy(i)
	}
	if cfg.ExternalPeers {
		g.sc.Peers = append(g.sc.Peers, Peer4)
		if cfg.IPv6 {
			g.sc.Peers = append(g.sc.Peers, Peer6)
		}
		if cfg.PodCIDRs {
			g.sc.Peers = append(g.sc.Peers, StrayPeer4)
			if cfg.IPv6 {
				g.sc.Peers = append(g.sc.Peers, StrayPeer6)
			}
		}
	}
	return g.sc
}

func (g *gen) add(kind, name string, obj any) {
	g.sc.Docs = append(g.sc.Docs, Doc{Kind: kind, Name: name, Object: obj})
}

func (g *gen) pick(ss []string) string { return ss[g.r.Intn(len(ss))] }

func (g *gen) nodes() {
	for i := 0; i < g.cfg.Nodes; i++ {
		n := &corev1.Node{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i), Labels: map[string]string{"zone": fmt.Sprintf("z%d", i%2), "role": g.pick([]string{"edge", "core"})}},
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: NodeAddr4(i).String()}}
		if g.cfg.IPv6 {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: NodeAddr6(i).String()})
		}
		if g.cfg.PodCIDRs {
			n.Spec.PodCIDRs = []string{netip.PrefixFrom(podAddr4(i, 0), 24).Masked().String()}
			if g.cfg.IPv6 {
				n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, netip.PrefixFrom(podAddr6(i, 0), 64).Masked().String())
			}
			n.Spec.PodCIDR = n.Spec.PodCIDRs[0]
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: GatewayAddr4(i).String()})
		}
		g.add("Node", n.Name, n)
	}
}

func (g *gen) namespaces() {
	n := 2 + g.r.Intn(max(1, g.cfg.Namespaces-1))
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("ns-%c", 'a'+i)
		g.ns = append(g.ns, name)
		o := &corev1.Namespace{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": g.pick(teamValues)}},
		}
		g.add("Namespace", name, o)
	}
}

func (g *gen) pods() {
	n := g.cfg.MinPods + g.r.Intn(g.cfg.MaxPods-g.cfg.MinPods+1)
	perNode := make([]int, g.cfg.Nodes)
	for i := 0; i < n; i++ {
		node := g.r.Intn(g.cfg.Nodes)
		idx := perNode[node]
		perNode[node]++
		p := &corev1.Pod{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: g.pick(g.ns),
				Labels: map[string]string{"app": g.pick(appValues), "tier": g.pick(tierValues)}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", node)},
		}
		var ports []corev1.ContainerPort
		used := map[string]bool{}
		for k, m := 0, 1+g.r.Intn(3); k < m; k++ {
			cp := portPool[g.r.Intn(len(portPool))]
			key := fmt.Sprint(cp.ContainerPort, cp.Protocol)
			if used[key] || used[cp.Name] {
				continue
			}
			used[key], used[cp.Name] = true, true
			ports = append(ports, cp)
		}
		if g.cfg.SCTP && g.r.Intn(4) == 0 {
			ports = append(ports, sctpPort)
		}
		p.Spec.Containers = []corev1.Container{{Name: "c", Image: "none", Ports: ports}}
		pool, at := node, idx
		if g.cfg.PodCIDRs && g.cfg.Nodes > 1 && g.r.Intn(4) == 0 {
			// An address from another node's CIDR, apart from that
			// node's own pods' (10+idx).
			pool, at = (node+1+g.r.Intn(g.cfg.Nodes-1))%g.cfg.Nodes, 100+i
		}
		p.Status.PodIPs = []corev1.PodIP{{IP: podAddr4(pool, at).String()}}
		if g.cfg.IPv6 && g.r.Intn(5) != 0 {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: podAddr6(pool, at).String()})
		}
		p.Status.PodIP = p.Status.PodIPs[0].IP
		g.add("Pod", p.Namespace+"/"+p.Name, p)
	}
	if g.cfg.HostNetworkPod {
		p := &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: "node-exporter", Namespace: g.ns[0], Labels: map[string]string{"app": "exporter"}},
			Spec: corev1.PodSpec{NodeName: "node-0", HostNetwork: true,
				Containers: []corev1.Container{{Name: "c", Image: "none", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100, Protocol: corev1.ProtocolTCP}}}}},
		}
		p.Status.PodIPs = []corev1.PodIP{{IP: NodeAddr4(0).String()}}
		if g.cfg.IPv6 {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: NodeAddr6(0).String()})
		}
		p.Status.PodIP = p.Status.PodIPs[0].IP
		g.add("Pod", p.Namespace+"/"+p.Name, p)
	}
}

// selector returns a random label selector over pod labels: empty,
// matchLabels or matchExpressions.
func (g *gen) podSelector() metav1.LabelSelector {
	switch g.r.Intn(5) {
	case 0:
		return metav1.LabelSelector{}
	case 1, 2:
		return metav1.LabelSelector{MatchLabels: map[string]string{"app": g.pick(appValues)}}
	case 3:
		return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{g.pick(appValues), g.pick(appValues)}}}}
	default:
		op := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist}[g.r.Intn(3)]
		req := metav1.LabelSelectorRequirement{Key: "tier", Operator: op}
		if op == metav1.LabelSelectorOpNotIn {
			req.Values = []string{g.pick(tierValues)}
		}
		return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{req}}
	}
}

func (g *gen) nsSelector() metav1.LabelSelector {
	switch g.r.Intn(3) {
	case 0:
		return metav1.LabelSelector{}
	case 1:
		return metav1.LabelSelector{MatchLabels: map[string]string{"team": g.pick(teamValues)}}
	default:
		return metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": g.pick(g.ns)}}
	}
}

// cidr picks a block that covers pods, nodes or peers, with an except
// inside it sometimes.
func (g *gen) cidr() (string, []string) {
	type block struct {
		cidr   string
		except []string
	}
	v4 := []block{
		{"10.77.0.0/16", []string{"10.77.1.0/24"}},
		{"10.77.0.0/24", []string{"10.77.0.8/29"}},
		{"10.77.1.0/24", nil},
		{"192.168.77.0/24", nil},
		{"203.0.113.0/24", []string{"203.0.113.48/28"}},
		{"0.0.0.0/0", []string{"10.0.0.0/8"}},
		{"0.0.0.0/0", nil},
	}
	v6 := []block{
		{"fd00:0:78::/48", []string{"fd00:0:78:0:100::/72"}},
		{"fd00:0:77::/64", nil},
		{"2001:db8:77::/64", []string{"2001:db8:77::/120"}},
		{"::/0", nil},
	}
	bs := v4
	if g.cfg.IPv6 && g.r.Intn(3) == 0 {
		bs = v6
	}
	b := bs[g.r.Intn(len(bs))]
	if g.r.Intn(2) == 0 {
		return b.cidr, nil
	}
	return b.cidr, b.except
}

func (g *gen) npPorts() []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for i, n := 0, g.r.Intn(3); i < n; i++ {
		proto := corev1.ProtocolTCP
		if g.r.Intn(4) == 0 {
			proto = corev1.ProtocolUDP
		}
		if g.cfg.SCTP && g.r.Intn(8) == 0 {
			proto = corev1.ProtocolSCTP
		}
		p := networkingv1.NetworkPolicyPort{}
		if g.r.Intn(3) != 0 {
			p.Protocol = &proto
		}
		switch g.r.Intn(4) {
		case 0: // all ports of the protocol
		case 1:
			cp := portPool[g.r.Intn(len(portPool))]
			v := intstr.FromString(cp.Name)
			p.Port = &v
		case 2:
			cp := portPool[g.r.Intn(len(portPool))]
			v := intstr.FromInt32(cp.ContainerPort)
			p.Port = &v
		default:
			start := []int32{1, 50, 80, 443, 5000, 8000}[g.r.Intn(6)]
			end := start + []int32{0, 10, 500, 4000, 20000}[g.r.Intn(5)]
			v := intstr.FromInt32(start)
			p.Port, p.EndPort = &v, &end
		}
		out = append(out, p)
	}
	return out
}

func (g *gen) npPeers() []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for i, n := 0, g.r.Intn(3); i < n; i++ {
		var p networkingv1.NetworkPolicyPeer
		switch g.r.Intn(4) {
		case 0:
			s := g.podSelector()
			p.PodSelector = &s
		case 1:
			s := g.nsSelector()
			p.NamespaceSelector = &s
		case 2:
			s, n := g.podSelector(), g.nsSelector()
			p.PodSelector, p.NamespaceSelector = &s, &n
		default:
			c, ex := g.cidr()
			p.IPBlock = &networkingv1.IPBlock{CIDR: c, Except: ex}
		}
		out = append(out, p)
	}
	return out
}

func (g *gen) networkPolicy(i int) {
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("np-%d", i), Namespace: g.pick(g.ns)},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: g.podSelector()},
	}
	for k, n := 0, g.r.Intn(g.cfg.MaxRulesPerDirection); k < n; k++ {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: g.npPeers(), Ports: g.npPorts()})
	}
	for k, n := 0, g.r.Intn(g.cfg.MaxRulesPerDirection); k < n; k++ {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: g.npPeers(), Ports: g.npPorts()})
	}
	switch g.r.Intn(4) {
	case 0:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	case 1:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	}
	g.add("NetworkPolicy", np.Namespace+"/"+np.Name, np)
}

func (g *gen) protocols() []v1alpha2.ClusterNetworkPolicyProtocol {
	var out []v1alpha2.ClusterNetworkPolicyProtocol
	for i, n := 0, g.r.Intn(3); i < n; i++ {
		var port *v1alpha2.Port
		switch g.r.Intn(3) {
		case 0:
		case 1:
			port = &v1alpha2.Port{Number: portPool[g.r.Intn(len(portPool))].ContainerPort}
		default:
			start := []int32{1, 53, 80, 443, 5000}[g.r.Intn(5)]
			port = &v1alpha2.Port{Range: &v1alpha2.PortRange{Start: start, End: start + []int32{1, 100, 9000}[g.r.Intn(3)]}}
		}
		var p v1alpha2.ClusterNetworkPolicyProtocol
		switch g.r.Intn(5) {
		case 0, 1:
			p.TCP = &v1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: port}
		case 2:
			p.UDP = &v1alpha2.ClusterNetworkPolicyProtocolUDP{DestinationPort: port}
		case 3:
			if g.cfg.SCTP {
				p.SCTP = &v1alpha2.ClusterNetworkPolicyProtocolSCTP{DestinationPort: port}
			} else {
				p.TCP = &v1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: port}
			}
		default:
			p.DestinationNamedPort = portPool[g.r.Intn(len(portPool))].Name
		}
		out = append(out, p)
	}
	return out
}

func (g *gen) action() v1alpha2.ClusterNetworkPolicyRuleAction {
	return []v1alpha2.ClusterNetworkPolicyRuleAction{
		v1alpha2.ClusterNetworkPolicyRuleActionAccept,
		v1alpha2.ClusterNetworkPolicyRuleActionDeny,
		v1alpha2.ClusterNetworkPolicyRuleActionPass,
	}[g.r.Intn(3)]
}

func (g *gen) networks() []v1alpha2.CIDR {
	var out []v1alpha2.CIDR
	for i, n := 0, 1+g.r.Intn(2); i < n; i++ {
		c, _ := g.cidr()
		out = append(out, v1alpha2.CIDR(c))
	}
	return out
}

func (g *gen) nodeSelector() *metav1.LabelSelector {
	if g.r.Intn(2) == 0 {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"zone": fmt.Sprintf("z%d", g.r.Intn(2))}}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{"role": g.pick([]string{"edge", "core"})}}
}

func (g *gen) namespacedPod() *v1alpha2.NamespacedPod {
	return &v1alpha2.NamespacedPod{NamespaceSelector: g.nsSelector(), PodSelector: g.podSelector()}
}

func (g *gen) clusterPolicy(i int) {
	tier := v1alpha2.AdminTier
	if g.r.Intn(2) == 0 {
		tier = v1alpha2.BaselineTier
	}
	c := &v1alpha2.ClusterNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha2.SchemeGroupVersion.String(), Kind: "ClusterNetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cnp-%d", i)},
		Spec:       v1alpha2.ClusterNetworkPolicySpec{Tier: tier, Priority: int32(g.r.Intn(3) * 10)},
	}
	if g.r.Intn(2) == 0 {
		s := g.nsSelector()
		c.Spec.Subject.Namespaces = &s
	} else {
		c.Spec.Subject.Pods = g.namespacedPod()
	}
	for k, n := 0, 1+g.r.Intn(g.cfg.MaxRulesPerDirection); k < n; k++ {
		if g.r.Intn(2) == 0 {
			continue
		}
		r := v1alpha2.ClusterNetworkPolicyIngressRule{Name: fmt.Sprintf("in-%d", k), Action: g.action(), Protocols: g.protocols()}
		for j, m := 0, 1+g.r.Intn(2); j < m; j++ {
			p := g.cnpPeer()
			r.From = append(r.From, v1alpha2.ClusterNetworkPolicyIngressPeer{Namespaces: p.Namespaces, Pods: p.Pods, Networks: p.Networks, Nodes: p.Nodes})
		}
		c.Spec.Ingress = append(c.Spec.Ingress, r)
	}
	for k, n := 0, 1+g.r.Intn(g.cfg.MaxRulesPerDirection); k < n; k++ {
		if g.r.Intn(2) == 0 {
			continue
		}
		r := v1alpha2.ClusterNetworkPolicyEgressRule{Name: fmt.Sprintf("eg-%d", k), Action: g.action(), Protocols: g.protocols()}
		for j, m := 0, 1+g.r.Intn(2); j < m; j++ {
			r.To = append(r.To, g.cnpPeer())
		}
		c.Spec.Egress = append(c.Spec.Egress, r)
	}
	g.add("ClusterNetworkPolicy", c.Name, c)
}

// cnpPeer is one random peer of the kinds both directions share (NPEP-127:
// ingress has the same namespaces, pods, networks and nodes as egress).
func (g *gen) cnpPeer() v1alpha2.ClusterNetworkPolicyEgressPeer {
	var p v1alpha2.ClusterNetworkPolicyEgressPeer
	switch g.r.Intn(4) {
	case 0:
		s := g.nsSelector()
		p.Namespaces = &s
	case 1:
		p.Pods = g.namespacedPod()
	case 2:
		p.Networks = g.networks()
	default:
		p.Nodes = g.nodeSelector()
	}
	return p
}
