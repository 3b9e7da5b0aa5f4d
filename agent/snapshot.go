package agent

import (
	"net/netip"
	"sort"
	"strings"

	"github.com/moat-net/moat/policy"
)

// Input problems, the label values of moat_agent_input_problems.
const (
	problemPodWithoutIP      = "pod_without_ip"
	problemDuplicatePodIP    = "duplicate_pod_ip"
	problemInvalidPodField   = "invalid_pod_field"
	problemNodeWithoutAddr   = "node_without_address"
	problemInvalidNodeAddr   = "invalid_node_address"
	problemUndecodablePolicy = "undecodable_policy"
	problemDuplicateLocal    = "duplicate_local_address"
)

var allProblems = []string{problemPodWithoutIP, problemDuplicatePodIP, problemInvalidPodField, problemNodeWithoutAddr, problemInvalidNodeAddr, problemUndecodablePolicy, problemDuplicateLocal}

// snapshot is one consistent reading of the caches, reduced to the
// compiler's input for this node (see scope.go).
type snapshot struct {
	cluster policy.Cluster
	// outOfScope counts the NetworkPolicies left out of cluster: they
	// cannot select a pod of this node.
	outOfScope int
	// cnps are the decoded ClusterNetworkPolicies by name, as compiled:
	// the status writer reports on exactly these generations.
	cnps map[string]*decodedCNP
	// nps are the decoded NetworkPolicies by namespace/name.
	nps map[string]*decodedNP
	// problems maps "Kind namespace/name" to what is wrong with it, for
	// logs and the input-problem gauge.
	problems map[string]problem
}

type problem struct {
	kind, msg string
}

// takeSnapshot reads every cache (the objects are already in the policy
// model's form, see cached.go). Pods that have finished are left out even
// if the cache still holds them (their IPs may be reused).
func (a *Agent) takeSnapshot() *snapshot {
	s := &snapshot{cnps: map[string]*decodedCNP{}, nps: map[string]*decodedNP{}, problems: map[string]problem{}}
	c := &s.cluster
	for _, o := range a.inf.namespaces.GetStore().List() {
		if ns, ok := o.(*cachedNamespace); ok {
			c.Namespaces = append(c.Namespaces, ns.Namespace)
		}
	}
	for _, o := range a.inf.nodes.GetStore().List() {
		n, ok := o.(*cachedNode)
		if !ok {
			continue
		}
		if len(n.diags) > 0 {
			s.problems["Node "+n.Name] = problem{problemInvalidNodeAddr, diagMessages(n.diags)}
		} else if len(n.Addrs) == 0 {
			s.problems["Node "+n.Name] = problem{problemNodeWithoutAddr, "node has no IP address in status.addresses: `nodes` peers select nothing on it and node-local traffic from it is not recognised"}
		}
		c.Nodes = append(c.Nodes, n.Node)
	}
	owner := map[netip.Addr]string{}
	for _, o := range a.inf.pods.GetStore().List() {
		p, ok := o.(*cachedPod)
		if !ok || p.finished {
			continue
		}
		pod := p.Pod
		key := "Pod " + pod.Key()
		switch {
		case len(p.diags) > 0:
			s.problems[key] = problem{problemInvalidPodField, diagMessages(p.diags)}
		case len(pod.IPs) == 0 && !pod.HostNetwork && pod.NodeName != "":
			// Unscheduled pods have no IP yet by design; a scheduled one
			// without an IP is worth knowing about once it lasts.
			s.problems[key] = problem{problemPodWithoutIP, "pod has no IP in status.podIPs: it is not policed and matches no peer until it has one"}
		}
		if !pod.HostNetwork {
			for _, ip := range pod.IPs {
				if other, dup := owner[ip]; dup {
					s.problems[key] = problem{problemDuplicatePodIP, "address " + ip.String() + " also belongs to pod " + other + ": only one of them is policed (the first by namespace/name); the other's traffic is judged as that pod's"}
					continue
				}
				owner[ip] = pod.Key()
			}
		}
		c.Pods = append(c.Pods, pod)
	}
	local := localNamespaces(c.Pods, a.cfg.NodeName)
	for _, o := range a.inf.nps.GetStore().List() {
		if np, ok := o.(*decodedNP); ok {
			s.nps[np.Namespace+"/"+np.Name] = np
			if bad := undecodable(np.Invalid); len(bad) > 0 {
				s.problems["NetworkPolicy "+np.Namespace+"/"+np.Name] = problem{problemUndecodablePolicy, "cannot decode " + strings.Join(bad, ", ") + ": enforced fail-closed"}
			}
			if !local[np.Namespace] {
				s.outOfScope++
				continue
			}
			c.NetworkPolicies = append(c.NetworkPolicies, np.NetworkPolicy)
		}
	}
	for _, o := range a.inf.cnps.GetStore().List() {
		if cnp, ok := o.(*decodedCNP); ok {
			s.cnps[cnp.Name] = cnp
			c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, cnp.ClusterNetworkPolicy)
			if bad := undecodable(cnp.Invalid); len(bad) > 0 {
				s.problems["ClusterNetworkPolicy "+cnp.Name] = problem{problemUndecodablePolicy, "cannot decode " + strings.Join(bad, ", ") + ": enforced fail-closed"}
			}
		}
	}
	// The compiler sorts too, but a stable order here keeps duplicate
	// resolution (first by key wins) independent of cache order.
	sort.Slice(c.Pods, func(i, j int) bool { return c.Pods[i].Key() < c.Pods[j].Key() })
	return s
}

func diagMessages(ds []policy.Diagnostic) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Field + ": " + d.Message
	}
	return strings.Join(parts, "; ")
}

// reportProblems logs each problem once, when it appears or changes, and
// when it is gone, and sets the gauge.
func (a *Agent) reportProblems(s *snapshot, rulesetWarnings []string) {
	counts := map[string]int{}
	for _, p := range allProblems {
		counts[p] = 0
	}
	seen := map[string]string{}
	for obj, p := range s.problems {
		counts[p.kind]++
		seen[obj] = p.msg
		if a.reported[obj] != p.msg {
			a.log.Info("Input problem", "object", obj, "problem", p.kind, "detail", p.msg)
		}
	}
	for _, w := range rulesetWarnings {
		counts[problemDuplicateLocal]++
		key := "ruleset: " + w
		seen[key] = w
		if _, ok := a.reported[key]; !ok {
			a.log.Info("Input problem", "object", "Node "+a.cfg.NodeName, "problem", problemDuplicateLocal, "detail", w)
		}
	}
	for obj := range a.reported {
		if _, ok := seen[obj]; !ok {
			a.log.V(2).Info("Input problem resolved", "object", obj)
		}
	}
	a.reported = seen
	for k, n := range counts {
		a.metrics.problems.WithLabelValues(k).Set(float64(n))
	}
}
