package policy

import (
	"maps"
	"strings"
)

// Compiler compiles a snapshot and keeps what it learned, so that changes
// (a pod relabelled, added or deleted, a policy added, replaced or
// deleted, a namespace's or node's labels) are applied in time
// proportional to what they change: the selectors and peers the object
// enters or leaves, the classes of pods whose policies change, and one
// copy of the Program's per-pod slices. Programs it returned earlier stay
// valid and unchanged (copy on write).
//
// The Upsert and Delete methods stage a change; the next call of Program
// applies every staged change at once. A Compiler is not safe for
// concurrent use; its Programs are.
type Compiler struct {
	s       *state
	pending bool
}

// NewCompiler compiles c fully. The Compiler keeps references to the
// Pods, NetworkPolicies, API objects and label maps of c; the caller must not
// change them (replace them instead), but may reuse c's slices.
func NewCompiler(c *Cluster, opts Options) *Compiler {
	return &Compiler{s: build(c, opts)}
}

// Program applies the staged changes, if any, and returns the latest
// Program.
func (c *Compiler) Program() *Program {
	if c.pending {
		c.pending = false
		c.s.publish()
	}
	return c.s.prog
}

// RelabelPod replaces the labels of pod "namespace/name" and returns the
// new Program (with any other staged change). ok is false when the pod is
// unknown; nothing is changed then.
func (c *Compiler) RelabelPod(key string, labels map[string]string) (prog *Program, ok bool) {
	_, ps := c.s.findPod(key)
	if ps == nil {
		return nil, false
	}
	p := *ps.pod
	p.Labels = maps.Clone(labels)
	c.UpsertPod(&p)
	return c.Program(), true
}

// UpsertPod stages a pod, new or replacing the one of the same namespace
// and name (labels, addresses, ports, node may all change). The Compiler
// keeps p: the caller must not change it (replace it instead).
func (c *Compiler) UpsertPod(p *Pod) {
	c.s.upsertPod(p)
	c.pending = true
}

// DeletePod stages the removal of pod "namespace/name"; false if unknown.
func (c *Compiler) DeletePod(key string) bool {
	ok := c.s.deletePod(key)
	c.pending = c.pending || ok
	return ok
}

// UpsertNamespace stages a namespace, new or with new labels. The
// Compiler may keep ns.Labels: the caller must not change it (replace it
// instead).
func (c *Compiler) UpsertNamespace(ns Namespace) {
	c.s.upsertNamespace(ns)
	c.pending = true
}

// DeleteNamespace stages the removal of a Namespace object. Pods still in
// it keep it known by name only, as in a full compile.
func (c *Compiler) DeleteNamespace(name string) {
	c.s.deleteNamespace(name)
	c.pending = true
}

// UpsertNode stages a node, new or with new labels or addresses.
func (c *Compiler) UpsertNode(n Node) {
	c.s.upsertNode(n)
	c.pending = true
}

// DeleteNode stages the removal of a node.
func (c *Compiler) DeleteNode(name string) {
	c.s.deleteNode(name)
	c.pending = true
}

// UpsertNetworkPolicy stages a NetworkPolicy, new or replacing the one of
// the same namespace and name. The Compiler keeps np: the caller must not
// change it (replace it instead).
func (c *Compiler) UpsertNetworkPolicy(np *NetworkPolicy) {
	c.s.upsertNP(np)
	c.pending = true
}

// NetworkPolicies returns the NetworkPolicies keys name ("namespace/name")
// as the Compiler holds them (as given to it), by key; keys it holds none
// for are left out, and a change staged since the last Program counts. It
// reads each namespace named once, whatever the number of keys: the agent
// finds here the compiled generation of the policies its diagnostics name
// (maybe thousands of one namespace) rather than in a map of its own
// beside every cached policy.
func (c *Compiler) NetworkPolicies(keys []string) map[string]*NetworkPolicy {
	want := map[string]map[string]struct{}{}
	for _, k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		if want[ns] == nil {
			want[ns] = map[string]struct{}{}
		}
		want[ns][name] = struct{}{}
	}
	var out map[string]*NetworkPolicy
	for namespace, names := range want {
		ns := c.s.namespaces[namespace]
		if ns == nil {
			continue
		}
		for np := range ns.tier.nps {
			if _, ok := names[np.src.Name]; ok {
				if out == nil {
					out = map[string]*NetworkPolicy{}
				}
				out[namespace+"/"+np.src.Name] = np.src
			}
		}
	}
	return out
}

// DeleteNetworkPolicy stages the removal of a NetworkPolicy.
func (c *Compiler) DeleteNetworkPolicy(namespace, name string) {
	c.s.deleteNP(namespace, name)
	c.pending = true
}

// UpsertClusterNetworkPolicy stages a ClusterNetworkPolicy, new or
// replacing the one of the same name. The Compiler keeps its spec and
// compiles its rules when a pod first needs them, after it validated the
// policy here: the caller must not change the spec (replace the policy
// instead), or what it compiles may not match what it validated.
func (c *Compiler) UpsertClusterNetworkPolicy(cnp ClusterNetworkPolicy) {
	c.s.upsertCNP(&cnp)
	c.pending = true
}

// DeleteClusterNetworkPolicy stages the removal of a ClusterNetworkPolicy.
func (c *Compiler) DeleteClusterNetworkPolicy(name string) {
	c.s.deleteCNP(name)
	c.pending = true
}
