package agent

import (
	"hash/maphash"
	"maps"
	"slices"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/policy"
)

// What the pod, namespace and node caches hold: the policy model's form of
// each object, converted once when it arrives (policy.PodFromAPI and
// friends, the same conversion the file source uses), not the API object.
// A slimmed *corev1.Pod still cost 2.3 KB of heap per pod (the PodSpec and
// PodStatus structs are large even when nearly empty); this form costs
// what policy reads and nothing else (BenchmarkPodCacheMemory), and a full
// compilation no longer converts every object again.
//
// The caches key objects by namespace and name through GetObjectMeta.

// cachedPod is a pod in the agent's cache.
type cachedPod struct {
	policy.Pod
	// labels keeps the shared set Pod.Labels belongs to alive (see
	// labelSets); nil when not interned.
	labels *labelSet
	// ports keeps the shared list Pod.Ports belongs to alive; nil when
	// not interned.
	ports *interned[[]policy.ContainerPort]
	// uid is a hash of the pod's UID: enough to tell a re-created pod
	// from an update, in 8 bytes instead of a 36-byte string.
	uid uint64
	// finished: phase Succeeded or Failed. The field selector keeps such
	// pods out of the watch, so this is a guard only: their IPs may
	// already belong to new pods.
	finished bool
	// problems are conversion problems (an unparsable IP or port); nil
	// for nearly every pod, and a pointer (8 bytes, where a slice takes
	// 24, kept cachedPod in the 192-byte size class instead of 176).
	problems *[]policy.Diagnostic
	// keys are the label keys policies read when the pod was cached; nil
	// when unknown then. Pod.Labels holds the labels with those keys (all
	// labels when keys is nil), rest the others, packed (labelproj.go).
	keys *keySet
	rest string
}

func (p *cachedPod) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}
}

// uidSeed seeds the hashes of pod UIDs (only compared within a process).
var uidSeed = maphash.MakeSeed()

// toCachedPod converts a pod without sharing its labels or packing any.
func toCachedPod(o any) (any, error) { return (*labelSets)(nil).toCachedPod(o, nil) }

// toCachedPod is the pod informer's transform: the pod in the policy
// model's form, its labels shared with equal ones (t may be nil: not
// shared).
//
// Labels whose keys are not in keys (the keys policies read) are packed
// away (labelproj.go); keys nil keeps them all.
func (t *labelSets) toCachedPod(o any, keys *keySet) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil // already converted, or a tombstone
	}
	pod, diags := policy.PodFromAPI(p)
	// The strings many pods repeat are kept once.
	pod.Namespace = unique.Make(pod.Namespace).Value()
	pod.NodeName = unique.Make(pod.NodeName).Value()
	for i := range pod.Ports {
		pod.Ports[i].Name = unique.Make(pod.Ports[i].Name).Value()
	}
	c := &cachedPod{
		Pod:      pod,
		uid:      maphash.String(uidSeed, string(p.UID)),
		finished: p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
	}
	if len(diags) > 0 {
		c.problems = &diags
	}
	if keys != nil {
		c.keys = keys
		c.Labels, c.rest = keys.split(c.Labels)
	}
	if t != nil {
		if c.labels = t.intern(c.Labels); c.labels != nil {
			c.Labels = c.labels.v
		}
		if c.ports = t.internPorts(c.Ports); c.ports != nil {
			c.Ports = c.ports.v
		}
	}
	return c, nil
}

// diags are the pod's conversion problems.
func (p *cachedPod) diags() []policy.Diagnostic {
	if p.problems == nil {
		return nil
	}
	return *p.problems
}

type cachedNamespace struct {
	policy.Namespace
}

func (n *cachedNamespace) GetObjectMeta() metav1.Object { return &metav1.ObjectMeta{Name: n.Name} }

func toCachedNamespace(o any) (any, error) {
	n, ok := o.(*corev1.Namespace)
	if !ok {
		return o, nil
	}
	return &cachedNamespace{policy.NamespaceFromAPI(n)}, nil
}

type cachedNode struct {
	policy.Node
	diags []policy.Diagnostic
}

func (n *cachedNode) GetObjectMeta() metav1.Object { return &metav1.ObjectMeta{Name: n.Name} }

func toCachedNode(o any) (any, error) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return o, nil
	}
	node, diags := policy.NodeFromAPI(n)
	return &cachedNode{Node: node, diags: diags}, nil
}

// The *Changed functions tell whether an update can change the compiled
// program; updates that cannot (status heartbeats, conditions, fields
// policy does not read) do not cause a sync.

func podChanged(old, cur any) bool {
	a, ok1 := old.(*cachedPod)
	b, ok2 := cur.(*cachedPod)
	return !ok1 || !ok2 || !sameLabels(a, b) || !samePodButLabels(a, b)
}

// cachedUnder reports whether two versions of a pod were both cached
// under keys, the label keys policies read now, so that comparing their
// maps tells whether a read label changed. A version cached under an
// earlier (smaller) key set may have packed away a key read now, and a
// compilation may have read the caches before the update arrived: such
// updates always reach the compiler.
func cachedUnder(old, cur any, keys *keySet) bool {
	a, ok1 := old.(*cachedPod)
	b, ok2 := cur.(*cachedPod)
	return ok1 && ok2 && a.keys == keys && b.keys == keys
}

// sameLabels reports whether two versions of a pod have the same labels.
// Cached under different key sets they count as different: what was
// packed away may be read now.
func sameLabels(a, b *cachedPod) bool {
	return a.keys == b.keys && a.rest == b.rest && maps.Equal(a.Labels, b.Labels)
}

func samePodButLabels(a, b *cachedPod) bool {
	return a.uid == b.uid && a.NodeName == b.NodeName && a.HostNetwork == b.HostNetwork && a.finished == b.finished &&
		slices.Equal(a.IPs, b.IPs) && slices.Equal(a.Ports, b.Ports) && slices.Equal(a.diags(), b.diags())
}

// relabelOnly reports whether a pod update changed nothing but labels,
// the most frequent change in a cluster, which the compiler applies
// incrementally. It returns the pod's "namespace/name".
func relabelOnly(old, cur any) (string, bool) {
	a, ok1 := old.(*cachedPod)
	b, ok2 := cur.(*cachedPod)
	if !ok1 || !ok2 || !samePodButLabels(a, b) {
		return "", false
	}
	return b.Key(), true
}

func namespaceChanged(old, cur any) bool {
	a, ok1 := old.(*cachedNamespace)
	b, ok2 := cur.(*cachedNamespace)
	return !ok1 || !ok2 || !maps.Equal(a.Labels, b.Labels)
}

func nodeChanged(old, cur any) bool {
	a, ok1 := old.(*cachedNode)
	b, ok2 := cur.(*cachedNode)
	return !ok1 || !ok2 || !maps.Equal(a.Labels, b.Labels) || !slices.Equal(a.Addrs, b.Addrs) || !slices.Equal(a.PodCIDRs, b.PodCIDRs) || !slices.Equal(a.diags, b.diags)
}
