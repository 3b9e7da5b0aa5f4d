package agent

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/moat-net/moat/api/v1alpha2"
)

// Resources the agent reads through dynamic informers: policies are
// decoded strictly from the informers' maps by package decode, as files
// are (see decode.go).
var (
	networkPolicyGVR        = schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}
	clusterNetworkPolicyGVR = v1alpha2.SchemeGroupVersion.WithResource("clusternetworkpolicies")
)

// activePods leaves out pods that have finished: their IPs go back to the
// pool and may already belong to a new pod. The API server then sends a
// deletion when a pod finishes, so the cache never holds them.
const activePods = "status.phase!=Succeeded,status.phase!=Failed"

// informers are the agent's five watches. Each cache holds only what
// policy needs (see the transforms), so memory follows the size of the
// cluster's policy-relevant state, not of its full objects.
type informers struct {
	pods, namespaces, nodes, nps, cnps cache.SharedIndexInformer
	// handled are the registrations of the change handlers. A handler has
	// synced once it was handed every object of the initial list, which
	// the informer's HasSynced does not wait for: the first sync must not
	// start before, or every object's initial add would reach the next
	// one as a change (seconds of recompiling nothing at 30,000 pods).
	handled []cache.ResourceEventHandlerRegistration
}

// handlersSynced reports whether every change handler was handed its
// informer's initial list.
func (i *informers) handlersSynced() bool {
	for _, r := range i.handled {
		if !r.HasSynced() {
			return false
		}
	}
	return true
}

func (i *informers) all() []cache.SharedIndexInformer {
	return []cache.SharedIndexInformer{i.pods, i.namespaces, i.nodes, i.nps, i.cnps}
}

// names of the informers for metrics and logs, in the order of all().
var informerNames = []string{"pods", "namespaces", "nodes", "networkpolicies", "clusternetworkpolicies"}

func (i *informers) synced() bool {
	for _, inf := range i.all() {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

func (a *Agent) newInformers() (*informers, error) {
	core := a.clients.Kube.CoreV1()
	typed := func(resource string, list func(context.Context, metav1.ListOptions) (runtime.Object, error), watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error), example runtime.Object) cache.SharedIndexInformer {
		lw := a.listWatch(a.watchState(resource), &cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: watchFn})
		return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, a.clients.Kube), example, cache.SharedIndexInformerOptions{})
	}
	inf := &informers{
		pods: typed("pods", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = activePods
			return core.Pods("").List(ctx, o)
		}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = activePods
			return core.Pods("").Watch(ctx, o)
		}, &corev1.Pod{}),
		namespaces: typed("namespaces", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return core.Namespaces().List(ctx, o)
		}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return core.Namespaces().Watch(ctx, o)
		}, &corev1.Namespace{}),
		nodes: typed("nodes", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return core.Nodes().List(ctx, o)
		}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return core.Nodes().Watch(ctx, o)
		}, &corev1.Node{}),
		nps:  a.dynamicInformer(networkPolicyGVR),
		cnps: a.dynamicInformer(clusterNetworkPolicyGVR),
	}
	transforms := []cache.TransformFunc{
		func(o any) (any, error) { return a.labelSets.toCachedPod(o, a.selectorKeys.Load()) },
		toCachedNamespace, toCachedNode,
		func(o any) (any, error) {
			if u, ok := o.(*unstructured.Unstructured); ok {
				return a.labelSets.decodeNP(u), nil
			}
			return o, nil
		},
		func(o any) (any, error) {
			if u, ok := o.(*unstructured.Unstructured); ok {
				return a.labelSets.decodeCNP(u), nil
			}
			return o, nil
		},
	}
	differs := []func(old, cur any) bool{podChanged, namespaceChanged, nodeChanged, npChanged, cnpChanged}
	for idx, in := range inf.all() {
		if err := in.SetTransform(transforms[idx]); err != nil {
			return nil, err
		}
		kind, differs := objKind(idx), differs[idx]
		reg, err := in.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) { a.changed(kind, o) },
			UpdateFunc: func(old, cur any) {
				if !differs(old, cur) {
					return
				}
				if kind == kindPod {
					keys := a.selectorKeys.Load()
					if _, ok := relabelOnly(old, cur); ok && cachedUnder(old, cur, keys) && !keys.mentions(old.(*cachedPod).Labels, cur.(*cachedPod).Labels) {
						a.metrics.ignoredRelabels.Inc()
						return
					}
				}
				a.changed(kind, cur)
			},
			DeleteFunc: func(o any) { a.changed(kind, o) },
		})
		if err != nil {
			return nil, err
		}
		inf.handled = append(inf.handled, reg)
	}
	// Status-only updates of ClusterNetworkPolicies do not change the
	// program, but someone may have overwritten the agent's condition.
	if _, err := inf.cnps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			if !cnpChanged(old, cur) {
				a.status.nudge()
			}
		},
	}); err != nil {
		return nil, err
	}
	return inf, nil
}

// watchState returns the state of resource's list and watch, made on
// first use.
func (a *Agent) watchState(resource string) *watchState {
	for _, s := range a.watches {
		if s.resource == resource {
			return s
		}
	}
	s := newWatchState(resource)
	a.watches = append(a.watches, s)
	a.metrics.watchState(s)
	return s
}

func (a *Agent) dynamicInformer(gvr schema.GroupVersionResource) cache.SharedIndexInformer {
	r := a.clients.Dynamic.Resource(gvr)
	lw := a.listWatch(a.watchState(gvr.Resource), &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return r.Watch(ctx, o)
		},
	})
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, a.clients.Dynamic), &unstructured.Unstructured{}, cache.SharedIndexInformerOptions{})
}

// npChanged and cnpChanged ignore status-only updates (the status
// subresource keeps metadata.generation, and the agent writes CNP status
// itself) but compare the decoded spec, not only the generation: after a
// CRD schema change an object may come again, same generation, decoded
// differently. What decoding refused counts too: the compiler fails
// closed on it, and it may change while the spec decodes the same (the
// refused part is left out of the spec).
func npChanged(old, cur any) bool {
	a, ok1 := old.(*decodedNP)
	b, ok2 := cur.(*decodedNP)
	return !ok1 || !ok2 || a.Generation != b.Generation || a.UID != b.UID ||
		!slices.Equal(a.UnknownFields(), b.UnknownFields()) || !sameErrors(a.Invalid(), b.Invalid()) ||
		!equality.Semantic.DeepEqual(a.Spec, b.Spec)
}

func cnpChanged(old, cur any) bool {
	a, ok1 := old.(*decodedCNP)
	b, ok2 := cur.(*decodedCNP)
	return !ok1 || !ok2 || a.Generation != b.Generation || a.UID != b.UID ||
		!slices.Equal(a.UnknownFields, b.UnknownFields) || !sameErrors(a.Invalid, b.Invalid) ||
		!equality.Semantic.DeepEqual(a.Spec, b.Spec)
}

// sameErrors reports whether two lists of decoding problems say the same.
func sameErrors(a, b field.ErrorList) bool {
	return slices.EqualFunc(a, b, func(x, y *field.Error) bool { return x.Error() == y.Error() })
}
