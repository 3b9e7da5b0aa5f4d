package agent

import (
	"net/netip"
	"slices"
	"strings"
	"time"

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
	problemPodOnNodeAddr     = "pod_claims_node_address"
	// problemNodeNotFound: no Node is named --node-name; the agent
	// programs nothing meanwhile (Agent.sync).
	problemNodeNotFound = "node_not_found"
)

var allProblems = []string{problemPodWithoutIP, problemDuplicatePodIP, problemInvalidPodField, problemNodeWithoutAddr, problemInvalidNodeAddr, problemUndecodablePolicy, problemDuplicateLocal, problemPodOnNodeAddr, problemNodeNotFound}

// snapshot is one consistent reading of the caches: the compiler's input
// for a full compilation and the policy objects it compiles.
type snapshot struct {
	cluster policy.Cluster
	// cnps are the decoded ClusterNetworkPolicies by name, as compiled:
	// the status writer reports on exactly these generations.
	cnps map[string]*decodedCNP
}

type problem struct {
	kind, msg string
}

// takeSnapshot reads every cache (the objects are already in the policy
// model's form, see cached.go). Pods that have finished are left out even
// if the cache still holds them (their IPs may be reused). It makes the
// label key set cover the policies it read before it reads the pods
// under that set (labelkeys.go), so it is for full compilations only:
// nothing else may grow the set.
func (a *Agent) takeSnapshot() *snapshot {
	s := &snapshot{cnps: map[string]*decodedCNP{}}
	c := &s.cluster
	for _, o := range a.inf.namespaces.GetStore().List() {
		if ns, ok := o.(*cachedNamespace); ok {
			c.Namespaces = append(c.Namespaces, ns.Namespace)
		}
	}
	for _, o := range a.inf.nodes.GetStore().List() {
		if n, ok := o.(*cachedNode); ok {
			c.Nodes = append(c.Nodes, n.Node)
		}
	}
	// The policies before the pods, and the key set from exactly these
	// (labelkeys.go).
	lists := keyLists{}
	for _, o := range a.inf.nps.GetStore().List() {
		if np, ok := o.(*decodedNP); ok {
			c.NetworkPolicies = append(c.NetworkPolicies, &np.NetworkPolicy)
			lists.add(np.keys)
		}
	}
	for _, o := range a.inf.cnps.GetStore().List() {
		if cnp, ok := o.(*decodedCNP); ok {
			s.cnps[cnp.Name] = cnp
			c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, cnp.ClusterNetworkPolicy)
			lists.add(cnp.keys)
		}
	}
	a.updateSelectorKeys(lists)
	keys := a.selectorKeys.Load()
	for _, o := range a.inf.pods.GetStore().List() {
		if p, ok := o.(*cachedPod); ok && !p.finished {
			c.Pods = append(c.Pods, p.podFor(keys))
		}
	}
	return s
}

// scanProblems reads the caches for input problems, by "Kind
// namespace/name". Addresses several pods claim come from prog, the
// program compiled from those caches (the compiler knows them; finding
// them again meant a map of every pod's address at each scan): of the
// claimants, the first by namespace/name is the owner and the others
// have the problem.
//
// A pod of this node scheduled without an IP is a problem only once it has
// lasted Config.PodWithoutIPAfter (every pod is in that state while its
// sandbox starts); recheck is then how long until the next such pod is
// due, 0 when none waits. Other nodes' pods without an IP are logged once
// at -v=2, not counted: this agent can do nothing about them, and every
// rollout anywhere would flap the gauge.
func (a *Agent) scanProblems(prog *policy.Program) (_ map[string]problem, recheck time.Duration) {
	problems := map[string]problem{}
	now := time.Now()
	noIP := map[string]time.Time{}
	othersNoIP := map[string]bool{}
	for _, o := range a.inf.nodes.GetStore().List() {
		n, ok := o.(*cachedNode)
		if !ok {
			continue
		}
		if len(n.diags) > 0 {
			problems["Node "+n.Name] = problem{problemInvalidNodeAddr, diagMessages(n.diags)}
		} else if len(n.Addrs) == 0 {
			problems["Node "+n.Name] = problem{problemNodeWithoutAddr, "node has no IP address in status.addresses: `nodes` peers select nothing on it and node-local traffic from it is not recognised"}
		} else if n.Name == a.cfg.NodeName {
			if addr, ok := podOnNodeAddr(prog, n); ok {
				problems["Node "+n.Name] = problem{problemPodOnNodeAddr, "address " + addr.String() + " is also a pod's: connections from it to this node's pods are judged as that pod's, not as node-local (kubelet probes from it are policed)"}
			}
		}
	}
	for _, o := range a.inf.pods.GetStore().List() {
		p, ok := o.(*cachedPod)
		if !ok || p.finished {
			continue
		}
		switch {
		case len(p.diags()) > 0:
			problems["Pod "+p.Key()] = problem{problemInvalidPodField, diagMessages(p.diags())}
		case len(p.IPs) == 0 && !p.HostNetwork && p.NodeName != "" && p.NodeName != a.cfg.NodeName:
			key := p.Key()
			othersNoIP[key] = true
			if !a.othersNoIP[key] {
				a.log.V(2).Info("Pod of another node has no IP yet", "object", "Pod "+key, "podNode", p.NodeName)
			}
		case len(p.IPs) == 0 && !p.HostNetwork && p.NodeName != "":
			// Unscheduled pods have no IP yet by design; a scheduled one
			// without an IP is worth knowing about once it lasts.
			key := p.Key()
			since, ok := a.noIPSince[key]
			if !ok {
				since = now
			}
			noIP[key] = since
			if left := a.cfg.PodWithoutIPAfter - now.Sub(since); left > 0 {
				if recheck == 0 || left < recheck {
					recheck = left
				}
				continue
			}
			problems["Pod "+key] = problem{problemPodWithoutIP, "pod has had no IP in status.podIPs for " + a.cfg.PodWithoutIPAfter.String() + " or more: it is not policed and matches no peer until it has one"}
		}
	}
	a.noIPSince, a.othersNoIP = noIP, othersNoIP
	for _, ip := range prog.DuplicateAddrs() {
		claimants := prog.Claimants(ip)
		for _, key := range claimants[1:] {
			problems["Pod "+key] = problem{problemDuplicatePodIP, "address " + ip.String() + " also belongs to pod " + claimants[0] + ": every connection from or to it is dropped"}
		}
	}
	for _, o := range a.inf.nps.GetStore().List() {
		if np, ok := o.(*decodedNP); ok {
			if bad := undecodable(np.Invalid()); len(bad) > 0 {
				problems["NetworkPolicy "+np.Namespace+"/"+np.Name] = problem{problemUndecodablePolicy, "cannot decode " + strings.Join(bad, ", ") + ": enforced fail-closed"}
			}
		}
	}
	for _, o := range a.inf.cnps.GetStore().List() {
		if cnp, ok := o.(*decodedCNP); ok {
			if bad := undecodable(cnp.Invalid); len(bad) > 0 {
				problems["ClusterNetworkPolicy "+cnp.Name] = problem{problemUndecodablePolicy, "cannot decode " + strings.Join(bad, ", ") + ": enforced fail-closed"}
			}
		}
	}
	return problems, recheck
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
func (a *Agent) reportProblems(problems map[string]problem, rulesetWarnings []string) {
	counts := map[string]int{}
	for _, p := range allProblems {
		counts[p] = 0
	}
	seen := map[string]string{}
	for obj, p := range problems {
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
	a.lastWarnings = rulesetWarnings
	for k, n := range counts {
		a.metrics.problems.WithLabelValues(k).Set(float64(n))
	}
}

// podOnNodeAddr finds an address of n that a pod-network pod claims too,
// which the Program therefore does not treat as node-local
// (policy.Program.NodeLocalAddrs).
func podOnNodeAddr(prog *policy.Program, n *cachedNode) (netip.Addr, bool) {
	if prog.Options.DenyNodeLocal {
		return netip.Addr{}, false
	}
	local := prog.NodeLocalAddrs(n.Name)
	for _, a := range n.Addrs {
		if !slices.Contains(local, a.Unmap()) {
			return a, true
		}
	}
	return netip.Addr{}, false
}
