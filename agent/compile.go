package agent

import (
	"maps"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/moat-net/moat/policy"
)

// The program is kept up to date incrementally: each changed object is
// read from its cache and staged in the policy compiler (Upsert, or
// Delete when it is gone), and Program applies them together, in time
// proportional to what they change. The compiler is scoped to this node
// (policy.Options.Node): only this node's pods get a policy, only the
// policies that select them are compiled, peers are resolved
// cluster-wide. A full compilation from the caches happens only
//
//   - for the first sync, and on every --resync (which also guards
//     against any drift of the incremental path);
//   - when a changed policy reads a label key the key set lacks (see
//     labelkeys.go: label changes on that key may have been dropped, so
//     the compiler's labels could be stale). The changed policies are
//     read before anything is staged, and the objects checked are the
//     ones compiled: a newer version stored meanwhile waits for its own
//     event.

// compiled are the ClusterNetworkPolicies the current program was
// compiled from, by name, as the status writer reports on them. The map
// is replaced, never changed, so a published snapshot of it stays valid.
// The NetworkPolicies the writer reports on are those its diagnostics
// name, found in the compiler when published: a map of every one, as
// here, held 1.1 MB at the 30,000-pod benchmark's 19,000 NetworkPolicies
// (more with longer names), and was copied for each change of one.
type compiled struct {
	cnps map[string]*decodedCNP
}

// compile brings the program up to date with the caches, from scratch
// when resync is set. full says the program was compiled from scratch;
// changed that anything changed.
func (a *Agent) compile(resync bool) (prog *policy.Program, full, changed bool) {
	changes := a.takeChanges()
	full = resync || a.compiler == nil
	var nps map[string]*decodedNP
	var cnps map[string]*decodedCNP
	if !full {
		// The changed policies first, before any pod, and these very
		// objects are compiled: a policy that reads a key the set lacks
		// makes this a full compilation (labelkeys.go).
		var lists keyLists
		nps, cnps, lists = a.changedPolicies(changes)
		full = !a.selectorKeys.Load().covers(lists)
	}
	if full {
		start := time.Now()
		// The old compiler's state is garbage once the new one exists:
		// dropping it first keeps the two from being live at once, which
		// was a full resync's peak of memory.
		a.compiler = nil
		s := a.takeSnapshot()
		a.compiler = policy.NewCompiler(&s.cluster, a.compilerOptions())
		a.compiled = compiled{cnps: s.cnps}
		a.metrics.compiles.WithLabelValues("full").Inc()
		a.log.V(2).Info("Compiled in full", "pods", len(s.cluster.Pods), "policies", len(s.cluster.NetworkPolicies)+len(s.cnps), "duration", time.Since(start))
		return a.compiler.Program(), true, true
	}
	n := 0
	keys := a.selectorKeys.Load()
	for key := range changes[kindPod] {
		o, exists, _ := a.inf.pods.GetStore().GetByKey(key)
		if p, ok := o.(*cachedPod); exists && ok && !p.finished {
			a.compiler.UpsertPod(p.podFor(keys))
		} else {
			a.compiler.DeletePod(key)
		}
		n++
	}
	for key := range changes[kindNamespace] {
		if o, exists, _ := a.inf.namespaces.GetStore().GetByKey(key); exists {
			a.compiler.UpsertNamespace(o.(*cachedNamespace).Namespace)
		} else {
			a.compiler.DeleteNamespace(key)
		}
		n++
	}
	for key := range changes[kindNode] {
		if o, exists, _ := a.inf.nodes.GetStore().GetByKey(key); exists {
			a.compiler.UpsertNode(o.(*cachedNode).Node)
		} else {
			a.compiler.DeleteNode(key)
		}
		n++
	}
	for key := range changes[kindNetworkPolicy] {
		if np, exists := nps[key]; exists {
			a.compiler.UpsertNetworkPolicy(&np.NetworkPolicy)
		} else {
			ns, name, _ := cache.SplitMetaNamespaceKey(key)
			a.compiler.DeleteNetworkPolicy(ns, name)
		}
		n++
	}
	if len(changes[kindClusterNetworkPolicy]) > 0 {
		compiledCNPs := maps.Clone(a.compiled.cnps)
		for key := range changes[kindClusterNetworkPolicy] {
			if cnp, exists := cnps[key]; exists {
				a.compiler.UpsertClusterNetworkPolicy(cnp.ClusterNetworkPolicy)
				compiledCNPs[key] = cnp
			} else {
				a.compiler.DeleteClusterNetworkPolicy(key)
				delete(compiledCNPs, key)
			}
			n++
		}
		a.compiled.cnps = compiledCNPs
	}
	if n > 0 {
		a.metrics.compiles.WithLabelValues("incremental").Inc()
		a.metrics.changes.Add(float64(n))
	}
	return a.compiler.Program(), false, n > 0
}

// changedPolicies reads the changed policies from their caches: those
// still there by key (the others are deleted), and the key lists they
// read.
func (a *Agent) changedPolicies(changes [numKinds]map[string]struct{}) (nps map[string]*decodedNP, cnps map[string]*decodedCNP, lists keyLists) {
	nps, cnps, lists = map[string]*decodedNP{}, map[string]*decodedCNP{}, keyLists{}
	for key := range changes[kindNetworkPolicy] {
		if o, exists, _ := a.inf.nps.GetStore().GetByKey(key); exists {
			np := o.(*decodedNP)
			nps[key] = np
			lists.add(np.keys)
		}
	}
	for key := range changes[kindClusterNetworkPolicy] {
		if o, exists, _ := a.inf.cnps.GetStore().GetByKey(key); exists {
			cnp := o.(*decodedCNP)
			cnps[key] = cnp
			lists.add(cnp.keys)
		}
	}
	return nps, cnps, lists
}

// compilerOptions are the compiler's options for this node.
func (a *Agent) compilerOptions() policy.Options {
	o := a.policyOptions()
	o.Node = a.cfg.NodeName
	return o
}
