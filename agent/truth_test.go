package agent

// The agent's whole informer path (transforms, label projection and
// interning, the update filters, the incremental compiler, the Syncer's
// patches) against the truth: a full policy.Compile of the objects as
// the fake API server holds them, converted with every label, programmed
// into a fresh table. TestIncrementalEqualsFull compares with a full
// compilation of the agent's own caches, so a bug in what the caches keep
// would be on both of its sides; here it is on one.

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// lastProgramDP remembers the last Program synced.
type lastProgramDP struct {
	*testDP
	last atomic.Pointer[policy.Program]
}

func (d *lastProgramDP) Sync(ctx context.Context, prog *policy.Program) (nft.Result, error) {
	d.last.Store(prog)
	return d.testDP.Sync(ctx, prog)
}

// truthRun changes the fake API server's objects at random. freed are
// the addresses of deleted pods, which new pods often take; spNP and
// spCNP are spare policies of other random clusters to create or swap
// in; self is the agent's node, never deleted.
type truthRun struct {
	t     *testing.T
	r     *rand.Rand
	c     *fakeCluster
	ctx   context.Context
	seq   int
	freed []string
	spNP  []*networkingv1.NetworkPolicy
	spCNP []*v1alpha2.ClusterNetworkPolicy
	self  string
}

// toUnstructured converts a typed object for the dynamic client.
func toUnstructured(t *testing.T, o any) *unstructured.Unstructured {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func (s *truthRun) pods() []corev1.Pod {
	l, err := s.c.kube.CoreV1().Pods("").List(s.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return l.Items
}

func (s *truthRun) nss() []corev1.Namespace {
	l, err := s.c.kube.CoreV1().Namespaces().List(s.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return l.Items
}

func (s *truthRun) nodes() []corev1.Node {
	l, err := s.c.kube.CoreV1().Nodes().List(s.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return l.Items
}

func (s *truthRun) policies(gvr int) []unstructured.Unstructured {
	g := networkPolicyGVR
	if gvr == 1 {
		g = clusterNetworkPolicyGVR
	}
	l, err := s.c.dyn.Resource(g).List(s.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return l.Items
}

// pickPod returns a random pod of the API server, nil if none.
func (s *truthRun) pickPod() *corev1.Pod {
	ps := s.pods()
	if len(ps) == 0 {
		return nil
	}
	p := ps[s.r.IntN(len(ps))]
	return &p
}

// labels: read keys app/tier, the key "color" that only some spare
// policies read (so the key set grows and shrinks), and noise no policy
// reads.
func (s *truthRun) labels() map[string]string {
	l := map[string]string{}
	if s.r.IntN(6) != 0 {
		l["app"] = []string{"web", "db", "api", "cache"}[s.r.IntN(4)]
	}
	if s.r.IntN(3) != 0 {
		l["tier"] = []string{"fe", "be"}[s.r.IntN(2)]
	}
	if s.r.IntN(2) == 0 {
		l["color"] = []string{"red", "green"}[s.r.IntN(2)]
	}
	l["pod-template-hash"] = strconv.Itoa(s.r.IntN(5))
	return l
}

// freshIP returns an address for a pod on node: half the time a freed
// one (reused), else a new one, sometimes with an IPv6 one.
func (s *truthRun) freshIP(node string) []string {
	if len(s.freed) > 0 && s.r.IntN(2) == 0 {
		i := s.r.IntN(len(s.freed))
		ip := s.freed[i]
		s.freed = slices.Delete(s.freed, i, i+1)
		return []string{ip}
	}
	s.seq++
	var n int
	fmt.Sscanf(node, "node-%d", &n)
	out := []string{fmt.Sprintf("10.77.%d.%d", n, 150+s.seq%100)}
	if s.r.IntN(2) == 0 {
		out = append(out, fmt.Sprintf("fd00:0:0:78:%d::%x", n, 150+s.seq%100))
	}
	return out
}

// setIPs sets a pod's status addresses.
func setIPs(p *corev1.Pod, ips []string) {
	p.Status.PodIPs = nil
	p.Status.PodIP = ""
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
}

func (s *truthRun) update(p *corev1.Pod) {
	if _, err := s.c.kube.CoreV1().Pods(p.Namespace).Update(s.ctx, p, metav1.UpdateOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

// nodeName returns a random node, sometimes one that does not exist.
func (s *truthRun) nodeName() string {
	ns := s.nodes()
	if len(ns) == 0 || s.r.IntN(12) == 0 {
		return "node-7" // no such node
	}
	return ns[s.r.IntN(len(ns))].Name
}

// step makes one random change and says what it did.
func (s *truthRun) step() string {
	switch s.r.IntN(22) {
	case 0, 1: // relabel, read and unread keys
		p := s.pickPod()
		if p == nil {
			return "nothing"
		}
		p.Labels = s.labels()
		s.update(p)
		return fmt.Sprintf("relabel %s/%s %v", p.Namespace, p.Name, p.Labels)
	case 2: // only unread labels change
		p := s.pickPod()
		if p == nil {
			return "nothing"
		}
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels["pod-template-hash"] = strconv.Itoa(s.r.IntN(50))
		p.Labels["noise"] = strconv.Itoa(s.r.IntN(50))
		s.update(p)
		return "noise-relabel " + p.Namespace + "/" + p.Name
	case 3: // readdress: fresh, freed (reused), a live pod's, none
		p := s.pickPod()
		if p == nil {
			return "nothing"
		}
		switch s.r.IntN(4) {
		case 0:
			setIPs(p, nil)
		case 1:
			if o := s.pickPod(); o != nil && len(o.Status.PodIPs) > 0 {
				setIPs(p, []string{o.Status.PodIPs[0].IP})
			}
		default:
			for _, ip := range p.Status.PodIPs {
				if !p.Spec.HostNetwork {
					s.freed = append(s.freed, ip.IP)
				}
			}
			setIPs(p, s.freshIP(p.Spec.NodeName))
		}
		s.update(p)
		return fmt.Sprintf("readdress %s/%s %v", p.Namespace, p.Name, p.Status.PodIPs)
	case 4, 5: // delete, maybe re-create with the same name elsewhere
		p := s.pickPod()
		if p == nil || len(s.pods()) < 4 {
			return "nothing"
		}
		if err := s.c.kube.CoreV1().Pods(p.Namespace).Delete(s.ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			s.t.Fatal(err)
		}
		if !p.Spec.HostNetwork {
			for _, ip := range p.Status.PodIPs {
				s.freed = append(s.freed, ip.IP)
			}
		}
		if s.r.IntN(2) == 0 {
			return "delete " + p.Namespace + "/" + p.Name
		}
		q := p.DeepCopy()
		q.ResourceVersion = ""
		q.UID = types.UID(fmt.Sprint("uid-", s.r.Uint32()))
		q.Labels = s.labels()
		q.Spec.NodeName = s.nodeName()
		setIPs(q, s.freshIP(q.Spec.NodeName))
		if _, err := s.c.kube.CoreV1().Pods(q.Namespace).Create(s.ctx, q, metav1.CreateOptions{}); err != nil {
			s.t.Fatal(err)
		}
		return fmt.Sprintf("delete and re-create %s/%s on %s %v", q.Namespace, q.Name, q.Spec.NodeName, q.Status.PodIPs)
	case 6, 7: // add a pod, often with a deleted pod's address
		nss := s.nss()
		if len(nss) == 0 {
			return "nothing"
		}
		s.seq++
		node := s.nodeName()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nss[s.r.IntN(len(nss))].Name, Name: fmt.Sprint("ev-", s.seq), Labels: s.labels(), UID: types.UID(fmt.Sprint("uid-", s.r.Uint32()))},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Ports: s.ports()}}}}
		if s.r.IntN(8) == 0 {
			always := corev1.ContainerRestartPolicyAlways
			p.Spec.InitContainers = []corev1.Container{{Name: "side", RestartPolicy: &always, Ports: s.ports()}}
		}
		setIPs(p, s.freshIP(node))
		p.Status.Phase = corev1.PodRunning
		if _, err := s.c.kube.CoreV1().Pods(p.Namespace).Create(s.ctx, p, metav1.CreateOptions{}); err != nil {
			s.t.Fatal(err)
		}
		return fmt.Sprintf("add %s/%s on %s %v %v", p.Namespace, p.Name, node, p.Status.PodIPs, p.Spec.Containers[0].Ports)
	case 8: // named ports change: renamed, renumbered, sidecar
		p := s.pickPod()
		if p == nil {
			return "nothing"
		}
		switch s.r.IntN(3) {
		case 0:
			p.Spec.Containers[0].Ports = s.ports()
		case 1:
			for i := range p.Spec.Containers[0].Ports {
				p.Spec.Containers[0].Ports[i].ContainerPort++
			}
		default:
			always := corev1.ContainerRestartPolicyAlways
			if len(p.Spec.InitContainers) > 0 {
				p.Spec.InitContainers = nil
			} else {
				p.Spec.InitContainers = []corev1.Container{{Name: "side", RestartPolicy: &always, Ports: s.ports()}}
			}
		}
		s.update(p)
		return fmt.Sprintf("ports %s/%s %v %v", p.Namespace, p.Name, p.Spec.Containers[0].Ports, p.Spec.InitContainers)
	case 9: // finish a pod (the agent's field selector would drop it; the fake sends it)
		p := s.pickPod()
		if p == nil {
			return "nothing"
		}
		p.Status.Phase = corev1.PodSucceeded
		s.update(p)
		return "finish " + p.Namespace + "/" + p.Name
	case 10: // status noise only
		p := s.pickPod()
		if p == nil {
			return "nothing"
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionStatus([]string{"True", "False"}[s.r.IntN(2)])}}
		p.Annotations = map[string]string{"x": strconv.Itoa(s.r.IntN(100))}
		s.update(p)
		return "status noise " + p.Namespace + "/" + p.Name
	case 11, 12: // namespace relabel, delete, re-create
		nss := s.nss()
		if len(nss) == 0 {
			n := corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns-a", Labels: map[string]string{"team": "red"}}}
			if _, err := s.c.kube.CoreV1().Namespaces().Create(s.ctx, &n, metav1.CreateOptions{}); err != nil {
				s.t.Fatal(err)
			}
			return "create namespace ns-a"
		}
		n := nss[s.r.IntN(len(nss))]
		switch s.r.IntN(4) {
		case 0:
			if err := s.c.kube.CoreV1().Namespaces().Delete(s.ctx, n.Name, metav1.DeleteOptions{}); err != nil {
				s.t.Fatal(err)
			}
			if s.r.IntN(2) == 0 {
				return "delete namespace " + n.Name
			}
			n.ResourceVersion = ""
			n.Labels = map[string]string{"team": []string{"red", "blue"}[s.r.IntN(2)]}
			if _, err := s.c.kube.CoreV1().Namespaces().Create(s.ctx, &n, metav1.CreateOptions{}); err != nil {
				s.t.Fatal(err)
			}
			return "delete and re-create namespace " + n.Name
		default:
			n.Labels = map[string]string{"team": []string{"red", "blue"}[s.r.IntN(2)]}
			if s.r.IntN(3) == 0 {
				n.Labels["color"] = "red"
			}
			if _, err := s.c.kube.CoreV1().Namespaces().Update(s.ctx, &n, metav1.UpdateOptions{}); err != nil {
				s.t.Fatal(err)
			}
			return fmt.Sprintf("relabel namespace %s %v", n.Name, n.Labels)
		}
	case 13, 14: // node addresses and labels; other nodes deleted and re-created
		nodes := s.nodes()
		n := nodes[s.r.IntN(len(nodes))]
		k := 0
		fmt.Sscanf(n.Name, "node-%d", &k)
		switch s.r.IntN(5) {
		case 0: // lose addresses
			if len(n.Status.Addresses) > 0 {
				i := s.r.IntN(len(n.Status.Addresses))
				n.Status.Addresses = slices.Delete(n.Status.Addresses, i, i+1)
			}
		case 1: // a Hostname address that is an IP, or a DNS name
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: []corev1.NodeAddressType{corev1.NodeHostName, corev1.NodeExternalDNS}[s.r.IntN(2)], Address: []string{randcluster.NodeAddr4(k + 5).String(), "host.example"}[s.r.IntN(2)]})
		case 2: // back to the plan
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: randcluster.NodeAddr4(k).String()}, {Type: corev1.NodeInternalIP, Address: randcluster.NodeAddr6(k).String()}}
		case 3:
			n.Labels = map[string]string{"zone": []string{"z0", "z1"}[s.r.IntN(2)], "role": []string{"edge", "core"}[s.r.IntN(2)]}
		default:
			if n.Name == s.self {
				return "nothing"
			}
			if err := s.c.kube.CoreV1().Nodes().Delete(s.ctx, n.Name, metav1.DeleteOptions{}); err != nil {
				s.t.Fatal(err)
			}
			if s.r.IntN(2) == 0 {
				return "delete node " + n.Name
			}
			n.ResourceVersion = ""
			if _, err := s.c.kube.CoreV1().Nodes().Create(s.ctx, &n, metav1.CreateOptions{}); err != nil {
				s.t.Fatal(err)
			}
			return "delete and re-create node " + n.Name
		}
		if _, err := s.c.kube.CoreV1().Nodes().Update(s.ctx, &n, metav1.UpdateOptions{}); err != nil {
			s.t.Fatal(err)
		}
		return fmt.Sprintf("node %s %v %v", n.Name, n.Labels, n.Status.Addresses)
	case 15, 16, 17: // NetworkPolicies
		return s.changeNP()
	default: // ClusterNetworkPolicies
		return s.changeCNP()
	}
}

// ports returns 1-3 distinct named container ports.
func (s *truthRun) ports() []corev1.ContainerPort {
	pool := []corev1.ContainerPort{
		{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP},
		{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "https", ContainerPort: 443, Protocol: corev1.ProtocolTCP},
		{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
		{Name: "pg", ContainerPort: 5432, Protocol: corev1.ProtocolTCP},
		{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
	}
	var out []corev1.ContainerPort
	used := map[string]bool{}
	for range 1 + s.r.IntN(3) {
		cp := pool[s.r.IntN(len(pool))]
		if used[cp.Name] || used[fmt.Sprint(cp.ContainerPort)] {
			continue
		}
		used[cp.Name], used[fmt.Sprint(cp.ContainerPort)] = true, true
		out = append(out, cp)
	}
	return out
}

// colorNP reads the key "color" that pods carry but few policies read.
func (s *truthRun) colorNP(ns, name string) *networkingv1.NetworkPolicy {
	c := []string{"red", "green"}[s.r.IntN(2)]
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"color": c}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "color", Operator: metav1.LabelSelectorOpExists}}}, NamespaceSelector: &metav1.LabelSelector{}},
			}}},
		},
	}
}

// changeNP adds, replaces, deletes or deletes and re-creates a
// NetworkPolicy.
func (s *truthRun) changeNP() string {
	nps := s.policies(0)
	res := s.c.dyn.Resource(networkPolicyGVR)
	nss := s.nss()
	op := s.r.IntN(5)
	if len(nps) == 0 {
		op = 0
	}
	if len(nss) == 0 && op < 2 {
		return "nothing"
	}
	switch op {
	case 0, 1: // add (a spare or a color one)
		s.seq++
		ns := nss[s.r.IntN(len(nss))].Name
		name := fmt.Sprint("evnp-", s.seq)
		np := s.colorNP(ns, name)
		if op == 1 && len(s.spNP) > 0 {
			np = s.spNP[s.r.IntN(len(s.spNP))].DeepCopy()
			np.Namespace, np.Name, np.ResourceVersion = ns, name, ""
		}
		np.UID = types.UID(fmt.Sprint("uid-", s.r.Uint32()))
		np.Generation = 1
		if _, err := res.Namespace(ns).Create(s.ctx, toUnstructured(s.t, np), metav1.CreateOptions{}); err != nil {
			s.t.Fatal(err)
		}
		return "add np " + ns + "/" + name
	case 2: // replace spec
		u := nps[s.r.IntN(len(nps))]
		np := s.colorNP(u.GetNamespace(), u.GetName())
		if s.r.IntN(2) == 0 && len(s.spNP) > 0 {
			np = s.spNP[s.r.IntN(len(s.spNP))].DeepCopy()
			np.Namespace, np.Name = u.GetNamespace(), u.GetName()
		}
		np.ResourceVersion = u.GetResourceVersion()
		np.UID = u.GetUID()
		np.Generation = u.GetGeneration() + 1
		if _, err := res.Namespace(np.Namespace).Update(s.ctx, toUnstructured(s.t, np), metav1.UpdateOptions{}); err != nil {
			s.t.Fatal(err)
		}
		return "replace np " + np.Namespace + "/" + np.Name
	default: // delete, maybe re-create
		u := nps[s.r.IntN(len(nps))]
		if err := res.Namespace(u.GetNamespace()).Delete(s.ctx, u.GetName(), metav1.DeleteOptions{}); err != nil {
			s.t.Fatal(err)
		}
		if s.r.IntN(2) == 0 {
			return "delete np " + u.GetNamespace() + "/" + u.GetName()
		}
		u.SetResourceVersion("")
		u.SetUID(types.UID(fmt.Sprint("uid-", s.r.Uint32())))
		if _, err := res.Namespace(u.GetNamespace()).Create(s.ctx, &u, metav1.CreateOptions{}); err != nil {
			s.t.Fatal(err)
		}
		return "delete and re-create np " + u.GetNamespace() + "/" + u.GetName()
	}
}

// changeCNP adds a ClusterNetworkPolicy, flips its tier, changes its
// priority, spec or node peers, or deletes (and maybe re-creates) it.
func (s *truthRun) changeCNP() string {
	cnps := s.policies(1)
	res := s.c.dyn.Resource(clusterNetworkPolicyGVR)
	op := s.r.IntN(7)
	if len(cnps) == 0 {
		op = 0
	}
	if op == 0 {
		if len(s.spCNP) == 0 {
			return "nothing"
		}
		c := s.spCNP[s.r.IntN(len(s.spCNP))].DeepCopy()
		s.seq++
		c.Name, c.ResourceVersion, c.UID, c.Generation = fmt.Sprint("evcnp-", s.seq), "", types.UID(fmt.Sprint("uid-", s.r.Uint32())), 1
		if _, err := res.Create(s.ctx, toUnstructured(s.t, c), metav1.CreateOptions{}); err != nil {
			s.t.Fatal(err)
		}
		return "add cnp " + c.Name
	}
	u := cnps[s.r.IntN(len(cnps))]
	var c v1alpha2.ClusterNetworkPolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c); err != nil {
		s.t.Fatal(err)
	}
	what := ""
	switch op {
	case 1: // tier flip
		if c.Spec.Tier == v1alpha2.AdminTier {
			c.Spec.Tier = v1alpha2.BaselineTier
		} else {
			c.Spec.Tier = v1alpha2.AdminTier
		}
		what = "tier " + string(c.Spec.Tier)
	case 2:
		c.Spec.Priority = int32(s.r.IntN(4) * 10)
		what = fmt.Sprint("priority ", c.Spec.Priority)
	case 3: // another spec; the subject sometimes reads "color"
		if len(s.spCNP) > 0 {
			c.Spec = *s.spCNP[s.r.IntN(len(s.spCNP))].Spec.DeepCopy()
		}
		if s.r.IntN(3) == 0 {
			c.Spec.Subject = v1alpha2.ClusterNetworkPolicySubject{Pods: &v1alpha2.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"color": "green"}}}}
		}
		what = "respec"
	case 4: // nodes peer on a node label
		c.Spec.Ingress = append(c.Spec.Ingress, v1alpha2.ClusterNetworkPolicyIngressRule{Name: "nodes", Action: []v1alpha2.ClusterNetworkPolicyRuleAction{v1alpha2.ClusterNetworkPolicyRuleActionDeny, v1alpha2.ClusterNetworkPolicyRuleActionAccept}[s.r.IntN(2)],
			From: []v1alpha2.ClusterNetworkPolicyIngressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "edge"}}}}})
		c.Spec.Egress = append(c.Spec.Egress, v1alpha2.ClusterNetworkPolicyEgressRule{Name: "nodes", Action: v1alpha2.ClusterNetworkPolicyRuleActionDeny,
			To: []v1alpha2.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "z1"}}}}})
		if len(c.Spec.Ingress) > 25 || len(c.Spec.Egress) > 25 {
			return "nothing"
		}
		what = "nodes peers"
	default:
		if err := res.Delete(s.ctx, c.Name, metav1.DeleteOptions{}); err != nil {
			s.t.Fatal(err)
		}
		if s.r.IntN(2) == 0 {
			return "delete cnp " + c.Name
		}
		c.ResourceVersion, c.UID = "", types.UID(fmt.Sprint("uid-", s.r.Uint32()))
		if _, err := res.Create(s.ctx, toUnstructured(s.t, &c), metav1.CreateOptions{}); err != nil {
			s.t.Fatal(err)
		}
		return "delete and re-create cnp " + c.Name
	}
	c.Generation++
	if _, err := res.Update(s.ctx, toUnstructured(s.t, &c), metav1.UpdateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	return what + " cnp " + c.Name
}

// truth compiles the objects as the fake API server holds them.
func (s *truthRun) truth(opts policy.Options) (*policy.Cluster, *policy.Program) {
	c := &policy.Cluster{}
	for _, n := range s.nss() {
		c.Namespaces = append(c.Namespaces, policy.NamespaceFromAPI(&n))
	}
	for _, n := range s.nodes() {
		pn, _ := policy.NodeFromAPI(&n)
		c.Nodes = append(c.Nodes, pn)
	}
	for _, p := range s.pods() {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		pp, _ := policy.PodFromAPI(&p)
		c.Pods = append(c.Pods, &pp)
	}
	for _, u := range s.policies(0) {
		d := decodeNP(&u)
		c.NetworkPolicies = append(c.NetworkPolicies, &d.NetworkPolicy)
	}
	for _, u := range s.policies(1) {
		d := decodeCNP(&u)
		c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, d.ClusterNetworkPolicy)
	}
	return c, policy.Compile(c, opts)
}

// truthVerdicts returns the first flow between the cluster's addresses
// (and a few outside ones) on which inc and full disagree, "" if none.
func truthVerdicts(c *policy.Cluster, inc, full *policy.Program) string {
	var addrs []netip.Addr
	for _, p := range c.Pods {
		addrs = append(addrs, p.IPs...)
	}
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addrs...)
	}
	addrs = append(addrs, randcluster.Peer4, randcluster.StrayPeer4, netip.MustParseAddr("10.77.1.200"))
	end := func(p *policy.Program, a netip.Addr) policy.Endpoint {
		if i, ok := p.PodByIP(a); ok {
			return policy.Endpoint{Pod: i, Addr: a}
		}
		return policy.Endpoint{Pod: -1, Addr: a}
	}
	for _, x := range addrs {
		for _, y := range addrs {
			if x.Is4() != y.Is4() {
				continue
			}
			for _, pp := range []struct {
				pr   policy.Protocol
				port uint16
			}{{policy.ProtoTCP, 53}, {policy.ProtoUDP, 53}, {policy.ProtoTCP, 80}, {policy.ProtoTCP, 81}, {policy.ProtoTCP, 443}, {policy.ProtoTCP, 5432}, {policy.ProtoTCP, 8080}, {policy.ProtoTCP, 9090}, {policy.ProtoTCP, 9091}} {
				a := inc.Evaluate(policy.Flow{Src: end(inc, x), Dst: end(inc, y), Proto: pp.pr, Port: pp.port})
				b := full.Evaluate(policy.Flow{Src: end(full, x), Dst: end(full, y), Proto: pp.pr, Port: pp.port})
				if a.Allowed != b.Allowed {
					return fmt.Sprintf("flow %s -> %s %v/%d: agent allowed=%v, truth allowed=%v\nagent %+v\ntruth %+v", x, y, pp.pr, pp.port, a.Allowed, b.Allowed, a, b)
				}
			}
		}
	}
	return ""
}

var (
	truthSeed       = flag.Int64("truth-seed", 2, "first seed of TestAgentMatchesAPITruth")
	truthSeeds      = flag.Int("truth-seeds", 2, "seeds TestAgentMatchesAPITruth runs (raise for a local soak)")
	truthRounds     = flag.Int("truth-rounds", 8, "rounds of changes per seed of TestAgentMatchesAPITruth")
	truthClustergen = flag.Bool("truth-clustergen", false, "TestAgentMatchesAPITruth starts from clustergen clusters (150 pods, 60 NetworkPolicies, 8 ClusterNetworkPolicies) instead of randcluster ones")
)

// TestAgentMatchesAPITruth: after each round of 1-5 random changes of
// every kind (the awkward ones included: addresses reused or claimed
// twice, namespaces and nodes deleted and re-created, tiers flipped,
// named ports moved, finished pods, labels no policy reads, a key only
// some policies read), the agent's table is the truth's line by line and
// its last Program's verdicts are the truth's over every pair of pod,
// node and peer addresses. Even seeds turn IngressNetworksAndNodes on;
// seeds divisible by 3 police node-local traffic. The default seeds take
// a few seconds, most of it waiting for the agent to settle after each
// round; -truth-seeds and -truth-rounds make a soak.
func TestAgentMatchesAPITruth(t *testing.T) {
	for seed := *truthSeed; seed < *truthSeed+int64(*truthSeeds); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			runTruth(t, seed, *truthRounds)
		})
	}
}

// runTruth runs rounds of changes on the cluster of seed and compares
// after each.
func runTruth(t *testing.T, seed int64, rounds int) {
	node := "node-0"
	ctx := context.Background()
	cfg := randcluster.Default()
	cfg.Nodes, cfg.MaxPods, cfg.PodCIDRs = 3, 14, true
	sc := randcluster.Generate(seed, cfg)
	if *truthClustergen {
		node = "node-000"
		g := clustergen.Generate(clustergen.Config{Nodes: 3, Namespaces: 8, Pods: 150, NetworkPolicies: 60, ClusterPolicies: 8, Seed: uint64(seed), Workloads: seed%2 == 0})
		sc = &randcluster.Scenario{}
		add := func(kind string, o any) { sc.Docs = append(sc.Docs, randcluster.Doc{Kind: kind, Object: o}) }
		for i := range g.Nodes {
			add("Node", &g.Nodes[i])
		}
		for i := range g.Namespaces {
			add("Namespace", &g.Namespaces[i])
		}
		for i := range g.Pods {
			g.Pods[i].Status.PodIPs = []corev1.PodIP{{IP: g.Pods[i].Status.PodIP}}
			add("Pod", &g.Pods[i])
		}
		for i := range g.NetworkPolicies {
			g.NetworkPolicies[i].TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
			add("NetworkPolicy", &g.NetworkPolicies[i])
		}
		for i := range g.ClusterNetworkPolicies {
			g.ClusterNetworkPolicies[i].TypeMeta = metav1.TypeMeta{APIVersion: v1alpha2.SchemeGroupVersion.String(), Kind: "ClusterNetworkPolicy"}
			add("ClusterNetworkPolicy", &g.ClusterNetworkPolicies[i])
		}
	}
	var objs []runtime.Object
	for _, d := range sc.Docs {
		switch o := d.Object.(type) {
		case *corev1.Pod:
			o.UID = types.UID(fmt.Sprint("uid-", o.Namespace, "/", o.Name))
			if o.Labels == nil {
				o.Labels = map[string]string{}
			}
			o.Labels["pod-template-hash"] = "h"
			if seed%2 == 0 {
				o.Labels["color"] = "red"
			}
			objs = append(objs, o)
		case *corev1.Namespace, *corev1.Node:
			objs = append(objs, o.(runtime.Object))
		case *networkingv1.NetworkPolicy, *v1alpha2.ClusterNetworkPolicy:
			objs = append(objs, toUnstructured(t, o))
		}
	}
	c := newFakeCluster(t, objs...)
	s := &truthRun{t: t, r: rand.New(rand.NewPCG(uint64(seed), 15)), c: c, ctx: ctx, self: node}
	for _, d := range append(randcluster.Generate(seed+1000, cfg).Docs, randcluster.Generate(seed+2000, cfg).Docs...) {
		switch o := d.Object.(type) {
		case *networkingv1.NetworkPolicy:
			s.spNP = append(s.spNP, o)
		case *v1alpha2.ClusterNetworkPolicy:
			s.spCNP = append(s.spCNP, o)
		}
	}
	dp := &lastProgramDP{testDP: newTestDP(node)}
	fg, err := features.New()
	if err != nil {
		t.Fatal(err)
	}
	if seed%2 == 0 {
		if err := fg.Set("IngressNetworksAndNodes=true"); err != nil {
			t.Fatal(err)
		}
	}
	a := startReady(t, c, Config{NodeName: node, Resync: time.Hour, AllowNodeLocal: seed%3 != 0, Features: fg}, dp)
	var steps []string
	for round := range rounds {
		var did []string
		for range 1 + s.r.IntN(5) {
			did = append(did, s.step())
		}
		steps = append(steps, fmt.Sprintf("round %d: %s", round, strings.Join(did, "; ")))
		settle(t, a)
		cl, full := s.truth(a.compilerOptions())
		fresh := knftables.NewFake(knftables.InetFamily, nft.Table)
		if _, err := nft.New(fresh, nft.Options{Node: node}).Sync(ctx, full); err != nil {
			t.Fatal(err)
		}
		if d := truthVerdicts(cl, dp.last.Load(), full); d != "" {
			t.Fatalf("seed %d after\n%s\nverdicts differ: %s\nsnapshot:\n%s", seed, strings.Join(steps, "\n"), d, dumpCluster(cl))
		}
		if got, want := sortLines(dp.fake.Dump()), sortLines(fresh.Dump()); got != want {
			t.Fatalf("seed %d after\n%s\nthe agent's table differs from the truth's:\n%s", seed, strings.Join(steps, "\n"), lineDiff(got, want))
		}
	}
	t.Logf("seed %d: full %s, incremental %s, ignored relabels %s", seed,
		testutilValue(t, a, "moat_agent_compilations_total", `kind="full"`), testutilValue(t, a, "moat_agent_compilations_total", `kind="incremental"`),
		testutilValue(t, a, "moat_agent_label_changes_ignored_total", ``))
}

// lineDiff lists the lines only in got or only in want (both sorted).
func lineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	var b strings.Builder
	for _, l := range g {
		if _, ok := slices.BinarySearch(w, l); !ok {
			fmt.Fprintf(&b, "only agent: %s\n", l)
		}
	}
	for _, l := range w {
		if _, ok := slices.BinarySearch(g, l); !ok {
			fmt.Fprintf(&b, "only truth: %s\n", l)
		}
	}
	return b.String()
}

// dumpCluster prints the cluster for a failure message.
func dumpCluster(c *policy.Cluster) string {
	var b strings.Builder
	for _, n := range c.Namespaces {
		fmt.Fprintf(&b, "namespace %s %v\n", n.Name, n.Labels)
	}
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "node %s %v %v %v\n", n.Name, n.Labels, n.Addrs, n.PodCIDRs)
	}
	for _, p := range c.Pods {
		fmt.Fprintf(&b, "pod %s node=%s hn=%v %v %v %v\n", p.Key(), p.NodeName, p.HostNetwork, p.Labels, p.IPs, p.Ports)
	}
	for _, np := range c.NetworkPolicies {
		fmt.Fprintf(&b, "np %s/%s %+v\n", np.Namespace, np.Name, np.Spec)
	}
	for _, cnp := range c.ClusterNetworkPolicies {
		fmt.Fprintf(&b, "cnp %s %+v\n", cnp.Name, cnp.Spec)
	}
	return b.String()
}
