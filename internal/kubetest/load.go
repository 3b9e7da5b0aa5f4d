package kubetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/moat-net/moat/internal/clustergen"
)

// LoadOptions tune Load.
type LoadOptions struct {
	// Concurrency bounds the requests in flight (default 32).
	Concurrency int
	// ExtraNetworkPolicies are created with the generated ones.
	ExtraNetworkPolicies []networkingv1.NetworkPolicy
}

// LoadCounts says what Load created.
type LoadCounts struct {
	Namespaces, Nodes, Pods, NetworkPolicies, ClusterNetworkPolicies int
	// Requests is every API request made, status writes included.
	Requests int
}

func (c LoadCounts) String() string {
	return fmt.Sprintf("%d namespaces, %d nodes, %d pods, %d NetworkPolicies, %d ClusterNetworkPolicies (%d requests)",
		c.Namespaces, c.Nodes, c.Pods, c.NetworkPolicies, c.ClusterNetworkPolicies, c.Requests)
}

var clusterNetworkPolicies = schema.GroupVersionResource{Group: "policy.networking.k8s.io", Version: "v1alpha2", Resource: "clusternetworkpolicies"}

// Load creates a generated cluster through the API as its controllers
// would: namespaces, then nodes with their addresses and pods with their
// IPs written through the status subresource (as kubelets do), then the
// policies; at most opts.Concurrency requests at a time. The
// ClusterNetworkPolicy CRD must be installed.
func Load(ctx context.Context, env *Env, gen *clustergen.Cluster, opts LoadOptions) (LoadCounts, error) {
	conc := opts.Concurrency
	if conc <= 0 {
		conc = 32
	}
	c := env.Client
	var requests atomic.Int64
	count := func(n int) { requests.Add(int64(n)) }
	var counts LoadCounts
	err := Parallel(ctx, conc, len(gen.Namespaces), func(i int) error {
		count(1)
		_, err := c.CoreV1().Namespaces().Create(ctx, &gen.Namespaces[i], metav1.CreateOptions{})
		return wrap("namespace", gen.Namespaces[i].Name, err)
	})
	if err != nil {
		return counts, err
	}
	counts.Namespaces = len(gen.Namespaces)
	if err := Parallel(ctx, conc, len(gen.Nodes), func(i int) error {
		n := gen.Nodes[i].DeepCopy()
		st := n.Status
		n.Status = corev1.NodeStatus{}
		count(2)
		got, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return wrap("node", n.Name, err)
		}
		got.Status = st
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return wrap("node status", n.Name, err)
	}); err != nil {
		return counts, err
	}
	counts.Nodes = len(gen.Nodes)
	if err := Parallel(ctx, conc, len(gen.Pods), func(i int) error {
		p := gen.Pods[i].DeepCopy()
		for j := range p.Spec.Containers {
			if p.Spec.Containers[j].Image == "" {
				p.Spec.Containers[j].Image = "registry.k8s.io/pause:3.10"
			}
		}
		ip := p.Status.PodIP
		p.Status = corev1.PodStatus{}
		count(1)
		got, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return wrap("pod", p.Namespace+"/"+p.Name, err)
		}
		if ip == "" {
			return nil
		}
		got.Status.Phase = corev1.PodRunning
		got.Status.PodIP = ip
		got.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		count(1)
		_, err = c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return wrap("pod status", p.Namespace+"/"+p.Name, err)
	}); err != nil {
		return counts, err
	}
	counts.Pods = len(gen.Pods)
	nps := append(append([]networkingv1.NetworkPolicy(nil), gen.NetworkPolicies...), opts.ExtraNetworkPolicies...)
	if err := Parallel(ctx, conc, len(nps), func(i int) error {
		count(1)
		_, err := c.NetworkingV1().NetworkPolicies(nps[i].Namespace).Create(ctx, &nps[i], metav1.CreateOptions{})
		return wrap("networkpolicy", nps[i].Namespace+"/"+nps[i].Name, err)
	}); err != nil {
		return counts, err
	}
	counts.NetworkPolicies = len(nps)
	if err := Parallel(ctx, conc, len(gen.ClusterNetworkPolicies), func(i int) error {
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&gen.ClusterNetworkPolicies[i])
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{Object: obj}
		u.SetAPIVersion("policy.networking.k8s.io/v1alpha2")
		u.SetKind("ClusterNetworkPolicy")
		count(1)
		_, err = env.Dynamic.Resource(clusterNetworkPolicies).Create(ctx, u, metav1.CreateOptions{})
		return wrap("clusternetworkpolicy", u.GetName(), err)
	}); err != nil {
		return counts, err
	}
	counts.ClusterNetworkPolicies = len(gen.ClusterNetworkPolicies)
	counts.Requests = int(requests.Load())
	return counts, nil
}

func wrap(kind, name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %s: %w", kind, name, err)
}

// Parallel calls f(0) ... f(n-1) with at most conc calls at a time and
// returns the errors joined; after the first error it starts no more
// calls.
func Parallel(ctx context.Context, conc, n int, f func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	sem := make(chan struct{}, max(conc, 1))
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
